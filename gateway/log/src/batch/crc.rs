//! CRC32C of a batch's bytes. The `crc32c` crate computes it with the CPU's CRC instructions
//! on x86_64 (SSE 4.2), found at run time; on aarch64 tern uses the ARMv8 CRC instructions
//! itself (found at run time too), one stream, fewer instructions on a batch's few hundred
//! bytes than the crate's three; on 32-bit ARM the crate computes in software. An ARMv8 core running a 32-bit system (a Raspberry Pi 3 or 4 with a 32-bit OS) has
//! the same instructions in its A32 state, so there the kernel's `HWCAP2_CRC32` bit selects
//! them; an ARMv7 core (Cortex-A7) keeps the software path. Same value on every path (a
//! property test checks it against the crate). Pure; never allocates.

/// `crc32c::crc32c_append`: the CRC32C of `data` continuing from `crc`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(all(
        target_arch = "arm",
        target_os = "linux",
        not(target_feature = "thumb-mode")
    ))]
    if a32::has_crc() {
        // SAFETY: the CPU has the CRC32 instructions.
        return unsafe { a32::crc32c_append(crc, data) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("crc") {
        // SAFETY: the CPU has the CRC32 instructions.
        return unsafe { a64::crc32c_append(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// The ARMv8 CRC32C instructions on aarch64, one 8-byte word at a time. The crate interleaves
/// three streams and joins them with table lookups, which pays for itself on long buffers; a
/// batch of a few records is short, and there one stream takes about a third of the
/// instructions (issue #29: CRC32C was 190 of a QoS 1 message's 4,500 on aarch64).
#[cfg(target_arch = "aarch64")]
mod a64 {
    use std::arch::aarch64::{__crc32cb, __crc32cd};

    /// CRC32C with the CPU's instructions.
    ///
    /// # Safety
    /// The CPU must have them (`is_aarch64_feature_detected!("crc")`).
    #[target_feature(enable = "crc")]
    pub unsafe fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
        let mut state = !crc;
        let mut words = data.chunks_exact(8);
        for word in &mut words {
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
            // SAFETY: the caller checked the CPU has the instruction (newer Rust calls it
            // safe inside this function).
            #[allow(unused_unsafe)]
            {
                state = unsafe { __crc32cd(state, word) };
            }
        }
        for &byte in words.remainder() {
            // SAFETY: as above (crc32cb).
            #[allow(unused_unsafe)]
            {
                state = unsafe { __crc32cb(state, byte) };
            }
        }
        !state
    }
}

/// The ARMv8 CRC32C instructions of the A32 instruction set. Rust 1.85 has no stable
/// intrinsics for them (`core::arch::arm::__crc32cw` is unstable), and an armv7 target's
/// assembler refuses their mnemonics, so they are written as their A32 encodings with fixed
/// registers: `crc32cw r0, r0, r1` is 0xe1400241 and `crc32cb r0, r0, r1` 0xe1000241.
#[cfg(all(
    target_arch = "arm",
    target_os = "linux",
    not(target_feature = "thumb-mode")
))]
mod a32 {
    use std::arch::asm;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// `HWCAP2_CRC32` of Linux's arm `asm/hwcap.h`.
    const HWCAP2_CRC32: libc::c_ulong = 1 << 4;
    const UNKNOWN: u8 = 0;
    const ABSENT: u8 = 1;
    const PRESENT: u8 = 2;
    static DETECTED: AtomicU8 = AtomicU8::new(UNKNOWN);

    /// Whether this CPU executes the CRC32 instructions (the kernel's hardware capabilities,
    /// read once).
    pub fn has_crc() -> bool {
        match DETECTED.load(Ordering::Relaxed) {
            UNKNOWN => {
                // SAFETY: getauxval only reads the process's auxiliary vector.
                let caps = unsafe { libc::getauxval(libc::AT_HWCAP2) };
                let present = caps & HWCAP2_CRC32 != 0;
                DETECTED.store(if present { PRESENT } else { ABSENT }, Ordering::Relaxed);
                present
            }
            state => state == PRESENT,
        }
    }

    /// CRC32C with the CPU's instructions.
    ///
    /// # Safety
    /// The CPU must have them: [`has_crc`] said so.
    pub unsafe fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
        let mut state = !crc;
        let mut words = data.chunks_exact(4);
        for word in &mut words {
            let word = u32::from_le_bytes(word.try_into().unwrap_or_default());
            // SAFETY: the caller checked the CPU has the instruction; it reads and writes r0,
            // reads r1 and touches neither memory nor the stack.
            unsafe {
                asm!(".inst 0xe1400241", inout("r0") state, in("r1") word,
                     options(pure, nomem, nostack));
            }
        }
        for &byte in words.remainder() {
            // SAFETY: as above (crc32cb).
            unsafe {
                asm!(".inst 0xe1000241", inout("r0") state, in("r1") u32::from(byte),
                     options(pure, nomem, nostack));
            }
        }
        !state
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_check_value_is_crc32c() {
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_append(0, b""), 0);
    }

    proptest! {
        /// On an ARMv8 core in 32-bit mode (qemu-arm in scripts/cross.sh) and on aarch64
        /// (qemu-aarch64) this compares the instructions with the crate's CRC; on x86_64 both
        /// are the crate's.
        #[test]
        fn every_path_computes_the_crates_crc(
            seed in any::<u32>(),
            data in proptest::collection::vec(any::<u8>(), 0..300),
            start in 0usize..4,
        ) {
            let data = data.get(start.min(data.len())..).unwrap_or_default();
            prop_assert_eq!(crc32c_append(seed, data), crc32c::crc32c_append(seed, data));
        }
    }
}
