//! The MQTT 3.1.1/5.0 server: accepts device connections, turns publishes into log records
//! (acknowledged only once durable) and serves subscriptions from the log. The only module that
//! imports `rumqttd`, and only for its packet codecs (in `codec.rs`).

pub mod codec;
