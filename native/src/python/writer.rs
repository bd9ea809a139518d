//! `write_cache`: pulls a Python iterable of `CacheInput` records into a cache.
//!
//! This module only converts: it pulls records from the iterator with the GIL
//! held, extracts their bytes and metadata, and feeds them to
//! `storage::WritePipeline`, which encodes them on the runtime's workers and
//! commits them in order. Creating the cache, committing and finishing run with
//! the GIL released.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use super::config::WriteOptions;
use super::errors::IntoPyResult;
use super::Runtime;
use crate::error::Error;
use crate::storage::{
    check_source_names, timed, validate_source_name, ColumnSpec, MetaValue, SchemaBinder, Stage,
    WritePipeline, WriteProfile, EMPTY_SOURCE, SHARED_MIN,
};

#[pyfunction(name = "validate_source_name")]
pub fn validate_source_name_py(name: &str) -> PyResult<()> {
    validate_source_name(name).py()
}

/// Refuse the names of one write's sources when two are alike, before
/// anything is written.
#[pyfunction(name = "check_source_names")]
pub fn check_source_names_py(base_dir: PathBuf, names: Vec<String>) -> PyResult<()> {
    check_source_names(&base_dir, &names).py()
}

/// The stage timings of cache writes (`WriterConfig(profiler=...)`): the
/// Python package makes one per source, passes it to `write_cache`, and reads
/// `totals()` afterwards, also when the write failed or was interrupted.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct WriteProfiler {
    inner: Arc<WriteProfile>,
}

impl WriteProfiler {
    pub(super) fn profile(&self) -> Arc<WriteProfile> {
        self.inner.clone()
    }
}

#[pymethods]
impl WriteProfiler {
    #[new]
    fn new() -> Self {
        WriteProfiler {
            inner: Arc::new(WriteProfile::default()),
        }
    }

    /// `(stage name, calls, bytes, seconds)` for every stage, in pipeline order.
    fn totals(&self) -> Vec<(&'static str, u64, u64, f64)> {
        self.inner
            .totals()
            .into_iter()
            .map(|t| (t.stage.name(), t.calls, t.bytes, t.seconds))
            .collect()
    }
}

/// Write the records of a Python iterator into the cache `base_dir/name`.
/// `options` are a `WriterConfig`'s, validated when the config was built.
#[pyfunction]
#[pyo3(signature = (runtime, records, base_dir, name, options, total=None, profiler=None))]
#[allow(clippy::too_many_arguments)]
pub fn write_cache(
    py: Python<'_>,
    runtime: &Runtime,
    records: &Bound<'_, PyAny>,
    base_dir: PathBuf,
    name: String,
    options: &WriteOptions,
    total: Option<u64>,
    profiler: Option<&WriteProfiler>,
) -> PyResult<String> {
    validate_source_name(&name).py()?;
    let profile = profiler.map(|p| p.inner.clone());
    let mut source = Source {
        iterator: records.try_iter()?,
        profile: profile.as_deref(),
        index: 0,
    };
    let Some((data, fields)) = source.next_record()? else {
        return Err(Error::Source(EMPTY_SOURCE.to_string())).py();
    };
    let binder = SchemaBinder::from_first(&fields).py()?;
    let first_values = binder.bind(0, fields).py()?;
    let columns: Vec<ColumnSpec> = binder.columns().to_vec();
    let mut pipeline = start_pipeline(
        py, runtime, &base_dir, &name, columns, options, total, profiler,
    )?;
    push(py, &mut pipeline, data, first_values)?;
    while let Some((data, fields)) = source.next_record()? {
        let values = binder.bind(source.index - 1, fields).py()?;
        push(py, &mut pipeline, data, values)?;
    }
    let (path, _) = py.detach(|| pipeline.finish()).py()?;
    Ok(path.to_string_lossy().into_owned())
}

/// The write pipeline of cache `base_dir/name` with `options`' progress bar and
/// the profiler's stages: one start for the iterable and the Arrow paths.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_pipeline(
    py: Python<'_>,
    runtime: &Runtime,
    base_dir: &Path,
    name: &str,
    columns: Vec<ColumnSpec>,
    options: &WriteOptions,
    total: Option<u64>,
    profiler: Option<&WriteProfiler>,
) -> PyResult<WritePipeline> {
    let pool = runtime.pool.clone();
    let writer_options = options.engine;
    let mut pipeline = py
        .detach(|| WritePipeline::create(pool, base_dir, name, columns, writer_options))
        .py()?;
    if options.show_progress {
        pipeline = pipeline.with_progress(total);
    }
    if let Some(profiler) = profiler {
        pipeline = pipeline.with_profile(profiler.profile());
    }
    Ok(pipeline)
}

/// The records of a source's iterator, pulled and read with the GIL held.
struct Source<'a, 'py> {
    iterator: Bound<'py, pyo3::types::PyIterator>,
    profile: Option<&'a WriteProfile>,
    /// Records pulled so far.
    index: u64,
}

impl Source<'_, '_> {
    fn next_record(&mut self) -> PyResult<Option<(Bytes, Fields)>> {
        let item = timed(self.profile, Stage::PythonNext, 0, || self.iterator.next());
        let Some(item) = item else {
            return Ok(None);
        };
        let item = item?;
        let start = Instant::now();
        let record = extract_record(&item, self.index)?;
        if let Some(profile) = self.profile {
            profile.record(Stage::PythonExtract, record.0.len() as u64, start.elapsed());
        }
        self.index += 1;
        Ok(Some(record))
    }
}

/// Hand one record over; commit (which may wait for the workers) without the GIL.
fn push(
    py: Python<'_>,
    pipeline: &mut WritePipeline,
    data: Bytes,
    values: Vec<MetaValue>,
) -> PyResult<()> {
    pipeline.push(data, values).py()?;
    if pipeline.commit_due() {
        py.detach(|| pipeline.commit()).py()?;
    }
    Ok(())
}

type Fields = Vec<(String, MetaValue)>;

/// A `bytes` object's contents for the writer: large ones lent as they are
/// (the shard writer queues them for `writev`, so they are never copied in
/// user space), small ones copied (cheaper than keeping the object alive).
/// `bytearray` and `memoryview` are always copied: their contents can change
/// after the call returns.
fn shared_bytes(object: &Bound<'_, PyBytes>) -> Bytes {
    let contents = object.as_bytes();
    if contents.len() < SHARED_MIN {
        return Bytes::copy_from_slice(contents);
    }
    Bytes::from_owner(LentBytes {
        ptr: contents.as_ptr(),
        len: contents.len(),
        _object: object.clone().unbind(),
    })
}

/// A Python `bytes` object's buffer, kept alive by a reference to the object.
/// The last `Bytes` that shares it is dropped on a worker or writer thread
/// without the GIL: PyO3 then queues the decref and runs it when this thread
/// next re-attaches (after every commit, which runs detached).
struct LentBytes {
    ptr: *const u8,
    len: usize,
    _object: Py<PyBytes>,
}

// SAFETY: `bytes` objects are immutable and `_object` keeps this one (and so
// `ptr..ptr + len`) alive; reading immutable memory from any thread is sound.
unsafe impl Send for LentBytes {}

impl AsRef<[u8]> for LentBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `Send` above: the buffer lives and never changes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A memoryview's bytes in one copy (`tobytes()` and then a copy of that were
/// two: 9% of writing 1 MiB records from memoryview slices).
fn memoryview_bytes(view: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let buffer = PyUntypedBuffer::get(view)?;
    if buffer.len_bytes() == 0 {
        return Ok(Vec::new());
    }
    if !buffer.is_c_contiguous() {
        // Strided: `tobytes()` gathers it in C order.
        return Ok(view
            .call_method0("tobytes")?
            .cast::<PyBytes>()?
            .as_bytes()
            .to_vec());
    }
    // SAFETY: a C-contiguous buffer is `len_bytes` bytes at `buf_ptr`, valid
    // while `buffer` holds the export; the GIL is held, so no Python code
    // changes it while it is copied.
    let bytes =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr().cast::<u8>(), buffer.len_bytes()) };
    Ok(bytes.to_vec())
}

/// Read one `CacheInput(data, metadata)` (or any object with those attributes).
fn extract_record(item: &Bound<'_, PyAny>, index: u64) -> PyResult<(Bytes, Fields)> {
    let (data, metadata) = match item.cast::<PyTuple>() {
        Ok(t) if t.len() == 2 => (t.get_item(0)?, t.get_item(1)?),
        _ => match (item.getattr("data"), item.getattr("metadata")) {
            (Ok(d), Ok(m)) => (d, m),
            _ => {
                return Err(Error::Source(format!(
                    "record {index}: expected CacheInput(data=bytes, metadata=dict), got {}",
                    type_name(item)
                )))
                .py()
            }
        },
    };
    let bytes = if let Ok(b) = data.cast::<PyBytes>() {
        shared_bytes(b)
    } else if let Ok(b) = data.cast::<PyByteArray>() {
        Bytes::from(b.to_vec())
    } else if data.get_type().name()? == "memoryview" {
        Bytes::from(memoryview_bytes(&data)?)
    } else {
        // 0.4.8's exact words: its users compare `CacheWriteError.message` with `==`.
        return Err(Error::Source("data must be bytes-like".to_string())).py();
    };
    let dict = metadata.cast::<PyDict>().map_err(|_| {
        super::errors::to_pyerr(Error::Source(format!(
            "record {index}: metadata must be a dict of str to bool/int/float/str, got {}",
            type_name(&metadata)
        )))
    })?;
    let mut fields = Vec::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        let key = key
            .cast::<PyString>()
            .map_err(|_| {
                super::errors::to_pyerr(Error::Source(format!(
                    "record {index}: metadata keys must be str, got {}",
                    type_name(&key)
                )))
            })?
            .to_string();
        let value = extract_value(&value)
            .map_err(|detail| Error::Source(format!("record {index}: metadata '{key}' {detail}")))
            .py()?;
        fields.push((key, value));
    }
    Ok((bytes, fields))
}

fn extract_value(value: &Bound<'_, PyAny>) -> std::result::Result<MetaValue, String> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(MetaValue::Bool(b.is_true()));
    }
    if value.cast::<PyInt>().is_ok() {
        return value
            .extract::<i64>()
            .map(MetaValue::Int)
            .map_err(|_| "is an int outside the 64-bit signed range".to_string());
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(MetaValue::Float(f.value()));
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(MetaValue::Str(s.to_string()));
    }
    Err(format!(
        "is {}; metadata values must be bool, int, float or str",
        type_name(value)
    ))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
