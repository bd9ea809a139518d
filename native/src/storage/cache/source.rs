//! Where a cache's shard files come from (`ShardSource`): in place, for a
//! cache directory on a local volume (every shard opened with the cache), or
//! fetched into a mirror when a read first needs one (`remote.rs`, a cache on
//! object storage). `Cache::shard` asks its source alike for both.

use std::path::Path;
use std::sync::OnceLock;

use super::shard::Shard;
use super::Cache;
use crate::error::{Error, Result};
use crate::storage::manifest::FileEntry;

/// Where the shard files of an open cache come from.
pub(super) trait ShardSource: Send + Sync {
    /// Shard `entry` at `path` as the cache opens: opened now (with its full
    /// checksum verified if `verify`), or left for its first read.
    fn at_open(&self, entry: &FileEntry, path: &Path, verify: bool) -> Result<OnceLock<Shard>>;

    /// Put shard `entry` at `path`, to be opened for its first read (called
    /// once per shard, under that shard's lock).
    fn bring(&self, entry: &FileEntry, path: &Path) -> Result<()>;
}

/// A cache directory read where it is: every shard opened with the cache,
/// so that a missing or damaged one is found at once.
pub(super) struct InPlace;

impl ShardSource for InPlace {
    fn at_open(&self, entry: &FileEntry, path: &Path, verify: bool) -> Result<OnceLock<Shard>> {
        Shard::open(path, entry, verify).map(OnceLock::from)
    }

    fn bring(&self, _entry: &FileEntry, _path: &Path) -> Result<()> {
        // Already there: every shard was opened with the cache.
        Ok(())
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
        self.source.bring(entry, path)?;
        let _ = slot.set(Shard::open(path, entry, false)?);
        slot.get()
            .ok_or_else(|| Error::internal(format!("shard {i} could not be kept")))
    }

    /// Shard `i` if it is open (never brings one: for hints).
    pub(super) fn open_shard(&self, i: usize) -> Option<&Shard> {
        self.shards.get(i).and_then(OnceLock::get)
    }
}
