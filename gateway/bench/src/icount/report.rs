//! The figures of `tern-bench icount` and their table: the plugin's self-test per architecture,
//! then per architecture and broker the two runs' counts and the instructions per message, with
//! tern's count as a multiple of Mosquitto's. Rendering only.

use std::fmt;

use serde::Serialize;

use super::symbols::Share;
use super::{Arch, IcountOptions, SelfTest, expected_loop_insns};

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
        }
    }

    /// tern's instructions per message over Mosquitto's on `arch`, when both ran.
    pub fn ratio(&self, arch: Arch) -> Option<f64> {
        let of = |broker: &str| {
            self.brokers
                .iter()
                .find(|count| count.arch == arch && count.broker == broker)
                .map(|count| count.insns_per_message)
        };
        Some(of("tern")? / of("mosquitto")?)
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
        for arch in Arch::ALL {
            if let Some(ratio) = self.ratio(arch) {
                writeln!(f, "  {}: tern / mosquitto = {ratio:.2}x", arch.name())?;
            }
        }
        for count in self.brokers.iter().filter(|c| !c.functions.is_empty()) {
            write_functions(f, count)?;
        }
        Ok(())
    }
}

/// The top functions of one broker's instructions per message, with their share of it.
fn write_functions(f: &mut fmt::Formatter<'_>, count: &BrokerCount) -> fmt::Result {
    writeln!(
        f,
        "top functions by instructions per message, {} {} ((count(2N) - count(N)) / N each):",
        count.arch.name(),
        count.broker
    )?;
    writeln!(f, "  {:>9} {:>6}  function (file)", "insns/msg", "share")?;
    for share in &count.functions {
        writeln!(
            f,
            "  {:>9.1} {:>5.1}%  {} ({})",
            share.insns_per_message,
            100.0 * share.insns_per_message / count.insns_per_message.max(1.0),
            share.function,
            share.file
        )?;
    }
    let listed: f64 = count.functions.iter().map(|s| s.insns_per_message).sum();
    writeln!(
        f,
        "  {:>9.1} {:>5.1}%  (every other function)",
        count.insns_per_message - listed,
        100.0 * (count.insns_per_message - listed) / count.insns_per_message.max(1.0)
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
        };
        assert_eq!(report.ratio(Arch::Aarch64), Some(0.5));
        assert_eq!(report.ratio(Arch::Armv7), None);
        report.brokers.pop();
        assert_eq!(report.ratio(Arch::Aarch64), None);
        assert!(report.to_string().contains("insns/msg"));
    }
}
