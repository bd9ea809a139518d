//! Publishing a cache on object storage (docs/storage-format.md, "On object
//! storage").
//!
//! ```text
//! <url>/<name>/<version>/<xx>/manifest.json, index.bin, metadata.arrow, shard-*.bin
//! <url>/<name>/published.json     {"format_version", "cache_id", "version", "layout"}: created last
//! ```
//! `version` is `<cache_id>-<xxh3 of manifest.json>` (16 + 16 hex digits), so
//! the files of two different caches never share keys, and the same cache
//! uploaded twice writes the same bytes to the same keys. `<xx>` spreads the
//! files over 256 key prefixes (`Layout`). The cache is published by creating
//! `published.json` with `If-None-Match: *`: a reader sees a cache only once
//! every file of it is in place, and of two different caches uploaded under
//! one name at once exactly one is published; the other upload fails, saying
//! which one is there, and removes its own files. A published cache is never
//! replaced, as a local one is never overwritten.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{hex64, Cache, INDEX_FILE, MANIFEST_FILE, METADATA_FILE};
use crate::error::{Error, IoContext, Result};
use crate::hash::xxh3_64;
use crate::progress::{self, Unit};
use crate::remote::{Bucket, Fetch};

pub const PUBLISHED: &str = "published.json";

/// What `published.json` holds: where the files of the published cache are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    pub format_version: u32,
    pub cache_id: u64,
    pub version: String,
    /// Absent in records written before layouts were recorded: `Flat`.
    #[serde(default, skip_serializing_if = "Layout::is_flat")]
    pub layout: Layout,
}

/// How the files of a published cache are named under `<version>/`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `<version>/<file>`: caches published before `Spread`, read as they are.
    #[default]
    Flat,
    /// `<version>/<xx>/<file>`, `xx` the top byte of the xxh3-64 of the file's
    /// name in hex. A store serves a bounded request rate per key prefix (S3
    /// about 5,500 GETs a second) and splits a busy prefix only after it has
    /// throttled it for a while (`503 SlowDown`); a shuffled epoch reads every
    /// shard at once, so its requests are spread over 256 prefixes from the
    /// first one. What uploads write.
    Spread,
}

impl Layout {
    fn is_flat(&self) -> bool {
        *self == Layout::Flat
    }

    /// The object name of the cache file `file`, under `<version>/`.
    fn name(self, file: &str) -> String {
        match self {
            Layout::Flat => file.to_string(),
            Layout::Spread => format!("{:02x}/{file}", xxh3_64(file.as_bytes()) >> 56),
        }
    }
}

/// The files of one published cache in its bucket, each under the name its
/// layout gives: what readers fetch and uploads write, by the cache's own
/// file names.
#[derive(Clone)]
pub struct PublishedFiles {
    version: Bucket,
    layout: Layout,
}

impl PublishedFiles {
    /// The files `published` names, in `bucket` (`<url>/<name>`).
    pub fn of(bucket: &Bucket, published: &Published) -> Self {
        PublishedFiles {
            version: bucket.child(&published.version),
            layout: published.layout,
        }
    }

    /// Where the cache file `file` is in the bucket, for messages and tests.
    pub fn object(&self, file: &str) -> String {
        format!("{}/{}", self.version.url(), self.layout.name(file))
    }

    pub fn download(&self, file: &str, dest: &Path) -> Result<()> {
        self.version.download(&self.layout.name(file), dest)
    }

    /// `file`, of `size` bytes (the manifest says), into `dest`.
    pub fn download_known(
        &self,
        file: &str,
        size: u64,
        dest: &Path,
        received: &dyn Fn(u64),
    ) -> Result<()> {
        self.version
            .download_known(&self.layout.name(file), size, dest, received)
    }

    pub fn fetch_range(&self, file: &str, range: std::ops::Range<u64>) -> Result<Fetch> {
        self.version.fetch_range(&self.layout.name(file), range)
    }

    /// The cache files `files` of `dir`, several at once.
    fn upload(&self, dir: &Path, files: &[&str], sent: &dyn Fn(u64)) -> Result<()> {
        let sources: Vec<(PathBuf, String)> = files
            .iter()
            .map(|file| (dir.join(file), self.layout.name(file)))
            .collect();
        self.version.upload_files(&sources, sent)
    }

    fn delete(&self, file: &str) -> Result<()> {
        self.version.delete(&self.layout.name(file))
    }
}

/// The outcome of an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// `<url>/<name>`, where readers find it.
    pub url: String,
    pub cache_id: u64,
    pub version: String,
    pub bytes: u64,
    /// False when exactly this cache was already published there.
    pub uploaded: bool,
}

impl Published {
    /// Whether `other` publishes the same files, in whichever layout (one
    /// uploaded by a version before layouts is the same cache).
    fn is_the_same_cache(&self, other: &Published) -> bool {
        (self.format_version, self.cache_id, &self.version)
            == (other.format_version, other.cache_id, &other.version)
    }

    pub fn read(bucket: &Bucket) -> Result<Option<Published>> {
        let Some(bytes) = bucket.get(PUBLISHED)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::corrupt(
                format!("{}/{PUBLISHED}", bucket.url()),
                format!("not a publication record: {e}"),
            )
        })
    }
}

/// Upload the cache at `dir` (verified in full first: a damaged cache is never
/// published) to `<base_url>/<its name>`.
pub fn upload_cache(dir: &Path, base_url: &str, show_progress: bool) -> Result<Uploaded> {
    publish_cache(dir, &Bucket::open(base_url)?, show_progress)
}

/// `upload_cache` to any bucket: `<base>/<the cache's name>`.
pub fn publish_cache(dir: &Path, base: &Bucket, show_progress: bool) -> Result<Uploaded> {
    // `verify` checks every file's checksum and every record's: opening with
    // the shards' checksums too would hash each shard twice.
    let cache = Cache::open(dir, false)?;
    cache.verify()?;
    let manifest = cache.manifest();
    let name = &manifest.source_name;
    let bucket = base.child(name);
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_bytes = std::fs::read(&manifest_path).at("cannot read", &manifest_path)?;
    let version = format!(
        "{}-{}",
        hex64(manifest.cache_id),
        hex64(xxh3_64(&manifest_bytes))
    );
    let record = Published {
        format_version: super::FORMAT_VERSION,
        cache_id: manifest.cache_id,
        version: version.clone(),
        layout: Layout::Spread,
    };
    let mut files: Vec<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
    files.extend([INDEX_FILE, METADATA_FILE, MANIFEST_FILE]);
    let bytes: u64 = manifest.shards.iter().map(|s| s.bytes).sum::<u64>()
        + manifest.index.bytes
        + manifest.metadata.bytes
        + manifest_bytes.len() as u64;
    let outcome = |uploaded| Uploaded {
        url: bucket.url().to_string(),
        cache_id: manifest.cache_id,
        version: version.clone(),
        bytes,
        uploaded,
    };
    let refuse = |there: &Published| {
        Error::invalid(format!(
            "{} already holds another cache named {name:?} (cache_id {}, version {}); a \
             published cache is never replaced: upload under another prefix or name",
            bucket.url(),
            hex64(there.cache_id),
            there.version
        ))
    };
    if let Some(there) = Published::read(&bucket)? {
        return if there.is_the_same_cache(&record) {
            Ok(outcome(false))
        } else {
            Err(refuse(&there))
        };
    }
    let label = format!("uploading {name}");
    let progress = progress::bar(show_progress, label, Some(bytes), Unit::Bytes);
    let objects = PublishedFiles::of(&bucket, &record);
    // The files before the publication record, several at once: the record
    // alone makes them a published cache.
    objects.upload(dir, &files, &|n| progress.inc(n))?;
    let encoded = serde_json::to_vec(&record)
        .map_err(|e| Error::internal(format!("cannot encode a publication record: {e}")))?;
    if bucket.create(PUBLISHED, encoded)? {
        progress.finish();
        return Ok(outcome(true));
    }
    progress.abandon();
    // Another upload published first: the same cache (fine) or another one.
    match Published::read(&bucket)? {
        Some(there) if there.is_the_same_cache(&record) => {
            if there.layout != record.layout {
                // Published by an older version, under other names: ours are not read.
                for file in &files {
                    let _ = objects.delete(file);
                }
            }
            Ok(outcome(false))
        }
        Some(there) => {
            for file in &files {
                let _ = objects.delete(file);
            }
            Err(refuse(&there))
        }
        None => Err(Error::Unavailable(format!(
            "{}/{PUBLISHED} could not be created and cannot be read; retry the upload",
            bucket.url()
        ))),
    }
}
