//! Wire compatibility between the two ends that must speak the same bytes: the firmware's MQTT
//! client (`tern_shared::mqtt`) against rumqttd's v4 codec, which the gateway decodes with, and
//! the reading schema as the gateway prints it (JSON) and rejects it (unknown versions).
//!
//! Nothing here is a stand-in for a running system: both codecs are the real ones, connected by
//! an in-memory byte pipe so every packet can be compared byte for byte.

mod mqtt;
mod reading;
