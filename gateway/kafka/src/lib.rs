//! The Kafka-protocol listener: Kafka clients (the Java clients, librdkafka and kcat,
//! kafka-python) produce to and consume from the log, so a local application reads the same
//! records MQTT devices publish, by offset and by time. The only gateway crate besides
//! tern-upstream that imports `kafka-protocol`, and it uses it for the whole codec. It reaches
//! storage only through `tern_log::LogPort`, so its unit tests run on `tern_log::MemoryLog`.
//!
//! Layers: `frame` (Kafka's size-prefixed frames; public, the bench's proxy reads them too),
//! `header` (request header), `sasl` (one connection's authentication), `api/` (one module per API, dispatch by key, ACL checks), `connection` (one client, answers in order), `listener` (accept loop).

mod api;
mod config;
mod configs;
mod connection;
mod error;
pub mod frame;
mod group;
mod header;
mod listener;
mod producers;
mod records;
mod sasl;
mod topics;

pub use config::{Authentication, KafkaListenerConfig, KafkaTlsConfig};
pub use error::KafkaError;
pub use listener::KafkaListener;
pub use sasl::Mechanism;
