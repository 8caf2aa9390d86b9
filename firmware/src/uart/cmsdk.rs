//! ARM CMSDK APB UART, as on the MPS2 AN385 FPGA image (UART0 at 0x4000_4000). It has no FIFO:
//! one byte of transmit and one of receive buffer. Polled, no interrupts.
//!
//! It owns one CMSDK UART instance's registers. It must never be constructed twice for one base
//! address (the board module hands out the only instance).

use embedded_io::{ErrorType, Read, ReadReady, Write};

use super::{Reg, UartError};

const DATA: usize = 0x000;
const STATE: usize = 0x004;
const CTRL: usize = 0x008;
const BAUDDIV: usize = 0x010;

const STATE_TXFULL: u32 = 1 << 0;
const STATE_RXFULL: u32 = 1 << 1;
const STATE_RXOVERRUN: u32 = 1 << 3;
const CTRL_TX_EN: u32 = 1 << 0;
const CTRL_RX_EN: u32 = 1 << 1;

/// One CMSDK APB UART.
#[derive(Debug)]
pub struct Cmsdk {
    base: usize,
}

impl Cmsdk {
    /// Configures the UART at `base` for `baud` from a `clock_hz` APB clock and enables it.
    ///
    /// # Safety
    /// `base` must be the address of a CMSDK APB UART that nothing else uses.
    pub unsafe fn new(base: usize, clock_hz: u32, baud: u32) -> Self {
        let uart = Cmsdk { base };
        // The divider must be at least 16 or the UART ignores it.
        uart.reg(BAUDDIV).write((clock_hz / baud).max(16));
        uart.reg(CTRL).write(CTRL_TX_EN | CTRL_RX_EN);
        uart
    }

    fn reg(&self, offset: usize) -> Reg {
        Reg(self.base + offset)
    }

    fn rx_full(&self) -> bool {
        self.reg(STATE).read() & STATE_RXFULL != 0
    }
}

impl ErrorType for Cmsdk {
    type Error = UartError;
}

impl ReadReady for Cmsdk {
    fn read_ready(&mut self) -> Result<bool, UartError> {
        Ok(self.rx_full())
    }
}

impl Read for Cmsdk {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, UartError> {
        if buf.is_empty() {
            return Ok(0);
        }
        while !self.rx_full() {
            core::hint::spin_loop();
        }
        let mut n = 0;
        for slot in buf.iter_mut() {
            if !self.rx_full() {
                break;
            }
            if self.reg(STATE).read() & STATE_RXOVERRUN != 0 {
                // Write-one-to-clear, then report the loss.
                self.reg(STATE).write(STATE_RXOVERRUN);
                return Err(UartError::Overrun);
            }
            *slot = self.reg(DATA).read() as u8;
            n += 1;
        }
        Ok(n)
    }
}

impl Write for Cmsdk {
    fn write(&mut self, buf: &[u8]) -> Result<usize, UartError> {
        for &byte in buf {
            while self.reg(STATE).read() & STATE_TXFULL != 0 {
                core::hint::spin_loop();
            }
            self.reg(DATA).write(u32::from(byte));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), UartError> {
        while self.reg(STATE).read() & STATE_TXFULL != 0 {
            core::hint::spin_loop();
        }
        Ok(())
    }
}
