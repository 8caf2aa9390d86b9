//! Texas Instruments LM3S6965 evaluation board (Cortex-M3), QEMU `-machine lm3s6965evb`.
//! MQTT runs over UART0 (PL011 at 0x4000_C000, pins PA0/PA1).
//!
//! It owns the LM3S6965's clock gating and pin muxing for UART0. It must never change the system
//! clock: the core runs at its reset clock (see `CORE_CLOCK_HZ`).

use crate::uart::pl011::Pl011;

pub const NAME: &str = "lm3s6965evb";

/// Core clock after reset. QEMU derives it from the reset RCC value (200 MHz PLL / SYSDIV 16 =
/// 12.5 MHz); real silicon runs from its 12 MHz internal oscillator, close enough for timeouts
/// but not for an exact baud rate (see boards/lm3s6965evb/README.md).
pub const CORE_CLOCK_HZ: u32 = 12_500_000;

pub type Uart = Pl011;

const UART0_BASE: usize = 0x4000_c000;
const SYSCTL_RCGC1: usize = 0x400f_e104;
const SYSCTL_RCGC2: usize = 0x400f_e108;
const GPIOA_AFSEL: usize = 0x4000_4420;
const GPIOA_DEN: usize = 0x4000_451c;

fn set_bits(address: usize, bits: u32) {
    // SAFETY: the addresses above are the LM3S6965's documented, aligned MMIO registers, and
    // only `open_uart` (called once) touches them.
    unsafe {
        let reg = address as *mut u32;
        core::ptr::write_volatile(reg, core::ptr::read_volatile(reg) | bits);
    }
}

/// Clocks UART0 and GPIO port A, hands PA0/PA1 to the UART, and configures it.
///
/// # Safety
/// Call once (`take_uart` guarantees it).
pub(super) unsafe fn open_uart() -> Uart {
    set_bits(SYSCTL_RCGC1, 1 << 0);
    set_bits(SYSCTL_RCGC2, 1 << 0);
    set_bits(GPIOA_AFSEL, 0b11);
    set_bits(GPIOA_DEN, 0b11);
    // SAFETY: UART0's base address; the caller guarantees a single instance.
    unsafe { Pl011::new(UART0_BASE, CORE_CLOCK_HZ, super::BAUD) }
}
