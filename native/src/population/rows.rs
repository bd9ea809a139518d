//! The rows file of a population (`<id>.rows`): per row its record and its
//! alias-table column, 16 bytes, mapped and read in place. (A row's weight is
//! in the table file, whose `weight` column a stream casts to Float64.)
//!
//! ```text
//! offset 0    header, 64 bytes (little-endian):
//!               magic "DRTROWS1" | version u32 = 3 (1 and 2 are read) | uniform u32
//!               rows u64 | caches key u64 | alias offset u64
//!               file length u64 | xxh3-64 of bytes 64..file length
//! offset 64   keys:    rows x u64   cache position << 40 | sample id
//! (64-aligned) alias:   rows x (u32 threshold, u32 alias)
//! then        sums:    an xxh3-64 per 4 KiB page of bytes 64..sums (version 3)
//! ```
//! The caches key is the xxh3 of the cache ids in the dataset's order (the
//! order cache positions refer to). Opening checks the header, the lengths and
//! the caches key, O(1): a truncated or foreign file is refused at once. Each
//! page of keys and alias table is verified against its sum the first time a
//! read touches it (`storage::pages`), so a page damaged on disk or written
//! over fails the batch that read it (the population's damage) instead of
//! changing the epoch. The whole-file checksum is verified on request
//! (`verify`), like a cache's file checksums. `uniform` is 0, or, when every
//! column of the alias table keeps itself (equal weights), a tag derived from
//! the checksum (`uniform_tag`): draws then skip the table. A tag is never 0,
//! and a damaged field matches it by chance once in 2^31, so damage can only
//! lose the shortcut (the table gives the same draws), never invent it;
//! builds that do not know the field ignore it. Files of versions 1 and 2 have
//! no page sums: they are read as before (a damaged key can only name a
//! record the cache refuses, or another record).
//!
//! The file is written as the table streams in: keys go to the file, the
//! validated weights to a scratch file; `finish` builds the alias table from
//! them in place in the mapped file (Vose's lists in a mapped scratch file)
//! and writes the header last, so a file is complete when its header says so.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use super::ids::{Keys, KeysFile};
use super::key::{MAX_CACHES, MAX_SAMPLE_ID, ROWS_HEADER, SAMPLE_BITS, SAMPLE_MASK};
use super::scratch::ScratchFile;
use crate::error::{Error, IoContext, Result};
use crate::hash::{xxh3_64, Xxh3};
use crate::os::mapped::{map_allocated, MappedFile};
use crate::sampling::{build_alias, AliasColumn, AliasTable};
use crate::storage::pages::PAGE;
use crate::storage::{page_sums, CacheSet, CheckedPages, Slab, Writeback};

const MAGIC: &[u8; 8] = b"DRTROWS1";
/// Version 2 files go with tables that leave their identity columns out
/// (`ids.rs`); the layout is version 1's, which is still read. A build
/// that reads version 1 only refuses a version 2 file by its version, so a
/// replica not yet upgraded cannot serve such a table without its ids.
/// Version 3 adds the page sums after the alias table; a build that reads
/// up to version 2 refuses it by its version.
const VERSION: u32 = 3;
const FIRST_WITH_SUMS: u32 = 3;
const VERSIONS_READ: std::ops::RangeInclusive<u32> = 1..=VERSION;
const HEADER: usize = ROWS_HEADER;
const WRITE_BUFFER: usize = 1 << 20;

/// A population's records and alias table, mapped.
pub struct PopulationRows {
    keys: Slab<u64>,
    alias: AliasTable,
    /// The keys' and alias table's pages, verified on first touch.
    pages: Arc<CheckedPages>,
    /// The file as last seen (`storage::Stamp`): another one means it was
    /// written over or replaced since, and its pages are verified again.
    stamp: std::sync::Mutex<crate::storage::Stamp>,
    /// The last cache position: a damaged key never names a cache past it.
    last_cache: u32,
    map: Arc<MappedFile>,
    path: std::path::PathBuf,
    /// Set while the file is not in memory (`warmup`).
    cold: crate::warmup::Cold,
}

/// Rows files this process wrote, by `storage::Stamp` (a rename into the
/// store keeps it): their page sums were computed from the bytes in memory,
/// so reading them again is not needed until the file changes (another
/// stamp). The newest `WRITTEN_KEPT` are remembered.
static WRITTEN: std::sync::Mutex<std::collections::VecDeque<crate::storage::Stamp>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
const WRITTEN_KEPT: usize = 256;

fn remember_written(path: &Path) {
    let Ok(stat) = std::fs::metadata(path) else {
        return;
    };
    let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    if written.len() == WRITTEN_KEPT {
        written.pop_front();
    }
    written.push_back(crate::storage::file_stamp(&stat));
}

fn written_here(stamp: &crate::storage::Stamp) -> bool {
    let written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    written.contains(stamp)
}

/// The xxh3 of `caches`' ids in order: which caches, in which order, cache
/// positions in a rows file refer to.
pub fn caches_key(caches: &CacheSet) -> u64 {
    let mut key = Xxh3::new();
    for cache in caches.caches() {
        key.update(&cache.cache_id().to_le_bytes());
    }
    key.digest()
}

struct Header {
    version: u32,
    /// `uniform_tag(checksum)` when every alias column keeps itself, else 0.
    uniform: u32,
    rows: u64,
    caches_key: u64,
    alias: u64,
    len: u64,
    checksum: u64,
}

impl Header {
    /// (alias offset, page sums offset, file length) of a file of `rows`
    /// rows in `version`'s layout (before version 3: no sums, the sums
    /// offset is the file's end).
    fn layout(rows: u64, version: u32) -> (u64, u64, u64) {
        let alias = (HEADER as u64 + rows * 8).div_ceil(64) * 64;
        let sums = alias + rows * 8;
        if version < FIRST_WITH_SUMS {
            return (alias, sums, sums);
        }
        let pages = sums.div_ceil(PAGE as u64) - HEADER as u64 / PAGE as u64;
        (alias, sums, sums + pages * 8)
    }

    fn sums_at(&self) -> u64 {
        Header::layout(self.rows, self.version).1
    }

    /// Whether the header says (with the tag of its checksum) that every
    /// column of the alias table keeps itself.
    fn keeps_every_column(&self) -> bool {
        self.uniform != 0 && self.uniform == uniform_tag(self.checksum)
    }

    fn bytes(&self) -> [u8; HEADER] {
        let mut out = [0u8; HEADER];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.uniform.to_le_bytes());
        let words = [
            self.rows,
            self.caches_key,
            self.alias,
            self.len,
            self.checksum,
        ];
        for (i, word) in words.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The header of a file of `len` bytes that starts with `bytes`, checked
    /// against the file's length and `caches`.
    fn check(bytes: &[u8], len: u64, caches: &CacheSet) -> std::result::Result<Self, String> {
        let header = Header::parse(bytes)?;
        if header.len != len {
            return Err(format!(
                "{len} bytes where its header says {}: the file is truncated or was \
                 written over",
                header.len
            ));
        }
        if header.caches_key != caches_key(caches) {
            return Err("the file was built for other caches (or another order of them)".into());
        }
        Ok(header)
    }

    fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err("not a population rows file (no DRTROWS1 header)".into());
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[16 + 8 * i..24 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if !VERSIONS_READ.contains(&version) {
            return Err(format!(
                "rows file version {version}; this build reads versions 1 to {VERSION}"
            ));
        }
        let header = Header {
            version,
            uniform: u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]),
            rows: word(0),
            caches_key: word(1),
            alias: word(2),
            len: word(3),
            checksum: word(4),
        };
        if header.rows == 0 || header.rows > u32::MAX as u64 {
            return Err(format!("the header says {} rows", header.rows));
        }
        let (alias, _, len) = Header::layout(header.rows, version);
        if (alias, len) != (header.alias, header.len) {
            return Err("the header's section offsets do not match its row count".into());
        }
        Ok(header)
    }
}

impl PopulationRows {
    /// Map the rows file at `path`, written for `caches`. O(1): the header,
    /// the file's length and the caches are checked, nothing is read per row.
    pub fn open(path: &Path, caches: &CacheSet) -> Result<Self> {
        let file = File::open(path).at("cannot open", path)?;
        let damaged = |detail: String| Error::corrupt_population(path, detail);
        let len = file.metadata().at("cannot stat", path)?.len();
        if len < HEADER as u64 {
            return Err(damaged(format!("{len} bytes, shorter than its header")));
        }
        let map = Arc::new(MappedFile::map(&file).at("cannot map", path)?);
        let header = Header::check(&map, len, caches).map_err(damaged)?;
        let rows = header.rows as usize;
        let keys = Slab::mapped(&map, HEADER, rows).map_err(damaged)?;
        let alias = Slab::mapped(&map, header.alias as usize, rows).map_err(damaged)?;
        let pages = Arc::new(if header.version < FIRST_WITH_SUMS {
            CheckedPages::trusted()
        } else {
            let sums_at = header.sums_at() as usize;
            let count = sums_at.div_ceil(PAGE) - HEADER / PAGE;
            let sums = Slab::mapped(&map, sums_at, count).map_err(damaged)?;
            CheckedPages::new(map.clone(), HEADER, sums_at, sums, path).map_err(damaged)?
        });
        let stamp = crate::storage::file_stamp(&file.metadata().at("cannot stat", path)?);
        // Both sections are read at random; a cold file starts with
        // single-page faults while it is read ahead (`warmup`).
        let cold = crate::warmup::Cold::default();
        let start = crate::warmup::open_random(&Arc::new(file), &map, HEADER..map.len(), &cold);
        if start != crate::warmup::Start::Warm && header.version >= FIRST_WITH_SUMS {
            // Every first touch reads its page's sum: all of them at once.
            let sums = header.sums_at() as usize..map.len();
            crate::os::pages::advise(&map, sums, crate::os::pages::Advice::WillNeed);
        }
        // Reads check a bit per page until every page was verified: a file this
        // process wrote (and that has not changed since) is trusted; another
        // one that fits in memory is verified front to back by a thread of its
        // own, once it is in memory (after `warmup` read it, if it was cold).
        if written_here(&stamp) {
            pages.mark_all_verified();
        } else if start != crate::warmup::Start::TooLarge {
            let warm = cold.clone();
            pages.verify_in_background_once(move || !warm.is_cold());
        }
        Ok(PopulationRows {
            keys,
            alias: AliasTable::stored(
                alias,
                header.alias as usize,
                pages.clone(),
                cold.clone(),
                header.keeps_every_column(),
            ),
            pages,
            stamp: std::sync::Mutex::new(stamp),
            cold,
            last_cache: caches.caches().len().saturating_sub(1) as u32,
            map,
            path: path.to_path_buf(),
        })
    }

    /// The file's keys, to be read from it (`KeysFile`): its header, length
    /// and caches checked as `open` does, nothing mapped.
    pub fn keys_file(path: &Path, caches: &CacheSet) -> Result<KeysFile> {
        let mut file = File::open(path).at("cannot open", path)?;
        let damaged = |detail: String| Error::corrupt_population(path, detail);
        let len = file.metadata().at("cannot stat", path)?.len();
        let mut bytes = [0u8; HEADER];
        std::io::Read::read_exact(&mut file, &mut bytes)
            .map_err(|_| damaged(format!("{len} bytes, shorter than its header")))?;
        let header = Header::check(&bytes, len, caches).map_err(damaged)?;
        Ok(KeysFile {
            path: path.to_path_buf(),
            rows: header.rows as usize,
            cache_ids: caches.cache_ids(),
        })
    }

    /// Check the file's checksum (a full read of the file).
    pub fn verify(path: &Path) -> Result<()> {
        let file = File::open(path).at("cannot open", path)?;
        let bytes = MappedFile::map(&file).at("cannot map", path)?;
        let header = Header::parse(&bytes).map_err(|d| Error::corrupt_population(path, d))?;
        if header.len != bytes.len() as u64 || xxh3_64(&bytes[HEADER..]) != header.checksum {
            return Err(Error::corrupt_population(
                path,
                "its content does not match its checksum",
            ));
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file, if a read found it cut short under its mapping.
    pub fn truncated(&self) -> Option<&Path> {
        self.map.truncated().then_some(self.path.as_path())
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn alias(&self) -> &AliasTable {
        &self.alias
    }

    /// The rows' identities, for a table that leaves them out (`ids.rs`).
    pub fn keys(&self, cache_ids: Arc<[u64]>) -> Keys {
        Keys::new(
            self.keys.clone(),
            self.map.clone(),
            self.pages.clone(),
            cache_ids,
            &self.path,
        )
    }

    /// Why the file's bytes cannot be trusted, if a read found a page that
    /// does not match its sum.
    pub fn damage(&self) -> Option<String> {
        self.pages.damage()
    }

    /// Whether the file on disk is no longer the one opened (written over in
    /// place, replaced, deleted): one `stat`. Its pages are then verified
    /// again, as they are read and on a thread of their own: whoever sees the
    /// change first (a stream, a readiness probe), damage in pages no stream
    /// reads (the alias table of equal weights) is found and reported.
    pub fn recheck(&self) -> bool {
        let now = std::fs::metadata(&self.path)
            .map(|m| crate::storage::file_stamp(&m))
            .unwrap_or_default();
        let Ok(mut seen) = self.stamp.lock() else {
            return false;
        };
        if *seen == now {
            return false;
        }
        *seen = now;
        self.pages.reset();
        self.pages.verify_in_background();
        true
    }

    /// Verify every page not verified yet (a full read of the rest of the
    /// file); true when none is damaged.
    pub fn verify_pages(&self) -> bool {
        self.pages.verify_all()
    }

    pub fn pages_verified(&self) -> bool {
        self.pages.all_verified()
    }

    /// Row `row`'s record: (cache position, sample id). A row past the end or
    /// a damaged key gives a record the cache refuses, never a bad position.
    #[inline]
    pub fn record(&self, row: usize) -> (u32, u64) {
        self.pages.touch(HEADER + row * 8);
        let key = self.keys.get(row).copied().unwrap_or(u64::MAX);
        (
            ((key >> SAMPLE_BITS) as u32).min(self.last_cache),
            key & SAMPLE_MASK,
        )
    }

    #[inline]
    pub fn prefetch(&self, row: usize) {
        if let Some(key) = self.keys.get(row) {
            crate::os::prefetch::prefetch_line(key);
        }
    }

    /// While the file is cold, start reading the pages of `rows`' records all
    /// at once, so that their disk reads overlap (a CPU prefetch does not
    /// fault a page in). Nothing once the file is in memory.
    pub fn read_ahead(&self, rows: &[u32]) {
        if self.cold.is_cold() {
            for key in rows.iter().filter_map(|&row| self.keys.get(row as usize)) {
                crate::warmup::will_need(key);
            }
        }
    }
}

/// Writes a rows file as validated rows stream in.
pub struct RowsWriter {
    /// Written back as it grows: the rows file is fsynced at the end.
    keys: BufWriter<Writeback>,
    keys_file: ScratchFile,
    weights: BufWriter<File>,
    weights_file: ScratchFile,
    rows: u64,
    /// The weights' sum in row order (the alias table's total).
    total: f64,
}

impl RowsWriter {
    pub fn create(dir: &Path) -> Result<Self> {
        let keys_file = ScratchFile::create(dir)?;
        let weights_file = ScratchFile::create(dir)?;
        let mut keys = BufWriter::with_capacity(WRITE_BUFFER, Writeback::new(keys_file.file()?));
        keys.write_all(&[0u8; HEADER])
            .at("cannot write", keys_file.path())?;
        let weights = BufWriter::with_capacity(WRITE_BUFFER, weights_file.file()?);
        Ok(RowsWriter {
            keys,
            keys_file,
            weights,
            weights_file,
            rows: 0,
            total: 0.0,
        })
    }

    /// Append validated rows: each row's cache position, sample id and weight.
    pub fn push(&mut self, cache_index: &[u32], sample_ids: &[u64], weights: &[f64]) -> Result<()> {
        let mut keys = Vec::with_capacity(cache_index.len() * 8);
        for (&ci, &sid) in cache_index.iter().zip(sample_ids) {
            if sid > MAX_SAMPLE_ID || ci as usize >= MAX_CACHES {
                return Err(Error::invalid(format!(
                    "record (cache {ci}, sample {sid}) is past what a population row can \
                     name ({MAX_CACHES} caches of {MAX_SAMPLE_ID} records)"
                )));
            }
            keys.extend_from_slice(&((u64::from(ci) << SAMPLE_BITS) | sid).to_le_bytes());
        }
        self.keys
            .write_all(&keys)
            .at("cannot write", self.keys_file.path())?;
        let mut bytes = Vec::with_capacity(weights.len() * 8);
        for &w in weights {
            self.total += w;
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        self.weights
            .write_all(&bytes)
            .at("cannot write", self.weights_file.path())?;
        self.rows += cache_index.len() as u64;
        Ok(())
    }

    /// The keys written so far, flushed to the file (whose path this is), so
    /// that they can be read from it while `finish` builds the alias table.
    pub fn flush_keys(&mut self) -> Result<&Path> {
        self.keys
            .flush()
            .at("cannot write", self.keys_file.path())?;
        Ok(self.keys_file.path())
    }

    /// Complete the file: the alias table built in place from the weights,
    /// the header last, fsynced. Returns the complete file (still a scratch
    /// file: the caller renames it into place or drops it).
    pub fn finish(self, caches: &CacheSet) -> Result<ScratchFile> {
        let RowsWriter {
            keys,
            keys_file,
            weights,
            weights_file,
            rows,
            total,
        } = self;
        let path = keys_file.path().to_path_buf();
        let out = keys
            .into_inner()
            .map_err(|e| Error::io("cannot write", &path, e.into_error()))?
            .into_inner();
        let weights_in = weights
            .into_inner()
            .map_err(|e| Error::io("cannot write", weights_file.path(), e.into_error()))?;
        let (alias_at, sums_at, len) = Header::layout(rows, VERSION);
        let n = rows as usize;
        {
            // Allocated before they are mapped (`map_allocated`): a store
            // into a hole on a full volume would be a SIGBUS.
            let mut map = map_allocated(&out, len).at("cannot write", &path)?;
            // SAFETY: a scratch file of ours, complete and locked, that
            // nobody else writes or truncates while it is mapped here.
            let weights_map =
                unsafe { memmap2::Mmap::map(&weights_in) }.at("cannot map", weights_file.path())?;
            let stack_file = ScratchFile::create(path.parent().unwrap_or(Path::new(".")))?;
            let stack_handle = stack_file.file()?;
            let mut stack_map = map_allocated(&stack_handle, rows.max(1) * 4)
                .at("cannot write", stack_file.path())?;
            let weights: &[f64] = cast(&weights_map[..n * 8]);
            let columns: &mut [AliasColumn] =
                cast_mut(&mut map[alias_at as usize..alias_at as usize + n * 8]);
            let stack: &mut [u32] = cast_mut(&mut stack_map[..n * 4]);
            let keeps_every_column = build_alias(weights, total, columns, stack)?;
            let sums_at = sums_at as usize;
            let sums = page_sums(&map, HEADER, sums_at);
            for (slot, sum) in map[sums_at..].chunks_exact_mut(8).zip(&sums) {
                slot.copy_from_slice(&sum.to_le_bytes());
            }
            let checksum = xxh3_64(&map[HEADER..]);
            let header = Header {
                version: VERSION,
                uniform: if keeps_every_column {
                    uniform_tag(checksum)
                } else {
                    0
                },
                rows,
                caches_key: caches_key(caches),
                alias: alias_at,
                len,
                checksum,
            };
            map[..HEADER].copy_from_slice(&header.bytes());
            map.flush().at("cannot fsync", &path)?;
        }
        drop(weights_file);
        out.sync_all().at("cannot fsync", &path)?;
        remember_written(&path);
        Ok(keys_file)
    }
}

/// The header's `uniform` value of a file whose checksum is `checksum` and
/// whose alias table keeps every column: never 0 (the value of every other
/// file, and of files written before the field).
fn uniform_tag(checksum: u64) -> u32 {
    (checksum >> 32) as u32 | 1
}

fn cast<T: crate::storage::Plain>(bytes: &[u8]) -> &[T] {
    // SAFETY: the mapping is page-aligned and the sections 64-aligned; `T` is
    // plain data and the length is a whole number of values.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / size_of::<T>()) }
}

fn cast_mut<T: crate::storage::Plain>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `cast`; the slice is borrowed mutably once.
    unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / size_of::<T>())
    }
}
