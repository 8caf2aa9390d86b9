//! Idempotent producers, as Kafka's broker keeps them: per (topic, partition, producer id) the
//! producer's epoch, its last sequence and the first and last sequences and base offset of its
//! last [`WINDOW`] batches. A batch a producer resends after losing the answer (same producer
//! id, epoch and sequences as one of those) is not appended again: it is answered with the
//! first copy's base offset, once that copy is durable. Otherwise the batch must continue the
//! sequence (`OUT_OF_ORDER_SEQUENCE_NUMBER`, 45), must not come from an older epoch
//! (`INVALID_PRODUCER_EPOCH`, 47, what Kafka's Produce answers since 2.7), and a newer epoch
//! must start at sequence 0.
//!
//! The state survives a restart or a crash as Kafka's does: each batch is stored with its
//! producer id, epoch and sequences (the producer section of a stored batch,
//! `docs/log-format.md`), and the first idempotent batch a partition gets after a start rebuilds
//! the partition's table from the stamps of its last two segments
//! ([`LogPort::producer_stamps`]) before it is checked. A batch whose answer was lost when the
//! gateway died is answered, when the producer retries it, with the offset of the copy stored
//! before the crash.
//!
//! Choices where Kafka's own rules depend on its persisted state:
//! - A producer id a partition does not know (a new producer, or one whose batches are older
//!   than the last two segments, or an eviction) is accepted at any sequence, as Kafka does
//!   once a producer's state has expired: never refused.
//! - At most [`MAX_PRODUCERS_PER_PARTITION`] producer ids per partition; a new one beyond that
//!   evicts the least recently used (Kafka expires them after `producer.id.expiration.ms`).
//!   About 200 bytes each.
//! - An append that fails after it was queued (a failed sync, shutdown) makes the partition
//!   forget the producer, so its retry is accepted rather than refused as out of order.
//!
//! Idempotent batches of one partition are checked and queued one at a time (Kafka does both
//! under the partition's lock), so the order of the sequences is the order in the log even
//! when a producer's retry arrives on a new connection while the old one is still appending.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kafka_protocol::ResponseError;
use tern_log::{Codec, LogError, LogPort, Queued, Record, StampedBatch};
use tokio::sync::watch;

use crate::records::ProducerBatch;

/// Batches remembered per producer and partition (Kafka's window, the most a producer has in
/// flight with `max.in.flight.requests.per.connection=5`).
pub const WINDOW: usize = 5;

/// Producer ids remembered per partition; the least recently used is forgotten beyond this.
pub const MAX_PRODUCERS_PER_PARTITION: usize = 1024;

/// Every partition's producers.
#[derive(Debug, Default)]
pub struct ProducerStates {
    partitions: Mutex<HashMap<(String, u32), Arc<Partition>>>,
}

/// Why an idempotent batch was not queued.
#[derive(Debug)]
pub enum Refusal {
    /// The log refused it.
    Log(LogError),
    /// Its producer id, epoch or sequence (the code and a message for the client).
    Sequence(ResponseError, String),
}

#[derive(Debug, Default)]
struct Partition {
    /// Held from the check of a batch until it is queued; holds whether the table was rebuilt
    /// from the log's stamps yet.
    turn: tokio::sync::Mutex<bool>,
    producers: Mutex<Producers>,
}

#[derive(Debug, Default)]
struct Producers {
    by_id: HashMap<i64, Entry>,
    /// Counts checks: the last use of each entry, for eviction.
    tick: u64,
}

#[derive(Debug)]
struct Entry {
    epoch: i16,
    last_seq: i32,
    batches: VecDeque<Cached>,
    used: u64,
}

#[derive(Debug, Clone)]
struct Cached {
    first_seq: i32,
    last_seq: i32,
    offset: Offset,
}

/// A cached batch's base offset, or the answer its append will give.
#[derive(Debug, Clone)]
enum Offset {
    InFlight(watch::Receiver<Option<Result<u64, String>>>),
    Stored(u64),
}

enum Verdict {
    Append,
    Duplicate(Offset),
    Refuse(ResponseError, String),
}

impl ProducerStates {
    /// Queues `records`, the batch `batch`, on the partition unless it is a duplicate (whose
    /// answer is the first copy's) or out of sequence.
    pub async fn enqueue<L: LogPort>(
        &self,
        log: &L,
        topic: &str,
        partition: u32,
        batch: ProducerBatch,
        records: Vec<Record>,
        codec: Codec,
    ) -> Result<Queued, Refusal> {
        let state = self.partition(topic, partition);
        let mut rebuilt = state.turn.lock().await;
        if !*rebuilt {
            let stamps = stamps_of(log, topic, partition)
                .await
                .map_err(Refusal::Log)?;
            let mut producers = state.lock();
            for stored in &stamps {
                producers.restore(stored);
            }
            *rebuilt = true;
        }
        let verdict = state.lock().check(&batch);
        match verdict {
            Verdict::Refuse(code, message) => Err(Refusal::Sequence(code, message)),
            Verdict::Duplicate(offset) => Ok(answer_of(offset, topic, partition)),
            Verdict::Append => {
                // Not stored, so nothing to remember: the retry is checked as this one was.
                let queued = log
                    .enqueue_stamped(topic, partition, records, codec, batch.into())
                    .await
                    .map_err(Refusal::Log)?;
                let (tx, rx) = watch::channel(None);
                state.lock().record(&batch, Offset::InFlight(rx));
                let state = Arc::clone(&state);
                // Driven to its end even if the client's connection (and its answer) is gone:
                // a retry on another connection waits for this offset.
                let done = tokio::spawn(async move {
                    let result = queued.await;
                    {
                        let mut producers = state.lock();
                        match &result {
                            Ok(base) => producers.stored(&batch, *base),
                            Err(_) => producers.forget(batch.producer_id),
                        }
                    }
                    tx.send_replace(Some(
                        result.as_ref().map(|b| *b).map_err(ToString::to_string),
                    ));
                    result
                });
                let (topic, reason) = (topic.to_owned(), "the append task ended".to_owned());
                Ok(Box::pin(async move {
                    let ended = LogError::Failed {
                        topic,
                        partition,
                        reason,
                    };
                    done.await.unwrap_or(Err(ended))
                }))
            }
        }
    }

    /// Forgets every partition of `topic` (deleted: one created again under its name starts
    /// with no producers).
    pub fn forget_topic(&self, topic: &str) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(name, _), _| name != topic);
    }

    fn partition(&self, topic: &str, partition: u32) -> Arc<Partition> {
        let mut partitions = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(partitions.entry((topic.to_owned(), partition)).or_default())
    }
}

impl Partition {
    fn lock(&self) -> MutexGuard<'_, Producers> {
        self.producers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Producers {
    fn check(&mut self, batch: &ProducerBatch) -> Verdict {
        self.tick += 1;
        let Some(entry) = self.by_id.get_mut(&batch.producer_id) else {
            return Verdict::Append;
        };
        entry.used = self.tick;
        if batch.epoch == entry.epoch {
            let cached = entry
                .batches
                .iter()
                .find(|c| c.first_seq == batch.first_seq && c.last_seq == batch.last_seq);
            if let Some(cached) = cached {
                return Verdict::Duplicate(cached.offset.clone());
            }
        }
        if batch.epoch < entry.epoch {
            return Verdict::Refuse(
                ResponseError::InvalidProducerEpoch,
                format!(
                    "producer {} epoch {} is older than its epoch {} on this partition",
                    batch.producer_id, batch.epoch, entry.epoch
                ),
            );
        }
        if batch.epoch > entry.epoch {
            if batch.first_seq == 0 {
                return Verdict::Append;
            }
            return Verdict::Refuse(
                ResponseError::OutOfOrderSequenceNumber,
                format!(
                    "producer {} new epoch {} starts at sequence {}, not 0",
                    batch.producer_id, batch.epoch, batch.first_seq
                ),
            );
        }
        if follows(entry.last_seq, batch.first_seq) {
            Verdict::Append
        } else {
            Verdict::Refuse(
                ResponseError::OutOfOrderSequenceNumber,
                format!(
                    "producer {} sequence {} does not follow {}",
                    batch.producer_id, batch.first_seq, entry.last_seq
                ),
            )
        }
    }

    /// Remembers an appended batch (after [`check`](Self::check) said to append it).
    fn record(&mut self, batch: &ProducerBatch, offset: Offset) {
        let cached = Cached {
            first_seq: batch.first_seq,
            last_seq: batch.last_seq,
            offset,
        };
        let used = self.tick;
        if let Some(entry) = self.by_id.get_mut(&batch.producer_id) {
            if entry.epoch != batch.epoch {
                entry.epoch = batch.epoch;
                entry.batches.clear();
            }
            entry.last_seq = batch.last_seq;
            entry.used = used;
            if entry.batches.len() == WINDOW {
                entry.batches.pop_front();
            }
            entry.batches.push_back(cached);
            return;
        }
        if self.by_id.len() >= MAX_PRODUCERS_PER_PARTITION {
            let oldest = self
                .by_id
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.by_id.remove(&oldest);
            }
        }
        self.by_id.insert(
            batch.producer_id,
            Entry {
                epoch: batch.epoch,
                last_seq: batch.last_seq,
                batches: VecDeque::from([cached]),
                used,
            },
        );
    }

    /// Takes a batch stored before this start (in log order, before any new batch is checked).
    fn restore(&mut self, stored: &StampedBatch) {
        self.tick += 1;
        self.record(&stored.stamp.into(), Offset::Stored(stored.base_offset));
    }

    /// The batch's append finished at `base`: later duplicates need no waiting.
    fn stored(&mut self, batch: &ProducerBatch, base: u64) {
        let Some(entry) = self.by_id.get_mut(&batch.producer_id) else {
            return;
        };
        if entry.epoch != batch.epoch {
            return;
        }
        for cached in &mut entry.batches {
            if cached.first_seq == batch.first_seq && cached.last_seq == batch.last_seq {
                cached.offset = Offset::Stored(base);
            }
        }
    }

    fn forget(&mut self, producer_id: i64) {
        self.by_id.remove(&producer_id);
    }
}

/// The stamps the log keeps at the end of the partition, read off the async workers (they may
/// touch a cold segment).
async fn stamps_of<L: LogPort>(
    log: &L,
    topic: &str,
    partition: u32,
) -> Result<Vec<StampedBatch>, LogError> {
    let (log, owned) = (log.clone(), topic.to_owned());
    tokio::task::spawn_blocking(move || log.producer_stamps(&owned, partition))
        .await
        .unwrap_or_else(|err| {
            Err(LogError::Failed {
                topic: topic.to_owned(),
                partition,
                reason: format!("reading its producers failed: {err}"),
            })
        })
}

/// Whether `next` is the sequence after `last` (which wraps from `i32::MAX` to 0).
fn follows(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// A duplicate's answer: the first copy's base offset, once it is known.
fn answer_of(offset: Offset, topic: &str, partition: u32) -> Queued {
    let failed = {
        let topic = topic.to_owned();
        move |reason: String| LogError::Failed {
            topic,
            partition,
            reason: format!("the first copy of this batch was not stored: {reason}"),
        }
    };
    Box::pin(async move {
        match offset {
            Offset::Stored(base) => Ok(base),
            Offset::InFlight(mut rx) => {
                let answer = rx.wait_for(Option::is_some).await.map(|a| a.clone());
                match answer {
                    Ok(Some(Ok(base))) => Ok(base),
                    Ok(Some(Err(reason))) => Err(failed(reason)),
                    Ok(None) | Err(_) => Err(failed("its append ended".to_owned())),
                }
            }
        }
    })
}

#[cfg(test)]
mod test;
