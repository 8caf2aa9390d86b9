//! Commands no MQTT client received within their expiry (`docs/downstream.md`, "Outcomes
//! upstream"): for each command log topic a watcher follows the log, notes every deliverable
//! command that carries a message expiry (`mqtt.message_expiry`), and when that expiry has
//! passed without the command being sent to any client — no session subscribed to its topic,
//! or none online to take it — appends one outcome record `tern-outcome: no-subscriber`,
//! awaited until durable. Sends are learnt in process from the delivery path
//! ([`Unclaimed::sent`], live sessions and `$share` groups alike); after a restart the log
//! itself says what was settled: a `delivered` or `no-subscriber` outcome already stored for a
//! command settles it. So each command gets at most one `no-subscriber` record, and one whose
//! expiry passed while the gateway was down is reported when it starts. Never delivers, never
//! reads a session.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tern_core::shutdown::Shutdown;
use tern_log::{LogError, LogPort, Record, StoredRecord};

use super::message::{MESSAGE_EXPIRY, TOPIC};
use super::outcome::{self, COMMAND_HEADER, OUTCOME_HEADER};
use super::router::PartitionId;

/// The outcome's name.
pub const NO_SUBSCRIBER: &str = "no-subscriber";
/// How long after a command's expiry the watcher looks: a send decided just before the
/// expiry is noted by then.
const GRACE_MS: i64 = 200;
/// The longest sleep between two looks at the clock (it may be set while the watcher waits).
const MAX_SLEEP: Duration = Duration::from_secs(30);
/// Bytes read per look at the log.
const READ_BYTES: usize = 64 * 1024;

/// The sends of commands with an expiry since start, until their watcher looked at them.
#[derive(Debug, Default)]
pub(crate) struct Unclaimed {
    sent: Mutex<HashSet<(PartitionId, u64)>>,
}

impl Unclaimed {
    /// The record `source` (a command with an expiry, as the caller checked) was sent to a
    /// client.
    pub(crate) fn sent(&self, source: &(PartitionId, u64)) {
        self.lock().insert(source.clone());
    }

    /// Whether `source` was sent; forgets it (each is looked at once).
    fn take_sent(&self, source: &(PartitionId, u64)) -> bool {
        self.lock().remove(source)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(PartitionId, u64)>> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A deliverable command with an expiry, not settled yet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    /// When its expiry passes (ms since the epoch, the clock of its record's timestamp).
    deadline_ms: i64,
    offset: u64,
    id: Vec<u8>,
}

/// What the watcher knows of one partition: the commands still waiting for their expiry.
#[derive(Debug, Default)]
struct Book {
    by_deadline: BTreeSet<Pending>,
    by_id: HashMap<Vec<u8>, Pending>,
}

impl Book {
    /// Takes note of one record of the log, in log order.
    fn note(&mut self, offset: u64, record: &Record) {
        let Some(id) = record.header(COMMAND_HEADER) else {
            return;
        };
        match record.header(OUTCOME_HEADER) {
            Some(outcome) if outcome == b"delivered" || outcome == NO_SUBSCRIBER.as_bytes() => {
                if let Some(pending) = self.by_id.remove(id) {
                    self.by_deadline.remove(&pending);
                }
            }
            Some(_) => {}
            // The command itself; a refused one carries no `mqtt.topic` and is never sent.
            None if record.header(TOPIC).is_some() => {
                let Some(seconds) = record
                    .header(MESSAGE_EXPIRY)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse::<u32>().ok())
                else {
                    return;
                };
                let pending = Pending {
                    deadline_ms: record
                        .timestamp_ms
                        .saturating_add(i64::from(seconds) * 1000),
                    offset,
                    id: id.to_vec(),
                };
                self.by_deadline.insert(pending.clone());
                self.by_id.insert(pending.id.clone(), pending);
            }
            None => {}
        }
    }

    /// The commands whose expiry (plus the grace) passed by `now_ms`, taken out.
    fn due(&mut self, now_ms: i64) -> Vec<Pending> {
        let mut due = Vec::new();
        while let Some(first) = self.by_deadline.first() {
            if first.deadline_ms.saturating_add(GRACE_MS) > now_ms {
                break;
            }
            if let Some(pending) = self.by_deadline.pop_first() {
                self.by_id.remove(&pending.id);
                due.push(pending);
            }
        }
        due
    }

    /// How long until the next command is due.
    fn wait(&self, now_ms: i64) -> Duration {
        self.by_deadline.first().map_or(MAX_SLEEP, |first| {
            let ms = first.deadline_ms.saturating_add(GRACE_MS) - now_ms;
            Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(MAX_SLEEP)
        })
    }

    /// Puts back a command whose outcome could not be stored (looked at again later).
    fn retry(&mut self, pending: Pending) {
        self.by_id.insert(pending.id.clone(), pending.clone());
        self.by_deadline.insert(pending);
    }
}

/// Watches `partition` of a command log topic until `shutdown`: reads it from its start,
/// then follows its durable end, reporting each command whose expiry passed unsent. `now_ms`
/// is the clock the records' timestamps and the delivery path's expiry checks use.
pub(crate) async fn watch<S: LogPort>(
    log: S,
    partition: PartitionId,
    unclaimed: std::sync::Arc<Unclaimed>,
    now_ms: impl Fn() -> i64 + Send,
    mut shutdown: Shutdown,
) {
    let (topic, index) = (&partition.0, partition.1);
    let mut end = match log.subscribe(topic, index) {
        Ok(end) => end,
        Err(err) => {
            tracing::warn!(%topic, partition = index, %err, "commands' expiries not watched");
            return;
        }
    };
    let mut next = log.offsets(topic, index).map_or(0, |(start, _)| start);
    let mut book = Book::default();
    loop {
        match read_into(&log, &partition, &mut next, &mut book) {
            Ok(()) => {}
            Err(err) => {
                tracing::warn!(%topic, partition = index, %err, "cannot read commands to watch their expiry");
            }
        }
        for pending in book.due(now_ms()) {
            let source = (partition.clone(), pending.offset);
            if unclaimed.take_sent(&source) {
                continue;
            }
            if let Err(err) = report(&log, &partition, &pending, now_ms()).await {
                tracing::warn!(%topic, partition = index, offset = pending.offset, %err, "no-subscriber outcome not stored; trying again");
                book.retry(pending);
                break;
            }
        }
        // At least the grace: an outcome that cannot be stored is not tried in a busy loop.
        let wait = book
            .wait(now_ms())
            .max(Duration::from_millis(GRACE_MS as u64));
        tokio::select! {
            () = shutdown.wait() => return,
            changed = end.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Reads every durable record from `next` into `book`, moving `next` on.
fn read_into<S: LogPort>(
    log: &S,
    (topic, partition): &PartitionId,
    next: &mut u64,
    book: &mut Book,
) -> Result<(), LogError> {
    let (start, _) = log.offsets(topic, *partition)?;
    *next = (*next).max(start);
    loop {
        let records: Vec<StoredRecord> = log.read(topic, *partition, *next, READ_BYTES)?;
        let Some(last) = records.last().map(|r| r.offset) else {
            return Ok(());
        };
        for stored in &records {
            book.note(stored.offset, &stored.record);
        }
        *next = last + 1;
    }
}

/// Appends the no-subscriber outcome of `pending` and waits until it is durable.
async fn report<S: LogPort>(
    log: &S,
    (topic, partition): &PartitionId,
    pending: &Pending,
    now_ms: i64,
) -> Result<(), LogError> {
    let record = outcome::record_of(&pending.id, NO_SUBSCRIBER, now_ms);
    log.append(topic, *partition, vec![record]).await?;
    tracing::info!(%topic, partition, offset = pending.offset, command = %String::from_utf8_lossy(&pending.id), "no client received a command within its expiry");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tern_core::shutdown;
    use tern_log::MemoryLog;

    use super::*;

    fn command(id: &str, timestamp_ms: i64, expiry: Option<u32>) -> Record {
        let mut headers = vec![
            (TOPIC.into(), b"devices/1/cmd".to_vec().into()),
            (COMMAND_HEADER.into(), id.as_bytes().to_vec().into()),
        ];
        if let Some(expiry) = expiry {
            headers.push((
                MESSAGE_EXPIRY.into(),
                expiry.to_string().into_bytes().into(),
            ));
        }
        Record {
            timestamp_ms,
            key: Some(id.as_bytes().to_vec().into()),
            value: b"reboot".to_vec().into(),
            headers: headers.into(),
        }
    }

    fn delivered(id: &str) -> Record {
        Record {
            timestamp_ms: 0,
            key: Some(id.as_bytes().to_vec().into()),
            value: tern_log::Bytes::new(),
            headers: tern_log::Headers::from(vec![
                (COMMAND_HEADER.into(), id.as_bytes().to_vec().into()),
                (OUTCOME_HEADER.into(), b"delivered".to_vec().into()),
            ]),
        }
    }

    /// The no-subscriber outcomes stored in `commands`/0, by command id.
    fn reported(log: &MemoryLog) -> Result<Vec<String>, LogError> {
        let records = log.read("commands", 0, 0, usize::MAX)?;
        Ok(records
            .iter()
            .filter(|r| r.record.header(OUTCOME_HEADER) == Some(NO_SUBSCRIBER.as_bytes()))
            .filter_map(|r| r.record.header(COMMAND_HEADER))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .collect())
    }

    /// A clock in ms that starts at `base` and moves with tokio's (paused) clock.
    fn clock(base: i64) -> impl Fn() -> i64 + Send + Clone {
        let start = tokio::time::Instant::now();
        move || base + i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_command_sent_to_no_client_within_its_expiry_is_reported_once()
    -> Result<(), Box<dyn std::error::Error>> {
        let log = MemoryLog::new(1);
        log.create_topic("commands", 1)?;
        let base = 1_000_000;
        // Expires after 5 s, never sent: reported.
        log.append("commands", 0, vec![command("c/0/1", base, Some(5))])
            .await?;
        // Expires after 5 s, sent in time: not reported.
        log.append("commands", 0, vec![command("c/0/2", base, Some(5))])
            .await?;
        // No expiry: it waits for a subscriber as long as the log keeps it.
        log.append("commands", 0, vec![command("c/0/3", base, None)])
            .await?;
        // Expires after 5 s, a delivered outcome already stored (before a restart).
        log.append("commands", 0, vec![command("c/0/4", base, Some(5))])
            .await?;
        log.append("commands", 0, vec![delivered("c/0/4")]).await?;
        let unclaimed = Arc::new(Unclaimed::default());
        unclaimed.sent(&(("commands".to_owned(), 0), 1));
        let (stop, stopped) = shutdown::channel();
        let partition = ("commands".to_owned(), 0);
        let watcher = tokio::spawn(watch(
            log.clone(),
            partition,
            Arc::clone(&unclaimed),
            clock(base),
            stopped,
        ));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(reported(&log)?.is_empty(), "reported before the expiry");
        // A command that arrives while the watcher waits, already past its expiry.
        log.append(
            "commands",
            0,
            vec![command("c/0/6", base - 10_000, Some(1))],
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(reported(&log)?, ["c/0/6", "c/0/1"]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(reported(&log)?, ["c/0/6", "c/0/1"], "each reported once");
        stop.trigger();
        watcher.await?;

        // c/0/2's client acknowledged it: its connection stores the delivered outcome.
        log.append("commands", 0, vec![delivered("c/0/2")]).await?;
        // A restart: the log says what was settled; nothing is reported again.
        let (stop, stopped) = shutdown::channel();
        let partition = ("commands".to_owned(), 0);
        let unclaimed = Arc::new(Unclaimed::default());
        let again = tokio::spawn(watch(
            log.clone(),
            partition,
            unclaimed,
            clock(base + 70_000),
            stopped,
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.trigger();
        again.await?;
        assert_eq!(
            reported(&log)?,
            ["c/0/6", "c/0/1"],
            "a restart reports nothing twice"
        );
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_whose_expiry_passed_while_the_gateway_was_down_is_reported_at_start()
    -> Result<(), Box<dyn std::error::Error>> {
        let log = MemoryLog::new(1);
        log.create_topic("commands", 1)?;
        log.append("commands", 0, vec![command("c/0/0", 1_000, Some(60))])
            .await?;
        let (stop, stopped) = shutdown::channel();
        let partition = ("commands".to_owned(), 0);
        let unclaimed = Arc::new(Unclaimed::default());
        let watcher = tokio::spawn(watch(
            log.clone(),
            partition,
            unclaimed,
            clock(500_000),
            stopped,
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reported(&log)?, ["c/0/0"]);
        stop.trigger();
        watcher.await?;
        Ok(())
    }
}
