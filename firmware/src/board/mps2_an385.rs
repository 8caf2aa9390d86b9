//! ARM MPS2 board with the AN385 FPGA image (Cortex-M3), QEMU `-machine mps2-an385`. MQTT runs
//! over UART0 (CMSDK APB UART at 0x4000_4000).
//!
//! It owns the AN385's UART0 configuration. It must never touch the FPGA system registers.

use crate::uart::cmsdk::Cmsdk;

pub const NAME: &str = "mps2-an385";

/// AN385 runs the core and the APB peripherals at 25 MHz (QEMU models the same).
pub const CORE_CLOCK_HZ: u32 = 25_000_000;

pub type Uart = Cmsdk;

const UART0_BASE: usize = 0x4000_4000;

/// Configures UART0.
///
/// # Safety
/// Call once (`take_uart` guarantees it).
pub(super) unsafe fn open_uart() -> Uart {
    // SAFETY: UART0's base address; the caller guarantees a single instance.
    unsafe { Cmsdk::new(UART0_BASE, CORE_CLOCK_HZ, super::BAUD) }
}
