//! What every crate of the gateway shares and nothing else: human units for configuration
//! (`ByteSize`, `HumanDuration`), the one configuration error a layer's validation returns
//! ([`InvalidConfig`]), the shutdown signal, the metrics trait of the admin endpoint, the
//! stderr diagnostics, Kafka's size-prefixed framing (`frame`, on a stream the caller owns),
//! which the Kafka listener and the upstream group client both speak, and the few OS calls
//! outside `std` (`sys`: `statvfs`, the open-files limit).
//!
//! It must never depend on another tern crate, and never do I/O beyond reading `/proc/self` for
//! process metrics and the calls of `sys`.

mod config;
pub mod frame;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod sys;
mod units;

pub use config::{InvalidConfig, invalid};
pub use units::{ByteSize, HumanDuration};
