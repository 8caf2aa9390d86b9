//! An ESTIMATE, never a measurement, of what the counted instructions mean on two gateway CPUs:
//! messages (or records) per second per core = clock × IPC / instructions per message. The
//! clocks are the boards' (a Raspberry Pi 4's Cortex-A72 at 1.5 GHz, a Pi 3's Cortex-A53 at
//! 1.2 GHz); the instructions per cycle are assumptions, not measured on this workload: ARM
//! documents the A72 as a 3-wide out-of-order core and the A53 as a 2-wide in-order one, and a
//! broker's branchy, allocation-heavy user-space code is taken to reach a third to two fifths of
//! the A72's width (IPC 0.8–1.2) and a quarter to a third of the A53's (0.5–0.7). The count is of
//! user space only (the kernel's syscalls, TCP and fsync run on the host and are not counted),
//! so a device does fewer than the figure.
//!
//! Arithmetic only; it runs nothing.

use serde::Serialize;

/// A gateway CPU of the estimate with its assumed instructions per cycle.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Core {
    pub name: &'static str,
    pub hz: f64,
    /// Assumed IPC: low, middle, high.
    pub ipc: [f64; 3],
}

pub const CORES: [Core; 2] = [
    Core {
        name: "Cortex-A72 @ 1.5 GHz",
        hz: 1.5e9,
        ipc: [0.8, 1.0, 1.2],
    },
    Core {
        name: "Cortex-A53 @ 1.2 GHz",
        hz: 1.2e9,
        ipc: [0.5, 0.6, 0.7],
    },
];

impl Core {
    /// Per second per core at each assumed IPC, for `insns` instructions each.
    pub fn per_second(&self, insns: f64) -> [f64; 3] {
        self.ipc.map(|ipc| self.hz * ipc / insns.max(1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_is_clock_times_ipc_over_instructions() {
        let [low, mid, high] = CORES[0].per_second(7_500.0);
        assert_eq!(mid, 200_000.0);
        assert!(low < mid && mid < high);
        assert_eq!(CORES[1].per_second(6_000.0)[1], 120_000.0);
    }
}
