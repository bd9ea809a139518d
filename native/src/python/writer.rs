//! `write_cache`: pulls a Python iterable of `CacheInput` records into a cache.
//!
//! The calling thread pulls records (it needs the GIL), groups them into chunks
//! and hands each chunk to the runtime's workers, which checksum and compress
//! it. Encoded chunks come back in any order and are committed in record order
//! with the GIL released. At most `prefetch_size` records are in flight.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use super::errors::IntoPyResult;
use super::Runtime;
use crate::error::{Error, Result};
use crate::storage::{
    validate_source_name, CacheWriter, Codec, ColumnSpec, Compression, EncodedRecord, MetaValue,
    SchemaBinder, WriterOptions,
};
use crate::stream::WorkerPool;

const CHUNK_RECORDS: usize = 16;
const CHUNK_BYTES: usize = 1 << 20;

type Pulled = (Vec<u8>, Vec<MetaValue>);
type Encoded = Result<Vec<(EncodedRecord, Vec<MetaValue>)>>;

#[pyfunction(name = "validate_source_name")]
pub fn validate_source_name_py(name: &str) -> PyResult<()> {
    validate_source_name(name).py()
}

#[pyfunction]
#[pyo3(signature = (runtime, records, base_dir, name, *, prefetch_size, max_shard_bytes, compression, compression_level, show_progress, total=None))]
#[allow(clippy::too_many_arguments)]
pub fn write_cache(
    py: Python<'_>,
    runtime: &Runtime,
    records: &Bound<'_, PyAny>,
    base_dir: PathBuf,
    name: String,
    prefetch_size: usize,
    max_shard_bytes: u64,
    compression: &str,
    compression_level: i32,
    show_progress: bool,
    total: Option<u64>,
) -> PyResult<String> {
    validate_source_name(&name).py()?;
    if prefetch_size == 0 {
        return Err(Error::invalid("prefetch_size must be >= 1")).py();
    }
    let options = WriterOptions {
        max_shard_bytes,
        compression: Compression {
            codec: Codec::parse(compression).py()?,
            level: compression_level,
        },
    };
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
    let writer = py
        .detach(|| CacheWriter::create(&base_dir, &name, columns, options))
        .py()?;
    let mut pipeline = Pipeline::new(
        runtime.pool.clone(),
        writer,
        options.compression,
        prefetch_size,
    );
    pipeline.progress = progress_bar(show_progress, total, &name);
    pipeline.push(py, (data, first_values))?;
    for (index, item) in (1u64..).zip(iterator) {
        let (data, fields) = extract_record(&item?, index)?;
        let values = binder.bind(index, fields).py()?;
        pipeline.push(py, (data, values))?;
    }
    let path = pipeline.finish(py)?;
    Ok(path.to_string_lossy().into_owned())
}

struct Pipeline {
    pool: Arc<WorkerPool>,
    writer: Option<CacheWriter>,
    compression: Compression,
    prefetch: usize,
    chunk: Vec<Pulled>,
    chunk_bytes: usize,
    next_submit: u64,
    next_commit: u64,
    in_flight_records: usize,
    ready: BTreeMap<u64, Encoded>,
    results: Receiver<(u64, Encoded)>,
    sender: crossbeam_channel::Sender<(u64, Encoded)>,
    progress: ProgressBar,
}

impl Pipeline {
    fn new(
        pool: Arc<WorkerPool>,
        writer: CacheWriter,
        compression: Compression,
        prefetch: usize,
    ) -> Self {
        let (sender, results) = unbounded();
        Pipeline {
            pool,
            writer: Some(writer),
            compression,
            prefetch,
            chunk: Vec::new(),
            chunk_bytes: 0,
            next_submit: 0,
            next_commit: 0,
            in_flight_records: 0,
            ready: BTreeMap::new(),
            results,
            sender,
            progress: ProgressBar::hidden(),
        }
    }

    fn push(&mut self, py: Python<'_>, record: Pulled) -> PyResult<()> {
        self.chunk_bytes += record.0.len();
        self.chunk.push(record);
        if self.chunk.len() >= CHUNK_RECORDS || self.chunk_bytes >= CHUNK_BYTES {
            self.submit_chunk().py()?;
            py.detach(|| self.commit(false)).py()?;
        }
        Ok(())
    }

    fn submit_chunk(&mut self) -> Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.chunk);
        self.chunk_bytes = 0;
        self.in_flight_records += chunk.len();
        let seq = self.next_submit;
        self.next_submit += 1;
        let sender = self.sender.clone();
        let compression = self.compression;
        self.pool.submit(Box::new(move || {
            let encoded = chunk
                .into_iter()
                .map(|(data, values)| EncodedRecord::encode(data, compression).map(|r| (r, values)))
                .collect::<Result<Vec<_>>>();
            let _ = sender.send((seq, encoded));
        }))
    }

    /// Commit finished chunks in order. Blocks while more than `prefetch`
    /// records are in flight, or until everything is committed when `drain`.
    fn commit(&mut self, drain: bool) -> Result<()> {
        loop {
            while let Ok((seq, encoded)) = self.results.try_recv() {
                self.ready.insert(seq, encoded);
            }
            while let Some(encoded) = self.ready.remove(&self.next_commit) {
                self.next_commit += 1;
                let encoded = encoded?;
                self.in_flight_records -= encoded.len();
                let writer = self
                    .writer
                    .as_mut()
                    .ok_or_else(|| Error::internal("the writer is closed"))?;
                for (record, values) in &encoded {
                    writer.append(record, values)?;
                }
                self.progress.set_position(writer.records());
                let seconds = self.progress.elapsed().as_secs_f64().max(1e-3);
                let rate = writer.payload_bytes() as f64 / 1e6 / seconds;
                self.progress.set_message(format!("{rate:.1} MB/s"));
            }
            let waiting = self.next_commit < self.next_submit;
            let over_budget = self.in_flight_records > self.prefetch;
            if !(waiting && (drain || over_budget)) {
                return Ok(());
            }
            match self.results.recv_timeout(Duration::from_secs(600)) {
                Ok((seq, encoded)) => {
                    self.ready.insert(seq, encoded);
                }
                Err(_) => return Err(Error::internal("the worker threads stopped responding")),
            }
        }
    }

    fn finish(mut self, py: Python<'_>) -> PyResult<PathBuf> {
        self.submit_chunk().py()?;
        py.detach(|| -> Result<PathBuf> {
            self.commit(true)?;
            let writer = self
                .writer
                .take()
                .ok_or_else(|| Error::internal("the writer is closed"))?;
            let (path, _) = writer.finish()?;
            self.progress.finish();
            Ok(path)
        })
        .py()
    }
}

fn progress_bar(show: bool, total: Option<u64>, name: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    // The stderr target draws only when stderr is a terminal.
    let bar = match total {
        Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = if total.is_some() {
        "{prefix} {bar:30} {pos}/{len} records · {per_sec} · {msg} · ETA {eta}"
    } else {
        "{prefix} {spinner} {pos} records · {per_sec} · {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(format!("writing {name}"));
    bar
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
