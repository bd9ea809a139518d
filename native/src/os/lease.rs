//! File leases (Linux's `F_SETLEASE`) and the page move a lease break needs,
//! for lending mapped records without a copy (`storage::lend`).
//!
//! A read lease tells this process when another opens the file for writing:
//! the kernel holds that `open` until the lease is given up (or a timeout),
//! so lent ranges can be made private copies first. Elsewhere there are no
//! leases: `take_read` fails with `Unsupported`, and every record is copied
//! instead of lent (what Linux does too on a file system without leases).

use std::fs::File;

/// The signal a lease break sends. Its default action is to ignore it, so the
/// break needs no handler (`SIGIO`, the default, would end the process); the
/// lender finds the break by polling (`breaking`).
#[cfg(target_os = "linux")]
const BREAK_SIGNAL: libc::c_int = libc::SIGURG;
/// `fcntl` command that sets the signal of a lease break (Linux's value;
/// the `libc` crate does not export it).
#[cfg(target_os = "linux")]
const F_SETSIG: libc::c_int = 10;

/// Take a read lease on `file` (`EAGAIN`: another process has it open for
/// writing now).
#[cfg(target_os = "linux")]
pub fn take_read(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // The signal first: a break before it is set would send `SIGIO`.
    // SAFETY: a plain fcntl on a descriptor that `file` keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), F_SETSIG, BREAK_SIGNAL) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    set(file, libc::F_RDLCK)
}

#[cfg(not(target_os = "linux"))]
pub fn take_read(_file: &File) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Give up the lease on `file`, if any (best effort).
pub fn release(file: &File) {
    #[cfg(target_os = "linux")]
    let _ = set(file, libc::F_UNLCK);
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Whether a break of the lease on `file` has started (or none is held).
pub fn breaking(file: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain fcntl on a descriptor that `file` keeps open.
        let held = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLEASE) };
        held != libc::F_RDLCK
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        true
    }
}

#[cfg(target_os = "linux")]
fn set(file: &File, kind: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain fcntl on a descriptor that `file` keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, kind) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Replace the mapped pages `start..start + len` by a private, read-only copy
/// of their bytes, in one step for other threads (`mremap` moves the copy over
/// the range under the address space's lock). Only ever called with a lease
/// held, so never without Linux.
///
/// # Safety
/// `start..start + len` is page-aligned and lies in a live mapping of ours.
#[cfg(target_os = "linux")]
pub unsafe fn replace_with_copy(start: usize, len: usize) {
    // SAFETY: fresh anonymous memory, filled, then moved over our own range.
    unsafe {
        let copy = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if copy == libc::MAP_FAILED {
            return;
        }
        std::ptr::copy_nonoverlapping(start as *const u8, copy.cast::<u8>(), len);
        libc::mprotect(copy, len, libc::PROT_READ);
        let moved = libc::mremap(
            copy,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        );
        if moved == libc::MAP_FAILED {
            libc::munmap(copy, len);
        }
    }
}

/// # Safety
/// As on Linux; never called, as no lease is ever held here.
#[cfg(not(target_os = "linux"))]
pub unsafe fn replace_with_copy(_start: usize, _len: usize) {}
