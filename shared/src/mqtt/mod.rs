//! MQTT 3.1.1 for constrained devices: the packet codec and a blocking client over
//! `embedded-io`.
//!
//! This module owns the device's side of MQTT only (QoS 0 and 1, one subscription, no will, no
//! credentials). It must never allocate and never depend on an operating system; the gateway's
//! server side lives in the gateway and is checked against these bytes by a host test.

pub mod client;
pub mod packet;

pub use client::{Awaiting, Client, ClientConfig, ClientError, Clock};
pub use packet::{Connect, DecodeError, EncodeError, Packet, Publish, QoS, decode};

/// Topic a device publishes its readings to.
pub fn reading_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    let mut topic = heapless::String::new();
    core::fmt::write(&mut topic, format_args!("sensors/{device_id}/reading")).ok()?;
    Some(topic)
}

/// Topic a device publishes its status (drop counter) to.
pub fn status_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    let mut topic = heapless::String::new();
    core::fmt::write(&mut topic, format_args!("sensors/{device_id}/status")).ok()?;
    Some(topic)
}

/// Topic filter a device subscribes to for commands.
pub fn command_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    let mut topic = heapless::String::new();
    core::fmt::write(&mut topic, format_args!("sensors/{device_id}/command")).ok()?;
    Some(topic)
}
