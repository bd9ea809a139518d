//! Where a cache's shard files come from (`ShardSource`): in place, for a
//! cache directory on a local volume (every shard opened with the cache), or
//! fetched into a mirror when a read first needs one (`remote.rs`, a cache on
//! object storage). `Cache::shard` asks its source alike for both.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use bytes::Bytes;

use super::shard::Shard;
use super::Cache;
use crate::error::{Error, Result};
use crate::storage::index::IndexEntry;
use crate::storage::manifest::FileEntry;

/// Where the shard files of an open cache come from.
pub(super) trait ShardSource: Send + Sync {
    /// Shard `entry` at `path` as the cache opens: opened now (with its full
    /// checksum verified if `verify`), or left for its first read.
    fn at_open(&self, entry: &FileEntry, path: &Path, verify: bool) -> Result<OnceLock<Shard>>;

    /// Put shard `entry` at `path` and open it, for its first read (called
    /// once per shard, under that shard's lock).
    fn bring(&self, entry: &FileEntry, path: &Path) -> Result<File>;

    /// The stored bytes of `record` (of shard `shard`, which is not open)
    /// fetched by themselves; None: read it from the shard (`bring`).
    fn record(&self, _shard: &FileEntry, _record: &IndexEntry) -> Result<Option<Bytes>> {
        Ok(None)
    }

    /// The records of shards not open that a stream reads next, in order, for
    /// a source that fetches to start on them now.
    fn plan(&self, _shards: &[FileEntry], _records: &[IndexEntry]) {}

    /// Whether a shard file that disappeared is fetched again when needed (a
    /// mirror's eviction), not lost (damage).
    fn refetches(&self) -> bool {
        false
    }
}

/// A cache directory read where it is: every shard opened with the cache,
/// so that a missing or damaged one is found at once.
pub(super) struct InPlace;

impl ShardSource for InPlace {
    fn at_open(&self, entry: &FileEntry, path: &Path, verify: bool) -> Result<OnceLock<Shard>> {
        Shard::open(path, entry, verify).map(OnceLock::from)
    }

    fn bring(&self, _entry: &FileEntry, path: &Path) -> Result<File> {
        // Every shard was opened with the cache: reached only after a failed
        // open, as that open again.
        File::open(path).map_err(|e| {
            Error::corrupt(
                path,
                format!("cannot open shard listed in the manifest: {e}"),
            )
        })
    }
}

impl Cache {
    /// Shard `i`, brought by the cache's source and opened on its first read.
    pub(super) fn shard(&self, i: usize) -> Result<&Shard> {
        let slot = self
            .shards
            .get(i)
            .ok_or_else(|| Error::internal(format!("shard {i} is out of range")))?;
        if let Some(shard) = slot.get() {
            return Ok(shard);
        }
        let _opening = self.opening[i]
            .lock()
            .map_err(|_| Error::internal("a shard's opening lock was poisoned"))?;
        if let Some(shard) = slot.get() {
            return Ok(shard);
        }
        let (entry, path) = (&self.manifest.shards[i], &self.shard_paths[i]);
        let file = self.source.bring(entry, path)?;
        let _ = slot.set(Shard::open_file(file, path, entry, false)?);
        slot.get()
            .ok_or_else(|| Error::internal(format!("shard {i} could not be kept")))
    }

    /// Shard `i` if it is open (never brings one: for hints).
    pub(super) fn open_shard(&self, i: usize) -> Option<&Shard> {
        self.shards.get(i).and_then(OnceLock::get)
    }

    /// The stored bytes of `record` when its shard is not open and the
    /// source fetched them by themselves (None: read them from the shard).
    pub(super) fn fetched(&self, record: &IndexEntry) -> Result<Option<Bytes>> {
        let shard = record.shard as usize;
        match self.manifest.shards.get(shard) {
            Some(entry) if self.open_shard(shard).is_none() => self.source.record(entry, record),
            _ => Ok(None),
        }
    }

    /// Whether every shard is open, so that a plan has nothing to ask for:
    /// always for a cache read in place, and for a mirrored one once each
    /// shard was read. O(1) once true.
    pub(super) fn every_shard_open(&self) -> bool {
        if self.every_shard_open.load(Relaxed) {
            return true;
        }
        let all = self.shards.iter().all(|shard| shard.get().is_some());
        if all {
            self.every_shard_open.store(true, Relaxed);
        }
        all
    }

    /// Tell the source which records of shards not open a stream reads next.
    pub(super) fn plan(&self, records: &[IndexEntry]) {
        self.source.plan(&self.manifest.shards, records);
    }

    /// Whether a shard file of this cache that disappeared is fetched again.
    pub(super) fn refetches(&self) -> bool {
        self.source.refetches()
    }
}
