//! Checking an open cache again. `verify` hashes every file and every record
//! (`VerifyReport`); between requests the server asks the cheap questions:
//! did a read find a file cut short under its mapping (`truncated_shard`,
//! `truncation`), and is a shard on disk still the file that was opened
//! (`files_changed`)? Either way the cache is reopened, or refused.

use std::path::Path;

use super::checked::check_digest;
use super::shard::{identity, Stamp};
use super::Cache;
use crate::error::{Error, Result};
use crate::hash::xxh3_64;
use crate::os::mapped;
use crate::storage::hex64;

/// What `Cache::verify` checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub files: u64,
    pub bytes: u64,
    pub records: u64,
}

impl Cache {
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
    /// replaced (another inode), written in place (another modification
    /// time), or of another length than the manifest's. One `stat` per open
    /// shard (a shard of a cache on object storage that was never read has
    /// no file to compare).
    pub fn files_changed(&self) -> bool {
        !self.changed_shards().is_empty()
    }

    /// The shards `files_changed` is about, with the file at each path now.
    pub fn changed_shards(&self) -> Vec<(usize, Option<Stamp>)> {
        let entries = &self.manifest.shards;
        let mut changed = Vec::new();
        for (i, ((path, shard), entry)) in self
            .shard_paths
            .iter()
            .zip(&self.shards)
            .zip(entries)
            .enumerate()
        {
            let Some(opened) = shard.get() else { continue };
            match std::fs::metadata(path) {
                Ok(m) if identity(&m) == opened.identity && m.len() == entry.bytes => {}
                Ok(m) => changed.push((i, Some(identity(&m)))),
                // A mirror deleted it: fetched again when a read needs it.
                Err(_) if self.refetches() => {}
                Err(_) => changed.push((i, None)),
            }
        }
        changed
    }

    /// Shard `i` hashed whole against the manifest: for a shard whose file
    /// changed on disk, before it is served again (a file replaced by one of
    /// the same length, or written in place, passes every cheaper check).
    pub fn check_shard(&self, i: usize) -> Result<()> {
        let entry = self
            .manifest
            .shards
            .get(i)
            .ok_or_else(|| Error::internal(format!("shard {i} is out of range")))?;
        let data = self.shard(i)?.map().map_or(&[][..], |m| &m[..]);
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy();
        check_digest(
            &Path::new(name.as_ref()).join(&entry.file),
            &entry.xxh3,
            &hex64(xxh3_64(data)),
        )
    }

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

    /// The error of a read that met a cut shard: it names the cache and the
    /// shard by name (no server path) and what to do.
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

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;
    use crate::storage::Codec;

    #[test]
    fn a_sound_cache_verifies_and_reports_what_it_checked() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[300, 300, 300], Codec::Lz4, 700);
        let cache = Cache::open(&dir, false).unwrap();
        let manifest = cache.manifest();
        assert_eq!(manifest.shards.len(), 2);
        let bytes = manifest.index.bytes
            + manifest.metadata.bytes
            + manifest.shards.iter().map(|s| s.bytes).sum::<u64>();
        let report = cache.verify().unwrap();
        assert_eq!(
            report,
            VerifyReport {
                files: 5,
                bytes,
                records: 3
            }
        );
        assert!(cache.truncation().is_none() && cache.truncated_shard().is_none());
        assert!(!cache.files_changed());
    }

    #[test]
    fn a_flipped_shard_byte_fails_verification_naming_the_shard() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[300, 300, 300], Codec::None, 700);
        fixture::flip(&dir, "shard-00001.bin", 10);
        let cache = Cache::open(&dir, false).unwrap();
        let err = cache.verify().unwrap_err();
        assert!(matches!(err, Error::CorruptCache { .. }), "{err:?}");
        assert!(err.to_string().contains("shard-00001.bin"), "{err}");
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn a_shard_replaced_or_removed_after_open_is_a_changed_file() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[300, 300, 300], Codec::None, 700);
        let cache = Cache::open(&dir, false).unwrap();
        let shard = dir.join("shard-00000.bin");
        // The same bytes under another inode: still another file.
        let copy = dir.join("copy");
        std::fs::copy(&shard, &copy).unwrap();
        std::fs::rename(&copy, &shard).unwrap();
        assert!(cache.files_changed());
        let cache = Cache::open(&dir, false).unwrap();
        assert!(
            !cache.files_changed(),
            "reopened: the new file is the one opened"
        );
        std::fs::remove_file(&shard).unwrap();
        assert!(cache.files_changed());
    }

    #[test]
    fn a_shard_cut_under_verification_is_reported_as_cut_naming_the_shard() {
        let base = tempfile::tempdir().unwrap();
        let page = 4096;
        let lens = [3 * page, 3 * page];
        let dir = fixture::write(base.path(), "c", &lens, Codec::None, 1 << 20);
        let cache = Cache::open(&dir, true).unwrap();
        let shard = dir.join("shard-00000.bin");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap();
        file.set_len(page as u64).unwrap();
        // Without the guard (`mapped`) this verification kills the process.
        let err = cache.verify().unwrap_err();
        assert_eq!(cache.truncated_shard(), Some(0));
        let message = err.to_string();
        assert!(
            message.contains("cut short while it was being read"),
            "{message}"
        );
        assert!(message.contains("now 4096 bytes"), "{message}");
        assert!(message.contains("c/shard-00000.bin"), "{message}");
        assert!(
            !message.contains(base.path().to_str().unwrap()),
            "{message}"
        );
        assert_eq!(
            cache.truncation().map(|e| e.to_string()),
            Some(message),
            "the same error for the server's readiness"
        );
    }
}
