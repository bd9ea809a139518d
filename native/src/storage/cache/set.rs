//! `CacheSet`: the caches of one dataset, addressable by position or by
//! `cache_id`, checked when put together (one schema, no cache twice), and
//! opened from directories or from object storage through a mirror.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Cache;
use crate::error::{Error, Result};
use crate::remote::Bucket;
use crate::storage::descriptor::Descriptor;
use crate::storage::hex64;
use crate::storage::index::IndexEntry;
use crate::storage::location::Location;
use crate::storage::schema::ColumnSpec;

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
    /// (`s3://bucket/prefix/name`), read through the directory `mirror`, or a
    /// dataset of many caches (a directory or prefix holding a dataset
    /// descriptor, `storage::descriptor`), which stands for its caches in its
    /// order, each checked to be the cache it names.
    pub fn open_mirrored(
        locations: &[PathBuf],
        verify_shards: bool,
        mirror: Option<&Path>,
    ) -> Result<Self> {
        let mut caches = Vec::new();
        for text in locations {
            let location = Location::parse(&text.to_string_lossy())?;
            location.check_mirror(mirror)?;
            match Descriptor::read(&location)? {
                None => caches.push(Arc::new(open_one(&location, verify_shards, mirror)?)),
                Some(descriptor) => {
                    for (at, cache_id) in descriptor.caches_at(&location) {
                        let cache = open_one(&at, verify_shards, mirror)?;
                        if cache.cache_id() != cache_id {
                            return Err(Error::corrupt_dataset(
                                cache.dir(),
                                format!(
                                    "the dataset {location} names the cache {} here, and this is cache {}: it \
                                     was replaced after the dataset was committed; write the \
                                     dataset again",
                                    hex64(cache_id),
                                    hex64(cache.cache_id())
                                ),
                            ));
                        }
                        caches.push(Arc::new(cache));
                    }
                }
            }
        }
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

    /// The records (cache, index entry) a stream reads next, in order: those
    /// of shards not open yet (a cache on object storage) are fetched now
    /// (`planned`). Once every shard of every cache is open (a cache read in
    /// place, from the start) the records are not looked at.
    pub fn plan(&self, records: impl Iterator<Item = (u32, IndexEntry)>) {
        // Not a record looked at while every shard is open (a stream's rows
        // are its hottest loop: this was a tenth of a 1 KiB stream's planning).
        if self.caches.iter().all(|cache| cache.every_shard_open()) {
            return;
        }
        let mut wanted: HashMap<u32, Vec<IndexEntry>> = HashMap::new();
        for (cache, entry) in records {
            if self.caches[cache as usize]
                .open_shard(entry.shard as usize)
                .is_some()
            {
                continue;
            }
            wanted.entry(cache).or_default().push(entry);
        }
        for (cache, entries) in wanted {
            self.caches[cache as usize].plan(&entries);
        }
    }

    /// The error for a shard of this set that a read found cut short, if any.
    pub fn truncation(&self) -> Option<Error> {
        self.caches.iter().find_map(|c| c.truncation())
    }
}

/// One cache: in place, or on object storage through `mirror`.
fn open_one(location: &Location, verify_shards: bool, mirror: Option<&Path>) -> Result<Cache> {
    location.check_mirror(mirror)?;
    match (location, mirror) {
        (Location::Dir(dir), _) => Cache::open(dir, verify_shards),
        (Location::Bucket(url), Some(mirror)) => Cache::open_remote(&Bucket::open(url)?, mirror),
        (Location::Bucket(url), None) => Err(Error::internal(format!(
            "{url}: a cache on object storage reached open_one without a mirror"
        ))),
    }
}

fn describe(columns: &[ColumnSpec]) -> String {
    let parts: Vec<String> = columns
        .iter()
        .map(|c| format!("{}: {}", c.name, c.dtype.name()))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;
    use crate::storage::{CacheWriter, Codec, EncodedRecord, MetaType, MetaValue};

    fn open(dir: &Path) -> Arc<Cache> {
        Arc::new(Cache::open(dir, true).unwrap())
    }

    fn message(result: Result<CacheSet>) -> Error {
        match result {
            Err(err) => err,
            Ok(_) => panic!("expected an error, the set was made"),
        }
    }

    #[test]
    fn caches_are_found_by_position_and_by_cache_id() {
        let base = tempfile::tempdir().unwrap();
        let a = fixture::write(base.path(), "a", &[1, 2, 3], Codec::None, 1 << 20);
        let b = fixture::write(base.path(), "b", &[4, 5], Codec::Zstd, 1 << 20);
        let set = CacheSet::open(&[b.clone(), a.clone()], true).unwrap();
        let ids = set.cache_ids();
        assert_eq!(ids, vec![open(&b).cache_id(), open(&a).cache_id()]);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(set.index_of(ids[1]), Some(1));
        assert_eq!(set.index_of(ids[0] ^ ids[1] ^ 1), None);
        assert_eq!(set.get(1).dir(), a.as_path());
        assert_eq!(set.caches().len(), 2);
        assert!(
            set.caches().iter().all(|c| c.every_shard_open()),
            "caches read in place open every shard with the cache"
        );
        assert_eq!(set.total_records(), 5);
        assert_eq!(set.columns(), open(&a).columns());
        assert!(set.truncation().is_none());
    }

    #[test]
    fn a_set_refuses_no_cache_a_cache_twice_and_two_schemas() {
        let base = tempfile::tempdir().unwrap();
        let a = fixture::write(base.path(), "a", &[1, 2, 3], Codec::None, 1 << 20);
        let err = message(CacheSet::new(vec![]));
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

        let err = message(CacheSet::new(vec![open(&a), open(&a)]));
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(
            err.to_string().contains("the same cache given twice"),
            "{err}"
        );

        let columns = vec![ColumnSpec {
            name: "split".into(),
            dtype: MetaType::String,
        }];
        let mut writer =
            CacheWriter::create(base.path(), "s", columns, Default::default()).unwrap();
        let record = EncodedRecord::encode(b"x".to_vec(), Default::default()).unwrap();
        writer
            .append(&record, &[MetaValue::Str("train".into())])
            .unwrap();
        let (s, _) = writer.finish().unwrap();
        let err = message(CacheSet::new(vec![open(&a), open(&s)]));
        assert!(matches!(err, Error::Schema(_)), "{err:?}");
        assert!(
            err.to_string().contains("([label: int] vs [split: str])"),
            "{err}"
        );
    }

    #[test]
    fn a_cache_on_object_storage_needs_a_mirror() {
        let url = PathBuf::from("s3://bucket/prefix/name");
        let err = message(CacheSet::open_mirrored(&[url], false, None));
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains("give a mirror directory"), "{err}");
    }
}
