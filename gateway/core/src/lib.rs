//! What every crate of the gateway shares and nothing else: human units for configuration
//! (`ByteSize`, `HumanDuration`), the one configuration error a layer's validation returns
//! ([`InvalidConfig`]), the shutdown signal, the metrics trait of the admin endpoint, the
//! stderr diagnostics, the wall clock in ms (`time`), the few OS calls outside `std` (`sys`: `statvfs`, the open-files limit),
//! and the file system (`fs`: the [`fs::Fs`] trait, the real one, the power-cut simulator, the
//! atomic small-file write), the one door to files of the log, the upstream producer state and
//! the password file.
//!
//! It speaks no protocol (a protocol's framing is its listener's crate's; `scripts/layout.sh`
//! checks), never depends on another tern crate, and never does I/O beyond
//! reading `/proc/self` for process metrics, the calls of `sys` and what its callers ask of `fs`.

mod config;
pub mod fs;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod sys;
pub mod time;
mod units;

pub use config::{InvalidConfig, invalid};
pub use units::{ByteSize, HumanDuration};
