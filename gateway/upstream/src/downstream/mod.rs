//! The downstream: commands from the datacenter to devices over the link the gateway already
//! opens. One task per partition of the fleet's command topic (`[upstream.commands] topic`)
//! reads it with `read_committed` Fetch, keeps the records addressed to this gateway
//! (`command.rs`) and appends each as one record to the edge log topic `log_topic`, where MQTT
//! subscriptions read it like any record of the MQTT route, and from where the upstream forwards
//! it back to the datacenter as the command's `stored` (or `refused`) outcome.
//!
//! Exactly once into the edge log: every append ends with a position record in the same batch
//! (`position.rs`), so the commands and how far the topic was read become durable together; at
//! start the last position record is where each partition resumes. The consumer group
//! `{topic_prefix}{gateway_id}.commands` is committed only after that (so
//! `kafka-consumer-groups` shows the gateway's lag) and may move a partition forward, never
//! back: an operator skips a backlog of commands by resetting the group's offsets ahead. Every
//! append waits for the previous one to be durable (one append at a time for the whole
//! downstream), so a position record never claims a command another partition's failed append
//! lost. It never produces to Kafka and never delivers to MQTT itself.

mod command;
mod position;

use std::sync::Arc;

use tern_core::shutdown::Shutdown;
use tern_log::{LogError, LogPort, Record};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::ablation::Ablation;
use crate::client::fetch::Fetched;
use crate::client::{ClientError, Settings};
use crate::config::{CommandStart, CommandsConfig, UpstreamConfig};
use crate::driver::{self, StatusMap, edge_error, run_sessions};
use crate::error::UpstreamError;
use crate::follower::Cluster;
use crate::group::GroupClient;
use crate::kafka::{KafkaUpstream, UpstreamPartition, tls_config};
use crate::provenance::Provenance;

pub use command::{
    H_COMMAND, H_COMMAND_KEY, H_COMMAND_TIMESTAMP, H_REFUSED, H_REFUSED_TOPIC, Verdict,
    addressed_to, command_id, edge_record,
};
pub use position::{H_POSITION, Positions, decode as decode_position, position_record};

/// Kafka's OFFSET_OUT_OF_RANGE: the position is before the first retained command or past the
/// end.
const OFFSET_OUT_OF_RANGE: i16 = 1;

/// The cursor on partition 0 of the log topic where the scan for the last position starts (a
/// position record's offset, committed now and then; it holds that record from retention).
pub fn scan_cursor(topic: &str) -> String {
    format!("downstream:{topic}")
}

/// The consumer group whose offsets show the gateway's lag on the command topic.
pub fn group_name(config: &UpstreamConfig, gateway: &str) -> String {
    format!("{}{gateway}.commands", config.topic_prefix)
}

/// Reads the commands of `config`'s `[upstream.commands]` into the edge log until `shutdown`;
/// returns at once without one.
pub async fn run<L: LogPort>(
    config: UpstreamConfig,
    gateway: String,
    log: L,
    status: StatusMap,
    shutdown: Shutdown,
) -> Result<(), UpstreamError> {
    run_ablated(config, Ablation::NONE, gateway, log, status, shutdown).await
}

/// [`run`] without the safeguards `ablation` turns off (tests and `tern-bench` only).
pub async fn run_ablated<L: LogPort>(
    config: UpstreamConfig,
    ablation: Ablation,
    gateway: String,
    log: L,
    status: StatusMap,
    mut shutdown: Shutdown,
) -> Result<(), UpstreamError> {
    let Some(commands) = config.commands.clone() else {
        return Ok(());
    };
    ensure_log_topic(&log, &commands.log_topic)?;
    let book = Book::load(&log, &commands, ablation)?;
    let tls = config.tls.as_ref().map(tls_config).transpose()?;
    let settings = Settings {
        bootstrap: config.bootstrap.clone(),
        tls,
        sasl: config.sasl.clone(),
    };
    let downstream = Arc::new(Downstream {
        kafka: KafkaUpstream::new(&config)?,
        group: GroupClient::new(settings, group_name(&config, &gateway)),
        book: tokio::sync::Mutex::new(book),
        commands,
        config,
        ablation,
        gateway,
        log,
        status,
    });
    let mut tasks = JoinSet::new();
    let mut running = 0;
    loop {
        match downstream
            .kafka
            .partition_count(&downstream.commands.topic)
            .await
        {
            Ok(count) => {
                for partition in running..count {
                    let task = Arc::clone(&downstream);
                    tasks.spawn(task.run_partition(partition, shutdown.clone()));
                }
                running = running.max(count);
                if count == 0 {
                    tracing::debug!(topic = %downstream.commands.topic, "no command topic upstream yet");
                }
            }
            Err(err) => tracing::debug!(%err, "cannot list the command topic's partitions"),
        }
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(downstream.config.discover_interval.0) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    downstream.save_unsaved().await;
    Ok(())
}

/// Creates the log topic with one partition (every command of the gateway in one order) unless
/// it exists. The binary calls it before MQTT opens, which reads the topic.
pub fn ensure_log_topic<L: LogPort>(log: &L, topic: &str) -> Result<(), UpstreamError> {
    if log.topics().iter().any(|t| t.name == topic) {
        return Ok(());
    }
    match log.create_topic(topic, 1) {
        Ok(_) | Err(LogError::TopicExists { .. }) => Ok(()),
        Err(err) => Err(edge_error("create the commands' log topic", err)),
    }
}

/// How far each command partition is read, and when that was last stored.
#[derive(Debug)]
struct Book {
    /// Each partition's next offset: stored in the edge log, or ahead of the last position
    /// record only by records addressed to other gateways.
    next: Positions,
    /// Whether `next` is ahead of the last position record.
    unsaved: bool,
    saved_at: Option<Instant>,
    cursor_at: Option<Instant>,
}

impl Book {
    /// The last stored position, read from the edge log (none when the ablation resumes from
    /// the group alone).
    fn load<L: LogPort>(
        log: &L,
        commands: &CommandsConfig,
        ablation: Ablation,
    ) -> Result<Self, UpstreamError> {
        let from = log
            .cursor(&scan_cursor(&commands.topic), &commands.log_topic, 0)
            .unwrap_or(0);
        let found = position::last_position(log, &commands.log_topic, &commands.topic, from)
            .map_err(|err| UpstreamError::Downstream {
                topic: commands.log_topic.clone(),
                message: format!("cannot read the stored position: {err}"),
            })?;
        let next = match found {
            Some((offset, next)) if !ablation.commit_before_append => {
                tracing::info!(log_topic = %commands.log_topic, offset, ?next, "downstream position");
                next
            }
            _ => Positions::new(),
        };
        Ok(Self {
            next,
            unsaved: false,
            saved_at: None,
            cursor_at: None,
        })
    }
}

/// The downstream of one upstream cluster.
#[derive(Debug)]
struct Downstream<L> {
    config: UpstreamConfig,
    commands: CommandsConfig,
    ablation: Ablation,
    gateway: String,
    kafka: KafkaUpstream,
    group: GroupClient,
    log: L,
    status: StatusMap,
    /// Held across each append until it is durable: one append at a time.
    book: tokio::sync::Mutex<Book>,
}

impl<L: LogPort> Downstream<L> {
    fn source(&self, partition: u32) -> Provenance {
        Provenance {
            gateway: self.gateway.clone(),
            topic: self.commands.topic.clone(),
            partition,
        }
    }

    /// Sessions for one command partition until shutdown, with backoff after failures.
    async fn run_partition(self: Arc<Self>, partition: u32, mut shutdown: Shutdown) {
        let source = self.source(partition);
        let interrupted = "downstream interrupted";
        run_sessions(
            &self.config,
            &source,
            &self.status,
            &mut shutdown,
            interrupted,
            || self.session(partition),
        )
        .await;
    }

    /// One session: find where to resume, then read, store and commit until an error.
    async fn session(&self, partition: u32) -> Result<(), UpstreamError> {
        let topic = &self.commands.topic;
        let handle = self.kafka.partition(topic, partition).await?;
        let p = i32::try_from(partition).unwrap_or(i32::MAX);
        let mut next = self.resume(&handle, p).await?;
        let source = self.source(partition);
        driver::connected(&self.status, &source, offset_u64(next));
        loop {
            let fetched = match handle.fetch_committed(next, self.commands.max_wait.0).await {
                Ok(fetched) => fetched,
                Err(err) if kafka_code(&err) == Some(OFFSET_OUT_OF_RANGE) => {
                    next = self.out_of_range(&handle, p, next).await?;
                    continue;
                }
                Err(err) => return Err(err),
            };
            driver::update(&self.status, &source, |s| {
                s.upstream_end = Some(offset_u64(fetched.end));
            });
            if fetched.next <= next {
                continue;
            }
            let (records, refused) = self.edge_records(&fetched, p);
            let stored = records.len();
            let bytes: usize = records.iter().map(Record::size).sum();
            if self.ablation.commit_before_append {
                self.commit_group(p, fetched.next).await;
            }
            self.store(p, records, fetched.next, false).await?;
            next = fetched.next;
            driver::forwarded(&self.status, &source, offset_u64(next), stored, bytes);
            driver::update(&self.status, &source, |s| s.refused += refused);
            if !self.ablation.commit_before_append {
                self.commit_group(p, next).await;
            }
        }
    }

    /// The edge records of the fetched commands addressed to this gateway, and how many of
    /// them were refused.
    fn edge_records(&self, fetched: &Fetched, partition: i32) -> (Vec<Record>, u64) {
        let now = wall_clock_ms();
        let (topic, allow) = (self.commands.topic.as_str(), &self.commands.allow);
        let mut refused = 0;
        let records = fetched
            .records
            .iter()
            .filter(|r| addressed_to(r.key.as_deref(), &self.gateway, &self.commands.groups))
            .map(|r| {
                let (edge, verdict) = edge_record(r, (topic, partition), allow, now);
                if let Verdict::Refused(reason) = verdict {
                    refused += 1;
                    let id = command_id(topic, partition, r.offset);
                    tracing::warn!(command = %id, %reason, "command refused");
                }
                edge
            })
            .collect();
        (records, refused)
    }

    /// Where partition `p` resumes: the stored position, moved forward by the group's offset
    /// when an operator reset it ahead; with neither, `start` (and that start is stored at
    /// once, so a restart does not move a `latest` start on). The ablation resumes from the
    /// group alone.
    async fn resume(&self, handle: &UpstreamPartition, p: i32) -> Result<i64, UpstreamError> {
        let stored = self.book.lock().await.next.get(&p).copied();
        let group = match self.group.fetch(&self.commands.topic, p).await {
            Ok(offset) => offset,
            Err(source) if source.is_unreachable() => {
                return Err(self.group_error("offset fetch", source));
            }
            Err(source) => {
                let err = self.group_error("offset fetch", source);
                tracing::warn!(%err, "resuming from the stored position alone");
                None
            }
        };
        let next = match (stored, group) {
            (Some(stored), Some(group)) if group > stored => {
                tracing::info!(
                    partition = p,
                    stored,
                    group,
                    "the group's offset is ahead of the stored position: commands in between are skipped"
                );
                group
            }
            (Some(stored), _) => stored,
            (None, Some(group)) => group,
            (None, None) => {
                let start = match self.commands.start {
                    CommandStart::Earliest => handle.first_offset().await?,
                    CommandStart::Latest => handle.end_offset().await?,
                };
                tracing::info!(partition = p, start, "first read of the command partition");
                start
            }
        };
        if stored != Some(next) {
            self.store(p, Vec::new(), next, true).await?;
        }
        Ok(next)
    }

    /// Where to go on after Kafka answered that `next` is out of range: its first retained
    /// command when retention passed `next` (the commands in between are lost, and said so),
    /// its first when the partition ends before `next` (deleted and created again).
    async fn out_of_range(
        &self,
        handle: &UpstreamPartition,
        p: i32,
        next: i64,
    ) -> Result<i64, UpstreamError> {
        let first = handle.first_offset().await?;
        let end = handle.end_offset().await?;
        let topic = &self.commands.topic;
        if next < first {
            tracing::error!(%topic, partition = p, lost = first - next, "Kafka deleted commands before this gateway read them");
        } else {
            tracing::error!(%topic, partition = p, next, end, "the command partition ends before this gateway's position: deleted and created again? reading it from its start");
        }
        self.store(p, Vec::new(), first, true).await?;
        Ok(first)
    }

    /// Appends `records` of partition `p` with the position `next` after them and waits until
    /// they are durable. Without records (all for other gateways) the position is only noted,
    /// and stored at most every `checkpoint_interval`, unless `force`.
    async fn store(
        &self,
        p: i32,
        mut records: Vec<Record>,
        next: i64,
        force: bool,
    ) -> Result<(), UpstreamError> {
        let mut book = self.book.lock().await;
        let mut after = book.next.clone();
        after.insert(p, next);
        let interval = self.commands.checkpoint_interval.0;
        let due = book.saved_at.is_none_or(|at| at.elapsed() >= interval);
        if records.is_empty() && !force && !due {
            book.next = after;
            book.unsaved = true;
            return Ok(());
        }
        let (topic, log_topic) = (&self.commands.topic, &self.commands.log_topic);
        records.push(position::position_record(topic, &after, wall_clock_ms()));
        let count = records.len() as u64;
        let base = self
            .log
            .append(log_topic, 0, records)
            .await
            .map_err(|e| edge_error("append commands", e))?;
        book.next = after;
        book.unsaved = false;
        book.saved_at = Some(Instant::now());
        if book.cursor_at.is_none_or(|at| at.elapsed() >= interval) {
            let marker = base + count - 1;
            self.log
                .commit_cursor(&scan_cursor(topic), log_topic, 0, marker)
                .await
                .map_err(|e| edge_error("commit the downstream's scan cursor", e))?;
            book.cursor_at = Some(Instant::now());
        }
        Ok(())
    }

    /// Stores a position that only skipped records moved (on shutdown).
    async fn save_unsaved(&self) {
        let Some((p, next)) = ({
            let book = self.book.lock().await;
            book.next
                .first_key_value()
                .filter(|_| book.unsaved)
                .map(|(p, o)| (*p, *o))
        }) else {
            return;
        };
        // The book's own position again, forced out: the position record holds every partition.
        if let Err(err) = self.store(p, Vec::new(), next, true).await {
            tracing::warn!(%err, "cannot store the downstream's position on shutdown");
        }
    }

    /// Commits the group's offset of partition `p`: it shows the lag and can move the gateway
    /// forward; a failure costs only that, so it is logged and forwarding goes on.
    async fn commit_group(&self, p: i32, next: i64) {
        let commit = crate::client::group::Commit {
            topic: &self.commands.topic,
            partition: p,
            offset: next,
            metadata: "",
        };
        if let Err(source) = self.group.commit(&commit).await {
            let err = self.group_error("offset commit", source);
            tracing::warn!(%err, "the command group's offset was not committed");
        }
    }

    fn group_error(&self, op: &'static str, source: ClientError) -> UpstreamError {
        UpstreamError::Group {
            op,
            group: self.group.group().to_owned(),
            source,
        }
    }
}

/// The Kafka error code of a broker's refusal in `err`.
fn kafka_code(err: &UpstreamError) -> Option<i16> {
    match err {
        UpstreamError::Client { source, .. } => source.code(),
        _ => None,
    }
}

fn offset_u64(offset: i64) -> u64 {
    u64::try_from(offset).unwrap_or(0)
}

/// Milliseconds since the epoch by the gateway's clock (the edge log keeps its timestamps from
/// going backwards).
use tern_core::time::now_ms as wall_clock_ms;

#[cfg(test)]
mod test;
