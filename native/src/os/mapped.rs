//! Read-only file mappings that survive their file being cut short.
//!
//! Reading a mapped page that lies past the end of its file raises `SIGBUS`,
//! and a process that does not handle it dies: one shard truncated under a
//! server would end every stream of every dataset. Caches are immutable by
//! contract, but a disk, an operator or another program can still cut a file.
//!
//! `MappedFile` registers each mapping in a process-wide table. A `SIGBUS`
//! handler, installed once and chained to the handler before it, looks the
//! faulting address up: when it lies in a registered mapping, it maps an
//! anonymous zero page over the faulting page (`MAP_FIXED`), marks the
//! mapping truncated, counts the fault for the thread and returns, so the read
//! completes (with zeros) instead of killing the process. A fault anywhere else
//! goes to the previous handler (the default one kills, as before).
//!
//! Readers then find out in two ways: a record read as zeros fails its
//! checksum, and a read run in `scope` returns `Err(Cut)` when its thread met
//! a cut file during it, even for bytes it did not verify (the per-sample
//! iterator's copy of a verified large record). Reads spread over threads (a
//! batch: the planner and the builder) ask `any_cut` once, and a watcher of
//! all reads (`CutWatch`) whether a cut happened since it last looked; no
//! caller compares counters. `MappedFile::truncated` tells which mapping it
//! was, for the error and for readiness; the cache is reopened (or refused)
//! on the next request.
//!
//! Writable mappings come only from `map_allocated`, which allocates the
//! file's blocks first: a store into a hole of a full volume would raise a
//! `SIGBUS` this handler does not absorb (it is not a cut file), so it must
//! never happen (`os::allocate`).
//!
//! The hot path pays nothing: no check per record, one thread-local read per
//! batch. docs/architecture.md ("Files that change under a reader") compares
//! the other ways this could be done.

use std::cell::Cell;
use std::fs::File;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use memmap2::Mmap;

/// Slots are allocated in chunks, published once and never freed, so the
/// signal handler can walk them without a lock.
const SLOTS_PER_CHUNK: usize = 1024;
const CHUNKS: usize = 1024;

/// One registered mapping: `[start, start + len)`, `start == 0` when free.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    truncated: AtomicBool,
}

type Chunk = [Slot; SLOTS_PER_CHUNK];

static CHUNK_TABLE: [AtomicPtr<Chunk>; CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];
/// Serialises claiming and freeing slots (never taken by the handler).
static CLAIM: Mutex<()> = Mutex::new(());
/// Faults the handler absorbed, in the whole process.
static FAULTS: AtomicU64 = AtomicU64::new(0);
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
/// The `SIGBUS` action before ours, to chain to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

thread_local! {
    // Constant-initialised and without a destructor: a plain thread-local
    // variable, safe to touch from a signal handler.
    static THREAD_FAULTS: Cell<u64> = const { Cell::new(0) };
}

/// How many cut-file faults this thread has met.
#[inline]
fn thread_faults() -> u64 {
    THREAD_FAULTS.with(Cell::get)
}

/// A read met a file cut short under its mapping (the bytes past the cut
/// read as zeros). The caller names the file (`truncation` of its cache or
/// population) when it can; `Error::from` says what happened without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut;

impl From<Cut> for crate::error::Error {
    fn from(_: Cut) -> Self {
        crate::error::Error::corrupt(
            "<a mapped file>",
            "a file was cut short while it was being read; the next request opens it again \
             (and refuses it if it is still damaged)",
        )
    }
}

/// Run `read`, which reads mapped files on this thread: `Err(Cut)` when one
/// of them was cut under it meanwhile (what it read may hold zeros).
#[inline]
pub fn scope<T>(read: impl FnOnce() -> T) -> Result<T, Cut> {
    let before = thread_faults();
    let value = read();
    if thread_faults() == before {
        Ok(value)
    } else {
        Err(Cut)
    }
}

/// Whether any mapping of the process was ever cut (one atomic load): reads
/// spread over threads check the files they used once this is true.
#[inline]
pub fn any_cut() -> bool {
    faults() != 0
}

/// Whether reads met cut files since it last looked, on any thread.
#[derive(Debug)]
pub struct CutWatch {
    seen: u64,
}

impl CutWatch {
    pub fn new() -> Self {
        CutWatch { seen: faults() }
    }

    /// True once for each batch of cuts met since the last call.
    pub fn saw_new(&mut self) -> bool {
        let now = faults();
        let new = now != self.seen;
        self.seen = now;
        new
    }
}

impl Default for CutWatch {
    fn default() -> Self {
        Self::new()
    }
}

/// A writable mapping of `file`, `len` bytes long, every block of it
/// allocated first (`os::allocate`): the only way the engine maps a file for
/// writing, so that a full volume is an `ENOSPC` here, never a `SIGBUS` at a
/// store.
pub fn map_allocated(file: &File, len: u64) -> std::io::Result<memmap2::MmapMut> {
    super::allocate(file, len)?;
    // SAFETY: the file is one of the caller's scratch files, sized and
    // allocated above; nobody else maps or truncates it while it is written.
    unsafe { memmap2::MmapMut::map_mut(file) }
}

/// The system's page size (once a file is mapped).
pub fn page_size() -> usize {
    PAGE_SIZE.load(Ordering::Relaxed)
}

/// How many cut-file faults the process has met (a change means some mapping
/// became `truncated`).
#[inline]
fn faults() -> u64 {
    FAULTS.load(Ordering::Acquire)
}

/// A read-only mapping of a whole file, guarded against the file being cut.
pub struct MappedFile {
    map: ManuallyDrop<Mmap>,
    slot: &'static Slot,
}

impl MappedFile {
    /// Map `file` (not empty) read-only.
    pub fn map(file: &File) -> std::io::Result<Self> {
        install_handler();
        // SAFETY: the file is mapped read-only; its contents changing or
        // shrinking under us is what this type guards against (a shrink turns
        // into zeros and a `truncated` mark, never a fault that kills).
        let map = unsafe { Mmap::map(file) }?;
        let slot = claim(map.as_ptr() as usize, map.len())?;
        Ok(MappedFile {
            map: ManuallyDrop::new(map),
            slot,
        })
    }

    /// Whether a read found this file shorter than when it was mapped (the
    /// pages past the cut now read as zeros).
    pub fn truncated(&self) -> bool {
        self.slot.truncated.load(Ordering::Acquire)
    }

    pub fn advise(&self, advice: memmap2::Advice) -> std::io::Result<()> {
        self.map.advise(advice)
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Unregistered before it is unmapped: the handler must never claim a
        // fault in an address range that is no longer ours.
        {
            let _claim = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
            self.slot.start.store(0, Ordering::Release);
        }
        // SAFETY: dropped once, here; `map` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.map) };
    }
}

fn claim(start: usize, len: usize) -> std::io::Result<&'static Slot> {
    let _claim = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
    for chunk_ptr in CHUNK_TABLE.iter() {
        let mut chunk = chunk_ptr.load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<Chunk> = Box::new(std::array::from_fn(|_| Slot {
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                truncated: AtomicBool::new(false),
            }));
            chunk = Box::into_raw(fresh);
            chunk_ptr.store(chunk, Ordering::Release);
        }
        // SAFETY: published chunks are never freed.
        let chunk: &'static Chunk = unsafe { &*chunk };
        if let Some(slot) = chunk.iter().find(|s| s.start.load(Ordering::Relaxed) == 0) {
            slot.len.store(len, Ordering::Relaxed);
            slot.truncated.store(false, Ordering::Relaxed);
            slot.start.store(start, Ordering::Release);
            return Ok(slot);
        }
    }
    Err(std::io::Error::other(format!(
        "more than {} files are mapped at once",
        SLOTS_PER_CHUNK * CHUNKS
    )))
}

/// The registered mapping holding `address`, if any (async-signal-safe: atomic
/// loads only).
fn slot_of(address: usize) -> Option<&'static Slot> {
    for chunk_ptr in CHUNK_TABLE.iter() {
        let chunk = chunk_ptr.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: published chunks are never freed.
        let chunk: &'static Chunk = unsafe { &*chunk };
        for slot in chunk.iter() {
            let start = slot.start.load(Ordering::Acquire);
            if start != 0 && address >= start && address - start < slot.len.load(Ordering::Relaxed)
            {
                return Some(slot);
            }
        }
    }
    None
}

fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: plain libc calls on zeroed, then filled, sigaction structs.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE_SIZE.store(page as usize, Ordering::Relaxed);
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            // PREVIOUS is set before the handler can run (it is installed after).
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) == 0 {
                let _ = PREVIOUS.set(previous);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
            }
        }
    });
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo; everything below is atomics,
    // a thread-local `Cell` and the `mmap` system call.
    unsafe {
        let errno = *errno_location();
        let address = (*info).si_addr() as usize;
        let from_fault = (*info).si_code > 0; // not sent by kill() or raise()
        if from_fault {
            if let Some(slot) = slot_of(address) {
                // Only the faulting page: a later page may be a private copy
                // of bytes lent out (`lend`), which zeros must not replace.
                let page = PAGE_SIZE.load(Ordering::Relaxed);
                let from = address & !(page - 1);
                let zeros = libc::mmap(
                    from as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if zeros != libc::MAP_FAILED {
                    slot.truncated.store(true, Ordering::Release);
                    FAULTS.fetch_add(1, Ordering::AcqRel);
                    THREAD_FAULTS.with(|n| n.set(n.get() + 1));
                    *errno_location() = errno;
                    return;
                }
            }
        }
        *errno_location() = errno;
        chain(signal, info, context);
    }
}

/// The thread's `errno`, which a signal handler must leave as it found it.
#[cfg(target_os = "linux")]
unsafe fn errno_location() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__errno_location() }
}

#[cfg(not(target_os = "linux"))]
unsafe fn errno_location() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread (BSDs and macOS).
    unsafe { libc::__error() }
}

/// Hand a fault that is not ours to the handler installed before ours.
unsafe fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // The default action: reset and let the fault happen again (a signal
        // from kill() is raised again), which ends the process as before.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
        if (*info).si_code <= 0 {
            libc::raise(signal);
        }
        return;
    }
    if previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0) {
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            std::mem::transmute(handler);
        f(signal, info, context);
    } else {
        let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
        f(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(len: usize) -> (tempfile::NamedTempFile, File) {
        let mut temp = tempfile::NamedTempFile::new().unwrap();
        temp.write_all(&vec![7u8; len]).unwrap();
        temp.flush().unwrap();
        let file = File::open(temp.path()).unwrap();
        (temp, file)
    }

    #[test]
    fn a_file_cut_under_its_mapping_reads_as_zeros_and_is_marked() {
        let page = PAGE_SIZE.load(Ordering::Relaxed).max(4096);
        let (temp, file) = file_of(8 * page);
        let map = MappedFile::map(&file).unwrap();
        assert_eq!(map[5 * page], 7);
        let (before, mine) = (faults(), thread_faults());
        temp.as_file().set_len(page as u64).unwrap();
        // Past the cut: without the guard this read kills the test process.
        let tail = std::hint::black_box(&map[6 * page..7 * page]).to_vec();
        assert!(tail.iter().all(|&b| b == 0));
        assert!(map.truncated());
        assert!(faults() > before && thread_faults() == mine + 1);
        assert_eq!(
            map[page - 1],
            7,
            "bytes before the cut are still the file's"
        );
    }

    #[test]
    fn an_intact_mapping_is_not_marked_and_slots_are_reused() {
        let (_temp, file) = file_of(10_000);
        for _ in 0..3 * SLOTS_PER_CHUNK {
            let map = MappedFile::map(&file).unwrap();
            assert_eq!(map.len(), 10_000);
            assert!(!map.truncated());
        }
    }

    #[test]
    fn a_fault_outside_every_mapping_is_not_claimed() {
        let (_temp, file) = file_of(4096);
        let map = MappedFile::map(&file).unwrap();
        let start = map.as_ptr() as usize;
        assert!(slot_of(start).is_some());
        assert!(slot_of(1).is_none(), "nothing is mapped at address 1");
        drop(map);
        assert!(
            slot_of(start).is_none(),
            "a dropped mapping is unregistered"
        );
    }
}
