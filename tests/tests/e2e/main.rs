//! End-to-end suites: each module drives the real `tern` binary as a user would.

mod boards;
mod clock_steps;
mod foundation;
mod full_disk;
mod kafka;
mod kafka_consumer_groups;
mod kafka_listener;
mod log;
mod log_damage;
mod log_format;
mod mqtt;
mod mqtt_abuse;
mod mqtt_abuse_limits;
mod mqtt_abuse_logins;
mod mqtt_abuse_retained;
mod mqtt_auth;
mod mqtt_consumer;
mod mqtt_delivery;
mod mqtt_durability;
mod mqtt_shared;
mod operations;
mod readings;
mod upstream;
mod upstream_faults;
mod upstream_shared;
