//! Wire types shared by the gateway and the sensor firmware: the sensor [`Reading`] schema, the
//! commands a node acts on (`command`) and a small MQTT 3.1.1 client for constrained devices.
//!
//! This crate is `no_std` and allocation-free unless its `std` feature is on, so the firmware uses
//! exactly the definitions the gateway decodes with. It must never depend on anything that needs
//! an operating system or an allocator.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod command;
pub mod device;
pub mod mqtt;
pub mod reading;

pub use reading::{
    DecodeError, EncodeError, READING_MAX_ENCODED_LEN, READING_VERSION, Reading, SensorValues,
};

/// Version of the shared wire types; bumped whenever an encoding changes.
pub const WIRE_VERSION: u8 = 1;
