//! An `LD_PRELOAD` library for `tern-bench kafka --flush-delay-us N`: every `fsync` and
//! `fdatasync` of the process it is loaded into first sleeps `TERN_FLUSH_DELAY_US`
//! microseconds, then makes the real call. On the development machine's virtual disk a flush
//! costs Kafka little; a Pi's SD card or eMMC takes milliseconds to flush its cache. Loaded into
//! both brokers the same way (tern's `fdatasync` through glibc, the JVM's `FileChannel.force`
//! through its libnio), it gives both that device's flush latency. Never part of `tern`.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;
use std::time::Duration;

type SyncFn = unsafe extern "C" fn(c_int) -> c_int;

static FSYNC: OnceLock<Option<SyncFn>> = OnceLock::new();
static FDATASYNC: OnceLock<Option<SyncFn>> = OnceLock::new();
static DELAY: OnceLock<Option<Duration>> = OnceLock::new();

/// `fsync(2)`, after the delay.
#[unsafe(no_mangle)]
pub extern "C" fn fsync(fd: c_int) -> c_int {
    delayed(&FSYNC, c"fsync", fd)
}

/// `fdatasync(2)`, after the delay.
#[unsafe(no_mangle)]
pub extern "C" fn fdatasync(fd: c_int) -> c_int {
    delayed(&FDATASYNC, c"fdatasync", fd)
}

fn delayed(real: &OnceLock<Option<SyncFn>>, name: &CStr, fd: c_int) -> c_int {
    if let Some(delay) = *DELAY.get_or_init(delay) {
        std::thread::sleep(delay);
    }
    match *real.get_or_init(|| next(name)) {
        // SAFETY: the symbol is the C library's own fsync or fdatasync, of this signature.
        Some(call) => unsafe { call(fd) },
        None => {
            // SAFETY: errno is this thread's own.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// `TERN_FLUSH_DELAY_US`, if set to a positive number.
fn delay() -> Option<Duration> {
    let us: u64 = std::env::var("TERN_FLUSH_DELAY_US").ok()?.parse().ok()?;
    (us > 0).then(|| Duration::from_micros(us))
}

/// The next definition of `name` after this library's (the C library's).
fn next(name: &CStr) -> Option<SyncFn> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only looks the symbol up.
    let symbol: *mut c_void = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if symbol.is_null() {
        return None;
    }
    // SAFETY: fsync and fdatasync both have the C signature `int (int)`.
    Some(unsafe { std::mem::transmute::<*mut c_void, SyncFn>(symbol) })
}
