//! ARM PrimeCell PL011 UART, as in the Stellaris LM3S6965 (UART0 at 0x4000_C000; QEMU models it
//! as "pl011_luminary"). Polled: 8N1, FIFOs on, no interrupts.
//!
//! It owns one PL011 instance's registers. It must never be constructed twice for one base
//! address (the board module hands out the only instance).

use embedded_io::{ErrorType, Read, ReadReady, Write};

use super::{Reg, UartError};

const DR: usize = 0x000;
const FR: usize = 0x018;
const IBRD: usize = 0x024;
const FBRD: usize = 0x028;
const LCRH: usize = 0x02c;
const CR: usize = 0x030;

const FR_BUSY: u32 = 1 << 3;
const FR_RXFE: u32 = 1 << 4;
const FR_TXFF: u32 = 1 << 5;
const DR_OE: u32 = 1 << 11;
const LCRH_FEN: u32 = 1 << 4;
const LCRH_WLEN_8: u32 = 0b11 << 5;
const CR_UARTEN: u32 = 1 << 0;
const CR_TXE: u32 = 1 << 8;
const CR_RXE: u32 = 1 << 9;

/// One PL011 UART.
#[derive(Debug)]
pub struct Pl011 {
    base: usize,
}

impl Pl011 {
    /// Configures the UART at `base` for `baud` from a `clock_hz` UART clock and enables it.
    ///
    /// # Safety
    /// `base` must be the address of a PL011 that nothing else uses.
    pub unsafe fn new(base: usize, clock_hz: u32, baud: u32) -> Self {
        let uart = Pl011 { base };
        uart.reg(CR).write(0);
        // Divisor = clock / (16 * baud) as 16.6 fixed point, rounded.
        let divisor_x64 = (clock_hz * 4 + baud / 2) / baud;
        uart.reg(IBRD).write(divisor_x64 >> 6);
        uart.reg(FBRD).write(divisor_x64 & 0x3f);
        uart.reg(LCRH).write(LCRH_WLEN_8 | LCRH_FEN);
        uart.reg(CR).write(CR_UARTEN | CR_TXE | CR_RXE);
        uart
    }

    fn reg(&self, offset: usize) -> Reg {
        Reg(self.base + offset)
    }

    fn rx_empty(&self) -> bool {
        self.reg(FR).read() & FR_RXFE != 0
    }
}

impl ErrorType for Pl011 {
    type Error = UartError;
}

impl ReadReady for Pl011 {
    fn read_ready(&mut self) -> Result<bool, UartError> {
        Ok(!self.rx_empty())
    }
}

impl Read for Pl011 {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, UartError> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.rx_empty() {
            core::hint::spin_loop();
        }
        let mut n = 0;
        for slot in buf.iter_mut() {
            if self.rx_empty() {
                break;
            }
            let word = self.reg(DR).read();
            if word & DR_OE != 0 {
                return Err(UartError::Overrun);
            }
            *slot = word as u8;
            n += 1;
        }
        Ok(n)
    }
}

impl Write for Pl011 {
    fn write(&mut self, buf: &[u8]) -> Result<usize, UartError> {
        for &byte in buf {
            while self.reg(FR).read() & FR_TXFF != 0 {
                core::hint::spin_loop();
            }
            self.reg(DR).write(u32::from(byte));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), UartError> {
        while self.reg(FR).read() & FR_BUSY != 0 {
            core::hint::spin_loop();
        }
        Ok(())
    }
}
