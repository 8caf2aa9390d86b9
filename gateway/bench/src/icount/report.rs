//! The figures of `tern-bench icount` and their table: the plugin's self-test per architecture,
//! then per architecture and broker the two runs' counts and the instructions per message, with
//! tern's count as a multiple of Mosquitto's. Rendering only.

use std::fmt;

use serde::Serialize;

use super::estimate;
use super::symbols::Share;
use super::{Arch, IcountOptions, MemoryFigure, RecordCount, SelfTest, expected_loop_insns};

/// The brokers tern is compared with, in the table's order.
const PEERS: [&str; 2] = ["mosquitto", "nats"];

/// One broker's instruction counts on one architecture.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BrokerCount {
    pub arch: Arch,
    pub broker: &'static str,
    /// Messages of the short run (the long run sent twice as many).
    pub messages: u64,
    pub short_insns: u64,
    pub long_insns: u64,
    pub insns_per_message: f64,
    /// Instructions per message of every pair of runs (`--runs`), in run order; the counts
    /// above are the median pair's.
    pub runs: Vec<f64>,
    /// The functions doing most of that work, most first (`--symbols N`; else empty).
    pub functions: Vec<Share>,
}

impl BrokerCount {
    pub fn new(arch: Arch, broker: &'static str, messages: u64, short: u64, long: u64) -> Self {
        Self {
            arch,
            broker,
            messages,
            short_insns: short,
            long_insns: long,
            insns_per_message: (long as f64 - short as f64) / messages.max(1) as f64,
            runs: Vec::new(),
            functions: Vec::new(),
        }
    }
}

/// Everything `tern-bench icount` measured, with the command line that ran it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub command: String,
    pub publishers: usize,
    pub size: usize,
    pub window: usize,
    pub self_tests: Vec<SelfTest>,
    pub brokers: Vec<BrokerCount>,
    /// tern's instructions per Kafka-consumed and per upstream-forwarded record.
    pub records: Vec<RecordCount>,
    /// Compression of the forward runs.
    pub forward_codec: &'static str,
    /// Each broker's memory with the idle clients.
    pub memory: Vec<MemoryFigure>,
}

impl Report {
    pub fn new(options: &IcountOptions) -> Self {
        Self {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            publishers: options.publishers,
            size: options.size,
            window: options.window,
            self_tests: Vec::new(),
            brokers: Vec::new(),
            records: Vec::new(),
            memory: Vec::new(),
            forward_codec: crate::upstream::codec_name(options.forward_codec),
        }
    }

    /// tern's instructions per message over `peer`'s on `arch`, when both ran.
    pub fn ratio(&self, arch: Arch, peer: &str) -> Option<f64> {
        let of = |broker: &str| {
            self.brokers
                .iter()
                .find(|count| count.arch == arch && count.broker == broker)
                .map(|count| count.insns_per_message)
        };
        Some(of("tern")? / of(peer)?)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.command)?;
        writeln!(
            f,
            "plugin self-test (known loop, N and 2N passes of 3 instructions):"
        )?;
        for test in &self.self_tests {
            let verdict = if test.exact() { "exact" } else { "NOT exact" };
            writeln!(
                f,
                "  {:<8} N={:<9} counted {} and {}, expected {} and {}: {verdict}",
                test.arch.name(),
                test.passes,
                test.short,
                test.long,
                expected_loop_insns(test.passes),
                expected_loop_insns(2 * test.passes),
            )?;
        }
        self.write_messages(f)?;
        write_records(f, &self.records, self.forward_codec)?;
        write_memory(f, &self.memory)?;
        self.write_estimate(f)?;
        for count in self.brokers.iter().filter(|c| !c.functions.is_empty()) {
            let what = format!("{} {}", count.arch.name(), count.broker);
            write_functions(f, &what, &count.functions, count.insns_per_message)?;
        }
        for count in self.records.iter().filter(|c| !c.functions.is_empty()) {
            let what = format!(
                "{} tern {} (per record)",
                count.arch.name(),
                count.path.name()
            );
            let total =
                (count.long_insns as f64 - count.short_insns as f64) / count.records.max(1) as f64;
            write_functions(f, &what, &count.functions, total)?;
        }
        Ok(())
    }
}

impl Report {
    /// The per-message table and tern's ratios to the peers.
    fn write_messages(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.brokers.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "guest instructions per durable QoS 1 message ({} publishers, {} B payload, window {}; \
             (count(2N) - count(N)) / N):",
            self.publishers, self.size, self.window
        )?;
        writeln!(
            f,
            "  {:<8} {:<10} {:>8} {:>15} {:>15} {:>12}",
            "arch", "broker", "N", "count(N)", "count(2N)", "insns/msg"
        )?;
        for count in &self.brokers {
            writeln!(
                f,
                "  {:<8} {:<10} {:>8} {:>15} {:>15} {:>12.0}",
                count.arch.name(),
                count.broker,
                count.messages,
                count.short_insns,
                count.long_insns,
                count.insns_per_message
            )?;
        }
        for count in self.brokers.iter().filter(|c| c.runs.len() > 1) {
            let runs: Vec<String> = count.runs.iter().map(|r| format!("{r:.0}")).collect();
            writeln!(
                f,
                "  {:<8} {:<10} insns/msg of each of {} runs: {} (the row above: the median)",
                count.arch.name(),
                count.broker,
                count.runs.len(),
                runs.join(" ")
            )?;
        }
        for arch in Arch::ALL {
            for peer in PEERS {
                if let Some(ratio) = self.ratio(arch, peer) {
                    writeln!(f, "  {}: tern / {peer} = {ratio:.2}x", arch.name())?;
                }
            }
        }
        Ok(())
    }

    /// Every counted figure with what it counts: (arch, what, instructions each).
    fn counted(&self) -> Vec<(Arch, String, f64)> {
        let messages = self.brokers.iter().map(|c| {
            let what = format!("{} QoS 1 msg", c.broker);
            (c.arch, what, c.insns_per_message)
        });
        let records = self.records.iter().map(|c| {
            let what = format!("tern {} rec", c.path.name());
            (c.arch, what, c.insns_per_record)
        });
        messages.chain(records).collect()
    }

    /// The labelled estimate of what the counts mean on the gateways' CPUs.
    fn write_estimate(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counted = self.counted();
        if counted.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "ESTIMATE, NOT A MEASUREMENT: per second per core = clock x IPC / instructions each; \
             IPC assumed, not measured (Cortex-A72 0.8/1.0/1.2, Cortex-A53 0.5/0.6/0.7); user \
             space only (the kernel's work is not counted, so a device does fewer):"
        )?;
        writeln!(
            f,
            "  {:<21} {:<8} {:<30} {:>9} {:>9} {:>9} {:>9}",
            "core", "arch", "what", "insns", "low", "mid", "high"
        )?;
        for core in estimate::CORES {
            for (arch, what, insns) in &counted {
                let [low, mid, high] = core.per_second(*insns);
                writeln!(
                    f,
                    "  {:<21} {:<8} {:<30} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
                    core.name,
                    arch.name(),
                    what,
                    insns,
                    low,
                    mid,
                    high
                )?;
            }
        }
        Ok(())
    }
}

/// tern's instructions per record of each Kafka path.
fn write_records(f: &mut fmt::Formatter<'_>, records: &[RecordCount], codec: &str) -> fmt::Result {
    let Some(first) = records.first() else {
        return Ok(());
    };
    writeln!(
        f,
        "guest instructions per record, tern (backlog of R and 2R records, one partition, \
         R = {}; consume: kcat -C from the Kafka listener; forward: mirror mode, {codec}; \
         base = start and stop alone on the same backlog; \
         ((count(2R) - base(2R)) - (count(R) - base(R))) / R):",
        first.records
    )?;
    writeln!(
        f,
        "  {:<8} {:<17} {:>13} {:>13} {:>13} {:>13} {:>10}",
        "arch", "path", "base(R)", "base(2R)", "count(R)", "count(2R)", "insns/rec"
    )?;
    for count in records {
        writeln!(
            f,
            "  {:<8} {:<17} {:>13} {:>13} {:>13} {:>13} {:>10.0}",
            count.arch.name(),
            count.path.name(),
            count.base_short,
            count.base_long,
            count.short_insns,
            count.long_insns,
            count.insns_per_record
        )?;
    }
    Ok(())
}

/// Each broker's memory with the idle clients, and tern's over each peer's.
fn write_memory(f: &mut fmt::Formatter<'_>, figures: &[MemoryFigure]) -> fmt::Result {
    let Some(first) = figures.first() else {
        return Ok(());
    };
    writeln!(
        f,
        "guest memory with {} idle MQTT clients, KiB (rss: pages inside QEMU's reserved guest \
         range, settled after 2 s, peak of samples every 100 ms; vm: the guest's address space \
         as QEMU's -d page log lists it, an upper bound by up to 24 MiB; qemu hwm: the whole \
         emulator process, QEMU included):",
        first.clients
    )?;
    writeln!(
        f,
        "  {:<8} {:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "arch", "broker", "start", "rss", "peak rss", "vm", "peak vm", "qemu hwm"
    )?;
    for m in figures {
        writeln!(
            f,
            "  {:<8} {:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            m.arch.name(),
            m.broker,
            m.start_rss_kib,
            m.rss_kib,
            m.peak_rss_kib,
            m.space_kib,
            m.peak_space_kib,
            m.qemu_hwm_kib
        )?;
    }
    for arch in Arch::ALL {
        let of = |broker: &str| {
            figures
                .iter()
                .find(|m| m.arch == arch && m.broker == broker)
                .map(|m| m.peak_rss_kib as f64)
        };
        for peer in PEERS {
            if let (Some(tern), Some(other)) = (of("tern"), of(peer)) {
                let ratio = tern / other.max(1.0);
                writeln!(f, "  {}: peak rss tern / {peer} = {ratio:.2}x", arch.name())?;
            }
        }
    }
    Ok(())
}

/// The top functions of `what`'s instructions per message (or record) out of `total`, with
/// their share of it.
fn write_functions(
    f: &mut fmt::Formatter<'_>,
    what: &str,
    functions: &[Share],
    total: f64,
) -> fmt::Result {
    writeln!(
        f,
        "top functions by instructions per message, {what} ((count(2N) - count(N)) / N each):"
    )?;
    writeln!(f, "  {:>9} {:>6}  function (file)", "insns/msg", "share")?;
    for share in functions {
        writeln!(
            f,
            "  {:>9.1} {:>5.1}%  {} ({})",
            share.insns_per_message,
            100.0 * share.insns_per_message / total.max(1.0),
            share.function,
            share.file
        )?;
    }
    let listed: f64 = functions.iter().map(|s| s.insns_per_message).sum();
    writeln!(
        f,
        "  {:>9.1} {:>5.1}%  (every other function)",
        total - listed,
        100.0 * (total - listed) / total.max(1.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_message_is_the_difference_over_n_and_the_ratio_pairs_one_arch() {
        let tern = BrokerCount::new(Arch::Aarch64, "tern", 100, 1_000_000, 1_500_000);
        assert_eq!(tern.insns_per_message, 5_000.0);
        let mosquitto = BrokerCount::new(Arch::Aarch64, "mosquitto", 100, 900_000, 1_900_000);
        let mut report = Report {
            command: "tern-bench icount".into(),
            publishers: 1,
            size: 64,
            window: 16,
            self_tests: Vec::new(),
            brokers: vec![tern, mosquitto],
            records: Vec::new(),
            memory: Vec::new(),
            forward_codec: "lz4",
        };
        assert_eq!(report.ratio(Arch::Aarch64, "mosquitto"), Some(0.5));
        assert_eq!(report.ratio(Arch::Aarch64, "nats"), None);
        assert_eq!(report.ratio(Arch::Armv7, "mosquitto"), None);
        report.brokers.pop();
        assert_eq!(report.ratio(Arch::Aarch64, "mosquitto"), None);
        assert!(report.to_string().contains("insns/msg"));
    }
}
