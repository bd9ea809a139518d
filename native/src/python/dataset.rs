//! `Dataset`, `BatchStream` and `SampleIterator`: the in-process reading API.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyString, PyType};

use super::arrow::{concat, export_stream, import_table, ArrowTable};
use super::errors::{to_pyerr, IntoPyResult};
use super::Runtime;
use crate::dataset::Dataset as EngineDataset;
use crate::error::Error;
use crate::population::Population;
use crate::sampling::{StreamOrder, StreamWindow};
use crate::storage::CacheSet;
use crate::stream::{draw_rows, BatchContext, EpochStream, StreamOptions, WorkerPool};

/// Rows per batch behind the per-sample iterator.
const SAMPLE_BATCH_ROWS: usize = 256;

#[pyclass(frozen, module = "dataset_rt._native")]
pub struct Dataset {
    inner: Arc<EngineDataset>,
    pool: Arc<WorkerPool>,
    prefetch: usize,
}

impl Dataset {
    fn open_stream(
        &self,
        population: Arc<Population>,
        window: StreamWindow,
        columns: Option<Vec<String>>,
        batch_rows: usize,
    ) -> crate::error::Result<EpochStream> {
        let stored: Vec<String> = self
            .inner
            .caches()
            .columns()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        let columns = columns.unwrap_or(stored);
        let ctx = BatchContext::new(
            self.inner.caches().clone(),
            population,
            self.inner.order(),
            window,
            &columns,
        )?;
        EpochStream::new(
            ctx,
            self.pool.clone(),
            StreamOptions {
                batch_rows,
                prefetch_rows: self.prefetch,
                ..StreamOptions::default()
            },
        )
    }
}

fn check_batch_size(batch_size: i64) -> PyResult<usize> {
    if batch_size < 1 {
        return Err(Error::invalid(format!(
            "batch_size must be >= 1, got {batch_size}"
        )))
        .py();
    }
    Ok(batch_size as usize)
}

fn non_negative(name: &str, value: i64) -> PyResult<u64> {
    if value < 0 {
        return Err(Error::invalid(format!("{name} must be >= 0, got {value}"))).py();
    }
    Ok(value as u64)
}

#[pymethods]
impl Dataset {
    #[new]
    #[pyo3(signature = (runtime, paths, *, seed, shuffle, prefetch_size, validate_cache))]
    fn new(
        py: Python<'_>,
        runtime: &Runtime,
        paths: Vec<PathBuf>,
        seed: u64,
        shuffle: bool,
        prefetch_size: usize,
        validate_cache: bool,
    ) -> PyResult<Self> {
        if prefetch_size == 0 {
            return Err(Error::invalid("prefetch_size must be >= 1")).py();
        }
        let inner = py
            .detach(|| {
                let caches = Arc::new(CacheSet::open(&paths, validate_cache)?);
                EngineDataset::new(caches, StreamOrder::new(shuffle, seed))
            })
            .py()?;
        Ok(Dataset {
            inner: Arc::new(inner),
            pool: runtime.pool.clone(),
            prefetch: prefetch_size,
        })
    }

    #[getter]
    fn epoch_len(&self) -> PyResult<u64> {
        self.inner.epoch_len().py()
    }

    #[getter]
    fn num_rows(&self) -> PyResult<usize> {
        Ok(self.inner.population().py()?.num_rows())
    }

    #[getter]
    fn position(&self) -> PyResult<u64> {
        self.inner.position().py()
    }

    #[getter]
    fn stored_columns(&self) -> Vec<String> {
        self.inner
            .caches()
            .columns()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    #[getter]
    fn cache_ids(&self) -> Vec<u64> {
        self.inner
            .caches()
            .caches()
            .iter()
            .map(|c| c.cache_id())
            .collect()
    }

    fn metadata(&self) -> PyResult<ArrowTable> {
        Ok(ArrowTable::new(
            self.inner.population().py()?.table().clone(),
        ))
    }

    fn update_metadata(&self, py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<()> {
        let (schema, batches) = import_table(table)?;
        let batch = concat(&schema, &batches)?;
        let caches = self.inner.caches().clone();
        let population = py.detach(|| Population::from_table(&caches, batch)).py()?;
        self.inner.activate(population).py()
    }

    fn set_epoch_len(&self, epoch_len: i64) -> PyResult<()> {
        if epoch_len < 1 {
            return Err(Error::invalid(format!(
                "epoch_len must be >= 1, got {epoch_len}"
            )))
            .py();
        }
        self.inner.set_epoch_len(epoch_len as u64).py()
    }

    /// Take the next epoch as a per-sample iterator (partitioned by rank).
    #[pyo3(signature = (rank=0, world_size=1))]
    fn samples(&self, rank: i64, world_size: i64) -> PyResult<SampleIterator> {
        let rank = non_negative("rank", rank)?;
        let world_size = non_negative("world_size", world_size)?;
        let stream = self
            .inner
            .next_epoch_with(|epoch| {
                let window = epoch.window.partition(rank, world_size, 0)?;
                self.open_stream(epoch.population, window, None, SAMPLE_BATCH_ROWS)
            })
            .py()?;
        Ok(SampleIterator::new(stream))
    }

    /// Take the next epoch as record batches.
    #[pyo3(signature = (columns, *, batch_size=1024))]
    fn batches(&self, columns: Option<Vec<String>>, batch_size: i64) -> PyResult<BatchStream> {
        let batch_rows = check_batch_size(batch_size)?;
        let stream = self
            .inner
            .next_epoch_with(|epoch| {
                self.open_stream(epoch.population, epoch.window, columns, batch_rows)
            })
            .py()?;
        Ok(BatchStream::new(stream))
    }

    /// Any window of the stream, without moving the dataset's position.
    #[pyo3(signature = (start, count, stride, columns, *, batch_size=1024))]
    fn stream(
        &self,
        start: i64,
        count: i64,
        stride: i64,
        columns: Option<Vec<String>>,
        batch_size: i64,
    ) -> PyResult<BatchStream> {
        let batch_rows = check_batch_size(batch_size)?;
        let window = StreamWindow::new(
            non_negative("start", start)?,
            non_negative("count", count)?,
            non_negative("stride", stride)?,
        )
        .py()?;
        let population = self.inner.population().py()?;
        let stream = self
            .open_stream(population, window, columns, batch_rows)
            .py()?;
        Ok(BatchStream::new(stream))
    }

    /// The population rows drawn at a window's positions, without payloads.
    fn draw_rows(
        &self,
        py: Python<'_>,
        start: i64,
        count: i64,
        stride: i64,
    ) -> PyResult<ArrowTable> {
        let window = StreamWindow::new(
            non_negative("start", start)?,
            non_negative("count", count)?,
            non_negative("stride", stride)?,
        )
        .py()?;
        let population = self.inner.population().py()?;
        let order = self.inner.order();
        let rows = py
            .detach(|| draw_rows(&self.pool, population, order, window))
            .py()?;
        let schema = Arc::new(Schema::new(vec![Field::new(
            "row",
            DataType::UInt32,
            false,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(UInt32Array::from(rows))])
            .map_err(|e| to_pyerr(Error::from(e)))?;
        Ok(ArrowTable::new(batch))
    }

    fn get_item(&self, py: Python<'_>, cache_id: u64, sample_id: u64) -> PyResult<Py<PyAny>> {
        let caches = self.inner.caches();
        let index = caches.index_of(cache_id).ok_or_else(|| {
            to_pyerr(Error::invalid(format!(
                "unknown cache_id {cache_id}; the dataset's caches are {:?}",
                self.cache_ids()
            )))
        })?;
        let cache = caches.get(index);
        if sample_id >= cache.len() {
            return Err(Error::invalid(format!(
                "sample_id {sample_id} is out of range; cache {cache_id} has sample ids 0..{}",
                cache.len()
            )))
            .py();
        }
        let data = py.detach(|| cache.read(sample_id)).py()?;
        let metadata = cache.metadata();
        let columns: Vec<(Py<PyString>, ArrayRef)> = metadata
            .schema()
            .fields()
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, f)| {
                (
                    PyString::new(py, f.name()).unbind(),
                    metadata.column(i).clone(),
                )
            })
            .collect();
        let dict = metadata_dict(py, &columns, sample_id as usize)?;
        make_sample(
            py,
            PyBytes::new(py, &data).into_any(),
            dict,
            cache_id,
            sample_id,
        )
    }
}

/// A one-shot stream of record batches, consumed through `__arrow_c_stream__`.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct BatchStream {
    stream: Mutex<Option<EpochStream>>,
    names: Vec<String>,
}

impl BatchStream {
    pub(super) fn new(stream: EpochStream) -> Self {
        let names = stream
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        BatchStream {
            stream: Mutex::new(Some(stream)),
            names,
        }
    }
}

#[pymethods]
impl BatchStream {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema; // batches are produced in their own schema
        let stream = self
            .stream
            .lock()
            .map_err(|_| to_pyerr(Error::internal("the stream's lock is poisoned")))?
            .take()
            .ok_or_else(|| to_pyerr(Error::invalid("this stream was already consumed")))?;
        export_stream(py, Box::new(stream))
    }

    #[getter]
    fn schema_names(&self) -> Vec<String> {
        self.names.clone()
    }
}

/// Per-sample iteration over the same batch stream.
#[pyclass(module = "dataset_rt._native")]
pub struct SampleIterator {
    stream: EpochStream,
    batch: Option<RecordBatch>,
    row: usize,
    remaining: u64,
    columns: Vec<(Py<PyString>, ArrayRef)>,
}

impl SampleIterator {
    fn new(stream: EpochStream) -> Self {
        let remaining = stream.remaining();
        SampleIterator {
            stream,
            batch: None,
            row: 0,
            remaining,
            columns: Vec::new(),
        }
    }
}

#[pymethods]
impl SampleIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self) -> usize {
        self.remaining as usize
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        loop {
            if let Some(batch) = &self.batch {
                if self.row < batch.num_rows() {
                    let row = self.row;
                    self.row += 1;
                    self.remaining = self.remaining.saturating_sub(1);
                    let payload = batch.column(3).as_binary::<i64>().value(row);
                    let cache_id = batch.column(1).as_primitive::<UInt64Type>().value(row);
                    let sample_id = batch.column(2).as_primitive::<UInt64Type>().value(row);
                    let dict = metadata_dict(py, &self.columns, row)?;
                    let data = PyBytes::new(py, payload).into_any();
                    return make_sample(py, data, dict, cache_id, sample_id).map(Some);
                }
            }
            let stream = &mut self.stream;
            match py.detach(|| stream.next_batch()) {
                None => {
                    self.batch = None;
                    return Ok(None);
                }
                Some(Err(e)) => return Err(to_pyerr(e)),
                Some(Ok(batch)) => {
                    if self.columns.is_empty() {
                        self.columns = batch
                            .schema()
                            .fields()
                            .iter()
                            .enumerate()
                            .skip(4)
                            .map(|(i, f)| {
                                (
                                    PyString::new(py, f.name()).unbind(),
                                    batch.column(i).clone(),
                                )
                            })
                            .collect();
                    } else {
                        for (i, slot) in self.columns.iter_mut().enumerate() {
                            slot.1 = batch.column(i + 4).clone();
                        }
                    }
                    self.batch = Some(batch);
                    self.row = 0;
                }
            }
        }
    }
}

fn metadata_dict<'py>(
    py: Python<'py>,
    columns: &[(Py<PyString>, ArrayRef)],
    row: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, array) in columns {
        let key = key.bind(py);
        if array.is_null(row) {
            dict.set_item(key, py.None())?;
            continue;
        }
        match array.data_type() {
            DataType::Int64 => dict.set_item(key, array.as_primitive::<Int64Type>().value(row))?,
            DataType::Float64 => {
                dict.set_item(key, array.as_primitive::<Float64Type>().value(row))?
            }
            DataType::UInt64 => {
                dict.set_item(key, array.as_primitive::<UInt64Type>().value(row))?
            }
            DataType::Boolean => dict.set_item(key, array.as_boolean().value(row))?,
            DataType::Utf8 => dict.set_item(key, array.as_string::<i32>().value(row))?,
            DataType::LargeUtf8 => dict.set_item(key, array.as_string::<i64>().value(row))?,
            DataType::Utf8View => dict.set_item(key, array.as_string_view().value(row))?,
            other => {
                let scalar = arrow_cast::display::ArrayFormatter::try_new(
                    array.as_ref(),
                    &arrow_cast::display::FormatOptions::default(),
                )
                .map(|f| f.value(row).to_string())
                .unwrap_or_else(|_| format!("<{other}>"));
                dict.set_item(key, scalar)?
            }
        }
    }
    Ok(dict)
}

static SAMPLE_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn make_sample(
    py: Python<'_>,
    data: Bound<'_, PyAny>,
    metadata: Bound<'_, PyDict>,
    cache_id: u64,
    sample_id: u64,
) -> PyResult<Py<PyAny>> {
    let class = SAMPLE_TYPE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        Ok(py
            .import("dataset_rt.records")?
            .getattr("CachedSample")?
            .cast_into::<PyType>()?
            .unbind())
    })?;
    Ok(class
        .bind(py)
        .call1((data, metadata, cache_id, sample_id))?
        .unbind())
}
