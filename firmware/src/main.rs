//! tern sensor firmware: a `no_std`, `no_main` Cortex-M3 program that samples a simulated sensor
//! and publishes its readings over MQTT on a UART, for the LM3S6965 and MPS2-AN385 boards.
//!
//! `main` only wires the board, clock, logger and node together; it must never hold behaviour
//! of its own (that is `node.rs`).
#![no_std]
#![no_main]

#[macro_use]
mod fmt;

mod board;
mod clock;
mod node;
mod stack;
mod uart;

#[cfg(all(feature = "semihosting", feature = "rtt"))]
compile_error!("choose one defmt transport: semihosting or rtt");

#[cfg(feature = "rtt")]
use defmt_rtt as _;
#[cfg(feature = "semihosting")]
use defmt_semihosting as _;

mod config {
    include!(concat!(env!("OUT_DIR"), "/config.rs"));
}

#[cfg(feature = "defmt")]
defmt::timestamp!("{=u64:ms}", clock::now_ms());

#[cortex_m_rt::entry]
fn main() -> ! {
    let Some(core) = cortex_m::Peripherals::take() else {
        finish(Exit::Failure)
    };
    let clock = clock::Millis::start(core.SYST, board::CORE_CLOCK_HZ);
    info!(
        "tern firmware {=str} on {=str}: device {=u32}, period {=u32} ms, {=str}",
        env!("CARGO_PKG_VERSION"),
        board::NAME,
        config::DEVICE_ID,
        config::PERIOD_MS,
        if config::PASSWORD.is_some() {
            "logs in as its device id"
        } else {
            "anonymous"
        }
    );
    let (Some(uart), Some(identity)) = (
        board::take_uart(),
        node::Identity::new(config::DEVICE_ID, config::PASSWORD),
    ) else {
        error!("cannot set up the UART");
        finish(Exit::Failure)
    };
    let mut node = node::Node::new(uart, clock, &identity, config::DEVICE_ID, config::PERIOD_MS);
    let stop = node.run();
    info!(
        "stack high-water mark {=u32} bytes",
        stack::high_water_bytes()
    );
    match stop {
        node::Stop::Halted => finish(Exit::Success),
        node::Stop::TopicTooLong => {
            error!("topic does not fit its buffer");
            finish(Exit::Failure)
        }
    }
}

/// How the run ended.
#[derive(Debug, Clone, Copy)]
enum Exit {
    Success,
    Failure,
}

/// Ends the program: under QEMU (semihosting) QEMU exits with the matching status; on hardware
/// the core sleeps forever.
fn finish(exit: Exit) -> ! {
    #[cfg(feature = "semihosting")]
    cortex_m_semihosting::debug::exit(match exit {
        Exit::Success => cortex_m_semihosting::debug::EXIT_SUCCESS,
        Exit::Failure => cortex_m_semihosting::debug::EXIT_FAILURE,
    });
    #[cfg(not(feature = "semihosting"))]
    let _ = exit;
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(at) => error!("panic at {=str}:{=u32}", at.file(), at.line()),
        None => error!("panic"),
    }
    finish(Exit::Failure)
}
