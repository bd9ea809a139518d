//! `Writeback`: a file written in order whose writeback to the disk is started
//! as it grows, so that the disk works while the rest is produced and the
//! `fsync` that ends the file waits for its tail only, not for all of it.

use std::fs::File;
use std::io::Write;

/// Writeback is started every this many bytes.
const STEP: u64 = 8 << 20;

pub struct Writeback {
    file: File,
    written: u64,
    /// Bytes whose writeback has been started.
    started: u64,
}

impl Writeback {
    pub fn new(file: File) -> Self {
        Self::resume(file, 0)
    }

    /// Continue `file`, whose first `offset` bytes are written and on their
    /// way to the disk (its position is at `offset`).
    pub fn resume(file: File, offset: u64) -> Self {
        Writeback {
            file,
            written: offset,
            started: offset,
        }
    }

    /// Bytes written to the file.
    pub fn position(&self) -> u64 {
        self.written
    }

    pub fn get_ref(&self) -> &File {
        &self.file
    }

    pub fn into_inner(self) -> File {
        self.file
    }

    fn start(&mut self) {
        if self.written - self.started < STEP {
            return;
        }
        crate::os::files::start_writeback(&self.file, self.started, self.written);
        self.started = self.written;
    }
}

impl Write for Writeback {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(bytes)?;
        self.written += n as u64;
        self.start();
        Ok(n)
    }

    fn write_vectored(&mut self, bytes: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        let n = self.file.write_vectored(bytes)?;
        self.written += n as u64;
        self.start();
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}
