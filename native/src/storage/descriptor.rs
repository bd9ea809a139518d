//! A dataset of many caches under one name and one location: the dataset
//! descriptor, the parts that writes leave beside it, and the commit that
//! publishes one over the others (docs/storage-format.md, "Datasets of many
//! caches"; docs/distributed.md).
//!
//! ```text
//! <location>/descriptor.json                  the descriptor: created last, once, never replaced
//! <location>/parts/<write_id>/<part>/        one cache per part (a cache directory, or a
//!                                            cache published on object storage)
//! ```
//! Any number of tasks write parts of one write (one `write_id`), each part an
//! ordinary immutable cache named after its part, so its `cache_id` depends
//! only on its records and that name: a retried task writes the same cache
//! again, which is kept, never a second one. `commit` then checks that every
//! part it is given is complete and creates the descriptor create-only, so the
//! dataset appears whole or not at all, exactly once. Parts that no descriptor
//! names (a crashed or abandoned write) are removed by `remove_uncommitted`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::location::Location;
use super::publish::validate_name;
use super::temp::LockedTemp;
use super::upload::upload_cache;
use crate::error::{Error, IoContext, Result};
use crate::storage::hex64;

pub const DESCRIPTOR: &str = "descriptor.json";
pub const PARTS: &str = "parts";
pub const FORMAT_VERSION: u32 = 1;
/// A descriptor is small: 141 bytes per cache (benchmarks/bench_distributed.py),
/// so this cap holds some 475,000 caches and keeps a hostile object from being
/// read into memory.
pub const MAX_DESCRIPTOR_BYTES: u64 = 64 << 20;

/// `descriptor.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    pub format_version: u32,
    /// The dataset's name (a plain name, as a served dataset's).
    pub name: String,
    /// In the dataset's order (its table order): by part name.
    pub caches: Vec<DescribedCache>,
    /// What the parts were written from, as the writing engine reported it (a
    /// table's snapshot, the files read); null when it reported nothing.
    #[serde(default)]
    pub input: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribedCache {
    /// Relative to the descriptor's location: plain names joined by `/`.
    pub location: String,
    /// The cache's `cache_id`, 16 hex digits: a replaced cache is refused at open.
    pub cache_id: String,
    pub records: u64,
}

/// One part as its writer reports it, sent back to whoever commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub cache_id: u64,
    pub records: u64,
}

impl Descriptor {
    /// The descriptor at `at`, or None when there is none (then `at` is not a
    /// dataset of many caches; it may be one cache).
    pub fn read(at: &Location) -> Result<Option<Descriptor>> {
        let Ok(bucket) = at.bucket(false) else {
            return Ok(None);
        };
        let Some(size) = bucket.size(DESCRIPTOR)? else {
            return Ok(None);
        };
        let path = format!("{at}/{DESCRIPTOR}");
        if size > MAX_DESCRIPTOR_BYTES {
            return Err(Error::corrupt_dataset(
                path,
                format!(
                    "a dataset descriptor of {size} bytes is over the {MAX_DESCRIPTOR_BYTES}-byte \
                     cap; it is not one this project wrote"
                ),
            ));
        }
        let Some(bytes) = bucket.get(DESCRIPTOR)? else {
            return Ok(None);
        };
        let descriptor: Descriptor = serde_json::from_slice(&bytes).map_err(|e| {
            Error::corrupt_dataset(path.clone(), format!("not a dataset descriptor: {e}"))
        })?;
        descriptor
            .check()
            .map_err(|e| Error::corrupt_dataset(path, e.to_string()))?;
        Ok(Some(descriptor))
    }

    /// The rules a descriptor keeps, whoever wrote it.
    pub fn check(&self) -> Result<()> {
        if self.format_version != FORMAT_VERSION {
            return Err(Error::invalid(format!(
                "format_version {} is not one this version reads (it reads {FORMAT_VERSION}); \
                 upgrade dataset-rt",
                self.format_version
            )));
        }
        validate_name("dataset", &self.name)?;
        if self.caches.is_empty() {
            return Err(Error::invalid("a dataset descriptor lists no caches"));
        }
        let mut ids = BTreeMap::new();
        let mut locations = BTreeSet::new();
        for cache in &self.caches {
            for part in cache.location.split('/') {
                validate_name("cache location part", part)?;
            }
            if !locations.insert(cache.location.as_str()) {
                return Err(Error::invalid(format!(
                    "the cache {:?} is listed twice",
                    cache.location
                )));
            }
            let id = parse_id(&cache.cache_id)?;
            if let Some(other) = ids.insert(id, cache.location.as_str()) {
                return Err(Error::invalid(format!(
                    "the caches {other:?} and {:?} have the same cache_id {}",
                    cache.location, cache.cache_id
                )));
            }
        }
        Ok(())
    }

    /// Where each cache is, with the `cache_id` it must have.
    pub fn caches_at(&self, at: &Location) -> Vec<(Location, u64)> {
        self.caches
            .iter()
            .map(|c| (at.join(&c.location), parse_id(&c.cache_id).unwrap_or(0)))
            .collect()
    }

    pub fn records(&self) -> u64 {
        self.caches.iter().map(|c| c.records).sum()
    }
}

fn parse_id(text: &str) -> Result<u64> {
    if text.len() != 16 {
        return Err(Error::invalid(format!(
            "cache_id {text:?} is not 16 hex digits"
        )));
    }
    u64::from_str_radix(text, 16)
        .map_err(|_| Error::invalid(format!("cache_id {text:?} is not 16 hex digits")))
}

/// Where the parts of the write `write_id` go, relative to the dataset.
pub fn parts_prefix(write_id: &str) -> Result<String> {
    let valid = write_id.len() == 32
        && write_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !valid {
        return Err(Error::invalid(format!(
            "write id {write_id:?} is not 32 lowercase hex digits (DatasetWrite.begin makes one)"
        )));
    }
    Ok(format!("{PARTS}/{write_id}"))
}

/// Where one task writes its parts of a write before they are published at
/// the dataset: in place for a local dataset (the writer publishes a cache by
/// renaming it into `parts/<write_id>/`), or a scratch directory whose caches
/// are uploaded to the bucket and then removed.
pub struct PartStage {
    at: Location,
    prefix: String,
    staging: PathBuf,
    /// The scratch directory of a dataset on object storage, held locked while
    /// in use (`storage::temp`) and removed when the stage is dropped.
    scratch: Option<LockedTemp>,
}

impl PartStage {
    pub fn new(at: &Location, write_id: &str, scratch_root: &Path) -> Result<Self> {
        let prefix = parts_prefix(write_id)?;
        let (staging, scratch) = match at.join(&prefix) {
            Location::Dir(dir) => {
                fs::create_dir_all(&dir).at("cannot create", &dir)?;
                (dir, None)
            }
            Location::Bucket(_) => {
                fs::create_dir_all(scratch_root).at("cannot create", scratch_root)?;
                let scratch = LockedTemp::create_dir(scratch_root, ".dataset-rt-part-")?;
                (scratch.path().to_path_buf(), Some(scratch))
            }
        };
        Ok(PartStage {
            at: at.clone(),
            prefix,
            staging,
            scratch,
        })
    }

    /// The base directory the part's cache is written in (as `base/<part>`).
    pub fn staging_dir(&self) -> &Path {
        &self.staging
    }

    /// Publish the cache written at `staging_dir()/<part>` as that part of the
    /// write, and say what it is.
    pub fn publish(&self, part: &str) -> Result<Part> {
        validate_name("part", part)?;
        let dir = self.staging.join(part);
        let manifest = crate::storage::Cache::open(&dir, false)?.manifest().clone();
        if let Location::Bucket(url) = &self.at {
            upload_cache(&dir, &format!("{url}/{}", self.prefix), false)?;
            fs::remove_dir_all(&dir).at("cannot remove", &dir)?;
        }
        Ok(Part {
            name: part.to_string(),
            cache_id: manifest.cache_id,
            records: manifest.record_count,
        })
    }
}

impl Drop for PartStage {
    fn drop(&mut self) {
        if let Some(scratch) = &self.scratch {
            let _ = fs::remove_dir_all(scratch.path());
        }
    }
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub descriptor: Descriptor,
    /// False when exactly this descriptor was there already (a retried commit).
    pub created: bool,
}

/// Publish one descriptor over `parts` of the write `write_id` at `at`: every
/// part must be complete there; the descriptor is created only if none exists
/// (the same one there already is a retried commit, another one an error).
pub fn commit(
    at: &Location,
    name: &str,
    write_id: &str,
    parts: &[Part],
    input: serde_json::Value,
) -> Result<Committed> {
    validate_name("dataset", name)?;
    let prefix = parts_prefix(write_id)?;
    if parts.is_empty() {
        return Err(Error::invalid(
            "a commit needs at least one part (every write task wrote no rows?)",
        ));
    }
    let mut by_name = BTreeMap::new();
    for part in parts {
        validate_name("part", &part.name)?;
        if by_name.insert(part.name.as_str(), part).is_some() {
            return Err(Error::invalid(format!(
                "the part {:?} is given twice; give each part once",
                part.name
            )));
        }
    }
    let bucket = at.bucket(false)?;
    // One listing (not a request per part) says which parts are complete.
    let marker = at.published_marker();
    let complete: BTreeSet<String> = bucket
        .list(&format!("{prefix}/"), None)?
        .into_iter()
        .filter_map(|key| {
            let rest = key.strip_prefix(&format!("{prefix}/"))?;
            let (part, file) = rest.split_once('/')?;
            (file == marker).then(|| part.to_string())
        })
        .collect();
    if let Some(missing) = by_name.keys().find(|p| !complete.contains(**p)) {
        return Err(Error::NotFound(format!(
            "the part {missing:?} of write {write_id} is not complete at {at}; commit only parts \
             whose writes returned (nothing was published)"
        )));
    }
    let descriptor = Descriptor {
        format_version: FORMAT_VERSION,
        name: name.to_string(),
        caches: by_name
            .values()
            .map(|p| DescribedCache {
                location: format!("{prefix}/{}", p.name),
                cache_id: hex64(p.cache_id),
                records: p.records,
            })
            .collect(),
        input,
    };
    descriptor.check()?;
    let encoded = serde_json::to_vec_pretty(&descriptor)
        .map_err(|e| Error::internal(format!("cannot encode a dataset descriptor: {e}")))?;
    if bucket.create(DESCRIPTOR, encoded)? {
        return Ok(Committed {
            descriptor,
            created: true,
        });
    }
    match Descriptor::read(at)? {
        Some(there) if there == descriptor => Ok(Committed {
            descriptor,
            created: false,
        }),
        Some(there) => Err(Error::invalid(format!(
            "{at} already holds the dataset {:?} ({} caches, {} records); a dataset descriptor \
             is never replaced: write to another location",
            there.name,
            there.caches.len(),
            there.records()
        ))),
        None => Err(Error::Unavailable(format!(
            "{at}/{DESCRIPTOR} could not be created and cannot be read; retry the commit"
        ))),
    }
}

/// What `remove_uncommitted` removed (or would remove, in a dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// `parts/<write_id>/<part>` of each part removed.
    pub parts: Vec<String>,
    /// Parts left because an object of theirs is younger than the age given.
    pub recent: Vec<String>,
    pub bytes: u64,
}

/// Remove the parts at `at` that its descriptor does not name (all of them
/// when there is none) and whose newest object is older than `min_age`, so
/// that a write still running is left alone.
pub fn remove_uncommitted(at: &Location, min_age: Duration, dry_run: bool) -> Result<Removal> {
    let named: BTreeSet<String> = Descriptor::read(at)?
        .map(|d| d.caches.into_iter().map(|c| c.location).collect())
        .unwrap_or_default();
    let bucket = at.bucket(false)?;
    // Per part: its newest object and its bytes.
    let mut parts: BTreeMap<String, (SystemTime, u64)> = BTreeMap::new();
    for object in bucket.list_modified(&format!("{PARTS}/"))? {
        let mut path = object.name.splitn(4, '/');
        let (Some(PARTS), Some(write_id), Some(part), Some(_)) =
            (path.next(), path.next(), path.next(), path.next())
        else {
            continue;
        };
        let entry = parts
            .entry(format!("{PARTS}/{write_id}/{part}"))
            .or_insert((SystemTime::UNIX_EPOCH, 0));
        entry.0 = entry.0.max(object.modified);
        entry.1 += object.size;
    }
    let now = SystemTime::now();
    let mut removal = Removal::default();
    for (part, (newest, bytes)) in parts {
        if named.contains(&part) {
            continue;
        }
        if now.duration_since(newest).unwrap_or_default() < min_age {
            removal.recent.push(part);
            continue;
        }
        if !dry_run {
            at.remove_tree(&part)?;
        }
        removal.parts.push(part);
        removal.bytes += bytes;
    }
    Ok(removal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, cache_id: u64) -> Part {
        Part {
            name: name.into(),
            cache_id,
            records: 10,
        }
    }

    const WRITE: &str = "0123456789abcdef0123456789abcdef";

    fn complete(at: &Location, part: &str) {
        let dir = at.local_dir().unwrap().join(PARTS).join(WRITE).join(part);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(at.published_marker()), b"{}").unwrap();
    }

    #[test]
    fn a_commit_publishes_once_and_a_retry_is_the_same_commit() {
        let base = tempfile::tempdir().unwrap();
        let at = Location::Dir(base.path().to_path_buf());
        complete(&at, "p1");
        complete(&at, "p0");
        let parts = [part("p1", 2), part("p0", 1)];
        let first = commit(&at, "set", WRITE, &parts, serde_json::Value::Null).unwrap();
        assert!(first.created);
        let locations: Vec<_> = first
            .descriptor
            .caches
            .iter()
            .map(|c| &c.location)
            .collect();
        assert_eq!(
            locations,
            [&format!("parts/{WRITE}/p0"), &format!("parts/{WRITE}/p1")]
        );
        let again = commit(&at, "set", WRITE, &parts, serde_json::Value::Null).unwrap();
        assert!(!again.created);
        assert_eq!(Descriptor::read(&at).unwrap(), Some(first.descriptor));
        let other = commit(&at, "set", WRITE, &parts[..1], serde_json::Value::Null);
        assert!(other.unwrap_err().to_string().contains("never replaced"));
    }

    #[test]
    fn a_commit_of_a_missing_part_publishes_nothing() {
        let base = tempfile::tempdir().unwrap();
        let at = Location::Dir(base.path().to_path_buf());
        complete(&at, "p0");
        let err = commit(
            &at,
            "set",
            WRITE,
            &[part("p0", 1), part("p1", 2)],
            Default::default(),
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::NotFound(ref m) if m.contains("\"p1\"")),
            "{err}"
        );
        assert_eq!(Descriptor::read(&at).unwrap(), None);
        let twice = commit(
            &at,
            "set",
            WRITE,
            &[part("p0", 1), part("p0", 1)],
            Default::default(),
        );
        assert!(twice.unwrap_err().to_string().contains("twice"));
        let bad_id = commit(&at, "set", "xyz", &[part("p0", 1)], Default::default());
        assert!(bad_id.unwrap_err().to_string().contains("32 lowercase hex"));
    }

    #[test]
    fn a_damaged_or_hostile_descriptor_is_reported_as_damage() {
        let base = tempfile::tempdir().unwrap();
        let at = Location::Dir(base.path().to_path_buf());
        let path = base.path().join(DESCRIPTOR);
        for (bytes, expect) in [
            (&b"{not json"[..], "not a dataset descriptor"),
            (br#"{"format_version":9,"name":"s","caches":[]}"#, "format_version 9"),
            (br#"{"format_version":1,"name":"s","caches":[]}"#, "lists no caches"),
            (
                br#"{"format_version":1,"name":"s","caches":[{"location":"../x","cache_id":"0000000000000001","records":1}]}"#,
                "starts with '.'",
            ),
            (
                br#"{"format_version":1,"name":"s","caches":[{"location":"a","cache_id":"1","records":1}]}"#,
                "16 hex digits",
            ),
            (
                br#"{"format_version":1,"name":"s","caches":[],"extra":1}"#,
                "unknown field",
            ),
        ] {
            std::fs::write(&path, bytes).unwrap();
            let err = Descriptor::read(&at).unwrap_err();
            assert!(matches!(err, Error::CorruptCache { .. }), "{err}");
            assert!(err.to_string().contains(expect), "{err} lacks {expect}");
        }
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_DESCRIPTOR_BYTES + 1).unwrap();
        assert!(Descriptor::read(&at)
            .unwrap_err()
            .to_string()
            .contains("cap"));
    }

    #[test]
    fn uncommitted_parts_are_removed_and_named_and_recent_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        let at = Location::Dir(base.path().to_path_buf());
        for p in ["p0", "p1", "orphan"] {
            complete(&at, p);
        }
        commit(
            &at,
            "set",
            WRITE,
            &[part("p0", 1), part("p1", 2)],
            Default::default(),
        )
        .unwrap();
        let recent = remove_uncommitted(&at, Duration::from_secs(3600), false).unwrap();
        assert_eq!(recent.recent, [format!("parts/{WRITE}/orphan")]);
        assert!(recent.parts.is_empty());
        let dry = remove_uncommitted(&at, Duration::ZERO, true).unwrap();
        assert_eq!(dry.parts, [format!("parts/{WRITE}/orphan")]);
        assert!(base.path().join(PARTS).join(WRITE).join("orphan").exists());
        let done = remove_uncommitted(&at, Duration::ZERO, false).unwrap();
        assert_eq!(done.parts, [format!("parts/{WRITE}/orphan")]);
        assert!(!base.path().join(PARTS).join(WRITE).join("orphan").exists());
        assert!(base.path().join(PARTS).join(WRITE).join("p0").exists());
    }
}
