//! A cache on object storage, read through a local mirror (`open_remote`):
//! its manifest, index and metadata are fetched when it is opened, each shard
//! when a read first needs it (`Mirrored`, the cache's `ShardSource`), one
//! fetch per shard at a time, and the mirror kept within its budget
//! (`storage::mirror`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::shard::Shard;
use super::source::ShardSource;
use super::Cache;
use crate::error::{Error, Result};
use crate::hash::xxh3_64;
use crate::remote::Bucket;
use crate::storage::manifest::FileEntry;
use crate::storage::upload::Published;
use crate::storage::{hex64, mirror, INDEX_FILE, MANIFEST_FILE, METADATA_FILE};

/// The shards of a cache on object storage: fetched into the mirror when a
/// read first needs one, the mirror kept within its budget as a whole.
struct Mirrored {
    bucket: Bucket,
    mirror: PathBuf,
}

impl ShardSource for Mirrored {
    fn at_open(&self, _entry: &FileEntry, _path: &Path, _verify: bool) -> Result<OnceLock<Shard>> {
        Ok(OnceLock::new())
    }

    fn bring(&self, entry: &FileEntry, path: &Path) -> Result<()> {
        if std::fs::metadata(path).is_ok_and(|m| m.len() == entry.bytes) {
            mirror::touch(path);
        } else {
            self.bucket.download(&entry.file, path)?;
            mirror::evict(&self.mirror, path);
        }
        Ok(())
    }
}

impl Cache {
    /// Open the cache published at `bucket` (`<url>/<name>`, see `upload`)
    /// through the local directory `mirror`: its manifest, index and metadata
    /// are fetched now (once), each shard when a read first needs it. Every
    /// record is verified by its checksum when read, as from a local cache.
    pub fn open_remote(bucket: &Bucket, mirror: &Path) -> Result<Self> {
        let published = Published::read(bucket)?.ok_or_else(|| {
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
        let source = Mirrored {
            bucket: files,
            mirror: mirror.to_path_buf(),
        };
        let cache = Self::open_from(&dir, false, Box::new(source))?;
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
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;
    use crate::storage::{Codec, Manifest};

    /// Publish the cache at `dir` under `root/<name>` as `upload` lays it
    /// out, on a local directory seen as a bucket; returns that bucket.
    fn publish(dir: &Path, root: &Path, name: &str, claimed_id: Option<u64>) -> Bucket {
        let manifest = Manifest::read(dir).unwrap();
        let bucket = Bucket::local(root).unwrap().child(name);
        let version = format!("{}-v", hex64(manifest.cache_id));
        let files = bucket.child(&version);
        let names = manifest.shards.iter().map(|s| s.file.as_str());
        for file in names.chain([INDEX_FILE, METADATA_FILE, MANIFEST_FILE]) {
            files.upload(&dir.join(file), file).unwrap();
        }
        let record = Published {
            format_version: crate::storage::FORMAT_VERSION,
            cache_id: claimed_id.unwrap_or(manifest.cache_id),
            version,
        };
        let body = serde_json::to_vec(&record).unwrap();
        assert!(bucket
            .create(crate::storage::upload::PUBLISHED, body)
            .unwrap());
        bucket
    }

    #[test]
    fn shards_are_fetched_into_the_mirror_when_first_read() {
        let base = tempfile::tempdir().unwrap();
        let lens = [700, 800, 900, 1000];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 2000);
        let bucket = publish(&dir, &base.path().join("bucket"), "c", None);
        let mirror = base.path().join("mirror");
        let cache = Cache::open_remote(&bucket, &mirror).unwrap();
        assert_eq!(
            cache.manifest(),
            Cache::open(&dir, true).unwrap().manifest()
        );
        assert_eq!(cache.manifest().shards.len(), 2);
        assert!(cache.dir().starts_with(&mirror) && cache.dir().ends_with("c"));
        let fetched = |i: usize| cache.dir().join(&cache.manifest().shards[i].file).exists();
        assert!(cache.dir().join(MANIFEST_FILE).exists());
        assert!(!fetched(0) && !fetched(1), "no shard before a read");
        assert!(cache.open_shard(1).is_none());

        assert_eq!(cache.read(3).unwrap(), fixture::payload(3, 1000));
        assert!(!fetched(0) && fetched(1), "only the shard read");
        assert!(cache.open_shard(1).is_some());
        for (i, &len) in lens.iter().enumerate() {
            assert_eq!(
                cache.read(i as u64).unwrap(),
                fixture::payload(i as u64, len)
            );
        }
        assert!(fetched(0));

        // Reopened: the mirror's files are used as they are.
        drop(cache);
        let again = Cache::open_remote(&bucket, &mirror).unwrap();
        assert!(again.open_shard(0).is_none());
        assert_eq!(again.read(0).unwrap(), fixture::payload(0, 700));
    }

    #[test]
    fn nothing_published_is_not_found_and_another_cache_id_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(&base.path().join("local"), "c", &[10], Codec::None, 2000);
        let root = base.path().join("bucket");
        let mirror = base.path().join("mirror");
        let empty = Bucket::local(&root).unwrap().child("none");
        match Cache::open_remote(&empty, &mirror) {
            Err(Error::NotFound(m)) => assert!(m.contains("no cache is published"), "{m}"),
            Err(other) => panic!("expected NotFound, got {other:?}"),
            Ok(_) => panic!("expected NotFound, it opened"),
        }
        let bucket = publish(&dir, &root, "c", Some(7));
        match Cache::open_remote(&bucket, &mirror) {
            Err(err @ Error::CorruptCache { .. }) => {
                assert!(err.to_string().contains("its publication record"), "{err}")
            }
            Err(other) => panic!("expected a corrupt cache, got {other:?}"),
            Ok(_) => panic!("expected a corrupt cache, it opened"),
        }
    }

    #[test]
    fn a_local_cache_has_every_shard_open_and_none_out_of_range() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[10, 10], Codec::None, 10);
        let cache = Cache::open(&dir, false).unwrap();
        assert_eq!(cache.manifest().shards.len(), 2);
        assert!(cache.open_shard(0).is_some() && cache.shard(1).is_ok());
        assert!(cache.open_shard(2).is_none());
        let err = cache.shard(2).err().unwrap();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
    }
}
