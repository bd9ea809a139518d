//! `ShardOut`: a shard's bytes on their way to the file, copied as little as
//! the record size allows.
//!
//! Small records are copied into one buffer (a system call or an I/O vector
//! per record would cost more than the copy). Records of `SHARED_MIN` bytes
//! and more are queued as they are (`Bytes` that share the caller's memory:
//! a Python `bytes`, a row of an Arrow batch, the workers' compressed output)
//! and reach the file with the buffered runs in one `writev`. Either way the
//! file is written in pieces of about `WRITE_CHUNK` bytes, so the page cache
//! holds a fresh shard in 2 MiB folios, which readers map with huge pages
//! (`Cache::open`): a write's length bounds its folios, and 1 MiB writes left
//! every shard in 4 KiB mappings.
//!
//! Measured on 64 KiB records from Python `bytes`: the copy into the buffer
//! (and the one out of Python) were most of the writer's user CPU.

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::ops::Range;

use bytes::Bytes;

use super::writeback::Writeback;

/// Records at least this large are queued, not copied. Below it a copy costs
/// less than keeping the record alive and one more I/O vector: at 16 KiB an
/// 8 MiB write needs at most 513 vectors, under Linux's `IOV_MAX` of 1024.
pub const SHARED_MIN: usize = 16 << 10;

/// The file is written once this many bytes are queued.
const WRITE_CHUNK: usize = 8 << 20;

/// Linux's limit on the I/O vectors of one `writev`.
const IOV_MAX: usize = 1024;

/// A record's stored bytes as the writer receives them.
pub enum StoredBytes<'a> {
    /// Copied into the shard's buffer.
    Borrowed(&'a [u8]),
    /// Queued as they are when at least `SHARED_MIN` bytes long.
    Shared(Bytes),
}

impl StoredBytes<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            StoredBytes::Borrowed(bytes) => bytes,
            StoredBytes::Shared(bytes) => bytes,
        }
    }
}

enum Segment {
    /// A run of small records in `ShardOut::buffer`.
    Buffered(Range<usize>),
    Shared(Bytes),
}

pub struct ShardOut {
    out: Writeback,
    /// The small records queued, back to back (its capacity is reused).
    buffer: Vec<u8>,
    segments: Vec<Segment>,
    queued: usize,
}

impl ShardOut {
    pub fn new(file: File) -> Self {
        ShardOut {
            out: Writeback::new(file),
            buffer: Vec::new(),
            segments: Vec::new(),
            queued: 0,
        }
    }

    /// Queue a record's bytes; writes the queue once it reaches `WRITE_CHUNK`.
    pub fn push(&mut self, stored: StoredBytes<'_>) -> io::Result<()> {
        let len = stored.as_slice().len();
        match stored {
            StoredBytes::Shared(bytes) if len >= SHARED_MIN => {
                self.segments.push(Segment::Shared(bytes));
            }
            other => self.copy(other.as_slice()),
        }
        self.queued += len;
        if self.queued >= WRITE_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn copy(&mut self, bytes: &[u8]) {
        let start = self.buffer.len();
        self.buffer.extend_from_slice(bytes);
        let end = self.buffer.len();
        match self.segments.last_mut() {
            Some(Segment::Buffered(run)) if run.end == start => run.end = end,
            _ => self.segments.push(Segment::Buffered(start..end)),
        }
    }

    /// Write everything queued.
    pub fn flush(&mut self) -> io::Result<()> {
        let buffer = &self.buffer;
        let mut slices: Vec<IoSlice<'_>> = self
            .segments
            .iter()
            .map(|segment| match segment {
                Segment::Buffered(run) => IoSlice::new(&buffer[run.clone()]),
                Segment::Shared(bytes) => IoSlice::new(bytes),
            })
            .filter(|slice| !slice.is_empty())
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let batch = rest.len().min(IOV_MAX);
            let written = self.out.write_vectored(&rest[..batch])?;
            if written == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the file accepted no more bytes",
                ));
            }
            IoSlice::advance_slices(&mut rest, written);
        }
        drop(slices);
        self.segments.clear();
        self.buffer.clear();
        self.queued = 0;
        Ok(())
    }

    /// Everything written; the file, for its `fsync`.
    pub fn finish(mut self) -> io::Result<File> {
        self.flush()?;
        Ok(self.out.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of every size class, in any mix, reach the file whole and in
    /// order, whatever the `writev` boundaries.
    #[test]
    fn every_byte_reaches_the_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard");
        let mut out = ShardOut::new(File::create(&path).unwrap());
        let mut expected = Vec::new();
        // Small and shared records alternate (the most vectors per write),
        // and some shared ones are small enough to be copied after all.
        for i in 0..1200usize {
            let len = match i % 4 {
                0 => 100 + i % 50,
                1 => SHARED_MIN + i,
                2 => 0,
                _ if i % 40 == 3 => 300 << 10,
                _ => 5000,
            };
            let record: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
            expected.extend_from_slice(&record);
            if i % 2 == 0 {
                out.push(StoredBytes::Borrowed(&record)).unwrap();
            } else {
                out.push(StoredBytes::Shared(Bytes::from(record))).unwrap();
            }
        }
        let file = out.finish().unwrap();
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }
}
