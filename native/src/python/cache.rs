//! Cache inspection for Python: open, verify and describe a cache directory.
//! Results are frozen typed classes, not dicts.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use crate::error::Error;
use crate::storage::{Cache, Manifest, FORMAT_VERSION};

/// What `verify_cache` checked.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct VerifyReport {
    path: String,
    cache_id: u64,
    files: u64,
    bytes: u64,
    records: u64,
}

/// What `upload_cache` did.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct UploadReport {
    /// Where readers find the cache: `<url>/<name>`.
    url: String,
    cache_id: u64,
    /// The key prefix of its files below `url`.
    version: String,
    bytes: u64,
    /// False when exactly this cache was already published there.
    uploaded: bool,
}

/// Publish the cache at `path` on object storage under `url` (`s3://bucket/prefix`):
/// verified in full, its files uploaded, then published (docs/storage-format.md).
#[pyfunction]
#[pyo3(signature = (path, url, *, show_progress=false))]
pub fn upload_cache(
    py: Python<'_>,
    path: PathBuf,
    url: String,
    show_progress: bool,
) -> PyResult<UploadReport> {
    let done = py
        .detach(|| crate::storage::upload::upload_cache(&path, &url, show_progress))
        .py()?;
    Ok(UploadReport {
        url: done.url,
        cache_id: done.cache_id,
        version: done.version,
        bytes: done.bytes,
        uploaded: done.uploaded,
    })
}

/// Bound the mirrors of caches on object storage in this process to `bytes`
/// of shards (0: no bound; `storage::mirror`).
#[pyfunction]
pub fn set_mirror_budget(bytes: u64) {
    crate::storage::mirror::set_budget(bytes);
}

/// Read requests this process made of object storage and the bytes they
/// brought, since it started: `(requests, bytes)`.
#[pyfunction]
pub fn object_store_reads() -> (u64, u64) {
    crate::remote::counters::read()
}

/// Slow-down answers (503 SlowDown, 429) this process received from object
/// storage since it started; each was retried with backoff
/// (`remote/slow_downs.rs`).
#[pyfunction]
pub fn object_store_slow_downs() -> u64 {
    crate::remote::counters::slow_downs()
}

/// One payload shard of a cache.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct ShardInfo {
    file: String,
    bytes: u64,
    records: u64,
}

/// A cache's manifest, as `inspect_cache` (after the open-time checks) or
/// `describe_manifest` (checked against its own checksum only) read it.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct CacheInfo {
    #[pyo3(get)]
    path: String,
    #[pyo3(get)]
    format_version: u32,
    #[pyo3(get)]
    source_name: String,
    #[pyo3(get)]
    cache_id: u64,
    #[pyo3(get)]
    record_count: u64,
    /// `"none"`, `"lz4"` or `"zstd"`.
    #[pyo3(get)]
    codec: String,
    #[pyo3(get)]
    level: i32,
    #[pyo3(get)]
    payload_bytes: u64,
    #[pyo3(get)]
    stored_bytes: u64,
    #[pyo3(get)]
    writer: String,
    /// `(name, type)` of the stored metadata columns.
    #[pyo3(get)]
    columns: Vec<(String, String)>,
    #[pyo3(get)]
    shards: Vec<Py<ShardInfo>>,
    manifest: Manifest,
}

#[pymethods]
impl CacheInfo {
    /// The manifest as JSON, with `format_version` and `path` added.
    fn to_json(&self) -> PyResult<String> {
        let mut value = serde_json::to_value(&self.manifest)
            .map_err(|e| Error::internal(format!("cannot encode the manifest: {e}")))
            .py()?;
        if let Some(object) = value.as_object_mut() {
            object.insert("format_version".into(), self.format_version.into());
            object.insert("path".into(), self.path.clone().into());
        }
        serde_json::to_string_pretty(&value)
            .map_err(|e| Error::internal(format!("cannot encode the manifest: {e}")))
            .py()
    }
}

/// Open a cache as a reader would; with `full`, verify every file's checksum.
#[pyfunction]
pub fn check_cache(py: Python<'_>, path: PathBuf, full: bool) -> PyResult<()> {
    py.detach(|| Cache::open(&path, full).map(|_| ())).py()
}

/// Verify every file and every record.
#[pyfunction]
pub fn verify_cache(py: Python<'_>, path: PathBuf) -> PyResult<VerifyReport> {
    let (cache_id, report) = py
        .detach(|| {
            let cache = Cache::open(&path, false)?;
            cache.verify().map(|r| (cache.cache_id(), r))
        })
        .py()?;
    Ok(VerifyReport {
        path: path.to_string_lossy().into_owned(),
        cache_id,
        files: report.files,
        bytes: report.bytes,
        records: report.records,
    })
}

/// Describe the cache at `path` after the open-time checks a reader makes
/// (`Cache::open`: the manifest, `index.bin` and `metadata.arrow`).
#[pyfunction]
pub fn inspect_cache(py: Python<'_>, path: PathBuf) -> PyResult<CacheInfo> {
    let manifest = py
        .detach(|| Cache::open(&path, false).map(|c| c.manifest().clone()))
        .py()?;
    cache_info(py, &path, manifest)
}

/// Describe the cache at `path` from its `manifest.json` alone, checked against
/// its own checksum: for a cache just written or already checked, described
/// without mapping and hashing `index.bin` and `metadata.arrow` (5.5 GiB at 10^8
/// records).
#[pyfunction]
pub fn describe_manifest(py: Python<'_>, path: PathBuf) -> PyResult<CacheInfo> {
    let manifest = py.detach(|| Manifest::read(&path)).py()?;
    cache_info(py, &path, manifest)
}

/// The Python description of the cache at `path` whose manifest is `manifest`.
fn cache_info(py: Python<'_>, path: &Path, manifest: Manifest) -> PyResult<CacheInfo> {
    let shards = manifest
        .shards
        .iter()
        .map(|s| {
            Py::new(
                py,
                ShardInfo {
                    file: s.file.clone(),
                    bytes: s.bytes,
                    records: s.records.unwrap_or(0),
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(CacheInfo {
        path: path.to_string_lossy().into_owned(),
        format_version: FORMAT_VERSION,
        source_name: manifest.source_name.clone(),
        cache_id: manifest.cache_id,
        record_count: manifest.record_count,
        codec: serde_name(&manifest.compression.codec()),
        level: manifest.compression.level(),
        payload_bytes: manifest.payload_bytes,
        stored_bytes: manifest.stored_bytes,
        writer: manifest.writer.clone(),
        columns: manifest
            .columns
            .iter()
            .map(|c| (c.name.clone(), serde_name(&c.dtype)))
            .collect(),
        shards,
        manifest,
    })
}

/// The name serde gives a unit variant (what the manifest file says).
fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}
