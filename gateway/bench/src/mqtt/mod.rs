//! `tern bench mqtt`: a lean MQTT 3.1.1 load generator and the run that puts tern (its defaults:
//! durable QoS 1 acks at the default commit window) next to Debian's Mosquitto under the same
//! load: throughput, PUBACK latency, CPU seconds per 100,000 messages (from `/proc`), a deep run
//! with so many publishes in flight that the commit window is not the bound, and each broker's
//! memory with many idle clients. It owns the bench's options and the order of
//! measurements (`tern bench upstream` reuses its load and its tern child); the load, speaking
//! MQTT through tern-shared's packet codec, is in `load.rs`, the child brokers in `servers.rs`
//! and the figures in `report.rs`.
//!
//! It must never assert a target (it prints whether each is met) and never touch a process it did
//! not start.

mod closed_loop;
pub(crate) mod load;
mod report;
pub(crate) mod servers;
mod subscribes;

use std::net::SocketAddr;
use std::time::Duration;

pub use report::Report;

use load::Load;
use report::{BrokerFigures, Kind, Memory, Run};
use servers::Server;

use crate::BenchError;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Measure only this broker, `HOST:PORT` (no child processes, no memory figure).
    pub broker: Option<String>,
    pub publishers: usize,
    pub messages: usize,
    pub size: usize,
    /// `None` measures QoS 1 and QoS 0.
    pub qos: Option<u8>,
    /// Unacknowledged QoS 1 publishes per connection.
    pub window: usize,
    pub repetitions: usize,
    /// Idle clients connected for each broker's memory figure.
    pub idle_clients: usize,
    /// Publisher connections of the deep QoS 1 run (0: no deep run).
    pub deep_publishers: usize,
    /// Unacknowledged QoS 1 publishes per connection in the deep run.
    pub deep_window: usize,
    /// Messages of the closed-loop run (one publisher, one publish in flight; 0: none).
    pub closed_loop_messages: usize,
}

impl BenchOptions {
    /// The full bench.
    pub fn full() -> Self {
        Self {
            broker: None,
            publishers: 16,
            messages: 5_000,
            size: 64,
            qos: None,
            window: 64,
            repetitions: 3,
            idle_clients: 1_000,
            deep_publishers: 64,
            deep_window: 256,
            closed_loop_messages: 200,
        }
    }

    /// A few seconds' run that checks the bench works.
    pub fn quick() -> Self {
        Self {
            publishers: 4,
            messages: 500,
            repetitions: 1,
            idle_clients: 100,
            deep_publishers: 8,
            deep_window: 128,
            closed_loop_messages: 40,
            ..Self::full()
        }
    }

    fn validate(&self) -> Result<(), BenchError> {
        let checks = [
            (self.publishers == 0, "--publishers", "must be at least 1"),
            (self.messages == 0, "--messages", "must be at least 1"),
            (self.repetitions == 0, "--repetitions", "must be at least 1"),
            (
                !(1..=65_535).contains(&self.window),
                "--window",
                "must be between 1 and 65535",
            ),
            (
                !(1..=65_535).contains(&self.deep_window),
                "--deep-window",
                "must be between 1 and 65535",
            ),
            (
                self.size > 256 * 1024 - 64,
                "--size",
                "must fit tern's default 256KiB packet limit",
            ),
            (self.qos.is_some_and(|q| q > 1), "--qos", "must be 0 or 1"),
        ];
        match checks.iter().find(|(bad, ..)| *bad) {
            Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
            None => Ok(()),
        }
    }

    /// The loads to run, in order: QoS 1, the deep QoS 1 run, QoS 0 (as chosen).
    fn loads(&self) -> Vec<(Kind, Load)> {
        let base = Load {
            publishers: self.publishers,
            messages: self.messages,
            size: self.size,
            qos1: true,
            window: self.window,
        };
        let mut loads = Vec::new();
        if self.qos != Some(0) {
            loads.push((Kind::Qos1, base));
            if self.deep_publishers > 0 {
                let deep = Load {
                    publishers: self.deep_publishers,
                    window: self.deep_window,
                    ..base
                };
                loads.push((Kind::Deep, deep));
            }
        }
        if self.qos != Some(1) {
            loads.push((
                Kind::Qos0,
                Load {
                    qos1: false,
                    ..base
                },
            ));
        }
        loads
    }

    /// The most clients connected to a broker at once.
    fn connections(&self) -> usize {
        self.idle_clients
            .max(self.publishers)
            .max(self.deep_publishers)
    }
}

/// Runs the bench described by `options` and returns every figure.
pub fn run(options: &BenchOptions) -> Result<Report, BenchError> {
    options.validate()?;
    raise_open_files_limit(options.connections() + 256);
    let runtime = crate::runtime(None)?;
    match &options.broker {
        Some(broker) => runtime.block_on(one_broker(options, resolve(broker)?)),
        None => side_by_side(options, &runtime),
    }
}

/// The first address `HOST:PORT` resolves to.
fn resolve(broker: &str) -> Result<SocketAddr, BenchError> {
    use std::net::ToSocketAddrs;
    let unresolved = || BenchError::Resolve {
        broker: broker.to_owned(),
    };
    broker
        .to_socket_addrs()
        .map_err(|_| unresolved())?
        .next()
        .ok_or_else(unresolved)
}

/// `--broker`: the load against one running broker.
async fn one_broker(options: &BenchOptions, addr: SocketAddr) -> Result<Report, BenchError> {
    let mut figures = BrokerFigures::default();
    for rep in 0..options.repetitions {
        for (kind, load) in options.loads() {
            let measured = load::run(addr, load, &format!("b{rep}")).await?;
            figures.add(kind, Run::new(measured, None));
        }
    }
    let measured_s = Some(subscribes::persistent_subscribes(addr, "bench-subs-b").await?);
    let subscribes = subscribes::SubscribeFigures {
        subscribes: subscribes::SUBSCRIBES,
        measured_s,
        ..Default::default()
    };
    Ok(Report::single(options, addr, figures).with_subscribes(subscribes))
}

/// tern and Mosquitto as children, the same load against each, interleaved run by run.
fn side_by_side(
    options: &BenchOptions,
    runtime: &tokio::runtime::Runtime,
) -> Result<Report, BenchError> {
    let settings = servers::mqtt_overrides(options.connections());
    let tern = Server::tern(&settings)?;
    let tern_memory = runtime.block_on(idle_memory(&tern, options.idle_clients))?;
    let mosquitto = Server::mosquitto()?;
    let mosquitto_memory = runtime.block_on(idle_memory(&mosquitto, options.idle_clients))?;
    let mut tern_figures = BrokerFigures::default();
    let mut mosquitto_figures = BrokerFigures::default();
    for rep in 0..options.repetitions {
        for (kind, load) in options.loads() {
            let run = runtime.block_on(measure(&tern, load, &format!("t{rep}")))?;
            tern_figures.add(kind, run);
            let run = runtime.block_on(measure(&mosquitto, load, &format!("m{rep}")))?;
            mosquitto_figures.add(kind, run);
        }
    }
    let subscribes = subscribes::SubscribeFigures {
        subscribes: subscribes::SUBSCRIBES,
        tern_s: Some(
            runtime.block_on(subscribes::persistent_subscribes(tern.addr, "bench-subs-t"))?,
        ),
        mosquitto_s: Some(runtime.block_on(subscribes::persistent_subscribes(
            mosquitto.addr,
            "bench-subs-m",
        ))?),
        measured_s: None,
    };
    let with_peak = |server: &Server, memory: Memory| -> Result<Memory, BenchError> {
        let (_, peak_kib) = server.rss_kib()?;
        Ok(Memory { peak_kib, ..memory })
    };
    let memory = [
        with_peak(&tern, tern_memory)?,
        with_peak(&mosquitto, mosquitto_memory)?,
    ];
    let closed_loop = if options.closed_loop_messages > 0 && options.qos != Some(0) {
        let windowed = Server::tern_with(&settings, closed_loop::WINDOWED)?;
        let load = closed_loop::load(options.closed_loop_messages, options.size);
        let servers = [&tern, &windowed, &mosquitto];
        Some(runtime.block_on(closed_loop::measure(servers, load, options.repetitions))?)
    } else {
        None
    };
    let settings = settings.iter().map(|line| format!("mqtt.{line}")).collect();
    let mut report =
        Report::side_by_side(options, [tern_figures, mosquitto_figures], memory, settings)
            .with_subscribes(subscribes);
    report.closed_loop = closed_loop;
    Ok(report)
}

/// One load run against a child broker, with the CPU time the broker spent on it.
async fn measure(server: &Server, load: Load, label: &str) -> Result<Run, BenchError> {
    let before = server.cpu_seconds()?;
    let measured = load::run(server.addr, load, label).await?;
    // The last acknowledgement (or PINGRESP) was sent, so the broker's work for the run is done
    // but for closing the connections, which is counted too: wait until they are closed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cpu = server.cpu_seconds()? - before;
    let messages = (load.publishers * load.messages) as f64;
    Ok(Run::new(measured, Some(cpu / messages * 100_000.0)))
}

/// A broker's RSS before and with `count` connected idle clients.
async fn idle_memory(server: &Server, count: usize) -> Result<Memory, BenchError> {
    let (start_kib, _) = server.rss_kib()?;
    let clients = load::idle_clients(server.addr, count).await?;
    // Let every connection task settle before reading the figure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_kib, _) = server.rss_kib()?;
    drop(clients);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(Memory {
        idle_clients: count,
        start_kib,
        idle_kib,
        peak_kib: idle_kib,
    })
}

/// Raises this process's soft open-files limit towards `wanted` (children inherit it).
fn raise_open_files_limit(wanted: usize) {
    let wanted = u64::try_from(wanted).unwrap_or(u64::MAX);
    if let Err(err) = tern_core::sys::raise_fd_limit(wanted) {
        tracing::warn!("cannot raise the open-files limit to {wanted}: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_name_the_flag() {
        let options = BenchOptions {
            qos: Some(2),
            ..BenchOptions::quick()
        };
        let err = options.validate().expect_err("QoS 2 is not benchmarked");
        assert_eq!(err.to_string(), "--qos must be 0 or 1");
        let options = BenchOptions {
            window: 0,
            ..BenchOptions::full()
        };
        assert!(options.validate().is_err());
        assert!(BenchOptions::full().validate().is_ok());
    }

    #[test]
    fn every_load_runs_unless_a_qos_level_is_chosen() {
        let kinds = |options: &BenchOptions| -> Vec<Kind> {
            options.loads().iter().map(|(kind, _)| *kind).collect()
        };
        let full = BenchOptions::full();
        assert_eq!(kinds(&full), vec![Kind::Qos1, Kind::Deep, Kind::Qos0]);
        let deep = full.loads()[1].1;
        assert_eq!((deep.publishers, deep.window, deep.qos1), (64, 256, true));
        let qos0 = BenchOptions {
            qos: Some(0),
            ..BenchOptions::full()
        };
        assert_eq!(kinds(&qos0), vec![Kind::Qos0]);
        let shallow = BenchOptions {
            qos: Some(1),
            deep_publishers: 0,
            ..BenchOptions::full()
        };
        assert_eq!(kinds(&shallow), vec![Kind::Qos1]);
    }
}
