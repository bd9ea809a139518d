//! `Dataset` and `SampleIterator`: the in-process reading API (its batch
//! streams are `batch_stream::BatchStream`s).

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString, PyType};

use super::args::{identity, positive, positive_usize_or, unsigned};
use super::arrow::{import_stream, stream_batch, ArrowTable};
use super::batch_stream::BatchStream;
use super::config::ReaderOptions;
use super::errors::{to_pyerr, IntoPyResult};
use super::partition::Partition as PyPartition;
use super::Runtime;
use crate::dataset::Dataset as EngineDataset;
use crate::error::Error;
use crate::os::mapped;
use crate::population::Population;
use crate::sampling::{Partition, StreamOrder, StreamWindow};
use crate::storage::CacheSet;
use crate::stream::{
    draw_rows, BaseColumn, BatchContext, EpochStream, StreamOptions, WorkerPool, BASE_COLUMNS,
};

/// How a stream carries the records' bytes.
#[derive(Debug, Clone, Copy)]
enum Payload {
    /// No payload column.
    Omitted,
    /// Every record copied into the batch.
    Copied,
    /// Large records verified in their shard and left out (a null payload),
    /// for `SampleIterator`, which copies each once into its `bytes`.
    LargeInPlace,
}

impl From<bool> for Payload {
    fn from(payload: bool) -> Self {
        if payload {
            Payload::Copied
        } else {
            Payload::Omitted
        }
    }
}

/// Rows per batch behind the per-sample iterator.
const SAMPLE_BATCH_ROWS: NonZeroUsize = NonZeroUsize::new(256).expect("256 is not zero");

#[pyclass(frozen, module = "dataset_rt._native")]
pub struct Dataset {
    inner: Arc<EngineDataset>,
    pool: Arc<WorkerPool>,
    prefetch: NonZeroUsize,
}

impl Dataset {
    fn open_stream(
        &self,
        population: Arc<Population>,
        window: StreamWindow,
        columns: Option<Vec<String>>,
        batch_rows: NonZeroUsize,
        payload: Payload,
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
        let ctx = match payload {
            Payload::Omitted => ctx.with_payload(false),
            Payload::Copied => ctx,
            Payload::LargeInPlace => ctx.with_large_in_place(),
        };
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

impl Dataset {
    /// A window of the active population's stream, without moving the position.
    fn active_stream(
        &self,
        window: StreamWindow,
        columns: Option<Vec<String>>,
        batch_rows: NonZeroUsize,
        payload: bool,
    ) -> PyResult<BatchStream> {
        let population = self.inner.population().py()?;
        let stream = self
            .open_stream(population, window, columns, batch_rows, payload.into())
            .py()?;
        Ok(BatchStream::new(stream))
    }
}

#[pymethods]
impl Dataset {
    /// `paths`: cache directories, datasets of many caches (a directory or
    /// prefix holding a descriptor) and caches on object storage, the latter
    /// read through `mirror_dir`.
    #[new]
    #[pyo3(signature = (runtime, paths, options, mirror_dir=None))]
    fn new(
        py: Python<'_>,
        runtime: &Runtime,
        paths: Vec<PathBuf>,
        options: &ReaderOptions,
        mirror_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        let order = StreamOrder::new(options.shuffle, options.seed);
        let verify = options.validate_cache;
        let inner = py
            .detach(|| {
                let caches = Arc::new(CacheSet::open_mirrored(
                    &paths,
                    verify,
                    mirror_dir.as_deref(),
                )?);
                EngineDataset::new(caches, order)
            })
            .py()?;
        Ok(Dataset {
            inner: Arc::new(inner),
            pool: runtime.pool.clone(),
            prefetch: options.prefetch_size,
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

    /// The `cache_id` of each cache, in the order the dataset was opened with.
    #[getter]
    fn cache_ids(&self) -> Vec<u64> {
        self.inner.caches().cache_ids()
    }

    /// The directory of each cache, in the same order (a dataset of many
    /// caches stands for its caches; a cache on object storage is its mirror).
    #[getter]
    fn cache_dirs(&self) -> Vec<PathBuf> {
        let caches = self.inner.caches().caches();
        caches.iter().map(|c| c.dir().to_path_buf()).collect()
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

    fn metadata(&self) -> PyResult<ArrowTable> {
        Ok(ArrowTable::new(
            self.inner.population().py()?.unchecked_table(),
        ))
    }

    fn update_metadata(&self, py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<()> {
        let reader = import_stream(table, Error::population)?;
        py.detach(|| self.inner.update(reader.map(stream_batch)))
            .py()
    }

    fn set_epoch_len(&self, epoch_len: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner
            .set_epoch_len(super::args::epoch_len(epoch_len)?)
            .py()
    }

    /// Take the next epoch as a per-sample iterator, partitioned like a ticket.
    #[pyo3(signature = (partition=None))]
    fn samples(&self, partition: Option<PyRef<'_, PyPartition>>) -> PyResult<SampleIterator> {
        let partition = partition.map_or(Partition::WHOLE, |p| p.inner);
        let stream = self
            .inner
            .next_epoch_with(|epoch| {
                let window = partition.of(&epoch.window)?;
                self.open_stream(
                    epoch.population,
                    window,
                    None,
                    SAMPLE_BATCH_ROWS,
                    Payload::LargeInPlace,
                )
            })
            .py()?;
        Ok(SampleIterator::new(stream, self.inner.caches().clone()))
    }

    /// One rank's partition of epoch `epoch` (positions `[e * L, (e + 1) * L)`
    /// of the active population at the current epoch length `L`), by the rule
    /// a Flight ticket follows. Does not move the dataset's position.
    #[pyo3(signature = (epoch, columns, *, partition=None, batch_size=None, payload=true))]
    fn epoch(
        &self,
        epoch: &Bound<'_, PyAny>,
        columns: Option<Vec<String>>,
        partition: Option<PyRef<'_, PyPartition>>,
        batch_size: Option<&Bound<'_, PyAny>>,
        payload: bool,
    ) -> PyResult<BatchStream> {
        let batch_rows = batch_rows(batch_size)?;
        let partition = partition.map_or(Partition::WHOLE, |p| p.inner);
        let epoch = unsigned("epoch", epoch)?;
        let epoch_len = NonZeroU64::new(self.epoch_len()?)
            .ok_or_else(|| Error::internal("the dataset's epoch length is 0"))
            .py()?;
        let window = StreamWindow::epoch(epoch, epoch_len)
            .and_then(|epoch| partition.of(&epoch))
            .py()?;
        self.active_stream(window, columns, batch_rows, payload)
    }

    /// Take the next epoch as record batches.
    #[pyo3(signature = (columns, *, batch_size=None))]
    fn batches(
        &self,
        columns: Option<Vec<String>>,
        batch_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<BatchStream> {
        let batch_rows = batch_rows(batch_size)?;
        let stream = self
            .inner
            .next_epoch_with(|epoch| {
                self.open_stream(
                    epoch.population,
                    epoch.window,
                    columns,
                    batch_rows,
                    Payload::Copied,
                )
            })
            .py()?;
        Ok(BatchStream::new(stream))
    }

    /// Any window of the stream, without moving the dataset's position.
    #[pyo3(signature = (start, count, stride, columns, *, batch_size=None, payload=true))]
    fn stream(
        &self,
        start: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        stride: &Bound<'_, PyAny>,
        columns: Option<Vec<String>>,
        batch_size: Option<&Bound<'_, PyAny>>,
        payload: bool,
    ) -> PyResult<BatchStream> {
        let batch_rows = batch_rows(batch_size)?;
        let window = window(start, count, stride)?;
        self.active_stream(window, columns, batch_rows, payload)
    }

    /// The population rows drawn at a window's positions, without payloads.
    fn draw_rows(
        &self,
        py: Python<'_>,
        start: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        stride: &Bound<'_, PyAny>,
    ) -> PyResult<ArrowTable> {
        let window = window(start, count, stride)?;
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
        Ok(ArrowTable::new(batch.into()))
    }

    /// One record by identity. The exception classes are a sequence's
    /// (`TypeError`, `IndexError`: see `args::identity`); an id that names no
    /// cache or record of this dataset is "out of range" too.
    fn get_item(
        &self,
        py: Python<'_>,
        cache_id: &Bound<'_, PyAny>,
        sample_id: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let cache_id = identity("cache_id", cache_id)?;
        let sample_id = identity("sample_id", sample_id)?;
        let caches = self.inner.caches();
        let index = caches.index_of(cache_id).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "cache_id {cache_id} is out of range: no cache of this dataset has it; the \
                 dataset's caches are {:?}",
                self.cache_ids()
            ))
        })?;
        let cache = caches.get(index);
        if sample_id >= cache.len() {
            return Err(PyIndexError::new_err(format!(
                "sample_id {sample_id} is out of range; cache {cache_id} has sample ids 0..{}",
                cache.len()
            )));
        }
        let data = py.detach(|| cache.read(sample_id)).py()?;
        let (batch, row) = cache
            .metadata()
            .batch_of(sample_id as usize)
            .ok_or_else(|| {
                PyIndexError::new_err(format!("sample_id {sample_id} has no metadata"))
            })?;
        let columns: Vec<(Py<PyString>, ArrayRef)> = batch
            .schema()
            .fields()
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, f)| {
                (
                    PyString::new(py, f.name()).unbind(),
                    batch.column(i).clone(),
                )
            })
            .collect();
        let dict = metadata_dict(py, &columns, row)?;
        make_sample(
            py,
            PyBytes::new(py, &data).into_any(),
            dict,
            cache_id,
            sample_id,
        )
    }
}

/// Rows per batch: `batch_size` (>= 1) or the stream default.
fn batch_rows(batch_size: Option<&Bound<'_, PyAny>>) -> PyResult<NonZeroUsize> {
    positive_usize_or(
        "batch_size",
        batch_size,
        StreamOptions::default().batch_rows,
    )
}

/// The window `start, start + stride, ...` (`count` positions).
fn window(
    start: &Bound<'_, PyAny>,
    count: &Bound<'_, PyAny>,
    stride: &Bound<'_, PyAny>,
) -> PyResult<StreamWindow> {
    let stride = positive("stride", stride)?;
    StreamWindow::new(
        unsigned("start", start)?,
        unsigned("count", count)?,
        stride.get(),
    )
    .py()
}

/// Per-sample iteration over the same batch stream.
#[pyclass(module = "dataset_rt._native")]
pub struct SampleIterator {
    stream: EpochStream,
    /// Where the records left out of the batches are (`Payload::LargeInPlace`).
    caches: Arc<CacheSet>,
    batch: Option<RecordBatch>,
    row: usize,
    remaining: u64,
    columns: Vec<(Py<PyString>, ArrayRef)>,
}

impl SampleIterator {
    fn new(stream: EpochStream, caches: Arc<CacheSet>) -> Self {
        let remaining = stream.remaining();
        SampleIterator {
            stream,
            caches,
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
                    let column = |c: BaseColumn| batch.column(c.index());
                    let payloads = column(BaseColumn::Payload).as_binary::<i64>();
                    let cache_id = column(BaseColumn::CacheId)
                        .as_primitive::<UInt64Type>()
                        .value(row);
                    let sample_id = column(BaseColumn::SampleId)
                        .as_primitive::<UInt64Type>()
                        .value(row);
                    let dict = metadata_dict(py, &self.columns, row)?;
                    let payload = if payloads.is_null(row) {
                        self.caches
                            .index_of(cache_id)
                            .and_then(|ci| self.caches.get(ci).stored_as_is(sample_id))
                            .ok_or_else(|| {
                                to_pyerr(Error::internal(format!(
                                    "record {sample_id} of cache {cache_id:016x} was verified \
                                     in place but is not stored as is"
                                )))
                            })?
                    } else {
                        payloads.value(row)
                    };
                    // A large record is copied from its mapped shard here, after
                    // it was verified: a shard cut short in between reads as
                    // zeros, which only this thread's fault count tells.
                    let data = match mapped::scope(|| PyBytes::new(py, payload).into_any()) {
                        Ok(data) => data,
                        Err(cut) => {
                            let error = self.caches.truncation().unwrap_or_else(|| cut.into());
                            return Err(to_pyerr(error));
                        }
                    };
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
                            .skip(BASE_COLUMNS.len())
                            .map(|(i, f)| {
                                (
                                    PyString::new(py, f.name()).unbind(),
                                    batch.column(i).clone(),
                                )
                            })
                            .collect();
                    } else {
                        for (i, slot) in self.columns.iter_mut().enumerate() {
                            slot.1 = batch.column(i + BASE_COLUMNS.len()).clone();
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

/// `CachedSample(data, metadata, cache_id, sample_id)`: a named tuple made
/// here (re-exported by `dataset_rt.records`), so reading never imports the
/// package above this module.
static SAMPLE_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

pub fn sample_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let class = SAMPLE_TYPE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let fields = ["data", "metadata", "cache_id", "sample_id"];
        let class = py
            .import("collections")?
            .getattr("namedtuple")?
            .call1(("CachedSample", fields))?
            .cast_into::<PyType>()?;
        class.setattr("__module__", "dataset_rt.api")?;
        class.setattr(
            "__doc__",
            "One sample of an epoch stream (or of `CachedDataset.get_item`): the \
             payload bytes, the metadata dict, and the record's identity.",
        )?;
        Ok(class.unbind())
    })?;
    Ok(class.bind(py))
}

fn make_sample(
    py: Python<'_>,
    data: Bound<'_, PyAny>,
    metadata: Bound<'_, PyDict>,
    cache_id: u64,
    sample_id: u64,
) -> PyResult<Py<PyAny>> {
    Ok(sample_type(py)?
        .call1((data, metadata, cache_id, sample_id))?
        .unbind())
}
