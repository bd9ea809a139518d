//! `write_cache`: pulls a Python iterable of `CacheInput` records into a cache.
//!
//! This module only converts: it pulls records from the iterator with the GIL
//! held, extracts their bytes and metadata, and feeds them to
//! `storage::WritePipeline`, which encodes them on the runtime's workers and
//! commits them in order. Creating the cache, committing and finishing run with
//! the GIL released.

use std::path::PathBuf;

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use super::errors::IntoPyResult;
use super::Runtime;
use crate::error::Error;
use crate::storage::{
    validate_source_name, ColumnSpec, Compression, MetaValue, SchemaBinder, WritePipeline,
    WriterOptions,
};

#[pyfunction(name = "validate_source_name")]
pub fn validate_source_name_py(name: &str) -> PyResult<()> {
    validate_source_name(name).py()
}

/// The keyword-only arguments arrive as `**options` (see `WriteKeywords`);
/// `text_signature` keeps the signature Python sees.
#[pyfunction]
#[pyo3(
    signature = (runtime, records, base_dir, name, **options),
    text_signature = "(runtime, records, base_dir, name, *, prefetch_size, max_shard_bytes, \
                      compression, compression_level, show_progress, total=None)"
)]
pub fn write_cache(
    py: Python<'_>,
    runtime: &Runtime,
    records: &Bound<'_, PyAny>,
    base_dir: PathBuf,
    name: String,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let keywords = WriteKeywords::extract(py, options)?;
    validate_source_name(&name).py()?;
    let compression = Compression::parse(&keywords.compression, keywords.compression_level).py()?;
    let options = WriterOptions::new(
        keywords.prefetch_size,
        keywords.max_shard_bytes,
        compression,
    )
    .py()?;
    let mut iterator = records.try_iter()?;
    let Some(first) = iterator.next() else {
        return Err(Error::Source(format!(
            "source '{name}' yielded no records; a cache needs at least one"
        )))
        .py();
    };
    let (data, fields) = extract_record(&first?, 0)?;
    let binder = SchemaBinder::from_first(&fields).py()?;
    let first_values = binder.bind(0, fields).py()?;
    let columns: Vec<ColumnSpec> = binder.columns().to_vec();
    let pool = runtime.pool.clone();
    let mut pipeline = py
        .detach(|| WritePipeline::create(pool, &base_dir, &name, columns, options))
        .py()?;
    if keywords.show_progress {
        pipeline = pipeline.with_progress(keywords.total);
    }
    push(py, &mut pipeline, data, first_values)?;
    for (index, item) in (1u64..).zip(iterator) {
        let (data, fields) = extract_record(&item?, index)?;
        let values = binder.bind(index, fields).py()?;
        push(py, &mut pipeline, data, values)?;
    }
    let (path, _) = py.detach(|| pipeline.finish()).py()?;
    Ok(path.to_string_lossy().into_owned())
}

/// Hand one record over; commit (which may wait for the workers) without the GIL.
fn push(
    py: Python<'_>,
    pipeline: &mut WritePipeline,
    data: Vec<u8>,
    values: Vec<MetaValue>,
) -> PyResult<()> {
    pipeline.push(data, values).py()?;
    if pipeline.commit_due() {
        py.detach(|| pipeline.commit()).py()?;
    }
    Ok(())
}

/// `write_cache`'s keyword-only arguments, taken as `**options` so that the
/// Rust function keeps a handful of parameters. Missing, unexpected and
/// mistyped keywords raise the same errors pyo3 raises for declared ones.
struct WriteKeywords {
    prefetch_size: usize,
    max_shard_bytes: u64,
    compression: String,
    compression_level: i32,
    show_progress: bool,
    total: Option<u64>,
}

/// The keywords in signature order; all but `total` are required.
const KEYWORDS: [&str; 6] = [
    "prefetch_size",
    "max_shard_bytes",
    "compression",
    "compression_level",
    "show_progress",
    "total",
];
const REQUIRED: &[&str] = KEYWORDS.split_at(5).0;

impl WriteKeywords {
    fn extract(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let options = options.cloned().unwrap_or_else(|| PyDict::new(py));
        for key in options.keys() {
            if !KEYWORDS.iter().any(|k| key.eq(k).unwrap_or(false)) {
                return Err(PyTypeError::new_err(format!(
                    "write_cache() got an unexpected keyword argument '{key}'"
                )));
            }
        }
        let mut missing = Vec::new();
        for name in REQUIRED {
            if !options.contains(name)? {
                missing.push(format!("'{name}'"));
            }
        }
        if !missing.is_empty() {
            return Err(PyTypeError::new_err(format!(
                "write_cache() missing {} required keyword argument{}: {}",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" },
                name_list(&missing)
            )));
        }
        Ok(WriteKeywords {
            prefetch_size: keyword(&options, "prefetch_size")?,
            max_shard_bytes: keyword(&options, "max_shard_bytes")?,
            compression: keyword(&options, "compression")?,
            compression_level: keyword(&options, "compression_level")?,
            show_progress: keyword(&options, "show_progress")?,
            total: keyword(&options, "total")?,
        })
    }
}

/// `'a'`, `'a' and 'b'`, `'a', 'b', and 'c'` (as Python and pyo3 list arguments).
fn name_list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [first, second] => format!("{first} and {second}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// The value of keyword `name` (`None` for an absent optional one); a
/// conversion error gets the note pyo3 adds: "while processing 'name'".
fn keyword<'py, T: FromPyObjectOwned<'py>>(
    options: &Bound<'py, PyDict>,
    name: &str,
) -> PyResult<T> {
    let value = options
        .get_item(name)?
        .unwrap_or_else(|| options.py().None().into_bound(options.py()));
    value.extract::<T>().map_err(|e| {
        let error: PyErr = e.into();
        let _ = error.add_note(options.py(), format!("while processing '{name}'"));
        error
    })
}

type Fields = Vec<(String, MetaValue)>;

/// Read one `CacheInput(data, metadata)` (or any object with those attributes).
fn extract_record(item: &Bound<'_, PyAny>, index: u64) -> PyResult<(Vec<u8>, Fields)> {
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
        b.as_bytes().to_vec()
    } else if let Ok(b) = data.cast::<PyByteArray>() {
        b.to_vec()
    } else if data.get_type().name()? == "memoryview" {
        data.call_method0("tobytes")?
            .cast::<PyBytes>()?
            .as_bytes()
            .to_vec()
    } else {
        return Err(Error::Source(format!(
            "record {index}: data must be bytes, bytearray or memoryview, got {}",
            type_name(&data)
        )))
        .py();
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
