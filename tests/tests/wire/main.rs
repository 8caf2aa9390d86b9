//! Wire compatibility between the two ends that must speak the same bytes: the firmware's MQTT
//! client (`tern_shared::mqtt`) against rumqttd's v4 codec, which the gateway decodes with, and
//! the reading schema as the gateway prints it (JSON) and rejects it (unknown versions).
//!
//! The import rule that keeps rumqttd out of everything but the gateway's MQTT server and this
//! suite is checked here too.
//!
//! Nothing here is a stand-in for a running system: both codecs are the real ones, connected by
//! an in-memory byte pipe so every packet can be compared byte for byte.

mod invariants;
mod mqtt;
mod reading;
