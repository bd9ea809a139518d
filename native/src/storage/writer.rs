//! `CacheWriter`: appends encoded records in order, rotates shards, and publishes
//! the finished cache atomically. Dropping an unfinished writer removes its
//! temporary directory. The writer holds the temporary directory's lock until
//! it is published or removed, so other writers know it is not abandoned.

use std::fs::{self, File};
use std::io::Write;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};

use crate::hash::{xxh3_64, Xxh3};

use super::codec::{Compression, EncodedRecord, Encoding};
use super::direct::DirectWriter;
use super::gather::{ShardOut, StoredBytes};
use super::index::IndexEntry;
use super::manifest::{FileEntry, Manifest};
use super::metadata_out::{MetadataOut, METADATA_BATCH_BYTES, METADATA_BATCH_ROWS};
use super::profile::{timed, Stage, WriteProfile};
use super::publish::EMPTY_SOURCE;
use super::publish::{create_partial_dir, fsync_file, publish, validate_source_name};
use super::schema::{ColumnSpec, MetaValue};
use super::temp::LockedTemp;
use super::{hex64, shard_file_name, INDEX_FILE, MANIFEST_FILE};

use crate::error::{Error, IoContext, Result};

/// How a cache is written. The types carry the rules (`NonZero*`, a checked
/// `Compression`); `WriterOptions::new` is the one place raw values are checked.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// Most records handed to the workers and not yet committed (used by
    /// `WritePipeline`; `CacheWriter` appends records one at a time).
    pub prefetch_records: NonZeroUsize,
    /// A shard is closed before it would pass this many bytes (a single larger
    /// record gets a shard of its own).
    pub max_shard_bytes: NonZeroU64,
    pub compression: Compression,
}

const DEFAULT_PREFETCH_RECORDS: NonZeroUsize = match NonZeroUsize::new(64) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};
const DEFAULT_MAX_SHARD_BYTES: NonZeroU64 = match NonZeroU64::new(64 << 20) {
    Some(n) => n,
    None => NonZeroU64::MIN,
};

impl WriterOptions {
    /// Options from the raw values a caller passes (`write_cache`'s keywords).
    pub fn new(
        prefetch_size: usize,
        max_shard_bytes: u64,
        compression: Compression,
    ) -> Result<Self> {
        Ok(WriterOptions {
            prefetch_records: NonZeroUsize::new(prefetch_size).ok_or_else(|| {
                Error::invalid("prefetch_size must be greater than zero (>= 1), got 0")
            })?,
            max_shard_bytes: NonZeroU64::new(max_shard_bytes).ok_or_else(|| {
                Error::invalid("max_shard_bytes must be greater than zero (>= 1), got 0")
            })?,
            compression,
        })
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            prefetch_records: DEFAULT_PREFETCH_RECORDS,
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
            compression: Compression::default(),
        }
    }
}

struct OpenShard {
    path: PathBuf,
    bytes: u64,
    records: u64,
    hasher: Xxh3,
}

/// `index.bin` written as records are appended (40 bytes a record would
/// otherwise be held until the end: 4 GB for 10^8 records), hashed as it goes.
struct IndexOut {
    path: PathBuf,
    /// Written around the page cache, as shards are: its first reader then
    /// maps it with huge pages (`Cache::open`), which pages left behind by
    /// buffered writes cannot be. `None` once finished.
    out: Option<DirectWriter>,
    hash: Xxh3,
    bytes: u64,
    entry: Vec<u8>,
}

impl IndexOut {
    fn create(dir: &Path) -> Result<Self> {
        let path = dir.join(INDEX_FILE);
        let file = File::create(&path).at("cannot create", &path)?;
        Ok(IndexOut {
            out: Some(DirectWriter::new(file, None).at("cannot write", &path)?),
            path,
            hash: Xxh3::new(),
            bytes: 0,
            entry: Vec::with_capacity(super::index::INDEX_ENTRY_BYTES),
        })
    }

    fn push(&mut self, entry: &IndexEntry) -> Result<()> {
        self.entry.clear();
        entry.encode(&mut self.entry);
        self.hash.update(&self.entry);
        self.bytes += self.entry.len() as u64;
        let out = self.out.as_mut().ok_or_else(|| {
            Error::internal(format!("{} is written already", self.path.display()))
        })?;
        out.write_all(&self.entry).at("cannot write", &self.path)
    }

    /// Written and fsynced: the manifest's entry for the file.
    fn finish(&mut self) -> Result<FileEntry> {
        let out = self.out.take().ok_or_else(|| {
            Error::internal(format!("{} is written already", self.path.display()))
        })?;
        let (file, _) = out.finish().at("cannot write", &self.path)?;
        file.sync_all().at("cannot fsync", &self.path)?;
        Ok(FileEntry {
            file: INDEX_FILE.to_string(),
            bytes: self.bytes,
            xxh3: hex64(self.hash.digest()),
            records: None,
        })
    }
}

pub struct CacheWriter {
    name: String,
    target: PathBuf,
    partial: LockedTemp,
    options: WriterOptions,
    columns: Vec<ColumnSpec>,
    /// `metadata.arrow`, written a batch of records at a time.
    metadata: MetadataOut,
    shard: Option<OpenShard>,
    /// Writes every shard in turn (around the page cache where it can).
    out: ShardOut,
    shards: Vec<FileEntry>,
    index: IndexOut,
    identity: Xxh3,
    records: u64,
    payload_bytes: u64,
    stored_bytes: u64,
    finished: bool,
}

impl CacheWriter {
    /// Start writing `base/name`. When that cache exists, the records are
    /// written all the same and compared by id when they are published
    /// (`publish`): the same records reuse it, others are refused.
    pub fn create(
        base: &Path,
        name: &str,
        columns: Vec<ColumnSpec>,
        options: WriterOptions,
    ) -> Result<Self> {
        Self::create_batched(base, name, columns, options, METADATA_BATCH_ROWS)
    }

    /// `create`, with a batch of `metadata.arrow` every `metadata_rows` records
    /// (tests write several batches from a few records).
    pub(crate) fn create_batched(
        base: &Path,
        name: &str,
        columns: Vec<ColumnSpec>,
        options: WriterOptions,
        metadata_rows: usize,
    ) -> Result<Self> {
        validate_source_name(name)?;
        let target = base.join(name);
        let partial = create_partial_dir(base, name)?;
        let opened = IndexOut::create(partial.path()).and_then(|index| {
            let metadata = MetadataOut::with_batches(
                partial.path(),
                &columns,
                metadata_rows,
                METADATA_BATCH_BYTES,
            )?;
            Ok((index, metadata))
        });
        let (index, metadata) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                // As `drop` does for a writer that fails later.
                let _ = fs::remove_dir_all(partial.path());
                return Err(error.naming_target(partial.path(), &target));
            }
        };
        let mut identity = Xxh3::new();
        identity.update(b"dataset_rt.cache.v1\0");
        identity.update(name.as_bytes());
        identity.update(&[0]);
        for column in &columns {
            identity.update(column.name.as_bytes());
            identity.update(&[0, column.dtype as u8]);
        }
        Ok(CacheWriter {
            name: name.to_string(),
            target,
            partial,
            options,
            metadata,
            columns,
            shard: None,
            out: ShardOut::new(),
            shards: Vec::new(),
            index,
            identity,
            records: 0,
            payload_bytes: 0,
            stored_bytes: 0,
            finished: false,
        })
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// Append the next record (records are numbered in append order).
    pub fn append(&mut self, record: &EncodedRecord, metadata: &[MetaValue]) -> Result<()> {
        let stored = StoredBytes::Shared(record.stored.clone());
        self.append_stored(stored, record.encoding(), metadata)
    }

    /// Append the next record from its stored bytes and their `encoding`
    /// (the columnar writer's records are slices of an Arrow buffer).
    pub fn append_stored(
        &mut self,
        stored: StoredBytes<'_>,
        record: Encoding,
        metadata: &[MetaValue],
    ) -> Result<()> {
        self.append_partial(stored, record, metadata)
            .map_err(|e| self.named(e))
    }

    /// An error of a write to the temporary directory, a full volume named
    /// at the cache's directory (the temporary one is removed when the
    /// write fails: `drop`).
    fn named(&self, error: Error) -> Error {
        error.naming_target(self.partial.path(), &self.target)
    }

    fn append_partial(
        &mut self,
        stored: StoredBytes<'_>,
        record: Encoding,
        metadata: &[MetaValue],
    ) -> Result<()> {
        let stored_len = stored.as_slice().len() as u64;
        if metadata.len() != self.columns.len() {
            return Err(Error::Schema(format!(
                "record {} has {} metadata values, the schema has {} columns",
                self.records,
                metadata.len(),
                self.columns.len()
            )));
        }
        let needs_new_shard = match &self.shard {
            None => true,
            Some(s) => s.bytes > 0 && s.bytes + stored_len > self.options.max_shard_bytes.get(),
        };
        if needs_new_shard {
            self.close_shard()?;
            let path = self
                .partial
                .path()
                .join(shard_file_name(self.shards.len() as u32));
            self.out.open(&path).at("cannot create", &path)?;
            self.shard = Some(OpenShard {
                path,
                bytes: 0,
                records: 0,
                hasher: Xxh3::new(),
            });
        }
        let shard_number = self.shards.len() as u32;
        let Some(shard) = self.shard.as_mut() else {
            return Err(Error::internal("no open shard"));
        };
        shard.hasher.update(stored.as_slice());
        self.out.push(stored).at("cannot write", &shard.path)?;
        self.index.push(&IndexEntry {
            shard: shard_number,
            codec: record.codec,
            offset: shard.bytes,
            stored_len,
            raw_len: record.raw_len,
            checksum: record.checksum,
        })?;
        shard.bytes += stored_len;
        shard.records += 1;
        self.metadata.push(metadata)?;
        self.identity.update(&record.raw_len.to_le_bytes());
        self.identity.update(&record.raw_hash.to_le_bytes());
        for value in metadata {
            value.hash_into(&mut self.identity);
        }
        self.records += 1;
        self.payload_bytes += record.raw_len;
        self.stored_bytes += stored_len;
        Ok(())
    }

    fn close_shard(&mut self) -> Result<()> {
        if let Some(shard) = self.shard.take() {
            let file = self.out.close().at("cannot write", &shard.path)?;
            file.sync_all().at("cannot fsync", &shard.path)?;
            self.shards.push(FileEntry {
                file: file_name(&shard.path),
                bytes: shard.bytes,
                xxh3: hex64(shard.hasher.digest()),
                records: Some(shard.records),
            });
        }
        Ok(())
    }

    /// Write the index, metadata and manifest, then publish. Returns the path
    /// and the manifest (an existing cache's, when it holds the same records).
    pub fn finish(self) -> Result<(PathBuf, Manifest)> {
        self.finish_profiled(None)
    }

    /// `finish`, counting its two stages (manifest, publication) in `profile`.
    pub fn finish_profiled(
        mut self,
        profile: Option<&WriteProfile>,
    ) -> Result<(PathBuf, Manifest)> {
        if self.records == 0 {
            return Err(Error::Source(EMPTY_SOURCE.to_string()));
        }
        let manifest = timed(profile, Stage::FinishManifest, 0, || self.write_manifest())
            .map_err(|e| self.named(e))?;
        let reused = timed(profile, Stage::Publish, 0, || {
            publish(self.partial.path(), &self.target, manifest.cache_id)
        })
        .map_err(|e| self.named(e))?;
        // Kept when published; removed (by `drop`) when the existing cache is.
        self.finished = !reused;
        Ok((self.target.clone(), manifest))
    }

    /// Close the last shard; write the index, the metadata and the manifest.
    fn write_manifest(&mut self) -> Result<Manifest> {
        self.close_shard()?;
        let index = self.index.finish()?;
        let metadata = self.metadata.finish()?;
        let manifest = Manifest {
            source_name: self.name.clone(),
            cache_id: self.identity.digest(),
            record_count: self.records,
            columns: self.columns.clone(),
            compression: self.options.compression,
            payload_bytes: self.payload_bytes,
            stored_bytes: self.stored_bytes,
            index,
            metadata,
            shards: std::mem::take(&mut self.shards),
            writer: format!("dataset_rt {}", env!("CARGO_PKG_VERSION")),
        };
        self.write_file(MANIFEST_FILE, &manifest.to_bytes()?)?;
        Ok(manifest)
    }

    fn write_file(&self, name: &str, bytes: &[u8]) -> Result<FileEntry> {
        let path = self.partial.path().join(name);
        fs::write(&path, bytes).at("cannot write", &path)?;
        fsync_file(&path)?;
        Ok(FileEntry {
            file: name.to_string(),
            bytes: bytes.len() as u64,
            xxh3: hex64(xxh3_64(bytes)),
            records: None,
        })
    }
}

impl Drop for CacheWriter {
    fn drop(&mut self) {
        if !self.finished {
            // Removed before `partial` (and with it the lock) is dropped.
            let _ = fs::remove_dir_all(self.partial.path());
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use arrow_ipc::writer::FileWriter;

    use super::*;
    use crate::storage::cache::fixture::label_split_columns;

    #[test]
    fn options_are_checked_once_with_the_argument_named() {
        let options = WriterOptions::new(4, 1000, Compression::default()).unwrap();
        assert_eq!(options.prefetch_records.get(), 4);
        assert_eq!(options.max_shard_bytes.get(), 1000);
        for (prefetch, shard, message) in [
            (
                0,
                1000,
                "prefetch_size must be greater than zero (>= 1), got 0",
            ),
            (
                4,
                0,
                "max_shard_bytes must be greater than zero (>= 1), got 0",
            ),
        ] {
            let err = WriterOptions::new(prefetch, shard, Compression::default()).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert_eq!(err.to_string(), message);
        }
        let defaults = WriterOptions::default();
        assert_eq!(defaults.prefetch_records.get(), 64);
        assert_eq!(defaults.max_shard_bytes.get(), 64 << 20);
    }

    fn write(base: &Path, records: &[&[u8]]) -> Result<(PathBuf, Manifest)> {
        let mut writer = CacheWriter::create(base, "c", Vec::new(), WriterOptions::default())?;
        for record in records {
            writer.append(
                &EncodedRecord::encode(record.to_vec(), Compression::default())?,
                &[],
            )?;
        }
        writer.finish()
    }

    fn entries(base: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(base)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_write_over_an_existing_cache_reuses_the_same_records_and_refuses_others() {
        let base = tempfile::tempdir().unwrap();
        let (path, first) = write(base.path(), &[b"a", b"b"]).unwrap();
        let shard = fs::read(path.join(crate::storage::shard_file_name(0))).unwrap();
        let (again, second) = write(base.path(), &[b"a", b"b"]).unwrap();
        assert_eq!((again, second.cache_id), (path.clone(), first.cache_id));
        assert_eq!(entries(base.path()), ["c"], "no partial directory is left");

        let refused = write(base.path(), &[b"a", b"c"]).unwrap_err();
        assert!(matches!(refused, Error::InvalidArgument(_)), "{refused:?}");
        let message = refused.to_string();
        assert!(
            message.contains("already exists and holds other records")
                && message.contains(&format!("cache_id {}", first.cache_id))
                && message.contains("c_v2"),
            "{message}"
        );
        assert_eq!(entries(base.path()), ["c"]);
        let kept = fs::read(path.join(crate::storage::shard_file_name(0))).unwrap();
        assert_eq!(kept, shard, "the existing cache is unchanged");
    }

    /// Cache `name` of 10 records, a batch of `metadata.arrow` every `rows`.
    fn write_labelled(base: &Path, name: &str, rows: usize) -> (PathBuf, Manifest) {
        let options = WriterOptions::default();
        let mut writer =
            CacheWriter::create_batched(base, name, label_split_columns(), options, rows).unwrap();
        for i in 0..10u64 {
            let record = EncodedRecord::encode(vec![i as u8; i as usize], options.compression);
            let values = [
                MetaValue::Int(i as i64 * 7 - 20),
                MetaValue::Str(format!("s{}", i % 3)),
            ];
            writer.append(&record.unwrap(), &values).unwrap();
        }
        writer.finish().unwrap()
    }

    /// The labels and splits of an open cache, by sample id.
    fn labels_and_splits(cache: &crate::storage::Cache) -> Vec<(u64, i64, String)> {
        use arrow_array::{Int64Array, StringArray, UInt64Array};
        let metadata = cache.metadata();
        let ids = metadata.typed::<UInt64Array>(0).unwrap();
        let labels = metadata.typed::<Int64Array>(1).unwrap();
        let splits = metadata.typed::<StringArray>(2).unwrap();
        (0..metadata.num_rows())
            .map(|row| {
                (
                    ids.value(row),
                    labels.value(row),
                    splits.value(row).to_string(),
                )
            })
            .collect()
    }

    fn batch_rows(cache: &crate::storage::Cache) -> Vec<usize> {
        let batches = cache.metadata().batches();
        batches.iter().map(|b| b.num_rows()).collect()
    }

    #[test]
    fn metadata_written_in_several_batches_reads_back_as_one_batch_did() {
        use crate::storage::{Cache, METADATA_FILE};
        let base = tempfile::tempdir().unwrap();
        let (batched, ours) = write_labelled(&base.path().join("batched"), "c", 3);
        let (single, theirs) =
            write_labelled(&base.path().join("single"), "c", METADATA_BATCH_ROWS);
        assert_eq!(
            ours.cache_id, theirs.cache_id,
            "the batches are not the identity"
        );
        assert_eq!(
            (ours.index.xxh3.clone(), ours.shards.clone()),
            (theirs.index.xxh3.clone(), theirs.shards.clone())
        );
        for (dir, manifest) in [(&batched, &ours), (&single, &theirs)] {
            let bytes = fs::read(dir.join(METADATA_FILE)).unwrap();
            assert_eq!(manifest.metadata.file, METADATA_FILE);
            assert_eq!(manifest.metadata.bytes, bytes.len() as u64);
            assert_eq!(manifest.metadata.xxh3, hex64(xxh3_64(&bytes)));
        }
        let (ours, theirs) = (
            Cache::open(&batched, true).unwrap(),
            Cache::open(&single, true).unwrap(),
        );
        assert_eq!(batch_rows(&ours), [3, 3, 3, 1]);
        assert_eq!(batch_rows(&theirs), [10]);
        let expected: Vec<(u64, i64, String)> = (0..10)
            .map(|i| (i, i as i64 * 7 - 20, format!("s{}", i % 3)))
            .collect();
        assert_eq!(labels_and_splits(&ours), expected);
        assert_eq!(labels_and_splits(&theirs), expected);
        assert_eq!(ours.verify().unwrap().records, 10);
    }

    #[test]
    fn a_cache_whose_metadata_is_one_batch_of_all_records_opens_unchanged() {
        use crate::storage::{Cache, METADATA_FILE};
        // What versions before the batches wrote for any number of records:
        // the batches of a cache written now, as one batch, listed in its manifest.
        let base = tempfile::tempdir().unwrap();
        let (dir, mut manifest) = write_labelled(base.path(), "old", 4);
        let cache = Cache::open(&dir, false).unwrap();
        let expected = labels_and_splits(&cache);
        let batches = cache.metadata().batches().to_vec();
        let schema = cache.metadata().schema().clone();
        drop(cache);
        let one = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
        let mut bytes = Vec::new();
        let mut writer = FileWriter::try_new(&mut bytes, &schema).unwrap();
        writer.write(&one).unwrap();
        writer.finish().unwrap();
        drop(writer);
        fs::write(dir.join(METADATA_FILE), &bytes).unwrap();
        manifest.metadata.bytes = bytes.len() as u64;
        manifest.metadata.xxh3 = hex64(xxh3_64(&bytes));
        fs::write(dir.join(MANIFEST_FILE), manifest.to_bytes().unwrap()).unwrap();

        let cache = Cache::open(&dir, true).unwrap();
        assert_eq!(batch_rows(&cache), [10]);
        assert_eq!(labels_and_splits(&cache), expected);
        assert_eq!(cache.verify().unwrap().records, 10);
    }
}
