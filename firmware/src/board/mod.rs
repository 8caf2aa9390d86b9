//! The board the firmware is built for, chosen by exactly one cargo feature: its name, core
//! clock and UART. Memory layout lives in `boards/<board>/memory.x` (picked by `build.rs`).
//!
//! This module owns the mapping from board to peripherals. It must never hand out a second
//! handle to the same UART.

#[cfg(all(feature = "lm3s6965evb", feature = "mps2-an385"))]
compile_error!("enable exactly one board feature: lm3s6965evb or mps2-an385");

#[cfg(feature = "lm3s6965evb")]
mod lm3s6965evb;
#[cfg(feature = "lm3s6965evb")]
pub use lm3s6965evb::*;

#[cfg(feature = "mps2-an385")]
mod mps2_an385;
#[cfg(feature = "mps2-an385")]
pub use mps2_an385::*;

use core::sync::atomic::{AtomicBool, Ordering};

/// Baud rate of the MQTT serial line (ignored by QEMU, which passes bytes as fast as they come).
pub const BAUD: u32 = 115_200;

static UART_TAKEN: AtomicBool = AtomicBool::new(false);

/// The board's MQTT UART, configured; `None` if it was already taken.
pub fn take_uart() -> Option<Uart> {
    if UART_TAKEN.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: the flag above makes this the only handle to the board's UART.
    Some(unsafe { open_uart() })
}
