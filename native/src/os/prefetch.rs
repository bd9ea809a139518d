//! Memory hints for random reads. Software prefetch: ask the CPU to start loading a cache line that will be
//! read soon, without waiting for it. Random reads of records in memory-mapped
//! shards are bound by memory latency (a TLB miss and a cache miss each), and
//! the records of a batch are known in advance, so a batch builder asks for
//! them a few records ahead (`stream::batch`).

/// A prefetch hint for the cache line at `ptr` into L1 (a no-op off x86-64).
/// It never faults, whatever `ptr` is.
#[inline(always)]
pub fn prefetch_line<T>(ptr: *const T) {
    prefetch::<false, T>(ptr);
}

/// A prefetch hint for the cache line at `ptr` into the core's L2 cache, not
/// L1 (a no-op off x86-64). For the later lines of a record asked for ahead: a
/// core has only a couple of dozen L1 miss buffers, and a record's 16 lines 8
/// records ahead would fill them, stalling every further prefetch and load
/// until memory answers; the L2 tracks many more misses, and a line in L2 is a
/// few cycles from L1 when it is read.
#[inline(always)]
pub fn prefetch_line_to_l2<T>(ptr: *const T) {
    prefetch::<true, T>(ptr);
}

#[inline(always)]
fn prefetch<const TO_L2: bool, T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch does not access memory architecturally and never
    // faults, for any address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        if TO_L2 {
            _mm_prefetch::<_MM_HINT_T1>(ptr.cast());
        } else {
            _mm_prefetch::<_MM_HINT_T0>(ptr.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Back a large table that is read at random (a cache's index, a population's
/// record columns) with 2 MiB pages where the kernel can: one TLB entry then
/// covers 512 times the memory, and a random read's page walk is shorter
/// (inside a virtual machine, where each walk is two-dimensional, that is most
/// of what a TLB miss costs). A hint only: `MADV_COLLAPSE` (Linux 6.1+) moves the
/// table's already-written pages into huge pages now; where it is refused (an
/// older kernel, huge pages off) nothing changes.
pub fn huge_pages<T>(table: &[T]) {
    advise_huge_pages(table, true);
}

/// For a table in a mapped file: only ask that later faults map huge pages
/// (`MADV_HUGEPAGE`). A collapse would read the whole file now, O(rows) work
/// when a population or a cache is opened, which must read nothing per row.
pub fn huge_pages_hint<T>(table: &[T]) {
    advise_huge_pages(table, false);
}

fn advise_huge_pages<T>(table: &[T], collapse: bool) {
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        // Not in every libc target's bindings; the same value on every Linux.
        const MADV_COLLAPSE: libc::c_int = 25;
        let bytes = std::mem::size_of_val(table);
        if bytes < HUGE_PAGE {
            return;
        }
        let page = 4096;
        let begin = (table.as_ptr() as usize).next_multiple_of(page);
        let end = (table.as_ptr() as usize + bytes) / page * page;
        if end <= begin {
            return;
        }
        let advice: &[libc::c_int] = if collapse {
            &[libc::MADV_HUGEPAGE, MADV_COLLAPSE]
        } else {
            &[libc::MADV_HUGEPAGE]
        };
        for &advice in advice {
            // SAFETY: [begin, end) lies inside `table`'s allocation, and neither
            // advice changes its contents (a collapse copies them into huge pages).
            unsafe { libc::madvise(begin as *mut libc::c_void, end - begin, advice) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (table, collapse);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_keep_the_contents() {
        let table: Vec<u64> = (0..(6 << 20) / 8).map(|i| i * 7 + 1).collect();
        for slice in [&table[..], &table[1..], &table[..10]] {
            huge_pages(slice);
        }
        assert!(table
            .iter()
            .enumerate()
            .all(|(i, &v)| v == i as u64 * 7 + 1));
    }
}
