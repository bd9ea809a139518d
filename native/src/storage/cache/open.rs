//! Opening a cache directory: the manifest read and checked, `index.bin` and
//! `metadata.arrow` mapped and checked against it (length and xxh3), every
//! index entry checked to lie inside its shard, and the shards opened (or,
//! for a cache on object storage, left to be fetched when first read).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use super::checked::map_checked;
use super::metadata::read_metadata;
use super::shard::Shard;
use super::source::{InPlace, ShardSource};
use super::Cache;
use crate::error::{Error, Result};
use crate::os::mapped::MappedFile;
use crate::storage::index::{StoredEntry, INDEX_ENTRY_BYTES};
use crate::storage::manifest::{FileEntry, Manifest};
use crate::storage::slab::Slab;
use crate::storage::{INDEX_FILE, METADATA_FILE};

impl Cache {
    /// Open `dir`, checking its structure and the small files' checksums. With
    /// `verify_shards`, every shard's full checksum is verified too.
    pub fn open(dir: &Path, verify_shards: bool) -> Result<Self> {
        Self::open_from(dir, verify_shards, Box::new(InPlace))
    }

    /// Open `dir`, its shards opened when `source` says (now, or when first read).
    pub(super) fn open_from(
        dir: &Path,
        verify_shards: bool,
        source: Box<dyn ShardSource>,
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
        let shards = manifest
            .shards
            .iter()
            .zip(&shard_paths)
            .map(|(entry, path)| source.at_open(entry, path, verify_shards))
            .collect::<Result<Vec<OnceLock<Shard>>>>()?;
        check_index_bounds(&index_path, &index, &manifest.shards)?;
        let opening = manifest.shards.iter().map(|_| Mutex::new(())).collect();
        Ok(Cache {
            dir: dir.to_path_buf(),
            manifest,
            index,
            metadata,
            mapped_files,
            shards,
            every_shard_open: AtomicBool::new(false),
            shard_paths,
            opening,
            source,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;
    use crate::storage::{hex64, Codec};

    fn corrupt_message(result: Result<Cache>) -> String {
        match result {
            Err(err @ Error::CorruptCache { .. }) => err.to_string(),
            Err(other) => panic!("expected a corrupt cache, got {other:?}"),
            Ok(_) => panic!("expected a corrupt cache, it opened"),
        }
    }

    #[test]
    fn a_missing_directory_is_not_found_and_a_file_is_not_a_cache() {
        let base = tempfile::tempdir().unwrap();
        let missing = base.path().join("nope");
        assert!(matches!(
            Cache::open(&missing, false),
            Err(Error::NotFound(m)) if m.contains("does not exist")
        ));
        let file = base.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(corrupt_message(Cache::open(&file, false)).contains("not a directory"));
    }

    #[test]
    fn a_flipped_byte_in_the_index_or_metadata_is_refused_at_open() {
        let base = tempfile::tempdir().unwrap();
        for (name, file) in [("i", INDEX_FILE), ("m", METADATA_FILE)] {
            let dir = fixture::write(base.path(), name, &[5, 6, 7], Codec::None, 1 << 20);
            Cache::open(&dir, true).unwrap();
            fixture::flip(&dir, file, 9);
            let message = corrupt_message(Cache::open(&dir, false));
            assert!(message.contains("checksum mismatch"), "{message}");
            assert!(message.contains(file), "{message}");
        }
    }

    #[test]
    fn shards_are_checked_by_length_always_and_by_checksum_when_asked() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[100, 100], Codec::None, 1 << 20);
        fixture::flip(&dir, "shard-00000.bin", 150);
        assert!(Cache::open(&dir, false).is_ok(), "shards are not hashed");
        let message = corrupt_message(Cache::open(&dir, true));
        assert!(message.contains("shard-00000.bin"), "{message}");
        assert!(message.contains("checksum mismatch"), "{message}");

        let shard = dir.join("shard-00000.bin");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap();
        file.set_len(150).unwrap();
        let message = corrupt_message(Cache::open(&dir, false));
        assert!(
            message.contains("150 bytes, the manifest says 200"),
            "{message}"
        );
    }

    #[test]
    fn every_index_entry_must_lie_inside_a_listed_shard() {
        let shards = [FileEntry {
            file: "shard-00000.bin".into(),
            bytes: 100,
            xxh3: hex64(0),
            records: Some(2),
        }];
        let entry = |shard, offset, stored_len, codec| StoredEntry {
            shard,
            codec,
            reserved: [0; 3],
            offset,
            stored_len,
            raw_len: stored_len,
            checksum: 0,
        };
        let path = Path::new("c/index.bin");
        let good = [entry(0, 0, 60, 0), entry(0, 60, 40, 0)];
        assert!(check_index_bounds(path, &good, &shards).is_ok());
        for (bad, expected) in [
            (
                entry(0, 60, 41, 0),
                "entry 1 spans bytes 60..+41 beyond shard",
            ),
            (entry(1, 0, 1, 0), "entry 1 names shard 1 of 1"),
            (entry(0, u64::MAX, 2, 0), "beyond shard"),
            (entry(0, 0, 1, 9), "entry 1: unknown codec tag 9"),
        ] {
            let err = check_index_bounds(path, &[good[0], bad], &shards).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn the_manifest_must_name_each_small_file_where_it_belongs() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[5], Codec::None, 1 << 20);
        let manifest = Manifest::read(&dir).unwrap();
        let err = map_checked(&dir, &manifest.metadata, INDEX_FILE)
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("lists 'metadata.arrow' where 'index.bin' belongs"),
            "{err}"
        );
        let map = map_checked(&dir, &manifest.index, INDEX_FILE).unwrap();
        assert_eq!(map.map(|m| m.len()), Some(INDEX_ENTRY_BYTES));
    }
}
