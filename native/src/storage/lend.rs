//! Large records lent straight from their mapped shard: an Arrow buffer over
//! the record's bytes where they are stored, with no copy of ours, for a
//! consumer (the Flight server's gRPC) that only passes the bytes on.
//!
//! A lent range is read by the consumer after the engine verified it, so it
//! must not change until the consumer lets go. Two things could change it:
//!
//! - **Another program cutting or rewriting the shard.** Each shard with
//!   records out on loan holds a read lease (`F_SETLEASE`): another process's
//!   `open` for writing or `truncate` then waits until the lease is given up.
//!   A watcher thread polls the leases (`F_GETLEASE` reports a break the
//!   moment it starts); on a break it replaces every lent range of that shard
//!   by a private copy of the same bytes (`mremap` of a copy over the range:
//!   readers see the old pages or the copy, never a gap), stops lending from
//!   the shard and gives the lease up, so the writer goes on within one poll.
//!   The lease outlives the shard's last loan until a poll finds that no loan
//!   was made since the poll before, so that a stream lending from a shard
//!   every few milliseconds keeps one lease instead of taking and giving up
//!   one a record (three `fcntl` calls and the watcher's lock each). A break
//!   is answered at the next poll all the same, so a writer waits at most one
//!   poll for such a shard, and not at all for a shard that is merely open.
//!   A file that cannot be leased (another writer has it open, a file system
//!   without leases, a file owned by someone else without `CAP_LEASE`) is
//!   not lent from: its records are copied, as before.
//! - **The page being evicted and read again.** The bytes come back from the
//!   same file; a read error on the way is a kernel-side fault of the
//!   consumer's `sendmsg` (`EFAULT`, the stream fails), never zeros. Pinning
//!   the range (`mlock`) would cover a disk that returns different bytes
//!   without an error, but costs half of what lending saves (measured:
//!   `mlock` + `munlock` 0.05 s of CPU per GiB, the copy it replaces 0.06-0.11).
//!
//! When the last loan of a range comes back, the range is dropped from this
//! process's page tables (`MADV_DONTNEED`: the pages stay in the page cache,
//! the kernel's to reclaim, but no longer count in the server's RSS), so the
//! mapped shards of a server that has sent the whole cache do not stay
//! resident in it.

use std::fs::File;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;

use crate::os::lease;
use crate::os::mapped::{self, MappedFile};
use crate::os::pages::Advice;

/// How often the watcher looks at the leases it holds. A writer waits at most
/// about this long (plus the copies of the lent ranges) for its `open`.
const POLL: Duration = Duration::from_millis(20);
/// After a lease was refused for a passing reason (another writer had the
/// file open), the next attempt waits this long: records are copied meanwhile.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Lending from one shard: its mapping, its file (for the lease) and what is
/// out on loan.
pub struct Lender {
    map: Arc<MappedFile>,
    file: Arc<File>,
    state: Mutex<LendState>,
}

#[derive(Default)]
struct LendState {
    lease: Lease,
    /// Page-aligned byte ranges of the mapping out on loan, one per loan.
    lent: Vec<(usize, usize)>,
    /// Whether a loan was made since the watcher's last poll.
    lent_since_poll: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Lease {
    /// Not held; the next loan asks for one.
    #[default]
    None,
    Held,
    /// Refused for a passing reason: ask again after this instant.
    RetryAt(Instant),
    /// Never lend from this shard again: leases are refused for good, or a
    /// lease was broken (its lent ranges are private copies now).
    Never,
}

/// One loan: dropping it (when the consumer lets go of the buffer) returns
/// the range.
struct Loan {
    lender: Arc<Lender>,
    range: (usize, usize),
}

impl Lender {
    pub fn new(map: Arc<MappedFile>, file: Arc<File>) -> Arc<Self> {
        Arc::new(Lender {
            map,
            file,
            state: Mutex::default(),
        })
    }

    /// The shard's mapping.
    pub fn map(&self) -> &MappedFile {
        &self.map
    }

    /// The shard's file (for positioned reads of large records).
    pub fn file(&self) -> &File {
        &self.file
    }

    fn state(&self) -> MutexGuard<'_, LendState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lend the mapped bytes `offset..offset + len` (None: they cannot be
    /// lent now; copy them). The caller verifies them after they are lent
    /// (reading the buffer), so a lease break in between finds them on loan.
    pub fn lend(self: &Arc<Self>, offset: usize, len: usize) -> Option<Buffer> {
        if len == 0 || offset.checked_add(len)? > self.map.len() {
            return None;
        }
        let start = self.map.as_ptr() as usize + offset;
        let range = page_range(start, len);
        {
            let mut state = self.state();
            if !self.hold_lease(&mut state) {
                return None;
            }
            state.lent.push(range);
            state.lent_since_poll = true;
        }
        let loan = Arc::new(Loan {
            lender: self.clone(),
            range,
        });
        let ptr = NonNull::new(start as *mut u8)?;
        // SAFETY: `ptr..ptr + len` lies in `map`, which `loan` keeps mapped
        // (through `lender`) for as long as the buffer lives; it is read-only
        // and changes only to a private copy of the same bytes (`on_break`).
        Some(unsafe { Buffer::from_custom_allocation(ptr, len, loan) })
    }

    /// Whether this shard holds a lease now (taking one when it has none).
    fn hold_lease(self: &Arc<Self>, state: &mut LendState) -> bool {
        match state.lease {
            Lease::Held => return true,
            Lease::Never => return false,
            Lease::RetryAt(at) if Instant::now() < at => return false,
            Lease::None | Lease::RetryAt(_) => {}
        }
        state.lease = match lease::take_read(&self.file) {
            Ok(()) if watch(self) => Lease::Held,
            Ok(()) => {
                // No watcher to answer a break: no loan is safe.
                lease::release(&self.file);
                Lease::Never
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Lease::RetryAt(Instant::now() + RETRY_AFTER)
            }
            Err(_) => Lease::Never,
        };
        state.lease == Lease::Held
    }

    fn give_back(&self, range: (usize, usize)) {
        let mut state = self.state();
        if let Some(i) = state.lent.iter().position(|&r| r == range) {
            state.lent.swap_remove(i);
        }
        if state.lease == Lease::Held {
            // Out of this process's page tables (not out of the page cache).
            // Harmless for a page another loan still covers: its reader
            // faults it in again from the same file. Not after a break: the
            // range may be a private copy then, which this would zero.
            // The range lies in a live mapping of ours.
            crate::os::pages::advise_raw(range.0, range.1 - range.0, Advice::DontNeed);
        }
        // With nothing lent the lease stays until a poll finds no loan made
        // since the one before (`poll`): a stream's next loan comes sooner.
    }

    /// The watcher's look at this shard's lease: on a break, every lent range
    /// becomes a private copy and lending from this shard stops; with nothing
    /// lent and no loan since the last poll, the lease is given up (a writer
    /// is not kept waiting by a shard that is merely open).
    fn poll(&self) {
        let mut state = self.state();
        let lent_since_poll = std::mem::take(&mut state.lent_since_poll);
        if state.lease != Lease::Held {
            return;
        }
        if lease::breaking(&self.file) {
            for (start, end) in merged(&state.lent) {
                // SAFETY: the range lies in our live mapping, still intact
                // (the writer waits for the lease).
                unsafe { lease::replace_with_copy(start, end - start) };
            }
            // Nothing on loan: nothing became a copy, so this shard may lend
            // again once the writer is gone (as one that held no lease).
            state.lease = if state.lent.is_empty() {
                Lease::None
            } else {
                Lease::Never
            };
        } else if state.lent.is_empty() && !lent_since_poll {
            state.lease = Lease::None;
        } else {
            return;
        }
        lease::release(&self.file);
        unwatch(self);
    }

    #[cfg(test)]
    fn holds_lease(&self) -> bool {
        self.state().lease == Lease::Held
    }
}

impl Drop for Lender {
    fn drop(&mut self) {
        // The file may outlive this lender (the shard's reader holds it too):
        // a lease left on it would hold a writer until `lease-break-time`.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.lease == Lease::Held {
            lease::release(&self.file);
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        self.lender.give_back(self.range);
    }
}

fn page_range(start: usize, len: usize) -> (usize, usize) {
    let page = mapped::page_size();
    (start & !(page - 1), (start + len).div_ceil(page) * page)
}

/// The union of `ranges`, as disjoint ranges.
fn merged(ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
    for (start, end) in sorted {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// The lenders holding a lease now (few: a lease is held while records are on
/// loan and up to two polls after), polled by one watcher thread. A lender
/// enters with its lease and leaves when it gives the lease up, both under its
/// own state lock.
static WATCHED: Mutex<Watched> = Mutex::new(Watched {
    lenders: Vec::new(),
    running: false,
});

struct Watched {
    lenders: Vec<Weak<Lender>>,
    running: bool,
}

/// The watcher ends after this many polls with no lease to watch (a thread is
/// not started and ended for every loan).
const IDLE_POLLS: usize = 250;

/// Called with `lender`'s state locked as it takes a lease: takes only the
/// `WATCHED` lock, which the watcher never holds while it locks a lender's
/// state. False: no watcher could be started.
fn watch(lender: &Arc<Lender>) -> bool {
    let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    if !watched.running {
        watched.running = std::thread::Builder::new()
            .name("dataset-rt-leases".into())
            .spawn(watch_leases)
            .is_ok();
    }
    if watched.running {
        watched.lenders.push(Arc::downgrade(lender));
    }
    watched.running
}

/// Called with `lender`'s state locked as it gives its lease up.
fn unwatch(lender: &Lender) {
    let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    let lenders = &mut watched.lenders;
    if let Some(i) = lenders
        .iter()
        .position(|w| std::ptr::eq(w.as_ptr(), lender))
    {
        lenders.swap_remove(i);
    }
}

fn watch_leases() {
    let mut idle = 0;
    loop {
        std::thread::sleep(POLL);
        let lenders: Vec<Arc<Lender>> = {
            let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            // A lender dropped with its lease held (its file closed) is gone.
            watched.lenders.retain(|w| w.strong_count() > 0);
            if watched.lenders.is_empty() {
                idle += 1;
                if idle >= IDLE_POLLS {
                    watched.running = false; // the next lease starts a new watcher
                    return;
                }
                continue;
            }
            idle = 0;
            watched.lenders.iter().filter_map(Weak::upgrade).collect()
        };
        for lender in lenders {
            lender.poll();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn shard(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, Arc<Lender>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.bin");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let map = Arc::new(MappedFile::map(&file).unwrap());
        (dir, path, Lender::new(map, file))
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    fn is_watched(lender: &Arc<Lender>) -> bool {
        let watched = WATCHED.lock().unwrap();
        watched
            .lenders
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(lender)))
    }

    /// `shard` of `len` pattern bytes, where this file system and user can
    /// take leases at all (None: the copy path covers this file system).
    fn leased_shard(
        len: usize,
    ) -> Option<(Vec<u8>, tempfile::TempDir, std::path::PathBuf, Arc<Lender>)> {
        let bytes = pattern(len);
        let (dir, path, lender) = shard(&bytes);
        if lender.lend(0, 1).is_none() {
            eprintln!("no leases here; the copy path covers this file system");
            return None;
        }
        Some((bytes, dir, path, lender))
    }

    #[test]
    fn a_loan_is_the_stored_bytes_and_its_return_keeps_them() {
        let Some((bytes, _dir, _path, lender)) = leased_shard(1 << 20) else {
            return;
        };
        let first = lender.lend(4096 + 5, 300_000).unwrap();
        let second = lender.lend(4096 + 5, 300_000).unwrap();
        assert!(is_watched(&lender), "a lease held is watched");
        assert_eq!(first.as_slice(), &bytes[4096 + 5..4096 + 5 + 300_000]);
        drop(first); // its pages leave our page tables; `second` reads them again
        assert_eq!(second.as_slice(), &bytes[4096 + 5..4096 + 5 + 300_000]);
        drop(second);
        assert!(
            returned_holding_lease(&lender),
            "the lease outlives the last loan until the watcher's next poll"
        );
        assert!(
            eventually(|| !lender.holds_lease()),
            "the lease is given up at a poll with nothing lent"
        );
        assert!(!is_watched(&lender), "and no longer polled");
        let again = lender.lend(0, bytes.len()).unwrap();
        assert_eq!(again.as_slice(), &bytes[..]);
        assert!(lender.lend(1, bytes.len()).is_none(), "past the end");
    }

    #[test]
    fn a_writer_waits_for_the_loans_to_become_copies_and_then_cuts_the_file() {
        let Some((bytes, _dir, path, lender)) = leased_shard(1 << 20) else {
            return;
        };
        let lent = lender.lend(8192, 500_000).unwrap();
        // The writer's open blocks on the lease until the watcher has made the
        // loan a private copy and given the lease up (a bounded wait: the
        // kernel breaks a lease itself after `lease-break-time`).
        let started = Instant::now();
        let writer = std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            file.set_len(0).unwrap();
        });
        writer.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(
            lent.as_slice(),
            &bytes[8192..8192 + 500_000],
            "a loan keeps the bytes it was verified with"
        );
        assert!(lender.lend(0, 10).is_none(), "no loans from a broken lease");
    }

    /// Lend and return a range until the lease is seen held with nothing on
    /// loan (the watcher may poll between a return and the look; not every
    /// time): whether it was.
    fn returned_holding_lease(lender: &Arc<Lender>) -> bool {
        (0..1000).any(|_| {
            drop(lender.lend(4096, 100_000));
            lender.holds_lease()
        })
    }

    /// Whether `done` turns true within 10 s (the watcher polls every 20 ms).
    fn eventually(done: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(POLL / 4);
        }
        done()
    }

    #[test]
    fn a_writer_waits_at_most_a_poll_for_a_lease_with_nothing_lent() {
        let Some((_, _dir, path, lender)) = leased_shard(1 << 20) else {
            return;
        };
        assert!(returned_holding_lease(&lender));
        let started = Instant::now();
        // Blocks until the watcher gives the lease up (the kernel's own
        // `lease-break-time`, 45 s by default, is the bound of this wait).
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        assert!(!lender.holds_lease());
        assert!(
            lender.lend(0, 10).is_none(),
            "not lent from while a writer has the file open"
        );
        drop(writer);
        // Nothing was on loan at the break, so nothing became a copy: the
        // shard lends again (after the retry delay of a refused lease).
        assert!(eventually(|| lender.lend(0, 10).is_some()));
    }

    #[test]
    fn a_lender_dropped_with_its_lease_gives_it_up() {
        let Some((_, _dir, path, lender)) = leased_shard(1 << 20) else {
            return;
        };
        let _file = lender.file.clone();
        assert!(returned_holding_lease(&lender));
        drop(lender);
        // The file is still open (`_file`): a lease left on it would hold
        // this open until the kernel's `lease-break-time`.
        let started = Instant::now();
        drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_file_open_for_writing_is_not_lent_from() {
        let bytes = pattern(1 << 16);
        let (_dir, path, lender) = shard(&bytes);
        let _writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(lender.lend(0, 100).is_none());
    }

    #[test]
    fn overlapping_ranges_merge() {
        assert_eq!(
            merged(&[(8, 12), (0, 4), (4, 6), (10, 20), (30, 40)]),
            vec![(0, 6), (8, 20), (30, 40)]
        );
    }
}
