//! Software prefetch: ask the CPU to start loading a cache line that will be
//! read soon, without waiting for it. Random reads of records in memory-mapped
//! shards are bound by memory latency (a TLB miss and a cache miss each), and
//! the records of a batch are known in advance, so a batch builder asks for
//! them a few records ahead (`stream::batch`).

/// A prefetch hint for the cache line at `ptr` (a no-op off x86-64). It never
/// faults, whatever `ptr` is.
#[inline(always)]
pub fn prefetch_line<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch does not access memory architecturally and never
    // faults, for any address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(ptr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
