//! Opening a file that is read at random while its pages are not in memory
//! (a server restarted after its page cache was dropped).
//!
//! Such files (a population's rows file) are mapped with the huge-page hint,
//! which keeps random reads short of TLB misses once the file is in memory.
//! But on a cold file each first touch is then a 2 MiB read: the first batch
//! of a 10^9-row population touched about 2,000 of them (4 GB) and took 7-9 s.
//! So a cold file starts with single-page faults and no read-around
//! (`MADV_RANDOM`: a first batch is a few thousand 4 KiB reads), while a
//! background thread reads the file front to back in 2 MiB steps through a
//! mapping of its own with the huge-page hint (so that the page cache can
//! hold it in 2 MiB folios, as a warm start would have). Then the hint
//! returns. Whether it does depends on the device's read-ahead: with 8 MiB of
//! it, the fault on a small file's header reads the whole file in small
//! folios before the hint applies; a rows file this process wrote (by
//! `pwrite`) is in small folios too. Measured with 1 KiB records: a stream's
//! CPU was the same with the file in 2 MiB pages or not.
//!
//! A file larger than 80 % of the memory available is not read ahead: it
//! cannot stay in memory, and single-page faults are then the cheaper way to
//! read it at random. (One thread reading in 2 MiB steps through a mapping
//! with the hint read a cold 4 GiB file at 2.6 GiB/s here, faster than 4 or 8
//! threads, 1.8-1.9 GiB/s, and than `read` in 8 MiB blocks, 0.7 GiB/s.)
//!
//! While a file is cold, its readers also ask for the pages they will read
//! next (`will_need`: the alias entries of a block of draws, the record keys
//! of the rows a batch builds ahead), so that those reads are in flight
//! together instead of faulting in one after another behind the read-ahead.
//!
//! A rows file's page sums (`storage::pages`, 0.2 % of the file) are read by
//! every first touch of a page: on a cold file they are asked for whole at
//! once (`Advice::WillNeed` over them, in `PopulationRows::open`; see
//! `os::pages::WILL_NEED_STEP` for why in steps). Faulted one by one, the
//! sums page of each draw was a synchronous read queued behind the
//! read-ahead's: a cold first batch at 10^9 rows took
//! 6-8 s, until the read-ahead was done, against 0.7-0.9 s with the sums in
//! memory.
//!
//! Cache shards keep the hint from the start: a version that also started cold
//! shards with single pages did not make the cold first batch of a 10^9-row
//! population faster (2.4-3.9 s against 3.1-5.6 s, one run each), and every
//! freshly written cache is cold (it is written around the page cache).

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::os::mapped::MappedFile;
use crate::os::pages::{advise, is_resident, Advice};

/// Pages sampled to tell a cold file from a warm one.
const PROBES: usize = 16;
/// At least this share of the probes resident: the file is warm enough for
/// 2 MiB faults (the rest comes in quickly). Less (a restart after the page
/// cache was dropped): single pages until read ahead. At 10^9 rows, a rows file
/// partly in memory after a put read 5-10x slower with single-page faults.
const WARM_SHARE: f64 = 0.5;
/// Read ahead only a file up to this share of `MemAvailable`: a larger one
/// cannot stay in memory.
const FITS_SHARE: f64 = 0.8;
const HUGE_PAGE: usize = 2 << 20;
/// The warm-up reader returns its own pages to the kernel every this many
/// bytes, so that its mapping does not count in the process's RSS.
const RELEASE_EVERY: usize = 256 << 20;

/// How a random-read file was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// In memory: the huge-page hint at once.
    Warm,
    /// Not in memory: single-page faults while a thread reads it ahead.
    Cold,
    /// Not in memory and too large to keep there: single-page faults.
    TooLarge,
}

/// Whether a file opened by `open_random` is still cold: set while its pages
/// are read ahead (and for good when it is too large to read ahead), so that
/// its readers ask for the pages they will need (`will_need`).
#[derive(Clone, Default)]
pub struct Cold(Arc<AtomicBool>);

impl Cold {
    #[inline]
    pub fn is_cold(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, cold: bool) {
        self.0.store(cold, Ordering::Relaxed);
    }
}

/// Start reading the page that holds `item` (a reference into a mapped file)
/// without waiting for it: `MADV_WILLNEED` queues the read and returns.
pub use crate::os::pages::will_need;

/// Advise the bytes `range` of `map` (read at random) for how much of them is
/// in memory now (see the module's header), and mark `cold` while they are
/// not. `file` is the mapped file, mapped again by the warm-up thread.
pub fn open_random(
    file: &Arc<File>,
    map: &Arc<MappedFile>,
    range: Range<usize>,
    cold: &Cold,
) -> Start {
    let range = range.start..range.end.min(map.len());
    let resident = (0..PROBES)
        .filter(|i| !range.is_empty() && is_resident(map, range.start + range.len() * i / PROBES))
        .count();
    if range.is_empty() || resident as f64 >= WARM_SHARE * PROBES as f64 {
        crate::os::prefetch::huge_pages_hint(&map[range]);
        return Start::Warm;
    }
    advise(map, range.clone(), Advice::Random);
    cold.set(true);
    let job = Job {
        file: file.clone(),
        serving: Arc::downgrade(map),
        range,
        cold: cold.clone(),
    };
    if queue(job) {
        Start::Cold
    } else {
        Start::TooLarge
    }
}

/// A file to read ahead, then give the hint back.
struct Job {
    file: Arc<File>,
    serving: Weak<MappedFile>,
    range: Range<usize>,
    cold: Cold,
}

/// Files waiting to be read ahead, one after the other by one thread (a
/// server opens its populations together), and how many bytes they hold.
static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    jobs: VecDeque::new(),
    bytes: 0,
    running: false,
});

struct Queue {
    jobs: VecDeque<Job>,
    bytes: usize,
    running: bool,
}

/// Queue `job` unless it does not fit in memory beside the files queued before.
fn queue(job: Job) -> bool {
    let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    let fits = mem_available().unwrap_or(0) as f64 * FITS_SHARE;
    if (queue.bytes + job.range.len()) as f64 > fits {
        return false;
    }
    queue.bytes += job.range.len();
    queue.jobs.push_back(job);
    if !queue.running {
        queue.running = std::thread::Builder::new()
            .name("dataset-rt-warmup".into())
            .spawn(warm_up_queued)
            .is_ok();
    }
    if !queue.running {
        let job = queue.jobs.pop_back();
        queue.bytes -= job.map_or(0, |j| j.range.len());
    }
    queue.running
}

fn warm_up_queued() {
    loop {
        let job = {
            let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
            match queue.jobs.pop_front() {
                Some(job) => job,
                None => {
                    queue.running = false; // the next cold file starts a new thread
                    return;
                }
            }
        };
        warm_up(&job.file, &job.serving, job.range.clone());
        job.cold.set(false);
        let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        queue.bytes -= job.range.len();
    }
}

fn warm_up(file: &File, serving: &Weak<MappedFile>, range: Range<usize>) {
    // A mapping of its own: its faults read 2 MiB each, which the serving
    // mapping (single pages for now) does not.
    if let Ok(reader) = MappedFile::map(file) {
        crate::os::prefetch::huge_pages_hint(&reader[range.clone()]);
        let mut released = range.start;
        for at in range.clone().step_by(HUGE_PAGE) {
            if serving.strong_count() == 0 {
                return; // closed: nobody reads it any more
            }
            // SAFETY: `at` lies in the mapping; a cut file reads as zeros
            // (`mapped`), which nothing uses.
            let _ = unsafe { std::ptr::read_volatile(reader.as_ptr().add(at)) };
            if at + HUGE_PAGE - released >= RELEASE_EVERY {
                drop_pages(&reader, released..at + HUGE_PAGE);
                released = at + HUGE_PAGE;
            }
        }
        drop_pages(&reader, released..range.end);
    }
    if let Some(map) = serving.upgrade() {
        advise(&map, range.clone(), Advice::Normal);
        crate::os::prefetch::huge_pages_hint(&map[range]);
    }
}

/// `advice` on the whole pages of `range`.
/// Out of this process's page tables (the page cache keeps the pages; a
/// shared, read-only file mapping reads them again if touched).
fn drop_pages(map: &MappedFile, range: Range<usize>) {
    advise(map, range, Advice::DontNeed);
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn evict(file: &File) {
        crate::os::files::evict_from_page_cache(file);
    }

    #[test]
    fn a_cold_file_is_read_ahead_and_a_warm_one_is_not() {
        let mut temp = tempfile::NamedTempFile::new().unwrap();
        let len = 16 << 20;
        temp.write_all(&vec![3u8; len]).unwrap();
        temp.as_file().sync_all().unwrap();
        let file = Arc::new(File::open(temp.path()).unwrap());
        evict(&file);
        let map = Arc::new(MappedFile::map(&file).unwrap());
        let cold = Cold::default();
        assert_eq!(open_random(&file, &map, 4096..len, &cold), Start::Cold);
        assert!(cold.is_cold());
        // The warm-up thread reads the file into memory (bounded wait).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let all_in = || (4096..len).step_by(1 << 20).all(|at| is_resident(&map, at));
        while !all_in() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(all_in(), "the warm-up read the file");
        while cold.is_cold() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!cold.is_cold(), "a file read ahead is no longer cold");
        assert_eq!(
            open_random(&file, &map, 4096..len, &Cold::default()),
            Start::Warm
        );
        assert!(map[4096..len].iter().all(|&b| b == 3));
    }
}
