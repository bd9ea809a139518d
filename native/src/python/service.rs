//! `DatasetService` for the Flight server: populations by id, streams by request.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::run::fence::Claim;
use crate::run::RunId;

use super::args::{positive, positive_usize_or};
use super::arrow::{import_stream, stream_batch, ArrowTable};
use super::batch_stream::BatchStream;
use super::errors::IntoPyResult;
use super::request::StreamRequest;
use super::Runtime;
use crate::error::Error;
use crate::ids::PopulationId;
use crate::remote::is_url;
use crate::service::{DatasetService as Engine, StateLocation};
use crate::storage::publish::validate_name;
use crate::stream::served::{Grouping, OVERFLOW};
use crate::stream::{StreamOptions, WorkerPool};

#[pyclass(frozen, module = "dataset_rt._native")]
pub struct DatasetService {
    inner: Arc<Engine>,
    pool: Arc<WorkerPool>,
}

/// Rows a served stream decodes ahead of the client, unless the server says otherwise.
const SERVER_PREFETCH_ROWS: NonZeroUsize = NonZeroUsize::new(256).expect("256 is not zero");

/// The active population of a served dataset.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct ActivePopulation {
    /// Its id in the content-addressed store.
    population: String,
    /// Positions per epoch when a request names none.
    epoch_len: u64,
    rows: usize,
}

/// What a served dataset has streamed since the server started.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct ServiceStats {
    streams: u64,
    rows_sent: u64,
    bytes_sent: u64,
    /// Activation-log entries skipped as damaged or hostile (object storage).
    skipped_log_entries: u64,
}

/// The core's one rule for a name used as a path part (`kind` is what the
/// name is, e.g. "dataset"): `InvalidArgumentError` unless it is one.
#[pyfunction]
pub fn check_name(kind: &str, name: &str) -> PyResult<()> {
    validate_name(kind, name).py()
}

/// The local directory a location names, or None when it is object storage:
/// the one place that tells them apart, so Python never inspects a URL.
#[pyfunction]
pub fn local_path(location: &str) -> Option<PathBuf> {
    (!is_url(location)).then(|| PathBuf::from(location))
}

/// The local directory this process writes for a population store at
/// `state_dir`: the store itself, or, on object storage, `mirror_dir`
/// (`InvalidArgumentError` when a store on object storage has none).
#[pyfunction]
#[pyo3(signature = (state_dir, mirror_dir=None))]
pub fn state_local_dir(state_dir: PathBuf, mirror_dir: Option<PathBuf>) -> PyResult<PathBuf> {
    match state_location(state_dir, mirror_dir, true).py()? {
        StateLocation::Dir { dir, .. } => Ok(dir),
        StateLocation::Bucket { mirror, .. } => Ok(mirror),
    }
}

/// Where the store of a dataset lives, from the Python arguments (a path, or
/// an `s3://` URL given as a string).
fn state_location(
    state_dir: PathBuf,
    mirror_dir: Option<PathBuf>,
    create: bool,
) -> crate::error::Result<StateLocation> {
    let Some(url) = state_dir.to_str().filter(|s| is_url(s)).map(str::to_string) else {
        return Ok(StateLocation::Dir {
            dir: state_dir,
            mirror: mirror_dir.map(|m| m.join("caches")),
        });
    };
    let Some(mirror) = mirror_dir else {
        return Err(Error::invalid(format!(
            "a population store on object storage ({url}) needs mirror_dir: a local \
             directory where this process keeps the populations it maps"
        )));
    };
    if !create {
        return Err(Error::invalid(format!(
            "create=False opens a store only on a local state dir, not on object storage \
             ({url})"
        )));
    }
    Ok(StateLocation::Bucket { url, mirror })
}

#[pymethods]
impl DatasetService {
    /// `create=False` opens only a store that exists with an active
    /// population, writing nothing (`NotFoundError` otherwise).
    #[new]
    ///
    /// `state_dir` is a directory, or object storage (`s3://bucket/prefix`,
    /// credentials from the environment) mirrored into `mirror_dir`.
    ///
    /// `show_progress` draws a progress bar on stderr, when it is a terminal,
    /// while a population is fetched from object storage on its first use or
    /// its rows file is built for a store written before rows files existed.
    #[pyo3(signature = (runtime, name, paths, state_dir, *, validate_cache=false, create=true, mirror_dir=None, show_progress=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        runtime: &Runtime,
        name: String,
        paths: Vec<PathBuf>,
        state_dir: PathBuf,
        validate_cache: bool,
        create: bool,
        mirror_dir: Option<PathBuf>,
        show_progress: bool,
    ) -> PyResult<Self> {
        let state = state_location(state_dir, mirror_dir, create).py()?;
        let inner = py
            .detach(|| match (&state, create) {
                (StateLocation::Dir { dir, .. }, false) => {
                    Engine::open_existing(&name, &paths, dir, validate_cache)
                }
                _ => Engine::open_at(&name, &paths, &state, validate_cache),
            })
            .py()?;
        inner.set_show_progress(show_progress);
        Ok(DatasetService {
            inner: Arc::new(inner),
            pool: runtime.pool.clone(),
        })
    }

    #[getter]
    fn cache_ids(&self) -> Vec<u64> {
        self.inner.caches().cache_ids()
    }

    /// Why the dataset cannot be served now (a cache file cut, deleted or
    /// replaced by a damaged one under the server), or None.
    fn problem(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.inner.problem())
    }

    /// Keep at most `keep` stored populations after each put (the active one
    /// and the newest others); 0 keeps all.
    fn set_keep_populations(&self, keep: usize) {
        self.inner.set_keep_populations(keep);
    }

    /// The active population, its epoch length and row count.
    fn active(&self, py: Python<'_>) -> PyResult<ActivePopulation> {
        let (active, rows) = py
            .detach(|| {
                let active = self.inner.active()?;
                let rows = self.inner.population(&active.population)?.num_rows();
                Ok::<_, Error>((active, rows))
            })
            .py()?;
        Ok(ActivePopulation {
            population: active.population.into(),
            epoch_len: active.epoch_len,
            rows,
        })
    }

    fn populations(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let ids = py.detach(|| self.inner.populations()).py()?;
        Ok(ids.into_iter().map(String::from).collect())
    }

    /// Validate and store a table, read batch by batch from any Arrow C
    /// stream (a Flight `do_put` reader, a table, a LazyFrame's batches);
    /// returns `(population id, rows)`.
    fn put(
        &self,
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        activate: bool,
    ) -> PyResult<(String, u64)> {
        let reader = import_stream(table, Error::population)?;
        let (id, rows, activation) = py
            .detach(|| {
                self.inner
                    .put_holding_activation(reader.map(stream_batch), activate)
            })
            .py()?;
        // Let go of the activation lock only now that this thread holds the
        // GIL again: Python code that records the acknowledgement right after
        // `put` returns then records activations in the order they took effect.
        drop(activation);
        Ok((id.into(), rows))
    }

    /// Delete a stored population that is not the active one.
    fn remove_population(&self, py: Python<'_>, population_id: String) -> PyResult<()> {
        let id = PopulationId::parse(&population_id).py()?;
        py.detach(|| self.inner.remove_population(&id)).py()
    }

    fn set_epoch_len(&self, py: Python<'_>, epoch_len: &Bound<'_, PyAny>) -> PyResult<u64> {
        let epoch_len = positive("epoch_len", epoch_len)?;
        py.detach(|| self.inner.set_epoch_len(epoch_len))
            .py()
            .map(|a| a.epoch_len)
    }

    /// The metadata table of population `population` (the active one if None).
    #[pyo3(signature = (population=None))]
    fn metadata(&self, py: Python<'_>, population: Option<String>) -> PyResult<ArrowTable> {
        let population = self.population_of(py, population)?;
        Ok(ArrowTable::new(population.unchecked_table()))
    }

    /// The same table as `metadata`, as a stream of checked slices that a
    /// server can watch and cancel (`BatchStream`); only `columns`, in that
    /// order, when given. A file of the population cut or changed while the
    /// stream is read ends it with the damage (`Population::table_slices`).
    #[pyo3(signature = (population=None, columns=None))]
    fn metadata_stream(
        &self,
        py: Python<'_>,
        population: Option<String>,
        columns: Option<Vec<String>>,
    ) -> PyResult<BatchStream> {
        let population = self.population_of(py, population)?;
        let mut table = population.unchecked_table();
        if let Some(columns) = columns {
            table = table.project(&columns).py()?;
        }
        let schema = table.schema();
        Ok(BatchStream::of_slices(
            schema,
            population.table_slices(table),
        ))
    }

    /// The request with the active population and epoch length filled in.
    fn pin(&self, py: Python<'_>, request: &StreamRequest) -> PyResult<StreamRequest> {
        let inner = py.detach(|| self.inner.pin(&request.inner)).py()?;
        Ok(StreamRequest { inner })
    }

    /// The stream a ticket names, in batches of at most `batch_size` rows.
    /// With `lend`, records of 256 KiB or more are lent from their mapped
    /// shards without a copy, each in a batch of its own: for a consumer that
    /// passes the bytes on and lets go of them (the Flight server).
    #[pyo3(signature = (request, *, batch_size=None, prefetch_size=None, lend=false))]
    fn stream(
        &self,
        py: Python<'_>,
        request: &StreamRequest,
        batch_size: Option<&Bound<'_, PyAny>>,
        prefetch_size: Option<&Bound<'_, PyAny>>,
        lend: bool,
    ) -> PyResult<BatchStream> {
        let options = StreamOptions {
            batch_rows: positive_usize_or(
                "batch_size",
                batch_size,
                StreamOptions::default().batch_rows,
            )?,
            prefetch_rows: positive_usize_or("prefetch_size", prefetch_size, SERVER_PREFETCH_ROWS)?,
            lend_large: lend,
            ..StreamOptions::default()
        };
        let stream = py
            .detach(|| {
                self.inner
                    .stream(&request.inner, self.pool.clone(), options)
            })
            .py()?;
        Ok(BatchStream::new(stream))
    }

    /// The schema of the stream a request names (checking that it can be served).
    fn schema(&self, py: Python<'_>, request: &StreamRequest) -> PyResult<ArrowTable> {
        let schema = py.detach(|| self.inner.check(&request.inner)).py()?;
        Ok(ArrowTable::new(RecordBatch::new_empty(schema).into()))
    }

    /// The generation a resume of run `run` gets, recorded in the store before
    /// it is returned: the resume loaded a state of generation `after` at
    /// `(epoch, position)`; `fresh` always gets a new one (see `run::fence`).
    #[pyo3(signature = (run, *, after, epoch, position, fresh=false))]
    fn claim_run(
        &self,
        py: Python<'_>,
        run: String,
        after: u64,
        epoch: u64,
        position: u64,
        fresh: bool,
    ) -> PyResult<u64> {
        let run = RunId::try_from(run).py()?;
        let claim = Claim {
            after,
            place: (epoch, position),
            fresh,
        };
        py.detach(|| self.inner.claim_run(&run, claim)).py()
    }

    /// `FencedError` when a newer generation of run `run` than `generation` exists.
    fn check_run(&self, py: Python<'_>, run: String, generation: u64) -> PyResult<()> {
        let run = RunId::try_from(run).py()?;
        py.detach(|| self.inner.check_run(&run, generation)).py()
    }

    /// Count the rows of every stream opened from now on per value of the
    /// population column `column` (None: rows and bytes only), keeping at most
    /// `max_groups` values per population (the rest count under "(other)").
    #[pyo3(signature = (column, max_groups=64))] // served::DEFAULT_MAX_GROUPS, as a literal for the signature
    fn set_grouping(&self, column: Option<String>, max_groups: usize) -> PyResult<()> {
        let grouping = Grouping::new(column, max_groups).py()?;
        self.inner.set_grouping(grouping);
        Ok(())
    }

    /// What the streams served per population, most recently streamed first:
    /// a dict per population (`population`, `streams`, `rows`, `bytes`,
    /// `groups`, `group_column_missing`).
    fn served<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .served()
            .into_iter()
            .map(|(population, served)| {
                let entry = PyDict::new(py);
                entry.set_item("population", population)?;
                entry.set_item("streams", served.streams)?;
                entry.set_item("rows", served.rows)?;
                entry.set_item("bytes", served.bytes)?;
                let groups = PyDict::new(py);
                for (key, rows) in &served.groups {
                    groups.set_item(key, rows)?;
                }
                if served.overflow > 0 {
                    groups.set_item(OVERFLOW, served.overflow)?;
                }
                entry.set_item("groups", groups)?;
                entry.set_item("group_column_missing", served.group_column_missing)?;
                Ok(entry)
            })
            .collect()
    }

    fn stats(&self) -> ServiceStats {
        let stats = self.inner.stats();
        ServiceStats {
            streams: stats.streams,
            rows_sent: stats.rows,
            bytes_sent: stats.bytes,
            skipped_log_entries: stats.skipped_log_entries,
        }
    }
}

impl DatasetService {
    /// The population `population` names (the active one if None), opened.
    fn population_of(
        &self,
        py: Python<'_>,
        population: Option<String>,
    ) -> PyResult<Arc<crate::population::Population>> {
        let population = population.as_deref().map(PopulationId::parse);
        py.detach(|| {
            let id = match population {
                Some(id) => id?,
                None => self.inner.active()?.population,
            };
            self.inner.population(&id)
        })
        .py()
    }
}
