//! The C heap after a burst. glibc's malloc keeps what a burst freed: its mmap threshold rises
//! to the largest block ever freed (so later 1 MiB request and fetch buffers come from the heap
//! and stay there), and each worker thread's arena keeps its free pages unless the topmost
//! chunk is freed. After a Kafka producer wrote 3 million records, an idle tern held 51 to
//! 60 MiB of anonymous memory; with the threshold fixed and the heap trimmed every few seconds,
//! 1.8 MiB (docs/operations.md, "Memory"). Other C libraries: nothing to do, both are no-ops.

use std::time::Duration;

/// Blocks this large or larger are mapped on their own and unmapped when freed. Above the 1 MiB
/// buffers of Kafka requests and fetches, which the heap reuses (at 128 KiB each one was a
/// fresh mapping, faulted in page by page: produce ran at 0.7x); the trim returns them when
/// idle.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 4 * 1024 * 1024;

/// How often free heap pages go back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Fixes glibc's mmap threshold (setting it turns off the dynamic raise). Call before any
/// thread is started.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a malloc parameter; it runs before any other thread exists.
        if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } != 1 {
            tracing::warn!("cannot fix the malloc mmap threshold");
        }
    }
}

/// Gives free heap pages back to the system every [`TRIM_EVERY`], for ever (the runtime's end
/// drops it). A trim takes each arena's lock briefly; pages a burst needs again fault back in.
pub async fn trim_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        trim();
    }
}

fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim has no preconditions; it is thread-safe (it takes the arena
        // locks itself).
        unsafe { libc::malloc_trim(0) };
    }
}
