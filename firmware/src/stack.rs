//! Stack high-water mark: cortex-m-rt paints the stack area with a fixed word before `main`
//! (its `paint-stack` feature); whatever is no longer painted has been used.
//!
//! This module only reads the stack area. It must never write to it.

unsafe extern "C" {
    /// Lowest address the stack may grow down to (end of static RAM), from cortex-m-rt's link.x.
    static _stack_end: u32;
    /// Initial stack pointer (top of RAM), from cortex-m-rt's link.x.
    static _stack_start: u32;
}

/// Bytes of stack used so far at most.
pub fn high_water_bytes() -> u32 {
    let bottom = &raw const _stack_end;
    let top = &raw const _stack_start;
    let mut word = bottom;
    while word < top {
        // SAFETY: `word` stays within [_stack_end, _stack_start), RAM that cortex-m-rt set aside
        // for the stack; it is aligned and readable.
        let value = unsafe { core::ptr::read_volatile(word) };
        if value != cortex_m_rt::STACK_PAINT_VALUE {
            break;
        }
        // SAFETY: still within or one past the end of the stack area (checked by the loop).
        word = unsafe { word.add(1) };
    }
    (top as usize).saturating_sub(word as usize) as u32
}
