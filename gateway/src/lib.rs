//! tern's gateway: an edge message broker that keeps every MQTT message in a segmented log and
//! forwards it upstream. The binary in `main.rs` is a thin shell around these modules; the module
//! map is in `docs/ARCHITECTURE.md`.

pub mod admin;
pub mod app;
pub mod bench;
pub mod cli;
pub mod config;
pub mod datadir;
pub mod log;
pub mod logging;
pub mod metrics;
pub mod mqtt;
pub mod shutdown;
pub mod upstream;
