//! Calls on open files beyond `std`: writeback started early
//! (`sync_file_range`), `O_DIRECT` switched on a descriptor, clean pages
//! dropped from the page cache (`posix_fadvise`), and the allocator's free
//! memory given back (`malloc_trim`). Off Linux (and glibc) each is a no-op
//! except `set_direct`, which refuses to turn direct I/O on.

use std::fs::File;
use std::io;

/// Queue the writeback of bytes `start..end` of `file` without waiting for
/// it (errors surface at the `fsync` that ends the file).
pub fn start_writeback(file: &File, start: u64, end: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(at), Ok(len)) = (
            libc::off64_t::try_from(start),
            libc::off64_t::try_from(end.saturating_sub(start)),
        ) else {
            return;
        };
        // SAFETY: a valid open descriptor and an in-file range; the call only
        // queues writeback (no data changes).
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), at, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, start, end);
}

/// Turn `O_DIRECT` on or off for `file`'s open file description (every
/// handle of it: `try_clone` shares it). Off Linux direct writes are refused.
pub fn set_direct(file: &File, on: bool) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: F_GETFL and F_SETFL on a descriptor this `File` owns; only
        // its status flags change.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        if on {
            Err(io::Error::from(io::ErrorKind::Unsupported))
        } else {
            Ok(())
        }
    }
}

/// Drop `file`'s clean pages from the page cache (a cold start, for tests).
#[cfg(test)]
pub fn evict_from_page_cache(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: advice on a descriptor `file` keeps open; it only drops clean
        // cached pages.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Give the allocator's free memory back to the system (glibc keeps what
/// large frees returned in its arenas).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}
