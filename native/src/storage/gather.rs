//! `ShardOut`: a cache's shards, one after the other, on their way to their
//! files, copied as little as the way they are written allows.
//!
//! **Direct** (`O_DIRECT`, `storage::direct`, the default): every record is
//! copied once into the aligned buffer that goes to the disk.
//!
//! **Buffered** (where the file system refuses direct writes): small records
//! are copied into one buffer; records of `SHARED_MIN` bytes and more are
//! queued as they are (`Bytes` that share the caller's memory: a Python
//! `bytes`, a row of an Arrow batch, the workers' compressed output) and reach
//! the file with the buffered runs in one `writev`, in pieces of about
//! `WRITE_CHUNK` bytes, so that the page cache holds a fresh shard in 2 MiB
//! folios, which readers map with huge pages (`Cache::open`): a write's length
//! bounds its folios, and 1 MiB writes left every shard in 4 KiB mappings.
//! Measured on 64 KiB records from Python `bytes`: the copy into the buffer
//! (and the one out of Python) were most of the buffered writer's user CPU.

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;

use super::direct::{write_zero, DirectWriter, WriteBuffer, WRITE_CHUNK};

/// Records at least this large are queued, not copied, by buffered writes.
/// Below it a copy costs less than keeping the record alive and one more I/O
/// vector: at 16 KiB an 8 MiB write needs at most 513 vectors, under Linux's
/// `IOV_MAX` of 1024.
pub const SHARED_MIN: usize = 16 << 10;

/// Linux's limit on the I/O vectors of one `writev`.
const IOV_MAX: usize = 1024;

/// A record's stored bytes as the writer receives them.
pub enum StoredBytes<'a> {
    /// Copied into the shard's buffer.
    Borrowed(&'a [u8]),
    /// Queued as they are when at least `SHARED_MIN` bytes long (buffered
    /// writes; direct writes copy every record into the aligned buffer).
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

pub struct ShardOut {
    out: Option<DirectWriter>,
    /// The aligned buffer, handed from shard to shard.
    buffer: Option<WriteBuffer>,
    /// Buffered writes' queue.
    queue: Queue,
}

impl ShardOut {
    pub fn new() -> Self {
        ShardOut {
            out: None,
            buffer: None,
            queue: Queue::default(),
        }
    }

    /// Create the next shard at `path` (the previous one must be closed).
    pub fn open(&mut self, path: &Path) -> io::Result<()> {
        if self.out.is_some() {
            return Err(io::Error::other("the previous shard is still open"));
        }
        let file = File::create(path)?;
        self.out = Some(DirectWriter::new(file, self.buffer.take())?);
        Ok(())
    }

    /// Whether the open shard is written around the page cache.
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        self.out.as_ref().is_some_and(DirectWriter::is_direct)
    }

    /// Queue a record's bytes; writes once `WRITE_CHUNK` bytes are queued.
    pub fn push(&mut self, stored: StoredBytes<'_>) -> io::Result<()> {
        let out = self.out.as_mut().ok_or_else(no_shard)?;
        if out.is_direct() {
            out.write_all(stored.as_slice())
        } else if self.queue.push(stored) >= WRITE_CHUNK {
            self.queue.write_to(out)
        } else {
            Ok(())
        }
    }

    /// Everything written and the file at its length: the file, for its
    /// `fsync`.
    pub fn close(&mut self) -> io::Result<File> {
        let mut out = self.out.take().ok_or_else(no_shard)?;
        self.queue.write_to(&mut out)?;
        let (file, buffer) = out.finish()?;
        self.buffer = Some(buffer);
        Ok(file)
    }

    #[cfg(test)]
    fn fall_back_now(&mut self) -> io::Result<()> {
        self.out.as_mut().ok_or_else(no_shard)?.fall_back_now()
    }
}

/// Small records copied back to back, larger ones queued as they are, until
/// buffered writes take them in one `writev`.
#[derive(Default)]
struct Queue {
    /// The small records queued (its capacity is reused).
    buffer: Vec<u8>,
    segments: Vec<Segment>,
    queued: usize,
}

enum Segment {
    /// A run of small records in `Queue::buffer`.
    Buffered(Range<usize>),
    Shared(Bytes),
}

impl Queue {
    /// Queue a record; returns the bytes queued.
    fn push(&mut self, stored: StoredBytes<'_>) -> usize {
        let len = stored.as_slice().len();
        match stored {
            StoredBytes::Shared(bytes) if len >= SHARED_MIN => {
                self.segments.push(Segment::Shared(bytes));
            }
            other => {
                let start = self.buffer.len();
                self.buffer.extend_from_slice(other.as_slice());
                let end = self.buffer.len();
                match self.segments.last_mut() {
                    Some(Segment::Buffered(run)) if run.end == start => run.end = end,
                    _ => self.segments.push(Segment::Buffered(start..end)),
                }
            }
        }
        self.queued += len;
        self.queued
    }

    /// Write everything queued.
    fn write_to(&mut self, out: &mut impl Write) -> io::Result<()> {
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
            let written = out.write_vectored(&rest[..batch])?;
            if written == 0 {
                return Err(write_zero());
            }
            IoSlice::advance_slices(&mut rest, written);
        }
        drop(slices);
        self.segments.clear();
        self.buffer.clear();
        self.queued = 0;
        Ok(())
    }
}

fn no_shard() -> io::Error {
    io::Error::other("no shard is open")
}

#[cfg(test)]
mod tests {
    use super::super::direct::takes_direct_writes;
    use super::super::direct::tests::same_bytes;
    use super::*;

    /// Records of every size class: small and shared ones alternating (the
    /// most vectors per buffered write), empty ones, some larger than a write.
    fn records(seed: usize, count: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| {
                let len = match i % 4 {
                    0 => 100 + i % 50,
                    1 => SHARED_MIN + i,
                    2 => 0,
                    _ if i % 40 == 3 => 300 << 10,
                    _ if i == 7 => WRITE_CHUNK + 12_345,
                    _ => 5000,
                };
                (0..len).map(|j| (seed + i * 31 + j) as u8).collect()
            })
            .collect()
    }

    fn push_all(out: &mut ShardOut, records: &[Vec<u8>]) {
        for (i, record) in records.iter().enumerate() {
            if i % 2 == 0 {
                out.push(StoredBytes::Borrowed(record)).unwrap();
            } else {
                out.push(StoredBytes::Shared(Bytes::from(record.clone())))
                    .unwrap();
            }
        }
    }

    /// Every byte reaches its shard whole and in order, whatever the write
    /// boundaries, for shard after shard through one `ShardOut`, and each
    /// file has exactly its records' length (direct writes' padding cut).
    #[test]
    fn every_byte_reaches_its_shard_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let direct = takes_direct_writes(dir.path());
        for buffered in [false, true] {
            let mut out = ShardOut::new();
            for shard in 0..3 {
                let path = dir.path().join(format!("{buffered}-{shard}"));
                let records = records(shard, [1200, 5, 1][shard]);
                out.open(&path).unwrap();
                if buffered {
                    // As where the file system refuses direct writes.
                    out.fall_back_now().unwrap();
                }
                assert_eq!(out.is_direct(), direct && !buffered);
                push_all(&mut out, &records);
                out.close().unwrap().sync_all().unwrap();
                same_bytes(&std::fs::read(&path).unwrap(), &records.concat());
            }
        }
    }

    /// A shard that falls back to buffered writes part way (as where the
    /// file system refuses a direct write) keeps every byte.
    #[test]
    fn a_fallback_part_way_keeps_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard");
        let records = records(3, 400);
        let mut out = ShardOut::new();
        out.open(&path).unwrap();
        push_all(&mut out, &records[..200]);
        out.fall_back_now().unwrap();
        assert!(!out.is_direct());
        push_all(&mut out, &records[200..]);
        out.close().unwrap();
        same_bytes(&std::fs::read(&path).unwrap(), &records.concat());
    }

    #[test]
    fn a_shard_must_be_closed_before_the_next_opens() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = ShardOut::new();
        out.open(&dir.path().join("a")).unwrap();
        let err = out.open(&dir.path().join("b")).unwrap_err();
        assert_eq!(err.to_string(), "the previous shard is still open");
        out.close().unwrap();
        assert!(out.close().is_err());
    }
}
