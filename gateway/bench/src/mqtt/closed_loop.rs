//! The closed-loop producer of `tern-bench mqtt`: one publisher with one QoS 1 publish in
//! flight, which sends the next only once the last is acknowledged (a request/response
//! application, a device resending its backlog, Kafka clients with one request in flight).
//! Run against tern on its defaults, against tern whose closed-loop producers are windowed like
//! a trickle (`[log.flush.wear] closed_loop_burst = "0s"`: how every producer was committed
//! before the writer told them apart, `gateway/log/src/pace.rs`), and against Mosquitto, in the
//! same run. Prints messages a second, PUBACK p50 and the ratio of the two tern figures.
//!
//! It must never assert a target and never touch a process it did not start.

use serde::Serialize;

use super::load::{self, Load};
use super::servers::Server;
use crate::BenchError;
use crate::stats::{median, percentile};

/// What the windowed tern adds to its config.
pub const WINDOWED: &str = "[log.flush.wear]\nclosed_loop_burst = \"0s\"\n";

/// The medians of one broker's closed-loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figures {
    pub msgs_per_sec: f64,
    pub p50_ms: f64,
}

/// The closed-loop figures of one bench.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClosedLoop {
    pub messages: usize,
    pub size: usize,
    /// tern on its defaults.
    pub tern: Figures,
    /// tern with closed-loop producers windowed like a trickle (the behaviour before).
    pub tern_windowed: Figures,
    pub mosquitto: Figures,
}

/// The load: one publisher, one publish in flight.
pub fn load(messages: usize, size: usize) -> Load {
    Load {
        publishers: 1,
        messages,
        size,
        qos1: true,
        window: 1,
    }
}

/// `repetitions` runs of `load` against each broker, interleaved.
pub async fn measure(
    [tern, windowed, mosquitto]: [&Server; 3],
    load: Load,
    repetitions: usize,
) -> Result<ClosedLoop, BenchError> {
    // (messages a second, PUBACK p50 in ms) of each run, per broker.
    let mut runs: [Vec<(f64, Option<f64>)>; 3] = Default::default();
    for rep in 0..repetitions {
        for (i, server) in [tern, windowed, mosquitto].into_iter().enumerate() {
            let measured = load::run(server.addr, load, &format!("c{i}-{rep}")).await?;
            if let Some(slot) = runs.get_mut(i) {
                let p50_ms = percentile(&measured.latencies_us, 50.0).map(|us| us / 1000.0);
                slot.push((measured.msgs_per_sec, p50_ms));
            }
        }
    }
    let [t, w, m] = runs.map(|runs| Figures {
        msgs_per_sec: median(runs.iter().map(|r| r.0)).unwrap_or(0.0),
        p50_ms: median(runs.iter().filter_map(|r| r.1)).unwrap_or(0.0),
    });
    Ok(ClosedLoop {
        messages: load.messages,
        size: load.size,
        tern: t,
        tern_windowed: w,
        mosquitto: m,
    })
}

impl std::fmt::Display for ClosedLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "closed loop (1 publisher, 1 QoS 1 publish in flight, {} x {} B):",
            self.messages, self.size
        )?;
        for (name, figures) in [
            ("tern (defaults)", self.tern),
            ("tern, windowed like a trickle", self.tern_windowed),
            ("mosquitto", self.mosquitto),
        ] {
            writeln!(
                f,
                "  {name:<32}{:>10.0} msgs/s   PUBACK p50 {:>8.3} ms",
                figures.msgs_per_sec, figures.p50_ms
            )?;
        }
        writeln!(
            f,
            "  tern defaults / windowed: {:.2}x msgs/s",
            self.tern.msgs_per_sec / self.tern_windowed.msgs_per_sec.max(f64::MIN_POSITIVE)
        )
    }
}
