//! Wire types shared by the gateway and the sensor firmware.
//!
//! This crate is `no_std` and allocation-free unless its `std` feature is on, so the firmware can
//! use exactly the same definitions the gateway decodes with. It must never depend on anything
//! that needs an operating system.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

/// Version of the shared wire types; bumped whenever an encoding changes.
pub const WIRE_VERSION: u8 = 1;
