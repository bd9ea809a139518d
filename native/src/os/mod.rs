//! What the engine asks of the operating system beyond `std`, in one place:
//! disk space reserved before a file is mapped for writing (`allocate`),
//! calls on open files (`files`: early writeback, `O_DIRECT`, page-cache
//! eviction, the allocator's free memory), advice about a mapping's pages
//! (`pages`: `madvise`, `mincore`), positioned reads into spare capacity
//! (`pread`),
//! mappings that survive their file being cut (`mapped`: the `SIGBUS`
//! handler, and the one guard through which readers learn of a cut), leases
//! for lending mapped records (`lease`), CPU prefetch and huge-page hints
//! (`prefetch`), and copies around the CPU's caches (`uncached`).
//!
//! Each names its Linux (or x86-64) implementation and the fallback used
//! elsewhere (`cfg(target_os = "linux")`, `cfg(target_arch = "x86_64")`): the
//! engine is built and tested on Linux; elsewhere it builds with the
//! fallbacks, which are correct and slower (no leases: records are copied;
//! no prefetch or huge-page hints; ordinary copies; zeros written instead of
//! `posix_fallocate`).

mod alloc;
pub mod files;
pub mod lease;
pub mod mapped;
pub mod pages;
pub mod pread;
pub mod prefetch;
pub mod uncached;

pub use alloc::allocate;
