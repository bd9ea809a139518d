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
/// Backwards when the destination sits a little past the source in the low
/// 12 bits of their addresses (as glibc's `memmove` does, for the same
/// reason): a load whose page offset matches a store still in flight waits
/// for that store (4K aliasing), and a non-temporal store stays in flight
/// long. Copied forwards, a destination 16 bytes past its source (a record at
/// a page boundary into a buffer from `malloc`) ran 4x slower
/// (`examples/read_floor.rs`, 64 KiB records: 0.62 CPU s/GiB against 0.17 at
/// a page offset of 2 KiB); backwards, each load comes before the store it
/// matches.
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
    // SAFETY: offsets stay below `len`; `dst + head` is aligned to 16
    // bytes, as `_mm_stream_si128` requires; the loads are unaligned ones.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        let copy_lane = |at: usize| {
            let lane = _mm_loadu_si128(src.as_ptr().add(at).cast());
            _mm_stream_si128(dst.add(at).cast(), lane);
        };
        if aliases_forwards(src.as_ptr(), dst) {
            (head..body_end).step_by(LANE).rev().for_each(copy_lane);
        } else {
            (head..body_end).step_by(LANE).for_each(copy_lane);
        }
        std::ptr::copy_nonoverlapping(
            src.as_ptr().add(body_end),
            dst.add(body_end),
            len - body_end,
        );
        _mm_sfence();
    }
}

/// Whether a forward copy from `src` to `dst` would load bytes whose page
/// offset matches a store it has just made: the destination is less than
/// `ALIASING_REACH` bytes past the source, modulo a page (the offsets a
/// core's 4K-aliasing check compares).
#[cfg(target_arch = "x86_64")]
fn aliases_forwards(src: *const u8, dst: *const u8) -> bool {
    /// About as far as a core's stores in flight reach (glibc's `memmove`
    /// takes 256 bytes too).
    const ALIASING_REACH: usize = 256;
    const PAGE_OFFSET: usize = 4096 - 1;
    let distance = (dst as usize).wrapping_sub(src as usize) & PAGE_OFFSET;
    distance != 0 && distance < ALIASING_REACH
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

    /// Forwards and backwards alike, whatever the destination's page offset
    /// from its source (each side of the aliasing reach, and at it): the
    /// bytes arrive whole and in order.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn copies_exactly_in_either_direction() {
        let len = 2 * MIN_UNCACHED + 40;
        let source: Vec<u8> = (0..(4096 + len) as u32)
            .map(|i| (i * 131 % 253) as u8)
            .collect();
        let mut backwards = 0;
        for distance in [0usize, 1, 16, 48, 64, 200, 255, 256, 300, 2048, 4095] {
            let mut out: Vec<u8> = Vec::with_capacity(len + 64);
            out.push(9);
            let dst = out.as_ptr() as usize + out.len();
            let from = dst.wrapping_sub(source.as_ptr() as usize + distance) % 4096;
            let src = &source[from..from + len];
            let aliases = aliases_forwards(src.as_ptr(), dst as *const u8);
            assert_eq!(
                aliases,
                distance != 0 && distance < 256,
                "distance {distance}"
            );
            backwards += usize::from(aliases);
            extend(&mut out, src);
            assert_eq!(out[0], 9);
            assert_eq!(&out[1..], src, "distance {distance}");
        }
        assert_eq!(backwards, 6);
    }
}
