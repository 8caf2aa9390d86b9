//! End-to-end suites: each module drives the real `tern` binary as a user would.

mod foundation;
mod log;
mod mqtt;
mod mqtt_auth;
mod mqtt_durability;
