//! Guest instructions per record on tern's two Kafka paths, counted like the QoS 1 messages: a
//! host `kcat -C` reading a backlog from the Kafka listener of tern under QEMU (`consume`), and
//! tern's forwarder (`[[upstream]]`, mirror mode, its default codec) sending the backlog to a
//! Kafka cluster the user started (`forward`). The backlog is an edge log built on the host
//! through the log API (topic `bench`, one partition, telemetry values of `--size` bytes, no key,
//! no headers: the upstream bench's backlog) with R and with 2R records; every run starts tern on
//! a fresh copy of one of them. A run on the same copy that only starts and stops tern is the
//! baseline: opening a log of 2R records validates more bytes than one of R, which is not the
//! work of a consumed or forwarded record. Per record:
//! ((count(2R) − base(2R)) − (count(R) − base(R))) / R.
//!
//! It never starts or stops Kafka and creates only upstream topics named
//! `tern-bench.icount-*`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tern_log::{Log, LogConfig};
use tern_upstream::{KafkaUpstream, Mode, UpstreamConfig, upstream_topic};

use super::symbols::{self, Blocks, Share};
use super::{Arch, Outputs, Runs};
use crate::BenchError;
use crate::kafka::kcat;
use crate::mqtt::servers::Server;
use crate::upstream::backlog;
use crate::upstream::serve::upstream_section;
use crate::upstream::{TOPIC_PREFIX, codec_name, wait_for_end};

/// The edge topic of the backlog.
const EDGE_TOPIC: &str = "bench";

/// Which Kafka path a record takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaPath {
    /// Read by a Kafka client from tern's Kafka listener.
    Consume,
    /// Sent upstream by tern's forwarder.
    Forward,
}

impl KafkaPath {
    pub fn name(self) -> &'static str {
        match self {
            KafkaPath::Consume => "kafka consume",
            KafkaPath::Forward => "upstream forward",
        }
    }
}

/// tern's instructions per record of one path on one architecture.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordCount {
    pub arch: Arch,
    pub path: KafkaPath,
    /// Records of the short run (the long run's backlog holds twice as many).
    pub records: u64,
    /// Start and stop alone on the short and the long backlog.
    pub base_short: u64,
    pub base_long: u64,
    pub short_insns: u64,
    pub long_insns: u64,
    pub insns_per_record: f64,
    /// The functions doing most of that work, most first (`--symbols N`; else empty), by
    /// (count(2R) − count(R)) / R each: the baseline's difference, recovery's, is in them.
    pub functions: Vec<Share>,
}

impl RecordCount {
    pub fn new(
        arch: Arch,
        path: KafkaPath,
        records: u64,
        base: (u64, u64),
        runs: (u64, u64),
    ) -> Self {
        let work = |count: u64, base: u64| count as f64 - base as f64;
        Self {
            arch,
            path,
            records,
            base_short: base.0,
            base_long: base.1,
            short_insns: runs.0,
            long_insns: runs.1,
            insns_per_record: (work(runs.1, base.1) - work(runs.0, base.0)) / records.max(1) as f64,
            functions: Vec::new(),
        }
    }
}

/// The two backlogs, each a `tern serve` data directory's `log/`.
#[derive(Debug)]
pub struct Backlogs {
    pub records: u64,
    short: PathBuf,
    long: PathBuf,
}

impl Backlogs {
    /// Builds logs of `records` and `2 × records` values of `size` bytes under `dir`.
    pub async fn build(dir: &Path, records: u64, size: usize) -> Result<Self, BenchError> {
        let backlogs = Self {
            records,
            short: dir.join("backlog-short"),
            long: dir.join("backlog-long"),
        };
        fill(&backlogs.short, records, size).await?;
        fill(&backlogs.long, 2 * records, size).await?;
        Ok(backlogs)
    }

    /// The short and the long backlog with their records.
    fn both(&self) -> [(&Path, u64); 2] {
        [(&self.short, self.records), (&self.long, 2 * self.records)]
    }
}

/// A new log in `dir` holding `records` telemetry values in partition 0 of the edge topic.
async fn fill(dir: &Path, records: u64, size: usize) -> Result<(), BenchError> {
    let log_error = |op| move |source| BenchError::log(op, source);
    let log = Log::open(dir, &LogConfig::default())
        .await
        .map_err(log_error("open"))?;
    backlog::fill(&log, EDGE_TOPIC, records, size).await?;
    log.close().await.map_err(log_error("close"))
}

/// The Kafka cluster of the forward runs and the names of this bench run.
pub struct Upstream<'a> {
    pub kafka: &'a KafkaUpstream,
    pub bootstrap: &'a [String],
    /// Distinguishes this bench run's upstream topics from earlier ones.
    pub run_id: &'a str,
}

impl Runs<'_> {
    /// tern's instructions per consumed record and, given a cluster, per forwarded record.
    pub(super) fn per_record(
        &self,
        backlogs: &Backlogs,
        upstream: Option<&Upstream<'_>>,
        paths: &[KafkaPath],
    ) -> Result<Vec<RecordCount>, BenchError> {
        let (base, _) = self.on_both(backlogs, "base", |log, _| {
            let server = self.start_on(log, "")?;
            Ok((server, None))
        })?;
        let mut counts = Vec::new();
        for &path in paths {
            let (runs, blocks) = match (path, upstream) {
                (KafkaPath::Consume, _) => self.on_both(backlogs, "consume", |log, records| {
                    self.consume(log, records)
                })?,
                (KafkaPath::Forward, Some(upstream)) => {
                    self.on_both(backlogs, "forward", |log, records| {
                        self.forward(upstream, log, records)
                    })?
                }
                (KafkaPath::Forward, None) => continue,
            };
            let mut count = RecordCount::new(self.arch, path, backlogs.records, base, runs);
            if let (Some(top), [Some(short), Some(long)]) = (self.options.symbols, blocks) {
                count.functions = symbols::per_message(self.arch, &short, &long, backlogs.records)?;
                count.functions.truncate(top);
            }
            counts.push(count);
        }
        Ok(counts)
    }

    /// The counts of `run` on the short and the long backlog, with their blocks when
    /// attributing. `run` starts tern on a copy of the log it is given and returns it with the
    /// work to do before it is stopped.
    fn on_both<'b>(
        &'b self,
        backlogs: &'b Backlogs,
        label: &str,
        run: impl Fn(&Path, u64) -> Result<(Starter<'b>, Option<Work<'b>>), BenchError>,
    ) -> Result<Both, BenchError> {
        let [short, long] = backlogs.both().map(|(log, records)| {
            let stem = format!("tern-{label}-{}-{records}", self.arch.name());
            let (start, work) = run(log, records)?;
            self.counted(&stem, start, |server| match work {
                Some(work) => work(server),
                None => Ok(()),
            })
        });
        let ((short, short_blocks), (long, long_blocks)) = (short?, long?);
        Ok(((short, long), [short_blocks, long_blocks]))
    }

    /// Starts tern under QEMU with the plugin on a copy of `log` with `extra` in its config.
    fn start_on(&self, log: &Path, extra: &str) -> Result<Starter<'_>, BenchError> {
        let log = log.to_path_buf();
        let extra = extra.to_owned();
        Ok(Box::new(move |out: &Outputs| {
            Server::tern_under_on_copy(self.tern_command(out), &log, &extra)
        }))
    }

    /// A `kcat -C` reading all `records` of the edge topic from tern's Kafka listener.
    fn consume(
        &self,
        log: &Path,
        records: u64,
    ) -> Result<(Starter<'_>, Option<Work<'_>>), BenchError> {
        let out = self
            .work
            .join(format!("kcat-{}-{records}", self.arch.name()));
        let work: Work<'_> = Box::new(move |server: &Server| {
            kcat::consume(&server.addr.to_string(), EDGE_TOPIC, records, &out).map(|_| ())
        });
        Ok((self.start_on(log, "")?, Some(work)))
    }

    /// tern forwarding the edge topic to a new upstream topic until all `records` are there.
    fn forward<'b>(
        &'b self,
        upstream: &Upstream<'b>,
        log: &Path,
        records: u64,
    ) -> Result<(Starter<'b>, Option<Work<'b>>), BenchError> {
        let gateway = format!("icount-{}-{}-{records}", upstream.run_id, self.arch.name());
        let topic = upstream_topic(TOPIC_PREFIX, &gateway, EDGE_TOPIC);
        let replication = UpstreamConfig::default().replication_factor;
        self.runtime
            .block_on(upstream.kafka.ensure_topic(&topic, 1, replication))?;
        let section = format!(
            "{}compression = \"{}\"\n",
            upstream_section(
                upstream.bootstrap,
                &gateway,
                TOPIC_PREFIX,
                Mode::Mirror,
                EDGE_TOPIC,
            ),
            codec_name(self.options.forward_codec)
        );
        let kafka = upstream.kafka;
        let work: Work<'_> = Box::new(move |_: &Server| {
            self.runtime
                .block_on(wait_for_end(kafka, &topic, records))
                .map(|_| ())
        });
        Ok((self.start_on(log, &section)?, Some(work)))
    }
}

/// The counts of a short and a long run, and their blocks when attributing.
type Both = ((u64, u64), [Option<Blocks>; 2]);
/// Starts a broker with the plugin writing to the outputs it is given.
type Starter<'a> = Box<dyn Fn(&Outputs) -> Result<Server, BenchError> + 'a>;
/// What a run does while the broker runs.
type Work<'a> = Box<dyn FnOnce(&Server) -> Result<(), BenchError> + 'a>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_record_takes_the_baselines_out_of_both_runs() {
        // Opening the long backlog costs 100,000 more; each record 7.
        let count = RecordCount::new(
            Arch::Aarch64,
            KafkaPath::Consume,
            1_000,
            (1_000_000, 1_100_000),
            (1_500_000, 1_607_000),
        );
        assert_eq!(count.insns_per_record, 7.0);
    }

    #[tokio::test]
    async fn the_backlogs_hold_r_and_2r_records_of_the_edge_topic() {
        let dir = std::env::temp_dir().join(format!("tern-bench-backlogs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let backlogs = Backlogs::build(&dir, 120, 64).await.expect("backlogs");
        for (log, records) in backlogs.both() {
            let log = Log::open(log, &LogConfig::default()).await.expect("open");
            let (start, end) = log.offsets(EDGE_TOPIC, 0).expect("offsets");
            assert_eq!((start, end), (0, records));
            log.close().await.expect("close");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
