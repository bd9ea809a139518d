//! `write_arrow`: an Arrow C stream into a cache, with no Python object per record.
//!
//! The stream is imported once (`arrow::import_stream`); its schema is checked
//! (`storage::ColumnarSchema`) before anything is written, then every batch is
//! read, checked and handed to the same `storage::WritePipeline` as the
//! iterable path (`push_rows`), with the GIL released. Batches are read one
//! ahead of the writer on a thread of their own (`READ_AHEAD`), so a source
//! that decodes as it is read (a Parquet scan, run without threads of its own
//! by `runtime._arrow_stream`) decodes the next batch while this one is
//! written, and holds no more than that. The GIL is taken back between batches
//! only to let Ctrl-C through; an error or an interrupt drops the pipeline,
//! which removes the unfinished cache.

use std::path::PathBuf;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchReader};
use pyo3::prelude::*;

use super::arrow::import_stream;
use super::config::WriteOptions;
use super::errors::IntoPyResult;
use super::writer::{start_pipeline, WriteProfiler};
use super::Runtime;
use crate::error::{Error, Result};
use crate::storage::{validate_source_name, ColumnarSchema, EMPTY_SOURCE};

/// Batches read ahead of the one being written (besides the one being read).
const READ_AHEAD: usize = 1;

/// Write the records of an Arrow stream (any `__arrow_c_stream__` exporter)
/// into the cache `base_dir/name`: `payload_column` is each record's payload,
/// the other columns its stored metadata. Returns the cache's path.
#[pyfunction]
#[pyo3(signature = (runtime, data, base_dir, name, payload_column, options, total=None, profiler=None))]
#[allow(clippy::too_many_arguments)]
pub fn write_arrow(
    py: Python<'_>,
    runtime: &Runtime,
    data: &Bound<'_, PyAny>,
    base_dir: PathBuf,
    name: String,
    payload_column: String,
    options: &WriteOptions,
    total: Option<u64>,
    profiler: Option<&WriteProfiler>,
) -> PyResult<String> {
    validate_source_name(&name).py()?;
    let mut reader = import_stream(data, Error::Source)?;
    let schema = ColumnarSchema::new(&reader.schema(), &payload_column).py()?;
    let mut next = move || -> Result<Option<RecordBatch>> {
        match reader.next() {
            None => Ok(None),
            Some(batch) => batch
                .map(Some)
                .map_err(|e| Error::Source(format!("cannot read the Arrow stream: {e}"))),
        }
    };
    // Like the iterable path: an empty source is refused before a cache is started.
    let first = loop {
        match py.detach(&mut next).py()? {
            None => return Err(Error::Source(EMPTY_SOURCE.to_string())).py(),
            Some(batch) if batch.num_rows() == 0 => continue,
            Some(batch) => break batch,
        }
    };
    let columns = schema.columns().to_vec();
    let mut pipeline = start_pipeline(
        py, runtime, &base_dir, &name, columns, options, total, profiler,
    )?;
    // Without the GIL until the end: the reader's thread may need it (a
    // stream of Python objects), also while this one waits for it to stop.
    let (path, _) = py.detach(|| {
        std::thread::scope(|scope| -> PyResult<_> {
            let (sender, batches) = sync_channel(READ_AHEAD);
            scope.spawn(move || loop {
                let batch = next();
                let last = !matches!(batch, Ok(Some(_)));
                // Stops when the writer has stopped (an error, an interrupt).
                if sender.send(batch).is_err() || last {
                    return;
                }
            });
            let mut records = 0u64;
            let mut batch = Some(first);
            while let Some(current) = batch.take() {
                let rows = schema.rows(&current, records).py()?;
                records += rows.len() as u64;
                pipeline.push_rows(Arc::new(rows)).py()?;
                drop(current);
                batch = batches
                    .recv()
                    .map_err(|_| Error::internal("the Arrow stream's reader stopped"))
                    .and_then(|batch| batch)
                    .py()?;
                Python::attach(|py| py.check_signals())?;
            }
            // `batches` is dropped before the reader's thread is joined.
            pipeline.finish().py()
        })
    })?;
    Ok(path.to_string_lossy().into_owned())
}
