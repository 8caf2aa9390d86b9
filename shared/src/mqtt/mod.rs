//! MQTT 3.1.1 for constrained devices: the packet codec and a blocking client over
//! `embedded-io`.
//!
//! This module owns the device's side of MQTT only (QoS 0 and 1, one subscription, no will, an optional
//! username and password). It must never allocate and never depend on an operating system; the gateway's
//! server side lives in the gateway and is checked against these bytes by a host test.

pub mod client;
pub mod packet;

pub use client::{Awaiting, Client, ClientConfig, ClientError, Clock};
pub use packet::{
    Connect, Credentials, DecodeError, EncodeError, Frame, Packet, Publish, QoS, decode, frame,
};

/// Topic a device publishes its readings to.
pub fn reading_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    device_topic(device_id, "reading")
}

/// Topic filter a device subscribes to for commands.
pub fn command_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    device_topic(device_id, "command")
}

/// Topic a device publishes its replies to commands to.
pub fn reply_topic<const N: usize>(device_id: u32) -> Option<heapless::String<N>> {
    device_topic(device_id, "reply")
}

/// `sensors/{device_id}/{leaf}`, if it fits `N` bytes.
fn device_topic<const N: usize>(device_id: u32, leaf: &str) -> Option<heapless::String<N>> {
    let mut topic = heapless::String::new();
    core::fmt::write(&mut topic, format_args!("sensors/{device_id}/{leaf}")).ok()?;
    Some(topic)
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_topics_name_the_device() {
        assert_eq!(
            super::reading_topic::<32>(7).as_deref(),
            Some("sensors/7/reading")
        );
        assert_eq!(
            super::command_topic::<32>(4_294_967_295).as_deref(),
            Some("sensors/4294967295/command")
        );
        assert_eq!(
            super::reply_topic::<32>(12).as_deref(),
            Some("sensors/12/reply")
        );
        assert_eq!(super::reading_topic::<8>(7), None);
    }
}
