//! Reading a published cache: checked at open, every record checksummed on read.
//!
//! `Cache` is one open cache directory; its jobs live in one file each:
//!
//! | file | job |
//! |------|-----|
//! | `open.rs` | opening a cache directory, each file checked against the manifest |
//! | `shard.rs` | one open shard file: its mapping, its identity on disk |
//! | `metadata.rs` | `metadata.arrow`, decoded in place and checked against the manifest; `CacheMetadata`, its rows by number over its batches |
//! | `source.rs` | where shard files come from: in place, or fetched on first read (`ShardSource`) |
//! | `remote.rs` | a cache on object storage, through a local mirror |
//! | `planned.rs` | records of a cache on object storage fetched by range ahead of a stream, shards whole when cheaper |
//! | `read.rs` | reading records: copied, prefetched, lent, or verified in place |
//! | `verify.rs` | checking an open cache again: every checksum, a file cut or replaced |
//! | `set.rs` | `CacheSet`: the caches of one dataset, by position or `cache_id` |

mod checked;
mod metadata;
mod open;
mod planned;
mod read;
mod remote;
mod set;
mod shard;
mod source;
pub use shard::{identity as file_stamp, Stamp};
mod verify;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use super::index::{IndexEntry, StoredEntry};
use super::manifest::Manifest;
use super::schema::ColumnSpec;
use super::slab::Slab;
use crate::os::mapped::MappedFile;
use shard::Shard;

pub use metadata::{CacheMetadata, TypedColumn};
pub use set::CacheSet;
pub use verify::VerifyReport;

/// One open cache. Its shards, index and metadata are memory-mapped (their
/// checksums verified when the cache is opened), so an open cache costs page
/// cache, which the kernel reclaims, not process memory.
pub struct Cache {
    dir: PathBuf,
    manifest: Manifest,
    index: Slab<StoredEntry>,
    /// `sample_id` plus the stored metadata columns, one row per record.
    metadata: CacheMetadata,
    /// The mapped `index.bin` and `metadata.arrow`, to tell a cut one.
    mapped_files: Vec<(&'static str, Arc<MappedFile>)>,
    /// Opened with the cache, or (on object storage) when first read.
    shards: Vec<OnceLock<Shard>>,
    /// Set once every shard is open (a shard, once open, stays open).
    every_shard_open: AtomicBool,
    shard_paths: Vec<PathBuf>,
    /// One lock per shard held while it is brought and opened on a first
    /// read, so that one fetch does not wait for another.
    opening: Vec<Mutex<()>>,
    /// Where shard files come from (`source.rs`).
    source: Box<dyn source::ShardSource>,
}

impl Cache {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn cache_id(&self) -> u64 {
        self.manifest.cache_id
    }

    pub fn len(&self) -> u64 {
        self.manifest.record_count
    }

    pub fn is_empty(&self) -> bool {
        self.manifest.record_count == 0
    }

    pub fn columns(&self) -> &[ColumnSpec] {
        &self.manifest.columns
    }

    /// `sample_id` followed by the stored columns, as `metadata.arrow`'s
    /// batches lie in its mapping.
    pub fn metadata(&self) -> &CacheMetadata {
        &self.metadata
    }

    /// Record `sample_id`'s index entry (None past the end, or damaged). A
    /// random read of the index: a stream's planner reads it once, for the
    /// record's length, and hands it to the batch builder (`read_entry_into`).
    #[inline]
    pub fn entry(&self, sample_id: u64) -> Option<IndexEntry> {
        self.index.get(sample_id as usize)?.entry()
    }

    pub fn raw_len(&self, sample_id: u64) -> u64 {
        self.index
            .get(sample_id as usize)
            .map(|e| e.raw_len)
            .unwrap_or(0)
    }
}

/// Small caches (and the column lists they are written with) for the tests
/// of every file of this module and of the writers (`storage::writer`,
/// `metadata_out`, `pipeline`).
#[cfg(test)]
pub(crate) mod fixture {
    use std::num::NonZeroU64;
    use std::path::{Path, PathBuf};

    use crate::storage::{
        CacheWriter, Codec, ColumnSpec, Compression, EncodedRecord, MetaType, MetaValue,
        WriterOptions,
    };

    /// The stored columns of the writers' tests: an integer `label` and a
    /// string `split`.
    pub fn label_split_columns() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec {
                name: "label".into(),
                dtype: MetaType::Int64,
            },
            ColumnSpec {
                name: "split".into(),
                dtype: MetaType::String,
            },
        ]
    }

    /// Record `i`'s payload: `len` bytes that differ from record to record.
    pub fn payload(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|b| (i as usize * 31 + b * 7) as u8).collect()
    }

    /// Write cache `name` under `base` with one record per entry of `lens`
    /// (record `i` is `payload(i, lens[i])`, its `label` is `i`), shards cut
    /// at `max_shard_bytes`; returns its directory.
    pub fn write(
        base: &Path,
        name: &str,
        lens: &[usize],
        codec: Codec,
        max_shard_bytes: u64,
    ) -> PathBuf {
        let columns = vec![ColumnSpec {
            name: "label".into(),
            dtype: MetaType::Int64,
        }];
        let options = WriterOptions {
            max_shard_bytes: NonZeroU64::new(max_shard_bytes).unwrap(),
            compression: Compression::new(codec, 3).unwrap(),
            ..WriterOptions::default()
        };
        let mut writer = CacheWriter::create(base, name, columns, options).unwrap();
        for (i, &len) in lens.iter().enumerate() {
            let record = EncodedRecord::encode(payload(i as u64, len), options.compression);
            writer
                .append(&record.unwrap(), &[MetaValue::Int(i as i64)])
                .unwrap();
        }
        writer.finish().unwrap().0
    }

    /// Write cache `name` of `records` records of 10 bytes (labels as in
    /// `write`) with a batch of `metadata.arrow` every `metadata_rows` records.
    pub fn write_batched(base: &Path, name: &str, records: u64, metadata_rows: usize) -> PathBuf {
        let columns = vec![ColumnSpec {
            name: "label".into(),
            dtype: MetaType::Int64,
        }];
        let options = WriterOptions::default();
        let mut writer =
            CacheWriter::create_batched(base, name, columns, options, metadata_rows).unwrap();
        for i in 0..records {
            let record = EncodedRecord::encode(payload(i, 10), options.compression);
            writer
                .append(&record.unwrap(), &[MetaValue::Int(i as i64)])
                .unwrap();
        }
        writer.finish().unwrap().0
    }

    /// Flip one byte of the file `dir/file` at `offset`, keeping its length.
    pub fn flip(dir: &Path, file: &str, offset: usize) {
        let path = dir.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[offset] ^= 0x55;
        std::fs::write(&path, bytes).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt64Type};

    use super::fixture;
    use super::*;
    use crate::storage::{Codec, MetaType};

    #[test]
    fn an_open_cache_describes_its_records_and_their_metadata() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[10, 0, 300], Codec::None, 1 << 20);
        let cache = Cache::open(&dir, true).unwrap();
        assert_eq!(cache.dir(), dir.as_path());
        assert_eq!((cache.len(), cache.is_empty()), (3, false));
        assert_eq!(cache.cache_id(), cache.manifest().cache_id);
        assert_eq!(cache.columns().len(), 1);
        assert_eq!(
            (cache.columns()[0].name.as_str(), cache.columns()[0].dtype),
            ("label", MetaType::Int64)
        );
        let metadata = cache.metadata();
        assert_eq!(metadata.num_rows(), 3);
        let ids = metadata.column_slice(0, 0, 3).unwrap();
        let labels = metadata.column_slice(1, 0, 3).unwrap();
        assert_eq!(
            ids.as_primitive::<UInt64Type>().values().to_vec(),
            [0, 1, 2]
        );
        assert_eq!(
            labels.as_primitive::<Int64Type>().values().to_vec(),
            [0, 1, 2]
        );
        let lens: Vec<u64> = (0..4).map(|i| cache.raw_len(i)).collect();
        assert_eq!(lens, vec![10, 0, 300, 0], "past the end: 0");
        assert_eq!(cache.entry(2).map(|e| e.raw_len), Some(300));
        assert!(cache.entry(3).is_none(), "past the end: no entry");
    }
}
