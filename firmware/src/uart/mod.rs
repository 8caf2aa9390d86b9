//! UART drivers: polled, blocking byte streams implementing `embedded_io::{Read, Write,
//! ReadReady}`, so the MQTT client runs over a serial line (under QEMU, a TCP socket).
//!
//! This module owns register access to the UART blocks only. It must never enable interrupts or
//! DMA, and never drop a received byte silently: an overrun is reported as [`UartError`].

#[cfg(feature = "mps2-an385")]
pub mod cmsdk;
#[cfg(feature = "lm3s6965evb")]
pub mod pl011;

/// What can go wrong on the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum UartError {
    /// A byte arrived while the receive buffer was full; at least one byte was lost.
    Overrun,
}

impl embedded_io::Error for UartError {
    fn kind(&self) -> embedded_io::ErrorKind {
        embedded_io::ErrorKind::Other
    }
}

/// A memory-mapped 32-bit register at `base + offset`.
#[derive(Debug, Clone, Copy)]
struct Reg(usize);

impl Reg {
    fn read(self) -> u32 {
        // SAFETY: `Reg`s are only built by the drivers from their board's documented UART base
        // and register offsets; the address is a valid, aligned MMIO register.
        unsafe { core::ptr::read_volatile(self.0 as *const u32) }
    }

    fn write(self, value: u32) {
        // SAFETY: as in `read`.
        unsafe { core::ptr::write_volatile(self.0 as *mut u32, value) }
    }
}
