//! `DatasetService` for the Flight server: populations by id, streams by request.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arrow::{concat, import_table, ArrowTable};
use super::dataset::BatchStream;
use super::errors::IntoPyResult;
use super::Runtime;
use crate::error::Error;
use crate::population::check_population_id;
use crate::service::{DatasetService as Engine, StreamRequest};
use crate::stream::WorkerPool;

#[pyclass(frozen, module = "dataset_rt._native")]
pub struct DatasetService {
    inner: Arc<Engine>,
    pool: Arc<WorkerPool>,
}

#[allow(clippy::too_many_arguments)]
fn request(
    population: String,
    seed: u64,
    shuffle: bool,
    epoch: u64,
    epoch_len: u64,
    rank: u64,
    world_size: u64,
    offset: u64,
    columns: Vec<String>,
    batch_size: usize,
    prefetch_size: usize,
) -> PyResult<StreamRequest> {
    check_population_id(&population).py()?;
    if batch_size < 1 || prefetch_size < 1 {
        return Err(Error::invalid(
            "'batch_size' and 'prefetch_size' must be >= 1",
        ))
        .py();
    }
    Ok(StreamRequest {
        population,
        seed,
        shuffle,
        epoch,
        epoch_len,
        rank,
        world_size,
        offset,
        columns,
        batch_rows: batch_size,
        prefetch_rows: prefetch_size,
    })
}

#[pymethods]
impl DatasetService {
    #[new]
    #[pyo3(signature = (runtime, name, paths, state_dir, *, validate_cache=false))]
    fn new(
        py: Python<'_>,
        runtime: &Runtime,
        name: String,
        paths: Vec<PathBuf>,
        state_dir: PathBuf,
        validate_cache: bool,
    ) -> PyResult<Self> {
        let inner = py
            .detach(|| Engine::open(&name, &paths, &state_dir, validate_cache))
            .py()?;
        Ok(DatasetService {
            inner: Arc::new(inner),
            pool: runtime.pool.clone(),
        })
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
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

    #[getter]
    fn stored_columns(&self) -> Vec<String> {
        self.inner
            .caches()
            .columns()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    /// `{"population", "epoch_len", "rows"}` of the active population.
    fn active<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let active = py.detach(|| self.inner.active()).py()?;
        let population = py
            .detach(|| self.inner.population(&active.population))
            .py()?;
        let out = PyDict::new(py);
        out.set_item("population", active.population)?;
        out.set_item("epoch_len", active.epoch_len)?;
        out.set_item("rows", population.num_rows())?;
        Ok(out)
    }

    fn populations(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.populations()).py()
    }

    /// Validate and store a table; returns `(population id, rows)`.
    fn put(
        &self,
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        activate: bool,
    ) -> PyResult<(String, u64)> {
        let (schema, batches) = import_table(table)?;
        let batch: RecordBatch = concat(&schema, &batches)?;
        py.detach(|| self.inner.put(batch, activate)).py()
    }

    fn set_epoch_len(&self, py: Python<'_>, epoch_len: i64) -> PyResult<u64> {
        if epoch_len < 1 {
            return Err(Error::invalid(format!(
                "'epoch_len' must be >= 1, got {epoch_len}"
            )))
            .py();
        }
        py.detach(|| self.inner.set_epoch_len(epoch_len as u64))
            .py()
            .map(|a| a.epoch_len)
    }

    /// The metadata table of population `population` (the active one if None).
    #[pyo3(signature = (population=None))]
    fn metadata(&self, py: Python<'_>, population: Option<String>) -> PyResult<ArrowTable> {
        let table = py
            .detach(|| {
                let id = match population {
                    Some(id) => {
                        check_population_id(&id)?;
                        id
                    }
                    None => self.inner.active()?.population,
                };
                self.inner.population(&id).map(|p| p.table().clone())
            })
            .py()?;
        Ok(ArrowTable::new(table))
    }

    /// The stream one ticket names.
    #[pyo3(signature = (*, population, seed, shuffle, epoch, epoch_len, rank, world_size, offset, columns, batch_size=1024, prefetch_size=256))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        py: Python<'_>,
        population: String,
        seed: u64,
        shuffle: bool,
        epoch: u64,
        epoch_len: u64,
        rank: u64,
        world_size: u64,
        offset: u64,
        columns: Vec<String>,
        batch_size: usize,
        prefetch_size: usize,
    ) -> PyResult<BatchStream> {
        let request = request(
            population,
            seed,
            shuffle,
            epoch,
            epoch_len,
            rank,
            world_size,
            offset,
            columns,
            batch_size,
            prefetch_size,
        )?;
        let stream = py
            .detach(|| self.inner.stream(&request, self.pool.clone()))
            .py()?;
        Ok(BatchStream::new(stream))
    }

    /// The schema of the stream a ticket names (checking that it can be served).
    #[pyo3(signature = (*, population, seed, shuffle, epoch, epoch_len, rank, world_size, offset, columns))]
    #[allow(clippy::too_many_arguments)]
    fn schema(
        &self,
        py: Python<'_>,
        population: String,
        seed: u64,
        shuffle: bool,
        epoch: u64,
        epoch_len: u64,
        rank: u64,
        world_size: u64,
        offset: u64,
        columns: Vec<String>,
    ) -> PyResult<ArrowTable> {
        let request = request(
            population, seed, shuffle, epoch, epoch_len, rank, world_size, offset, columns, 1, 1,
        )?;
        let schema = py.detach(|| self.inner.check(&request)).py()?;
        Ok(ArrowTable::new(RecordBatch::new_empty(schema)))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        let out = PyDict::new(py);
        out.set_item("streams", stats.streams)?;
        out.set_item("rows_sent", stats.rows)?;
        out.set_item("bytes_sent", stats.bytes)?;
        Ok(out)
    }
}
