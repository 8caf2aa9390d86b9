//! tern sensor firmware (placeholder crate until the firmware issue fills it): a `no_std`,
//! `no_main` Cortex-M program.
#![no_std]
#![no_main]

use core::panic::PanicInfo;

/// The reset entry point; loops forever.
#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    loop {
        core::hint::spin_loop();
    }
}

#[panic_handler]
fn panic(_info: &PanicInfo) -> ! {
    loop {
        core::hint::spin_loop();
    }
}
