//! A cache on object storage, read through a local mirror (`open_remote`):
//! its manifest, index and metadata are fetched when it is opened; its
//! records by range before a stream reads them, or when read, and its shards
//! whole into the mirror when that is cheaper (`Mirrored`, the cache's
//! `ShardSource`, and `planned`), the mirror kept within its budget
//! (`storage::mirror`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::planned::Planned;
use super::shard::Shard;
use super::source::ShardSource;
use super::Cache;
use crate::error::{Error, Result};
use crate::hash::xxh3_64;
use crate::remote::Bucket;
use crate::storage::index::IndexEntry;
use crate::storage::manifest::FileEntry;
use crate::storage::upload::{Published, PublishedFiles};
use crate::storage::{hex64, mirror, INDEX_FILE, MANIFEST_FILE, METADATA_FILE};

/// The shards of a cache on object storage: records fetched by range before
/// or when they are read (`Planned`), shards fetched whole into the mirror
/// when that is cheaper or when a read needs the whole file.
struct Mirrored {
    files: PublishedFiles,
    mirror: PathBuf,
    planned: Arc<Planned>,
}

/// Times a shard is fetched again when the mirror removed it between its
/// fetch and its opening (a budget smaller than the shards read at once).
const BRING_ATTEMPTS: usize = 3;

impl ShardSource for Mirrored {
    fn at_open(&self, _entry: &FileEntry, _path: &Path, _verify: bool) -> Result<OnceLock<Shard>> {
        Ok(OnceLock::new())
    }

    fn bring(&self, entry: &FileEntry, path: &Path) -> Result<File> {
        for _ in 0..BRING_ATTEMPTS {
            // Opened, not only looked at: once open, the mirror may delete
            // the file and the shard stays readable.
            if let Ok(file) = File::open(path) {
                if file.metadata().is_ok_and(|m| m.len() == entry.bytes) {
                    mirror::touch(path);
                    return Ok(file);
                }
            }
            self.files
                .download_known(&entry.file, entry.bytes, path, &|_| {})?;
            mirror::evict(&self.mirror, path);
        }
        Err(evicted_before_open(path))
    }

    fn record(&self, shard: &FileEntry, record: &IndexEntry) -> Result<Option<Bytes>> {
        self.planned.record(shard, record)
    }

    fn plan(&self, shards: &[FileEntry], records: &[IndexEntry]) {
        self.planned.plan(shards, records)
    }

    fn refetches(&self) -> bool {
        true
    }
}

/// The error for a shard that a mirror fetched but lost before it was opened.
pub(super) fn evicted_before_open(path: &Path) -> Error {
    Error::Unavailable(format!(
        "{} was fetched into the mirror but removed again before it could be opened; \
         the mirror's budget (--mirror-max-bytes) is smaller than the shards read at once",
        path.display()
    ))
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
        let files = PublishedFiles::of(bucket, &published);
        for file in [MANIFEST_FILE, INDEX_FILE, METADATA_FILE] {
            if !dir.join(file).exists() {
                files.download(file, &dir.join(file))?;
            }
        }
        let source = Mirrored {
            planned: Planned::new(files.clone(), &dir, mirror),
            files,
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
    use crate::storage::upload::{publish_cache, PUBLISHED};
    use crate::storage::{Codec, Manifest};

    /// Publish the cache at `dir` (named `c`) under `root/c` as `upload`
    /// does, on a local directory seen as a bucket; returns that bucket.
    fn publish(dir: &Path, root: &Path) -> Bucket {
        let base = Bucket::local(root).unwrap();
        assert!(publish_cache(dir, &base, false).unwrap().uploaded);
        base.child("c")
    }

    /// Publish as a version before `Layout::Spread` did: every file at
    /// `<version>/<file>`, a record without a layout, claiming `cache_id`.
    fn publish_flat(dir: &Path, root: &Path, cache_id: u64) -> Bucket {
        let manifest = Manifest::read(dir).unwrap();
        let bucket = Bucket::local(root).unwrap().child("c");
        let manifest_bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
        let version = format!(
            "{}-{}",
            hex64(manifest.cache_id),
            hex64(xxh3_64(&manifest_bytes))
        );
        let files = bucket.child(&version);
        let names = manifest.shards.iter().map(|s| s.file.as_str());
        for file in names.chain([INDEX_FILE, METADATA_FILE, MANIFEST_FILE]) {
            files.upload(&dir.join(file), file).unwrap();
        }
        let body = format!(
            r#"{{"format_version": {}, "cache_id": {cache_id}, "version": "{version}"}}"#,
            crate::storage::FORMAT_VERSION
        );
        assert!(bucket.create(PUBLISHED, body.into_bytes()).unwrap());
        bucket
    }

    /// Until `cond` holds (a background fetch), for at most 10 s.
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn records_are_read_by_range_and_small_shards_then_fetched_whole() {
        let base = tempfile::tempdir().unwrap();
        let lens = [700, 800, 900, 1000];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 2000);
        let bucket = publish(&dir, &base.path().join("bucket"));
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
        assert!(
            !cache.every_shard_open(),
            "a plan still has records to ask for"
        );

        // The first read fetches its record alone; a shard smaller than what
        // a request costs is then fetched whole, in the background.
        assert_eq!(cache.read(3).unwrap(), fixture::payload(3, 1000));
        assert!(
            cache.open_shard(1).is_none(),
            "read by range, not from the shard"
        );
        assert!(eventually(|| fetched(1)), "the shard arrives in the mirror");
        assert!(!fetched(0), "only the shard read");
        for (i, &len) in lens.iter().enumerate() {
            assert_eq!(
                cache.read(i as u64).unwrap(),
                fixture::payload(i as u64, len)
            );
        }
        assert!(
            cache.open_shard(1).is_some(),
            "read from the mirror once there"
        );
        assert!(
            eventually(|| (0..4).all(|i| cache.read(i).is_ok()) && cache.every_shard_open()),
            "every shard opens once it is in the mirror"
        );

        // Reopened: the mirror's files are used as they are.
        drop(cache);
        let again = Cache::open_remote(&bucket, &mirror).unwrap();
        assert!(again.open_shard(1).is_none());
        assert_eq!(again.read(3).unwrap(), fixture::payload(3, 1000));
        assert!(again.open_shard(1).is_some());
    }

    #[test]
    fn planned_records_are_fetched_once_and_verified_when_read() {
        let base = tempfile::tempdir().unwrap();
        // One shard far larger than a request's cost: it stays on the store.
        let lens = vec![100_000; 40];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 8 << 20);
        let bucket = publish(&dir, &base.path().join("bucket"));
        let cache = Cache::open_remote(&bucket, &base.path().join("mirror")).unwrap();
        let entries: Vec<IndexEntry> = [5u64, 6, 30, 5]
            .iter()
            .map(|&i| cache.entry(i).unwrap())
            .collect();
        cache.plan(&entries);
        for i in [5u64, 30, 6, 5, 5] {
            assert_eq!(cache.read(i).unwrap(), fixture::payload(i, 100_000));
        }
        assert!(cache.open_shard(0).is_none(), "never fetched whole");

        // A record whose bytes on the store were damaged fails its checksum,
        // planned or not.
        let shard = &cache.manifest().shards[0];
        let published = Published::read(&bucket).unwrap().unwrap();
        let path = PathBuf::from(PublishedFiles::of(&bucket, &published).object(&shard.file));
        assert!(path.starts_with(base.path().join("bucket")), "{path:?}");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = cache.entry(12).unwrap().offset as usize + 10;
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        cache.plan(&[cache.entry(12).unwrap()]);
        for _ in 0..2 {
            let err = cache.read(12).unwrap_err();
            assert!(err.to_string().contains("fails its checksum"), "{err}");
        }
        assert_eq!(cache.read(13).unwrap(), fixture::payload(13, 100_000));
    }

    #[test]
    fn a_shard_the_mirror_deleted_is_not_damage_and_is_read_again() {
        let base = tempfile::tempdir().unwrap();
        let lens = [700, 800];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 1 << 20);
        let bucket = publish(&dir, &base.path().join("bucket"));
        let cache = Cache::open_remote(&bucket, &base.path().join("mirror")).unwrap();
        let path = cache.dir().join(&cache.manifest().shards[0].file);
        assert_eq!(cache.read(0).unwrap(), fixture::payload(0, 700));
        assert!(eventually(|| path.exists()));
        assert_eq!(cache.read(1).unwrap(), fixture::payload(1, 800));
        assert!(cache.open_shard(0).is_some());
        std::fs::remove_file(&path).unwrap();
        assert!(
            !cache.files_changed(),
            "an evicted shard is not a changed one"
        );
        assert_eq!(cache.read(1).unwrap(), fixture::payload(1, 800));
        let reopened = Cache::open_remote(&bucket, &base.path().join("mirror")).unwrap();
        assert_eq!(reopened.read(0).unwrap(), fixture::payload(0, 700));
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
        let bucket = publish_flat(&dir, &root, 7);
        match Cache::open_remote(&bucket, &mirror) {
            Err(err @ Error::CorruptCache { .. }) => {
                assert!(err.to_string().contains("its publication record"), "{err}")
            }
            Err(other) => panic!("expected a corrupt cache, got {other:?}"),
            Ok(_) => panic!("expected a corrupt cache, it opened"),
        }
    }

    #[test]
    fn uploads_spread_their_files_over_key_prefixes() {
        let base = tempfile::tempdir().unwrap();
        let lens = vec![1000; 64];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 4000);
        let bucket = publish(&dir, &base.path().join("bucket"));
        let published = Published::read(&bucket).unwrap().unwrap();
        let record = std::fs::read_to_string(base.path().join("bucket/c").join(PUBLISHED));
        assert!(record.unwrap().contains(r#""layout":"spread""#));
        let version = base.path().join("bucket/c").join(&published.version);
        let files = PublishedFiles::of(&bucket, &published);
        let manifest = Manifest::read(&dir).unwrap();
        assert!(manifest.shards.len() >= 16, "{}", manifest.shards.len());
        let mut prefixes = std::collections::BTreeSet::new();
        for shard in &manifest.shards {
            let object = PathBuf::from(files.object(&shard.file));
            let below = object.strip_prefix(&version).unwrap();
            let prefix = below.parent().unwrap().to_string_lossy().to_string();
            assert!(
                prefix.len() == 2 && u8::from_str_radix(&prefix, 16).is_ok(),
                "{below:?}"
            );
            assert!(object.is_file(), "{object:?}");
            prefixes.insert(prefix);
        }
        assert!(prefixes.len() > manifest.shards.len() / 2, "{prefixes:?}");
        assert!(
            !version.join(&manifest.shards[0].file).exists(),
            "none flat"
        );
        let cache = Cache::open_remote(&bucket, &base.path().join("mirror")).unwrap();
        for (i, &len) in lens.iter().enumerate() {
            assert_eq!(
                cache.read(i as u64).unwrap(),
                fixture::payload(i as u64, len)
            );
        }
    }

    #[test]
    fn a_cache_published_before_layouts_is_read_where_it_is_and_not_uploaded_again() {
        let base = tempfile::tempdir().unwrap();
        let lens = [700, 800, 900, 1000];
        let dir = fixture::write(&base.path().join("local"), "c", &lens, Codec::None, 2000);
        let root = base.path().join("bucket");
        let id = Manifest::read(&dir).unwrap().cache_id;
        let bucket = publish_flat(&dir, &root, id);
        let cache = Cache::open_remote(&bucket, &base.path().join("mirror")).unwrap();
        for (i, &len) in lens.iter().enumerate() {
            assert_eq!(
                cache.read(i as u64).unwrap(),
                fixture::payload(i as u64, len)
            );
        }
        let before = std::fs::read(root.join("c").join(PUBLISHED)).unwrap();
        let again = publish_cache(&dir, &Bucket::local(&root).unwrap(), false).unwrap();
        assert!(!again.uploaded, "the same cache, already published");
        assert_eq!(
            std::fs::read(root.join("c").join(PUBLISHED)).unwrap(),
            before
        );
        let version = root.join("c").join(&again.version);
        let spread = std::fs::read_dir(&version).unwrap().flatten();
        assert!(
            spread.into_iter().all(|e| e.path().is_file()),
            "no file written again"
        );
    }

    #[test]
    fn a_publication_record_of_an_unknown_layout_or_field_is_damage() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(
            &base.path().join("local"),
            "c",
            &[10, 20],
            Codec::None,
            2000,
        );
        let root = base.path().join("bucket");
        let bucket = publish(&dir, &root);
        let record = root.join("c").join(PUBLISHED);
        let good = std::fs::read_to_string(&record).unwrap();
        for hostile in [
            good.replace(r#""layout":"spread""#, r#""layout":"zigzag""#),
            good.replace(
                r#""layout":"spread""#,
                r#""layout":"spread","keys":"../../x""#,
            ),
        ] {
            assert_ne!(hostile, good);
            std::fs::write(&record, &hostile).unwrap();
            match Cache::open_remote(&bucket, &base.path().join("mirror")) {
                Err(err @ Error::CorruptCache { .. }) => {
                    assert!(
                        err.to_string().contains("not a publication record"),
                        "{err}"
                    )
                }
                Err(other) => panic!("expected a corrupt cache, got {other:?}"),
                Ok(_) => panic!("{hostile} was read as a publication record"),
            }
        }
        std::fs::write(&record, &good).unwrap();
        assert!(Cache::open_remote(&bucket, &base.path().join("mirror")).is_ok());
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
