//! Milliseconds since boot, counted by SysTick interrupts from the core clock.
//!
//! This module owns SysTick and the tick counter. It must never be started twice, and reading
//! the time must never tear (the 64-bit counter is read inside a critical section).

use core::cell::Cell;

use cortex_m::interrupt::Mutex;
use cortex_m::peripheral::SYST;
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::exception;

static MILLIS: Mutex<Cell<u64>> = Mutex::new(Cell::new(0));

/// The running millisecond clock; a zero-sized handle, cheap to copy into the MQTT client.
#[derive(Debug, Clone, Copy)]
pub struct Millis(());

impl Millis {
    /// Starts SysTick at 1 kHz from a `core_clock_hz` processor clock.
    pub fn start(mut syst: SYST, core_clock_hz: u32) -> Self {
        syst.set_clock_source(SystClkSource::Core);
        syst.set_reload(core_clock_hz / 1000 - 1);
        syst.clear_current();
        syst.enable_interrupt();
        syst.enable_counter();
        Millis(())
    }

    pub fn now_ms(self) -> u64 {
        now_ms()
    }

    /// Sleeps until at least `deadline_ms` (the core waits for the next tick in between).
    pub fn sleep_until(self, deadline_ms: u64) {
        while self.now_ms() < deadline_ms {
            cortex_m::asm::wfi();
        }
    }
}

/// Milliseconds since SysTick started (0 before); also the defmt timestamp.
pub fn now_ms() -> u64 {
    cortex_m::interrupt::free(|cs| MILLIS.borrow(cs).get())
}

impl tern_shared::mqtt::Clock for Millis {
    fn now_ms(&self) -> u64 {
        Millis::now_ms(*self)
    }
}

#[exception]
fn SysTick() {
    cortex_m::interrupt::free(|cs| {
        let millis = MILLIS.borrow(cs);
        millis.set(millis.get() + 1);
    });
}
