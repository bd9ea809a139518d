//! Page checksums of a mapped file, verified on the first touch of each page.
//!
//! A population's rows file decides which records an epoch draws (its keys
//! and alias table are read at random, 10^9 rows are 16 GB), so a byte
//! damaged on disk or written over in place would silently change an epoch.
//! Hashing the whole file when it is opened would make opening O(rows); so
//! the file carries an xxh3-64 per 4 KiB page (`page_sums`, written with it)
//! and a reader verifies a page the first time it reads from it: a bit per
//! page says it was verified, and once every page was, one relaxed load says
//! so. A page that does not match is recorded (`damage`) and every batch that
//! read from the file checks for it before it is handed out, so a damaged
//! page never serves a different epoch: the stream fails with the file's
//! damage instead.
//!
//! Page size: a first touch hashes the whole page (about 0.3 us from memory);
//! pages are the kernel's 4 KiB pages of the file (the grid starts at byte 0
//! of the file, so the first and last checked pages may be shorter), so a
//! first touch reads no more than the random read itself faults in, and the
//! first batch of a 10^9-row population hashes a few MiB, not GiB. The sums
//! cost 8 bytes per 4 KiB (0.2 % of the file).
//!
//! A bit per page read at random costs a cache miss of its own while pages
//! are left to verify (a 10^9-row file has 4 M pages: 512 KiB of bits): so a
//! file that fits in memory is also verified front to back by a thread of
//! its own from when it is opened (`verify_in_background`), after which one
//! load says every page was. (At 10^9 rows, reads that checked the bit per
//! draw drew at half the rate.)
//!
//! A file that changes on disk while mapped (its stamp differs: written in
//! place, replaced) has its pages verified again (`reset`): population
//! files are never written after they are stored, so a change is damage
//! until the pages say otherwise.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use super::Slab;
use crate::hash::xxh3_64;
use crate::os::mapped::MappedFile;

/// Bytes per checked page.
pub const PAGE: usize = 4096;
const INTACT: usize = usize::MAX;

/// The xxh3-64 of each page of bytes `start..end` of `file`: the file's
/// `PAGE`-byte pages cut to that range (the first and last may be shorter).
pub fn page_sums(file: &[u8], start: usize, end: usize) -> Vec<u64> {
    (start / PAGE..end.div_ceil(PAGE))
        .map(|page| xxh3_64(&file[(page * PAGE).max(start)..((page + 1) * PAGE).min(end)]))
        .collect()
}

/// Pages of bytes `start..end` of a mapped file, each verified against its sum
/// on its first touch.
pub struct CheckedPages {
    map: Option<Arc<MappedFile>>,
    start: usize,
    end: usize,
    sums: Slab<u64>,
    /// A bit per page: verified.
    verified: Box<[AtomicU64]>,
    /// Pages not verified yet; `all` once none is left.
    left: AtomicUsize,
    all: AtomicBool,
    /// The first page found damaged (`INTACT`: none).
    damaged: AtomicUsize,
    /// A background verification runs (`verify_in_background`).
    verifying: AtomicBool,
    path: PathBuf,
}

impl CheckedPages {
    /// Bytes `start..end` of `map` (the file at `path`), page `i` checked
    /// against `sums[i]`. `sums` must hold one sum per page.
    pub fn new(
        map: Arc<MappedFile>,
        start: usize,
        end: usize,
        sums: Slab<u64>,
        path: &Path,
    ) -> std::result::Result<Self, String> {
        let pages = end.div_ceil(PAGE) - start / PAGE;
        if sums.len() != pages || end > map.len() || start > end {
            return Err(format!(
                "{} page checksums for {pages} pages of bytes {start}..{end}",
                sums.len()
            ));
        }
        Ok(CheckedPages {
            map: Some(map),
            start,
            end,
            sums,
            verified: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            left: AtomicUsize::new(pages),
            all: AtomicBool::new(pages == 0),
            damaged: AtomicUsize::new(INTACT),
            verifying: AtomicBool::new(false),
            path: path.to_path_buf(),
        })
    }

    /// Nothing to verify: memory this process built (an alias table made in
    /// memory), or a file written before files carried page sums.
    pub fn trusted() -> Self {
        CheckedPages {
            map: None,
            start: 0,
            end: 0,
            sums: Slab::from_vec(Vec::new()),
            verified: Box::new([]),
            left: AtomicUsize::new(0),
            all: AtomicBool::new(true),
            damaged: AtomicUsize::new(INTACT),
            verifying: AtomicBool::new(false),
            path: PathBuf::new(),
        }
    }

    /// Verify the page holding byte `offset` if it was not verified yet. A
    /// mismatch is recorded for `damage`, not returned: the hot paths that
    /// call this (a draw, a record's key) are infallible, and the batch they
    /// build asks `damage` before it is handed out.
    #[inline]
    pub fn touch(&self, offset: usize) {
        if !self.all.load(Relaxed) {
            self.touch_slow(offset);
        }
    }

    /// `touch` every page of bytes `range`.
    pub fn touch_range(&self, range: std::ops::Range<usize>) {
        if self.all.load(Relaxed) || range.is_empty() {
            return;
        }
        let first = range.start.max(self.start) / PAGE;
        let last = (range.end - 1).min(self.end.saturating_sub(1)) / PAGE;
        for page in first..=last {
            self.touch_slow((page * PAGE).max(self.start));
        }
    }

    #[cold]
    fn touch_slow(&self, offset: usize) {
        if offset < self.start || offset >= self.end {
            return;
        }
        let page = offset / PAGE - self.start / PAGE;
        let (word, bit) = (page / 64, 1u64 << (page % 64));
        if self.verified[word].load(Relaxed) & bit != 0 {
            return;
        }
        self.verify_page(page);
    }

    fn verify_page(&self, page: usize) {
        let Some(map) = &self.map else { return };
        let (at, to) = self.bytes_of(page);
        let bytes = &map[at..to];
        if xxh3_64(bytes) != self.sums[page] {
            let _ = self
                .damaged
                .compare_exchange(INTACT, page, Relaxed, Relaxed);
            return;
        }
        let (word, bit) = (page / 64, 1u64 << (page % 64));
        // Two threads may verify the same page at once: only the one that
        // sets the bit counts it.
        if self.verified[word].fetch_or(bit, Relaxed) & bit == 0
            && self.left.fetch_sub(1, Relaxed) == 1
        {
            self.all.store(true, Relaxed);
        }
    }

    /// The bytes of page `page` (counted from the first checked one).
    fn bytes_of(&self, page: usize) -> (usize, usize) {
        let at = (self.start / PAGE + page) * PAGE;
        (at.max(self.start), (at + PAGE).min(self.end))
    }

    /// `verify_all` on a thread of its own (one at a time), which stops early
    /// when nobody else holds the pages any more.
    pub fn verify_in_background(self: &Arc<Self>) {
        self.verify_in_background_once(|| true);
    }

    /// `verify_in_background` once `ready` says so (polled every 50 ms): for a
    /// file read into memory by another thread first (`warmup`), so that the
    /// verification reads memory instead of competing for the disk with the
    /// first reads.
    pub fn verify_in_background_once(self: &Arc<Self>, ready: impl Fn() -> bool + Send + 'static) {
        if self.map.is_none() || self.verifying.swap(true, Relaxed) {
            return;
        }
        let pages = self.clone();
        let spawned = std::thread::Builder::new()
            .name("verify-pages".into())
            .spawn(move || {
                let owned = || Arc::strong_count(&pages) > 1;
                while !ready() && owned() {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                pages.verify_while(|_| owned());
                pages.verifying.store(false, Relaxed);
            });
        if spawned.is_err() {
            self.verifying.store(false, Relaxed);
        }
    }

    /// Verify every page not verified yet (a full read of what is left);
    /// true when none is damaged.
    pub fn verify_all(&self) -> bool {
        self.verify_while(|_| true)
    }

    fn verify_while(&self, go_on: impl Fn(&Self) -> bool) -> bool {
        for page in 0..self.sums.len() {
            if self.all.load(Relaxed) || self.damaged.load(Relaxed) != INTACT || !go_on(self) {
                break;
            }
            if self.verified[page / 64].load(Relaxed) & (1 << (page % 64)) == 0 {
                self.verify_page(page);
            }
        }
        self.damaged.load(Relaxed) == INTACT
    }

    /// The file changed on disk (written over, or put back): verify its
    /// pages again as they are read, and forget damage found before. (A page
    /// verified by a reader that raced this call may keep its bit; the
    /// file's next change, or `verify`, finds it.)
    pub fn reset(&self) {
        if self.map.is_none() {
            return;
        }
        for word in self.verified.iter() {
            word.store(0, Relaxed);
        }
        self.damaged.store(INTACT, Relaxed);
        self.left.store(self.sums.len(), Relaxed);
        self.all.store(self.sums.is_empty(), Relaxed);
    }

    /// Why the file cannot be read, if a page was found damaged.
    pub fn damage(&self) -> Option<String> {
        let page = self.damaged.load(Relaxed);
        if page == INTACT {
            return None;
        }
        let (at, to) = self.bytes_of(page);
        Some(format!(
            "bytes {at}..{to} of {} do not match their checksum: the file was damaged on disk \
             or written over in place",
            self.path.file_name().unwrap_or_default().to_string_lossy()
        ))
    }

    /// Take every page as verified: bytes this process wrote and computed the
    /// sums of, unchanged since (`trust_written`).
    pub fn mark_all_verified(&self) {
        if self.map.is_some() && self.damaged.load(Relaxed) == INTACT {
            self.all.store(true, Relaxed);
        }
    }

    /// Whether every page was verified (and none found damaged).
    pub fn all_verified(&self) -> bool {
        self.all.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> (tempfile::NamedTempFile, Arc<MappedFile>) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        file.flush().unwrap();
        let map = Arc::new(MappedFile::map(file.as_file()).unwrap());
        (file, map)
    }

    fn checked(bytes: &[u8], start: usize, path: &Path) -> (Arc<MappedFile>, CheckedPages) {
        let (_, map) = file(bytes);
        let sums = Slab::from_vec(page_sums(bytes, start, bytes.len()));
        let pages = CheckedPages::new(map.clone(), start, bytes.len(), sums, path).unwrap();
        (map, pages)
    }

    #[test]
    fn a_touch_verifies_its_page_once_and_every_page_makes_all() {
        let bytes: Vec<u8> = (0..3 * PAGE + 100).map(|i| (i % 251) as u8).collect();
        let (_map, pages) = checked(&bytes, 64, Path::new("x.rows"));
        assert!(!pages.all_verified());
        pages.touch(64);
        pages.touch(64 + PAGE + 5);
        assert!(!pages.all_verified());
        // The grid is the file's pages: the first checked one is bytes 64..4096.
        assert_eq!(pages.sums.len(), 4);
        assert_eq!(pages.bytes_of(0), (64, PAGE));
        assert_eq!(pages.bytes_of(3), (3 * PAGE, bytes.len()));
        pages.touch_range(64..bytes.len());
        assert!(pages.all_verified() && pages.damage().is_none());
        // Outside the checked bytes: nothing to do, no panic.
        pages.touch(0);
        pages.touch(bytes.len() + 10);
    }

    #[test]
    fn a_page_that_differs_from_its_sum_is_damage_naming_its_bytes() {
        let bytes: Vec<u8> = (0..2 * PAGE).map(|i| (i % 7) as u8).collect();
        let (_, map) = file(&bytes);
        let mut sums = page_sums(&bytes, 0, bytes.len());
        sums[1] ^= 1; // as if page 1 were written over after the sums
        let pages = CheckedPages::new(
            map,
            0,
            bytes.len(),
            Slab::from_vec(sums),
            Path::new("/state/p.rows"),
        )
        .unwrap();
        pages.touch(10);
        assert!(pages.damage().is_none(), "page 0 is whole");
        pages.touch(PAGE + 10);
        let damage = pages.damage().unwrap();
        assert!(damage.contains("bytes 4096..8192 of p.rows"), "{damage}");
        assert!(!damage.contains("/state"), "no state path: {damage}");
        assert!(!pages.verify_all() && !pages.all_verified());
        // The file changed again: the verdict is forgotten until found again.
        pages.reset();
        assert!(pages.damage().is_none());
        assert!(!pages.verify_all() && pages.damage().is_some());
    }

    #[test]
    fn a_reset_verifies_again_and_trusted_pages_check_nothing() {
        let bytes = vec![5u8; PAGE * 2];
        let (_map, pages) = checked(&bytes, 0, Path::new("x"));
        assert!(pages.verify_all() && pages.all_verified());
        pages.reset();
        assert!(!pages.all_verified());
        assert!(pages.verify_all() && pages.all_verified());
        let trusted = CheckedPages::trusted();
        trusted.touch(123);
        trusted.reset();
        assert!(trusted.all_verified() && trusted.verify_all() && trusted.damage().is_none());
    }

    #[test]
    fn a_background_verification_finds_every_page_or_the_damage() {
        let bytes: Vec<u8> = (0..40 * PAGE + 3).map(|i| (i % 13) as u8).collect();
        let (map, pages) = checked(&bytes, 100, Path::new("x"));
        let pages = Arc::new(pages);
        pages.verify_in_background();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !pages.all_verified() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pages.all_verified());
        drop(map);
    }

    #[test]
    fn sums_must_match_the_page_count() {
        let bytes = vec![0u8; PAGE + 1];
        let (_, map) = file(&bytes);
        let sums = Slab::from_vec(vec![0u64; 1]);
        assert!(CheckedPages::new(map, 0, bytes.len(), sums, Path::new("x")).is_err());
    }
}
