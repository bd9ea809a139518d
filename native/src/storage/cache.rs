//! Reading a published cache: checked at open, every record checksummed on read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::hash::xxh3_64;
use arrow_array::{Array, RecordBatch};

use super::codec::decode_into;
use super::index::{IndexEntry, StoredEntry, INDEX_ENTRY_BYTES};
use super::lend::Lender;
use super::manifest::{FileEntry, Manifest};
use super::pread::append_exact_at;
use super::schema::ColumnSpec;
use super::slab::Slab;
use super::LARGE_RECORD;
use super::{hex64, INDEX_FILE, MANIFEST_FILE, METADATA_FILE};
use crate::error::{Error, IoContext, Result};
use crate::os::mapped::{self, MappedFile};
use crate::os::prefetch::{prefetch_line, prefetch_line_to_l2};
use crate::remote::Bucket;

/// One open cache. Its shards, index and metadata are memory-mapped (their
/// checksums verified when the cache is opened), so an open cache costs page
/// cache, which the kernel reclaims, not process memory.
pub struct Cache {
    dir: PathBuf,
    manifest: Manifest,
    index: Slab<StoredEntry>,
    /// `sample_id` plus the stored metadata columns, one row per record.
    metadata: RecordBatch,
    /// The mapped `index.bin` and `metadata.arrow`, to tell a cut one.
    mapped_files: Vec<(&'static str, Arc<MappedFile>)>,
    /// Opened with the cache, or (on object storage) when first read.
    shards: Vec<OnceLock<Shard>>,
    shard_paths: Vec<PathBuf>,
    /// Where shards not in `dir` yet come from (a cache on object storage),
    /// with one lock per shard so that one fetch does not wait for another.
    remote: Option<Remote>,
}

/// The object storage a cache's shards are fetched from.
struct Remote {
    bucket: Bucket,
    fetching: Vec<Mutex<()>>,
    /// The mirror the shards go to, bounded as a whole (`mirror`).
    mirror: PathBuf,
}

/// One open shard file.
struct Shard {
    /// The shard's mapping and file, and the large records lent from it
    /// (None for an empty shard, which has no records to read).
    lender: Option<Arc<Lender>>,
    /// The file's (device, inode) when it was opened.
    identity: (u64, u64),
}

impl Shard {
    /// Open the shard `entry` at `path`, checked against the manifest's
    /// length (and with `verify`, its checksum).
    fn open(path: &Path, entry: &FileEntry, verify: bool) -> Result<Shard> {
        let file = File::open(path).map_err(|e| {
            Error::corrupt(
                path,
                format!("cannot open shard listed in the manifest: {e}"),
            )
        })?;
        let stat = file.metadata().at("cannot stat", path)?;
        let len = stat.len();
        if len != entry.bytes {
            return Err(Error::corrupt(
                path,
                format!("{len} bytes, the manifest says {}", entry.bytes),
            ));
        }
        // Cache files are immutable once published; one cut short under
        // the mapping anyway is survived (`mapped`) and reported.
        let map = if len == 0 {
            None
        } else {
            Some(Arc::new(
                MappedFile::map(&file).at("cannot memory-map", path)?,
            ))
        };
        if verify {
            let digest = hex64(xxh3_64(map.as_deref().map_or(&[][..], |m| &m[..])));
            check_digest(path, &entry.xxh3, &digest)?;
        }
        let file = Arc::new(file);
        if let Some(map) = &map {
            // Records are read at random: 2 MiB pages where the page cache
            // has them (see `crate::os::prefetch::huge_pages`); only a hint.
            crate::os::prefetch::huge_pages_hint(&map[..]);
        }
        Ok(Shard {
            lender: map.map(|m| Lender::new(m, file)),
            identity: identity(&stat),
        })
    }
}

const CACHE_LINE: usize = 64;
/// Lines of a record `Cache::prefetch` asks for (a 1 KiB record is 16; for
/// longer ones the hardware prefetcher follows the sequential read). Measured
/// on 1 KiB records: 16 lines cost less CPU per GiB than 2 (benchmarks/README.md).
const PREFETCH_LINES: usize = 16;
/// The base page size the hardware prefetcher stops at.
const PAGE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub files: u64,
    pub bytes: u64,
    pub records: u64,
}

impl Cache {
    /// Open `dir`, checking its structure and the small files' checksums. With
    /// `verify_shards`, every shard's full checksum is verified too.
    pub fn open(dir: &Path, verify_shards: bool) -> Result<Self> {
        Self::open_from(dir, verify_shards, None)
    }

    /// Open the cache published at `bucket` (`<url>/<name>`, see `upload`)
    /// through the local directory `mirror`: its manifest, index and metadata
    /// are fetched now (once), each shard when a read first needs it. Every
    /// record is verified by its checksum when read, as from a local cache.
    pub fn open_remote(bucket: &Bucket, mirror: &Path) -> Result<Self> {
        let published = super::upload::Published::read(bucket)?.ok_or_else(|| {
            Error::NotFound(format!(
                "no cache is published at {}; publish one with `python -m dataset_rt upload \
                 CACHE_DIR URL`",
                bucket.url()
            ))
        })?;
        let name = bucket.url().rsplit('/').next().unwrap_or("cache");
        let dir = mirror
            .join(hex64(xxh3_64(bucket.url().as_bytes())))
            .join(&published.version)
            .join(name);
        let files = bucket.child(&published.version);
        for file in [MANIFEST_FILE, INDEX_FILE, METADATA_FILE] {
            if !dir.join(file).exists() {
                files.download(file, &dir.join(file))?;
            }
        }
        let cache = Self::open_from(&dir, false, Some((files, mirror.to_path_buf())))?;
        if cache.cache_id() != published.cache_id {
            return Err(Error::corrupt(
                &dir,
                format!(
                    "the manifest fetched from {} names cache_id {}, its publication record {}",
                    bucket.url(),
                    hex64(cache.cache_id()),
                    hex64(published.cache_id)
                ),
            ));
        }
        Ok(cache)
    }

    /// Open `dir`; its shards now, or with `remote` when first read.
    fn open_from(
        dir: &Path,
        verify_shards: bool,
        remote: Option<(Bucket, PathBuf)>,
    ) -> Result<Self> {
        if !dir.exists() {
            return Err(Error::NotFound(format!(
                "cache directory {} does not exist; check the path, or write the cache first",
                dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(Error::corrupt(
                dir,
                "not a directory: expected a cache directory written by dataset_rt",
            ));
        }
        let manifest = Manifest::read(dir)?;
        // Mapped, not read: a cache costs page cache, not process memory.
        let index_map = map_checked(dir, &manifest.index, INDEX_FILE)?;
        let index_path = dir.join(INDEX_FILE);
        let expected = manifest.record_count as usize * INDEX_ENTRY_BYTES;
        if index_map.as_ref().map_or(0, |m| m.len()) != expected {
            return Err(Error::corrupt(
                &index_path,
                format!(
                    "{} bytes, expected {expected} for {} records",
                    manifest.index.bytes, manifest.record_count
                ),
            ));
        }
        let index: Slab<StoredEntry> = match &index_map {
            Some(map) => Slab::mapped(map, 0, manifest.record_count as usize)
                .map_err(|e| Error::corrupt(&index_path, e))?,
            None => Slab::from_vec(Vec::new()),
        };
        let (metadata, metadata_map) = read_metadata(dir, &manifest)?;
        let mapped_files: Vec<(&'static str, Arc<MappedFile>)> = index_map
            .iter()
            .map(|m| (INDEX_FILE, m.clone()))
            .chain([(METADATA_FILE, metadata_map)])
            .collect();
        let shard_paths: Vec<PathBuf> = manifest.shards.iter().map(|e| dir.join(&e.file)).collect();
        let shards = match &remote {
            Some(_) => manifest.shards.iter().map(|_| OnceLock::new()).collect(),
            None => manifest
                .shards
                .iter()
                .zip(&shard_paths)
                .map(|(entry, path)| Shard::open(path, entry, verify_shards).map(OnceLock::from))
                .collect::<Result<Vec<_>>>()?,
        };
        check_index_bounds(&index_path, &index, &manifest.shards)?;
        let remote = remote.map(|(bucket, mirror)| Remote {
            bucket,
            fetching: manifest.shards.iter().map(|_| Mutex::new(())).collect(),
            mirror,
        });
        Ok(Cache {
            dir: dir.to_path_buf(),
            manifest,
            index,
            metadata,
            mapped_files,
            shards,
            shard_paths,
            remote,
        })
    }

    /// Shard `i`, fetched and opened first if it is on object storage and
    /// not read yet (a shard already in the mirror is opened as it is).
    fn shard(&self, i: usize) -> Result<&Shard> {
        let slot = self
            .shards
            .get(i)
            .ok_or_else(|| Error::internal(format!("shard {i} is out of range")))?;
        if let Some(shard) = slot.get() {
            return Ok(shard);
        }
        let Some(remote) = &self.remote else {
            return Err(Error::internal(format!("shard {i} was never opened")));
        };
        let _fetching = remote.fetching[i]
            .lock()
            .map_err(|_| Error::internal("a shard fetch lock was poisoned"))?;
        if let Some(shard) = slot.get() {
            return Ok(shard);
        }
        let entry = &self.manifest.shards[i];
        let path = &self.shard_paths[i];
        let present = std::fs::metadata(path).is_ok_and(|m| m.len() == entry.bytes);
        if present {
            super::mirror::touch(path);
        } else {
            remote.bucket.download(&entry.file, path)?;
            super::mirror::evict(&remote.mirror, path);
        }
        let _ = slot.set(Shard::open(path, entry, false)?);
        slot.get()
            .ok_or_else(|| Error::internal(format!("shard {i} could not be kept")))
    }

    /// Shard `i` if it is open (never fetches: for hints).
    fn open_shard(&self, i: usize) -> Option<&Shard> {
        self.shards.get(i).and_then(OnceLock::get)
    }

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

    /// `sample_id` followed by the stored columns.
    pub fn metadata(&self) -> &RecordBatch {
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
    /// and copying it again. `Ok(false)`: the record is small or encoded; read
    /// it with `read_into`.
    pub fn verify_in_place(&self, sample_id: u64) -> Result<bool> {
        match self.entry(sample_id) {
            Some(ref entry) if entry.stored_len >= LARGE_RECORD && entry.stored_as_is() => {
                self.check_record(sample_id, entry, self.stored_bytes(entry)?)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Record `sample_id`'s payload as a buffer lent from its mapped shard,
    /// verified (`lend`): Ok(None) when it is not lent (small, encoded, or its
    /// shard cannot be leased now); copy it with `read_into` then.
    pub fn lend(&self, sample_id: u64) -> Result<Option<arrow_buffer::Buffer>> {
        let Some(ref entry) = self.entry(sample_id) else {
            return Ok(None);
        };
        if entry.stored_len < LARGE_RECORD || !entry.stored_as_is() {
            return Ok(None);
        }
        let Some(lender) = &self.shard(entry.shard as usize)?.lender else {
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

    /// The first shard that a read found cut short under its mapping (see
    /// `mapped`): its pages past the cut read as zeros, so its records cannot
    /// be served from this `Cache` again; the cache must be reopened.
    pub fn truncated_shard(&self) -> Option<usize> {
        self.shards.iter().position(|shard| {
            shard
                .get()
                .is_some_and(|s| s.map().is_some_and(|m| m.truncated()))
        })
    }

    /// Whether a shard on disk is no longer the file that was opened: deleted,
    /// replaced (another inode), or of another length than the manifest's.
    /// One `stat` per open shard (a shard of a cache on object storage that
    /// was never read has no file to compare).
    pub fn files_changed(&self) -> bool {
        let entries = &self.manifest.shards;
        self.shard_paths
            .iter()
            .zip(&self.shards)
            .zip(entries)
            .any(|((path, shard), entry)| {
                shard.get().is_some_and(|opened| {
                    std::fs::metadata(path).map_or(true, |m| {
                        identity(&m) != opened.identity || m.len() != entry.bytes
                    })
                })
            })
    }

    /// The error of a read that met a cut shard: it names the cache and the
    /// shard by name (no server path) and what to do.
    /// The error for a file of this cache that a read found cut short under
    /// its mapping (a shard, `index.bin` or `metadata.arrow`), if any.
    pub fn truncation(&self) -> Option<Error> {
        if let Some(shard) = self.truncated_shard() {
            return Some(self.truncation_error(shard));
        }
        let (file, _) = self.mapped_files.iter().find(|(_, map)| map.truncated())?;
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy();
        Some(Error::corrupt(
            Path::new(name.as_ref()).join(file),
            "the file was cut short while it was being read; restore the cache's files (the \
             next request reopens it) or write the cache again",
        ))
    }

    pub fn truncation_error(&self, shard: usize) -> Error {
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy();
        let file = self
            .manifest
            .shards
            .get(shard)
            .map_or("?", |e| e.file.as_str());
        let now = std::fs::metadata(&self.shard_paths[shard])
            .map_or_else(|_| "missing".to_string(), |m| format!("{} bytes", m.len()));
        Error::corrupt(
            Path::new(name.as_ref()).join(file),
            format!(
                "the shard was cut short while it was being read (now {now}, the manifest \
                 says {}); restore the cache's files (the next request reopens it) or write \
                 the cache again",
                self.manifest.shards.get(shard).map_or(0, |e| e.bytes)
            ),
        )
    }

    /// Verify every file's full checksum and every record's checksum.
    pub fn verify(&self) -> Result<VerifyReport> {
        match mapped::scope(|| self.verify_records()) {
            Ok(report) => report,
            Err(cut) => Err(self
                .truncated_shard()
                .map(|shard| self.truncation_error(shard))
                .or_else(|| self.truncation())
                .unwrap_or_else(|| cut.into())),
        }
    }

    fn verify_records(&self) -> Result<VerifyReport> {
        let mut bytes = self.manifest.index.bytes + self.manifest.metadata.bytes;
        for (i, entry) in self.manifest.shards.iter().enumerate() {
            let data = self.shard(i)?.map().map_or(&[][..], |m| &m[..]);
            check_digest(&self.shard_paths[i], &entry.xxh3, &hex64(xxh3_64(data)))?;
            bytes += entry.bytes;
        }
        let mut scratch = Vec::new();
        for sample_id in 0..self.len() {
            scratch.clear();
            self.read_into(sample_id, &mut scratch)?;
        }
        Ok(VerifyReport {
            files: 3 + self.manifest.shards.len() as u64,
            bytes,
            records: self.len(),
        })
    }
}

impl Shard {
    /// The mapping (None when the shard is empty).
    fn map(&self) -> Option<&MappedFile> {
        self.lender.as_deref().map(Lender::map)
    }

    fn bytes(&self, entry: &IndexEntry) -> &[u8] {
        match self.map() {
            Some(map) => &map[entry.offset as usize..(entry.offset + entry.stored_len) as usize],
            None => &[],
        }
    }
}

#[cfg(unix)]
fn identity(stat: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (stat.dev(), stat.ino())
}

#[cfg(not(unix))]
fn identity(_stat: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// The file `expected_name` listed by `entry`, mapped and checked against
/// the manifest (size and xxh3); None when it is empty.
fn map_checked(
    dir: &Path,
    entry: &FileEntry,
    expected_name: &str,
) -> Result<Option<Arc<MappedFile>>> {
    let path = dir.join(expected_name);
    if entry.file != expected_name {
        return Err(Error::corrupt(
            dir.join(super::MANIFEST_FILE),
            format!("lists '{}' where '{expected_name}' belongs", entry.file),
        ));
    }
    let unreadable = |e: std::io::Error| {
        Error::corrupt(
            &path,
            format!("cannot read a file listed in the manifest: {e}"),
        )
    };
    let file = File::open(&path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    if len != entry.bytes {
        return Err(Error::corrupt(
            &path,
            format!("{len} bytes, the manifest says {}", entry.bytes),
        ));
    }
    let map = if len == 0 {
        None
    } else {
        Some(Arc::new(MappedFile::map(&file).map_err(unreadable)?))
    };
    // Before the first read: the pages this read brings in are the ones the
    // cache is served from, and only pages read in after the hint can be
    // mapped huge (`crate::os::prefetch::huge_pages_hint`).
    if let Some(map) = &map {
        crate::os::prefetch::huge_pages_hint(&map[..]);
    }
    let digest = hex64(xxh3_64(map.as_deref().map_or(&[][..], |m| &m[..])));
    check_digest(&path, &entry.xxh3, &digest)?;
    Ok(map)
}

fn check_digest(path: &Path, recorded: &str, computed: &str) -> Result<()> {
    if recorded != computed {
        return Err(Error::corrupt(
            path,
            format!(
                "checksum mismatch (manifest {recorded}, file {computed}): the file was \
                 modified or damaged"
            ),
        ));
    }
    Ok(())
}

fn read_metadata(dir: &Path, manifest: &Manifest) -> Result<(RecordBatch, Arc<MappedFile>)> {
    let path = dir.join(METADATA_FILE);
    let corrupt = |detail: String| Error::corrupt(&path, detail);
    let map = map_checked(dir, &manifest.metadata, METADATA_FILE)?
        .ok_or_else(|| corrupt("the file is empty; it holds an Arrow IPC file".into()))?;
    let buffer = super::arrow_buffer(&map, 0, map.len())
        .ok_or_else(|| corrupt("cannot be mapped".into()))?;
    // The arrays are views of the mapped file (the writer writes one batch).
    let (schema, mut batches) = decode_ipc_file(&buffer)
        .map_err(|e| corrupt(format!("not a valid Arrow IPC file: {e}")))?;
    let batch = match batches.len() {
        1 => batches.remove(0),
        _ => arrow_select::concat::concat_batches(&schema, &batches)?,
    };
    let fields = schema.fields();
    let expected_names: Vec<&str> = std::iter::once("sample_id")
        .chain(manifest.columns.iter().map(|c| c.name.as_str()))
        .collect();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    if names != expected_names {
        return Err(corrupt(format!(
            "columns {names:?} differ from the manifest's {expected_names:?}"
        )));
    }
    for (field, spec) in fields.iter().skip(1).zip(&manifest.columns) {
        if field.data_type() != &spec.dtype.arrow() {
            return Err(corrupt(format!(
                "column '{}' is {}, the manifest says {}",
                spec.name,
                field.data_type(),
                spec.dtype.arrow()
            )));
        }
    }
    if batch.num_rows() as u64 != manifest.record_count {
        return Err(corrupt(format!(
            "{} rows, the manifest says {} records",
            batch.num_rows(),
            manifest.record_count
        )));
    }
    if batch.columns().iter().any(|c| c.null_count() > 0) {
        return Err(corrupt(
            "contains nulls; stored metadata is never null".into(),
        ));
    }
    Ok((batch, map))
}

/// The schema and record batches of an Arrow IPC file held in `buffer`,
/// decoded without a copy; every block is checked to lie inside the buffer.
fn decode_ipc_file(
    buffer: &arrow_buffer::Buffer,
) -> std::result::Result<(arrow_schema::SchemaRef, Vec<RecordBatch>), String> {
    use arrow_ipc::reader::{read_footer_length, FileDecoder};
    let len = buffer.len();
    let trailer: [u8; 10] = buffer
        .get(len.saturating_sub(10)..)
        .and_then(|t| t.try_into().ok())
        .ok_or("shorter than an Arrow IPC file's trailer")?;
    let footer_len = read_footer_length(trailer).map_err(|e| e.to_string())?;
    let start = (len - 10)
        .checked_sub(footer_len)
        .ok_or("the footer is longer than the file")?;
    let footer = arrow_ipc::root_as_footer(&buffer[start..len - 10]).map_err(|e| e.to_string())?;
    let schema = Arc::new(
        arrow_ipc::convert::try_fb_to_schema(footer.schema().ok_or("the footer has no schema")?)
            .map_err(|e| e.to_string())?,
    );
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let block_data = |block: &arrow_ipc::Block| {
        let offset = usize::try_from(block.offset()).ok()?;
        let block_len = usize::try_from(block.bodyLength()).ok()?
            + usize::try_from(block.metaDataLength()).ok()?;
        (offset.checked_add(block_len)? <= len).then(|| buffer.slice_with_length(offset, block_len))
    };
    for block in footer.dictionaries().into_iter().flatten() {
        let data = block_data(block).ok_or("a dictionary block lies outside the file")?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| e.to_string())?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().into_iter().flatten() {
        let data = block_data(block).ok_or("a record batch lies outside the file")?;
        if let Some(batch) = decoder
            .read_record_batch(block, &data)
            .map_err(|e| e.to_string())?
        {
            batches.push(batch);
        }
    }
    if batches.is_empty() {
        return Err("the file holds no record batch".into());
    }
    Ok((schema, batches))
}

fn check_index_bounds(path: &Path, index: &[StoredEntry], shards: &[FileEntry]) -> Result<()> {
    for (i, e) in index.iter().enumerate() {
        if let Some(problem) = e.problem() {
            return Err(Error::corrupt(path, format!("entry {i}: {problem}")));
        }
        let Some(shard) = shards.get(e.shard as usize) else {
            return Err(Error::corrupt(
                path,
                format!("entry {i} names shard {} of {}", e.shard, shards.len()),
            ));
        };
        let end = e.offset.checked_add(e.stored_len);
        if end.is_none_or(|end| end > shard.bytes) {
            return Err(Error::corrupt(
                path,
                format!(
                    "entry {i} spans bytes {}..+{} beyond shard {} ({} bytes)",
                    e.offset, e.stored_len, shard.file, shard.bytes
                ),
            ));
        }
    }
    Ok(())
}

/// The caches of one dataset, addressable by position or by `cache_id`.
pub struct CacheSet {
    caches: Vec<Arc<Cache>>,
    by_id: HashMap<u64, u32>,
    columns: Vec<ColumnSpec>,
}

impl CacheSet {
    pub fn open(dirs: &[PathBuf], verify_shards: bool) -> Result<Self> {
        Self::open_mirrored(dirs, verify_shards, None)
    }

    /// `open`, where a location may also be a cache on object storage
    /// (`s3://bucket/prefix/name`), read through the directory `mirror`.
    pub fn open_mirrored(
        locations: &[PathBuf],
        verify_shards: bool,
        mirror: Option<&Path>,
    ) -> Result<Self> {
        let caches = locations
            .iter()
            .map(|location| {
                let url = location.to_str().filter(|s| crate::remote::is_url(s));
                match (url, mirror) {
                    (None, _) => Cache::open(location, verify_shards),
                    (Some(url), Some(mirror)) => Cache::open_remote(&Bucket::open(url)?, mirror),
                    (Some(url), None) => Err(Error::invalid(format!(
                        "the cache {url} is on object storage: give a mirror directory to \
                         read it through"
                    ))),
                }
                .map(Arc::new)
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(caches)
    }

    pub fn new(caches: Vec<Arc<Cache>>) -> Result<Self> {
        let Some(first) = caches.first() else {
            return Err(Error::invalid("a dataset needs at least one cache"));
        };
        let columns = first.columns().to_vec();
        let mut by_id = HashMap::new();
        for (i, cache) in caches.iter().enumerate() {
            if cache.columns() != columns.as_slice() {
                return Err(Error::Schema(format!(
                    "caches {} and {} store different metadata columns ({} vs {}); \
                     the caches of one dataset must share one schema",
                    first.dir().display(),
                    cache.dir().display(),
                    describe(&columns),
                    describe(cache.columns())
                )));
            }
            if let Some(prev) = by_id.insert(cache.cache_id(), i as u32) {
                return Err(Error::invalid(format!(
                    "caches {} and {} have the same cache_id {} (the same cache given twice)",
                    caches[prev as usize].dir().display(),
                    cache.dir().display(),
                    cache.cache_id()
                )));
            }
        }
        Ok(CacheSet {
            caches,
            by_id,
            columns,
        })
    }

    /// The `cache_id` of each cache, in the order the set was opened with.
    pub fn cache_ids(&self) -> Vec<u64> {
        self.caches().iter().map(|c| c.cache_id()).collect()
    }

    pub fn caches(&self) -> &[Arc<Cache>] {
        &self.caches
    }

    pub fn get(&self, index: u32) -> &Cache {
        &self.caches[index as usize]
    }

    pub fn index_of(&self, cache_id: u64) -> Option<u32> {
        self.by_id.get(&cache_id).copied()
    }

    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    pub fn total_records(&self) -> u64 {
        self.caches.iter().map(|c| c.len()).sum()
    }

    /// The error for a shard of this set that a read found cut short, if any.
    pub fn truncation(&self) -> Option<Error> {
        self.caches.iter().find_map(|c| c.truncation())
    }
}

fn describe(columns: &[ColumnSpec]) -> String {
    let parts: Vec<String> = columns
        .iter()
        .map(|c| format!("{}: {}", c.name, c.dtype.name()))
        .collect();
    format!("[{}]", parts.join(", "))
}
