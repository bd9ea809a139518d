//! Reading records: a record is copied (`read_into`: small ones from the
//! mapping, large ones with one `pread`), decoded when it was stored with a
//! codec, and verified by its checksum on every read. For the stream's hot
//! path a record can also be prefetched ahead (`prefetch`, `prefetch_entry`),
//! lent from its mapping without a copy (`lend`), or verified where it is
//! stored and copied once by the caller (`verify_in_place`, `stored_as_is`).

use super::Cache;
use crate::error::{Error, Result};
use crate::hash::xxh3_64;
use crate::os::pread::append_exact_at;
use crate::os::prefetch::{prefetch_line, prefetch_line_to_l2};
use crate::storage::codec::decode_into;
use crate::storage::hex64;
use crate::storage::index::IndexEntry;
use crate::storage::LARGE_RECORD;

const CACHE_LINE: usize = 64;
/// Lines of a record `Cache::prefetch` asks for (a 1 KiB record is 16; for
/// longer ones the hardware prefetcher follows the sequential read). Measured
/// on 1 KiB records: 16 lines cost less CPU per GiB than 2 (benchmarks/README.md).
const PREFETCH_LINES: usize = 16;
/// The base page size the hardware prefetcher stops at.
const PAGE: usize = 4096;

impl Cache {
    /// Append record `sample_id`'s payload to `out`, verifying its checksum.
    pub fn read_into(&self, sample_id: u64, out: &mut Vec<u8>) -> Result<()> {
        self.read_entry_into(sample_id, self.entry(sample_id), out)
    }

    /// `read_into` with the record's `entry` already read (`Cache::entry`).
    pub fn read_entry_into(
        &self,
        sample_id: u64,
        entry: Option<IndexEntry>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let entry = &entry.ok_or_else(|| {
            Error::invalid(format!(
                "sample_id {sample_id} is out of range for cache {} ({} records)",
                self.manifest.cache_id, self.manifest.record_count
            ))
        })?;
        if let Some(stored) = self.fetched(entry)? {
            // Fetched by itself from object storage: its shard is not here.
            self.check_record(sample_id, entry, &stored)?;
            if entry.stored_as_is() {
                out.extend_from_slice(&stored);
                return Ok(());
            }
            return self.decode_record(sample_id, entry, &stored, out);
        }
        if entry.stored_len >= LARGE_RECORD {
            return self.pread_into(sample_id, entry, out);
        }
        let stored = self.stored_bytes(entry)?;
        self.check_record(sample_id, entry, stored)?;
        if entry.stored_as_is() {
            crate::os::uncached::extend(out, stored);
            return Ok(());
        }
        self.decode_record(sample_id, entry, stored, out)
    }

    /// Ask the CPU to start loading the bytes of the record at `entry` (and
    /// their page table entries) into its caches, without waiting for them and
    /// without reading them: a batch builder calls it a few records ahead, so
    /// that the memory latency of random records in memory-mapped shards
    /// overlaps with the verification of the records before. A hint only: it
    /// never faults and does nothing for records read with `pread`.
    pub fn prefetch(&self, entry: &IndexEntry) {
        if entry.stored_len >= LARGE_RECORD {
            return;
        }
        let Some(stored) = self
            .open_shard(entry.shard as usize)
            .map(|s| s.bytes(entry))
        else {
            return;
        };
        // The first lines of a record (the first into L1, where the hash
        // starts; the others into L2, which tracks more misses at once): the
        // hardware prefetcher follows a sequential read once it has started,
        // but not across a 4 KiB page; so also the first line of each later
        // page, which starts that page's TLB walk (in a VM, a walk of the
        // host's tables too) early.
        let mut lines = stored.chunks(CACHE_LINE).take(PREFETCH_LINES);
        if let Some(first) = lines.next() {
            prefetch_line(first.as_ptr());
        }
        for line in lines {
            prefetch_line_to_l2(line.as_ptr());
        }
        for page in stored.chunks(PAGE).skip(1) {
            prefetch_line(page.as_ptr());
        }
    }

    /// Verify a large record where it is stored, for a reader that then copies
    /// it from there once (`stored_as_is`) instead of reading it into a buffer
    /// and copying it again. `Ok(false)`: the record is small, encoded or in a
    /// shard not open; read it with `read_into`.
    pub fn verify_in_place(&self, sample_id: u64) -> Result<bool> {
        match self.entry(sample_id) {
            // A shard not open yet (on object storage) is not read in place:
            // `read_into` fetches what it needs.
            Some(ref entry)
                if entry.stored_len >= LARGE_RECORD
                    && entry.stored_as_is()
                    && self.open_shard(entry.shard as usize).is_some() =>
            {
                self.check_record(sample_id, entry, self.stored_bytes(entry)?)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Record `sample_id`'s payload as a buffer lent from its mapped shard,
    /// verified (`lend`): Ok(None) when it is not lent (small, encoded, its
    /// shard not open or not leased now); copy it with `read_into` then.
    pub fn lend(&self, sample_id: u64) -> Result<Option<arrow_buffer::Buffer>> {
        let Some(ref entry) = self.entry(sample_id) else {
            return Ok(None);
        };
        if entry.stored_len < LARGE_RECORD || !entry.stored_as_is() {
            return Ok(None);
        }
        // A shard not open yet is not lent from: `read_into` fetches the
        // record (and opens the shard when it is here).
        let Some(lender) = self
            .open_shard(entry.shard as usize)
            .and_then(|s| s.lender.as_ref())
        else {
            return Ok(None);
        };
        let Some(lent) = lender.lend(entry.offset as usize, entry.stored_len as usize) else {
            return Ok(None);
        };
        // Verified once lent: a writer arriving now finds the range on loan
        // and waits until it is a private copy of these bytes.
        self.check_record(sample_id, entry, lent.as_slice())?;
        Ok(Some(lent))
    }

    /// Record `sample_id`'s bytes in its memory-mapped shard when they are
    /// stored as is (no codec), unverified: `verify_in_place` checks them
    /// (and opens the shard; None until then).
    pub fn stored_as_is(&self, sample_id: u64) -> Option<&[u8]> {
        let entry = &self.entry(sample_id)?;
        if !entry.stored_as_is() {
            return None;
        }
        self.open_shard(entry.shard as usize)
            .map(|s| s.bytes(entry))
    }

    /// Ask for the index entry of `sample_id` (what `prefetch` reads first):
    /// called further ahead than `prefetch`, so that its lookup does not wait.
    pub fn prefetch_entry(&self, sample_id: u64) {
        if let Some(entry) = self.index.get(sample_id as usize) {
            prefetch_line(entry);
        }
    }

    /// Read a large record with one positioned read into `out`.
    fn pread_into(&self, sample_id: u64, entry: &IndexEntry, out: &mut Vec<u8>) -> Result<()> {
        let shard = entry.shard as usize;
        let read_error = |e: std::io::Error| {
            Error::corrupt(&self.shard_paths[shard], format!("record {sample_id}: {e}"))
        };
        let start = out.len();
        // Index entries are checked against their shard's length at open, so
        // a record with bytes has a shard with bytes.
        let Some(lender) = &self.shard(shard)?.lender else {
            return Err(read_error(std::io::ErrorKind::UnexpectedEof.into()));
        };
        let file = lender.file();
        if entry.stored_as_is() {
            let checked = append_exact_at(file, out, entry.raw_len as usize, entry.offset)
                .map_err(read_error)
                .and_then(|()| self.check_record(sample_id, entry, &out[start..]));
            if checked.is_err() {
                out.truncate(start);
            }
            return checked;
        }
        let mut stored = Vec::new();
        append_exact_at(file, &mut stored, entry.stored_len as usize, entry.offset)
            .map_err(read_error)?;
        self.check_record(sample_id, entry, &stored)?;
        self.decode_record(sample_id, entry, &stored, out)
    }

    fn check_record(&self, sample_id: u64, entry: &IndexEntry, stored: &[u8]) -> Result<()> {
        let computed = xxh3_64(stored);
        if computed != entry.checksum {
            return Err(Error::corrupt(
                &self.shard_paths[entry.shard as usize],
                format!(
                    "record {sample_id} fails its checksum (index says {}, data hashes to {})",
                    hex64(entry.checksum),
                    hex64(computed),
                ),
            ));
        }
        Ok(())
    }

    fn decode_record(
        &self,
        sample_id: u64,
        entry: &IndexEntry,
        stored: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let start = out.len();
        out.resize(start + entry.raw_len as usize, 0);
        decode_into(entry.codec, stored, &mut out[start..]).map_err(|detail| {
            out.truncate(start);
            Error::corrupt(
                &self.shard_paths[entry.shard as usize],
                format!("record {sample_id}: {detail}"),
            )
        })
    }

    pub fn read(&self, sample_id: u64) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.raw_len(sample_id) as usize);
        self.read_into(sample_id, &mut out)?;
        Ok(out)
    }

    fn stored_bytes(&self, entry: &IndexEntry) -> Result<&[u8]> {
        Ok(self.shard(entry.shard as usize)?.bytes(entry))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{self, payload};
    use super::*;
    use crate::storage::Codec;

    const LARGE: usize = LARGE_RECORD as usize;

    /// Small, empty and large records, compressible (a codec applies) or not.
    const LENS: [usize; 5] = [100, 0, 3000, LARGE + 10, 40];

    #[test]
    fn every_record_reads_back_appended_after_what_out_holds() {
        let base = tempfile::tempdir().unwrap();
        for (name, codec) in [("n", Codec::None), ("l", Codec::Lz4), ("z", Codec::Zstd)] {
            let dir = fixture::write(base.path(), name, &LENS, codec, 1 << 16);
            let cache = Cache::open(&dir, true).unwrap();
            for (i, &len) in LENS.iter().enumerate() {
                let mut out = b"kept".to_vec();
                cache.read_into(i as u64, &mut out).unwrap();
                assert_eq!(&out[..4], b"kept");
                assert_eq!(out[4..], payload(i as u64, len), "{codec:?} record {i}");
                assert_eq!(cache.read(i as u64).unwrap(), payload(i as u64, len));
                let entry = cache.entry(i as u64).unwrap();
                cache.prefetch(&entry);
                cache.prefetch_entry(i as u64);
            }
            let err = cache.read(LENS.len() as u64).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(
                err.to_string().contains("sample_id 5 is out of range"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_damaged_record_fails_its_checksum_and_leaves_out_as_it_was() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &LENS, Codec::None, 1 << 30);
        let large = Cache::open(&dir, false).unwrap().entry(3).unwrap();
        fixture::flip(&dir, "shard-00000.bin", 50);
        fixture::flip(&dir, "shard-00000.bin", large.offset as usize + 7);
        let cache = Cache::open(&dir, false).unwrap();
        for damaged in [0, 3] {
            let mut out = b"kept".to_vec();
            let err = cache.read_into(damaged, &mut out).unwrap_err();
            assert!(matches!(err, Error::CorruptCache { .. }), "{err:?}");
            let expected = format!("record {damaged} fails its checksum");
            assert!(err.to_string().contains(&expected), "{err}");
            assert!(err.to_string().contains("shard-00000.bin"), "{err}");
            assert_eq!(out, b"kept");
        }
        assert_eq!(cache.read(2).unwrap(), payload(2, 3000), "the others read");
        assert!(cache.verify_in_place(3).is_err());
        assert!(
            !matches!(cache.lend(3), Ok(Some(_))),
            "never lent unverified"
        );
    }

    #[test]
    fn large_records_stored_as_is_are_lent_or_verified_in_place() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &LENS, Codec::None, 1 << 30);
        let cache = Cache::open(&dir, false).unwrap();
        let large = payload(3, LARGE + 10);
        match cache.lend(3).unwrap() {
            Some(lent) => assert_eq!(lent.as_slice(), large.as_slice()),
            None => eprintln!("no leases here; a large record is copied instead"),
        }
        assert!(cache.lend(0).unwrap().is_none(), "a small record is copied");
        assert!(cache.lend(99).unwrap().is_none(), "past the end");
        assert!(cache.verify_in_place(3).unwrap());
        assert!(!cache.verify_in_place(0).unwrap(), "small: read_into");
        assert_eq!(cache.stored_as_is(3), Some(large.as_slice()));
        assert_eq!(cache.stored_as_is(0), Some(payload(0, 100).as_slice()));

        let dir = fixture::write(base.path(), "z", &LENS, Codec::Zstd, 1 << 30);
        let cache = Cache::open(&dir, false).unwrap();
        assert!(
            cache.lend(3).unwrap().is_none(),
            "an encoded record is decoded"
        );
        assert!(!cache.verify_in_place(3).unwrap());
        assert!(cache.stored_as_is(3).is_none());
    }
}
