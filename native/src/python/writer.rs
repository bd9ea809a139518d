//! `write_cache`: pulls a Python iterable of `CacheInput` records into a cache.
//!
//! This module only converts: it pulls records from the iterator with the GIL
//! held, extracts their bytes and metadata, and feeds them to
//! `storage::WritePipeline`, which encodes them on the runtime's workers and
//! commits them in order. Creating the cache, committing and finishing run with
//! the GIL released.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use super::config::WriteOptions;
use super::errors::IntoPyResult;
use super::Runtime;
use crate::error::Error;
use crate::storage::{validate_source_name, ColumnSpec, MetaValue, SchemaBinder, WritePipeline};

#[pyfunction(name = "validate_source_name")]
pub fn validate_source_name_py(name: &str) -> PyResult<()> {
    validate_source_name(name).py()
}

/// Write the records of a Python iterator into the cache `base_dir/name`.
/// `options` are a `WriterConfig`'s, validated when the config was built.
#[pyfunction]
#[pyo3(signature = (runtime, records, base_dir, name, options, total=None))]
pub fn write_cache(
    py: Python<'_>,
    runtime: &Runtime,
    records: &Bound<'_, PyAny>,
    base_dir: PathBuf,
    name: String,
    options: &WriteOptions,
    total: Option<u64>,
) -> PyResult<String> {
    validate_source_name(&name).py()?;
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
    let writer_options = options.engine;
    let mut pipeline = py
        .detach(|| WritePipeline::create(pool, &base_dir, &name, columns, writer_options))
        .py()?;
    if options.show_progress {
        pipeline = pipeline.with_progress(total);
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
