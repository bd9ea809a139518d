//! Publishing a cache on object storage (docs/storage-format.md, "On object
//! storage").
//!
//! ```text
//! <url>/<name>/<version>/manifest.json, index.bin, metadata.arrow, shard-*.bin
//! <url>/<name>/published.json     {"format_version", "cache_id", "version"}: created last
//! ```
//! `version` is `<cache_id>-<xxh3 of manifest.json>` (16 + 16 hex digits), so
//! the files of two different caches never share keys, and the same cache
//! uploaded twice writes the same bytes to the same keys. The cache is
//! published by creating `published.json` with `If-None-Match: *`: a reader
//! sees a cache only once every file of it is in place, and of two different
//! caches uploaded under one name at once exactly one is published; the other
//! upload fails, saying which one is there, and removes its own files. A
//! published cache is never replaced, as a local one is never overwritten.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{hex64, Cache, INDEX_FILE, MANIFEST_FILE, METADATA_FILE};
use crate::error::{Error, IoContext, Result};
use crate::hash::xxh3_64;
use crate::progress::{self, Unit};
use crate::remote::Bucket;

pub const PUBLISHED: &str = "published.json";

/// What `published.json` holds: where the files of the published cache are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    pub format_version: u32,
    pub cache_id: u64,
    pub version: String,
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
    // `verify` checks every file's checksum and every record's: opening with
    // the shards' checksums too would hash each shard twice.
    let cache = Cache::open(dir, false)?;
    cache.verify()?;
    let manifest = cache.manifest();
    let name = &manifest.source_name;
    let bucket = Bucket::open(base_url)?.child(name);
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
        return if there == record {
            Ok(outcome(false))
        } else {
            Err(refuse(&there))
        };
    }
    let label = format!("uploading {name}");
    let progress = progress::bar(show_progress, label, Some(bytes), Unit::Bytes);
    let versioned = bucket.child(&version);
    let sources: Vec<(PathBuf, String)> = files
        .iter()
        .map(|file| (dir.join(file), file.to_string()))
        .collect();
    // The files before the publication record, several at once: the record
    // alone makes them a published cache.
    versioned.upload_files(&sources, &|n| progress.inc(n))?;
    let encoded = serde_json::to_vec(&record)
        .map_err(|e| Error::internal(format!("cannot encode a publication record: {e}")))?;
    if bucket.create(PUBLISHED, encoded)? {
        progress.finish();
        return Ok(outcome(true));
    }
    progress.abandon();
    // Another upload published first: the same cache (fine) or another one.
    match Published::read(&bucket)? {
        Some(there) if there == record => Ok(outcome(false)),
        Some(there) => {
            for file in &files {
                let _ = versioned.delete(file);
            }
            Err(refuse(&there))
        }
        None => Err(Error::Unavailable(format!(
            "{}/{PUBLISHED} could not be created and cannot be read; retry the upload",
            bucket.url()
        ))),
    }
}
