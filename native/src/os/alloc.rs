//! Disk space reserved before a file is written through a mapping.
//!
//! A store through a writable mapping into a hole of a sparse file makes the
//! kernel find a block at that moment; on a full volume it cannot, and the
//! store raises `SIGBUS`, which ends the process (issue 46, finding 1: a put
//! on a nearly full state volume killed the server). A file whose blocks are
//! allocated up front cannot fault that way: the full volume is an
//! `ENOSPC` from `allocate`, an ordinary error (`Error::StorageFull`).

use std::fs::File;

/// Extend `file` to `len` bytes (it is no longer), every block of it allocated.
#[cfg(target_os = "linux")]
pub fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return file.set_len(0);
    }
    let len = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: a plain system call on a descriptor that `file` keeps open.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match code {
        0 => Ok(()),
        // A file system without fallocate (glibc emulates it elsewhere).
        libc::EOPNOTSUPP => write_zeros(file, len as u64),
        code => Err(std::io::Error::from_raw_os_error(code)),
    }
}

/// Elsewhere: zeros written past what the file holds, which allocates
/// those blocks as well (the bytes already written are kept, and assumed
/// not to be holes).
#[cfg(not(target_os = "linux"))]
pub fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    write_zeros(file, len)
}

/// Zeros from the file's current end to `len` (fallocate's fallback).
fn write_zeros(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut at = file.metadata()?.len().min(len);
    while at < len {
        let n = CHUNK.min(len - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn every_block_of_the_length_is_allocated() {
        let file = tempfile::tempfile().unwrap();
        allocate(&file, 1 << 20).unwrap();
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
    }

    #[test]
    fn an_empty_length_is_an_empty_file() {
        let file = tempfile::tempfile().unwrap();
        allocate(&file, 0).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
    }
}
