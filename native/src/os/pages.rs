//! Advice to the kernel about the pages of a mapping (`madvise`, `mincore`):
//! how a range will be read, pages to read now without waiting, pages to
//! drop from this process's page tables, and whether a page is in memory.
//! Off Linux the advice is ignored and every page counts as in memory (the
//! callers then take their warm path).

use std::ops::Range;

use super::mapped::{page_size, MappedFile};

/// How bytes of a mapping will be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Read them now, without waiting (`MADV_WILLNEED`).
    WillNeed,
    /// At random: no read-around on a fault (`MADV_RANDOM`).
    Random,
    /// The kernel's default read-ahead (`MADV_NORMAL`).
    Normal,
    /// Out of this process's page tables; a shared file mapping reads them
    /// again from the page cache if touched (`MADV_DONTNEED`).
    DontNeed,
}

/// Linux reads at most its read-ahead window per `MADV_WILLNEED` (the
/// larger of the device's `read_ahead_kb` and its largest request, often
/// 128 KiB to a few MiB) and silently drops the rest of the range: so a
/// larger range is asked for in steps of this many bytes, the smallest
/// window a device has by default.
const WILL_NEED_STEP: usize = 128 << 10;

/// Give `advice` for the whole pages inside bytes `range` of `map`; for
/// `WillNeed`, for every page that holds a byte of it (reading more is
/// harmless), step by step (`WILL_NEED_STEP`).
pub fn advise(map: &MappedFile, range: Range<usize>, advice: Advice) {
    let page = page_size();
    let base = map.as_ptr() as usize;
    let (start, end) = (base + range.start, base + range.end.min(map.len()));
    if advice == Advice::WillNeed {
        let end = end.next_multiple_of(page);
        for at in (start / page * page..end).step_by(WILL_NEED_STEP) {
            advise_raw(at, WILL_NEED_STEP.min(end - at), advice);
        }
        return;
    }
    let (start, end) = (start.next_multiple_of(page), end / page * page);
    if end > start {
        advise_raw(start, end - start, advice);
    }
}

/// Start reading the page that holds `item` (a reference into a mapped file)
/// without waiting for it.
#[inline]
pub fn will_need<T>(item: &T) {
    let page = page_size();
    advise_raw(
        item as *const T as usize & !(page - 1),
        page,
        Advice::WillNeed,
    );
}

/// `advice` for `len` bytes at the page-aligned address `start`, which lie in
/// a live mapping of this process (`MappedFile`'s, or a lent record's).
pub fn advise_raw(start: usize, len: usize, advice: Advice) {
    #[cfg(target_os = "linux")]
    {
        let advice = match advice {
            Advice::WillNeed => libc::MADV_WILLNEED,
            Advice::Random => libc::MADV_RANDOM,
            Advice::Normal => libc::MADV_NORMAL,
            Advice::DontNeed => libc::MADV_DONTNEED,
        };
        // SAFETY: the range lies in a live mapping of ours (the callers' and
        // `advise`'s contract); the advice does not change a shared file
        // mapping's contents.
        unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len, advice);
}

/// Whether the page holding byte `at` of `map` is in memory.
pub fn is_resident(map: &MappedFile, at: usize) -> bool {
    resident(map.as_ptr() as usize + at, 1) == 1
}

/// How many of the pages holding bytes `start..start + len` (addresses in a
/// live mapping of ours) are in memory.
pub fn resident(start: usize, len: usize) -> usize {
    #[cfg(target_os = "linux")]
    {
        let page = page_size();
        let first = start & !(page - 1);
        let pages = (start + len).div_ceil(page) - first / page;
        let mut flags = vec![0u8; pages];
        // SAFETY: the pages lie in a mapping of ours; mincore writes one byte
        // per page into `flags`, which holds that many.
        let done =
            unsafe { libc::mincore(first as *mut libc::c_void, pages * page, flags.as_mut_ptr()) };
        if done != 0 {
            return 0;
        }
        flags.iter().filter(|f| **f & 1 == 1).count()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let page = page_size();
        (start + len).div_ceil(page) - start / page
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    /// A rows file's page sums are asked for whole when it opens cold: a
    /// single `MADV_WILLNEED` over them read only the device's read-ahead
    /// window (8 MiB here) of 31 MB at 10^9 rows, and every draw beyond it
    /// then waited for a read of its own (a cold first batch of 6-8 s).
    #[test]
    fn will_need_reads_a_range_larger_than_the_read_ahead_window() {
        let len = 64 << 20;
        let mut temp = tempfile::NamedTempFile::new().unwrap();
        temp.write_all(&vec![7u8; len]).unwrap();
        temp.as_file().sync_all().unwrap();
        crate::os::files::evict_from_page_cache(temp.as_file());
        let map = MappedFile::map(temp.as_file()).unwrap();
        // Not page-aligned at either end: the pages holding its bytes count.
        let range = 100..len - 100;
        advise(&map, range.clone(), Advice::WillNeed);
        let pages = len / page_size();
        let deadline = Instant::now() + Duration::from_secs(30);
        let in_memory = || resident(map.as_ptr() as usize + range.start, range.len());
        while in_memory() < pages && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(in_memory(), pages, "every page of the range was read");
    }
}
