//! `tern-bench kafka`: tern's Kafka listener next to a single-node Apache Kafka on the same
//! machine and file system, both driven by the same client (kcat) with the same records.
//!
//! - produce: `kcat -P -X acks=all` of `--records` values to a topic of each broker: tern (acks
//!   after the group-committed fdatasync), Kafka with the topic config `flush.messages=1`
//!   (fsync after every append, as durable as tern) and Kafka's default topic (acks from the
//!   page cache, no fsync);
//! - consume: `kcat -C -o beginning -e` of the same records from each broker;
//! - memory: tern's resident set (all of it, and its anonymous part: without the mapped
//!   segment pages the kernel can drop) idle and with a consumer group of 3 (`kcat -G`) attached
//!   and caught up.
//!
//! With `--flush-delay-us N` both brokers run with `tern-flush-delay` preloaded: each fsync and
//! fdatasync waits N µs first, the flush latency of an SD card or eMMC (docs/kafka.md).
//!
//! Runs interleave the brokers, `--repetitions` times each, after one untimed warm-up round
//! (each produce topic written once, each consume topic read once): without it the first run
//! measured Kafka's JVM before its JIT compiled the hot paths (its first produce runs were half
//! its later ones) and both brokers' topic creation. The report prints every run, the medians
//! and tern/Kafka ratios. It never judges a run by its figures (targets only print
//! whether they are met) and touches only the processes, topics and directories it created.

mod broker;
pub mod cold;
pub(crate) mod kcat;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::mqtt::servers::Server;

pub use report::Report;

/// Members of the consumer group whose memory is measured.
pub const GROUP_MEMBERS: usize = 3;
/// How long the members may take to join and read the topic.
const GROUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long tern idles before the idle reading, and the caught-up group stays attached
/// (heartbeats, fetches waiting) before the second reading: longer than tern's heap trim period
/// (5 s), so each reading holds what an idle tern or the attached group costs, not buffers the
/// runs before it just freed.
const SETTLE: Duration = Duration::from_secs(7);

/// What `tern-bench kafka` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaBenchOptions {
    pub kafka_classpath: String,
    pub records: u64,
    pub size: usize,
    pub repetitions: usize,
    /// Parent of both brokers' data directories.
    pub dir: PathBuf,
    /// Microseconds each fsync and fdatasync of either broker waits first (0: none).
    pub flush_delay_us: u64,
}

/// The environment that loads `tern-flush-delay` into a broker, for a delay of `us` (none for
/// 0): the library built beside this `tern-bench`.
fn flush_delay_env(us: u64) -> Result<Vec<(String, String)>, BenchError> {
    if us == 0 {
        return Ok(Vec::new());
    }
    let library = crate::beside_exe("libtern_flush_delay.so")?;
    if !library.is_file() {
        return Err(BenchError::NoFlushDelayLibrary { path: library });
    }
    Ok(vec![
        ("LD_PRELOAD".to_owned(), library.display().to_string()),
        ("TERN_FLUSH_DELAY_US".to_owned(), us.to_string()),
    ])
}

/// Runs the bench.
pub fn run(options: &KafkaBenchOptions) -> Result<Report, BenchError> {
    let values = kcat::Values::write(&options.dir, options.records, options.size)?;
    let env = flush_delay_env(options.flush_delay_us)?;
    let tern = Server::tern_kafka(&options.dir, &env)?;
    let tern_addr = tern.addr.to_string();
    let kafka = broker::Kafka::start(&options.kafka_classpath, &options.dir, &env)?;
    eprintln!("kafka started at {}, tern at {tern_addr}", kafka.bootstrap);
    kafka.create_topic("bench-produce-fsync", &["flush.messages=1"])?;

    let mut report = Report::new(options);
    let rate = |elapsed| kcat::rate(options.records, elapsed);
    kcat::produce(&tern_addr, "bench-produce", &values)?;
    kcat::produce(&kafka.bootstrap, "bench-produce-fsync", &values)?;
    kcat::produce(&kafka.bootstrap, "bench-produce", &values)?;
    eprintln!("produce warm-up done");
    for run in 0..options.repetitions {
        report
            .tern_produce
            .push(rate(kcat::produce(&tern_addr, "bench-produce", &values)?));
        report.kafka_fsync_produce.push(rate(kcat::produce(
            &kafka.bootstrap,
            "bench-produce-fsync",
            &values,
        )?));
        report.kafka_produce.push(rate(kcat::produce(
            &kafka.bootstrap,
            "bench-produce",
            &values,
        )?));
        eprintln!("produce run {} of {} done", run + 1, options.repetitions);
    }

    let out = options
        .dir
        .join(format!("tern-bench-kafka-out-{}", std::process::id()));
    kcat::produce(&tern_addr, "bench-consume", &values)?;
    kcat::produce(&kafka.bootstrap, "bench-consume", &values)?;
    kcat::consume(&tern_addr, "bench-consume", options.records, &out)?;
    kcat::consume(&kafka.bootstrap, "bench-consume", options.records, &out)?;
    eprintln!("consume warm-up done");
    for run in 0..options.repetitions {
        report.tern_consume.push(rate(kcat::consume(
            &tern_addr,
            "bench-consume",
            options.records,
            &out,
        )?));
        report.kafka_consume.push(rate(kcat::consume(
            &kafka.bootstrap,
            "bench-consume",
            options.records,
            &out,
        )?));
        eprintln!("consume run {} of {} done", run + 1, options.repetitions);
    }
    drop(kafka);

    std::thread::sleep(SETTLE);
    (report.rss_idle_kib, report.anon_idle_kib) = tern.rss_and_anon_kib()?;
    let mut members = kcat::Members::join(&tern_addr, "bench", "bench-consume", GROUP_MEMBERS)?;
    let deadline = Instant::now() + GROUP_TIMEOUT;
    while members.received() < options.records {
        if !members.alive() || Instant::now() > deadline {
            return Err(BenchError::Stalled {
                topic: "bench-consume (consumer group)".to_owned(),
                expected: options.records,
                got: members.received(),
                after: GROUP_TIMEOUT,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let caught_up;
    (caught_up, report.anon_catchup_kib) = tern.rss_and_anon_kib()?;
    std::thread::sleep(SETTLE);
    let (settled, anon) = tern.rss_and_anon_kib()?;
    (report.rss_group_kib, report.anon_group_kib) = (caught_up.max(settled), anon);
    drop(members);
    Ok(report)
}
