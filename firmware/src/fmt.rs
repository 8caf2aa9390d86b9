//! Logging shim: `info!`, `warn!`, `error!` and `debug!` go to defmt when a defmt transport is
//! enabled (semihosting under QEMU, RTT on hardware) and to nowhere otherwise, so no other module
//! needs a `cfg` for logging. It must never format anything on the device: defmt sends only
//! indices and raw arguments, the host formats.
#![allow(unused_macros)]
// Included with `#[macro_use]` first in main.rs, so the macros are in scope everywhere after.

#[cfg(feature = "defmt")]
macro_rules! info { ($($t:tt)*) => { ::defmt::info!($($t)*) }; }
#[cfg(feature = "defmt")]
macro_rules! warn { ($($t:tt)*) => { ::defmt::warn!($($t)*) }; }
#[cfg(feature = "defmt")]
macro_rules! error { ($($t:tt)*) => { ::defmt::error!($($t)*) }; }
#[cfg(feature = "defmt")]
macro_rules! debug { ($($t:tt)*) => { ::defmt::debug!($($t)*) }; }

#[cfg(not(feature = "defmt"))]
macro_rules! info { ($fmt:literal $(, $x:expr)* $(,)?) => { { $( let _ = &$x; )* } }; }
#[cfg(not(feature = "defmt"))]
macro_rules! warn { ($fmt:literal $(, $x:expr)* $(,)?) => { { $( let _ = &$x; )* } }; }
#[cfg(not(feature = "defmt"))]
macro_rules! error { ($fmt:literal $(, $x:expr)* $(,)?) => { { $( let _ = &$x; )* } }; }
#[cfg(not(feature = "defmt"))]
macro_rules! debug { ($fmt:literal $(, $x:expr)* $(,)?) => { { $( let _ = &$x; )* } }; }
