//! Copies written around the CPU's caches.
//!
//! A record copied into a batch is next read by another thread, later: the
//! kernel's copy into a socket when gRPC sends the batch, or the consumer of
//! an in-process stream. An ordinary copy first reads every destination line
//! into the cache (to own it) and then writes it back, so a copied byte costs
//! three memory transfers; a non-temporal store writes whole lines straight to
//! memory, one transfer. `benchmarks/README.md` ("Records copied around the
//! cache") has the profile and the figures.

/// Below this a record's lines are few: the copy's cost is its misses on the
/// source, and an ordinary copy is as fast.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MIN_UNCACHED: usize = 4096;

/// Append `src` to `out`, the bulk of it with non-temporal stores (x86-64;
/// elsewhere, and for short slices, an ordinary copy). The stores are fenced
/// before it returns, so the bytes are ordered like any other write: the batch
/// can be handed to another thread as usual.
pub fn extend(out: &mut Vec<u8>, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= MIN_UNCACHED {
        out.reserve(src.len());
        let start = out.len();
        // SAFETY: `reserve` made room for `src.len()` bytes after `start`;
        // every one of them is written below before `set_len` exposes them,
        // and `src` cannot overlap `out`'s spare capacity (`out` is borrowed
        // mutably).
        unsafe {
            copy_streaming(src, out.as_mut_ptr().add(start));
            out.set_len(start + src.len());
        }
        return;
    }
    out.extend_from_slice(src);
}

/// Copy `src` to `dst` (`src.len()` writable bytes): the unaligned head and
/// tail with ordinary stores, the 16-byte-aligned body with `movntdq` (SSE2,
/// which every x86-64 CPU has), then `sfence`, without which the streamed
/// lines may become visible to another core after a later ordinary store (the
/// one that hands the batch over).
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(src: &[u8], dst: *mut u8) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LANE: usize = std::mem::size_of::<__m128i>();
    let len = src.len();
    let head = dst.align_offset(LANE).min(len);
    let body_end = head + (len - head) / LANE * LANE;
    // SAFETY (every block below): offsets stay below `len`; `dst + head` is
    // aligned to 16 bytes, as `_mm_stream_si128` requires; the loads are
    // unaligned ones.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        let mut at = head;
        while at < body_end {
            let lane = _mm_loadu_si128(src.as_ptr().add(at).cast());
            _mm_stream_si128(dst.add(at).cast(), lane);
            at += LANE;
        }
        std::ptr::copy_nonoverlapping(
            src.as_ptr().add(body_end),
            dst.add(body_end),
            len - body_end,
        );
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the threshold and every alignment of the
    /// destination: the bytes arrive whole and in order, after what was there.
    #[test]
    fn appends_exactly_at_every_alignment_and_length() {
        let source: Vec<u8> = (0..3 * MIN_UNCACHED as u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            15,
            16,
            17,
            MIN_UNCACHED - 1,
            MIN_UNCACHED,
            MIN_UNCACHED + 1,
            MIN_UNCACHED + 33,
            3 * MIN_UNCACHED,
        ] {
            for prefix in 0..17 {
                let mut out: Vec<u8> = vec![7; prefix];
                let from = prefix % 5;
                let src = &source[from..(from + len).min(source.len())];
                extend(&mut out, src);
                assert_eq!(out.len(), prefix + src.len());
                assert!(out[..prefix].iter().all(|&b| b == 7));
                assert_eq!(&out[prefix..], src, "len {len}, prefix {prefix}");
            }
        }
    }
}
