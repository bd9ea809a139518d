//! `RunState` for Python: the one run-state type (`crate::run`), which the
//! training loader, its workers and the audit all use.

use std::num::NonZeroU64;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use serde_json::Value;

use super::errors::IntoPyResult;
use super::json::{to_json, to_python};
use super::request::StreamRequest;
use super::run_options::RunOptions;
use crate::error::Error;
use crate::request::PopulationId;
use crate::run;

/// Where a training run is: its stream, its progress, the population of every
/// position and every resume (docs/training.md, "What the state holds").
#[pyclass(module = "dataset_rt._native", name = "RunState", eq)]
#[derive(Clone, PartialEq)]
pub struct RunState {
    inner: run::RunState,
}

/// A stretch of a run read at one world size and batch size from one
/// population (`RunState.seen` / `RunState.ahead`).
#[pyclass(frozen, module = "dataset_rt._native", name = "RunSpan")]
pub struct RunSpan {
    inner: run::Span,
}

fn positive(name: &str, value: u64) -> PyResult<NonZeroU64> {
    NonZeroU64::new(value)
        .ok_or_else(|| Error::invalid(format!("'{name}' must be an integer >= 1, got {value}")))
        .py()
}

fn population_id(value: &str) -> PyResult<PopulationId> {
    PopulationId::try_from(value.to_string()).py()
}

#[pymethods]
impl RunState {
    /// A new run with `options`, over the population and epoch length the
    /// source pinned (`pinned`: `options.request()` resolved).
    #[staticmethod]
    fn start(options: &RunOptions, pinned: &StreamRequest) -> PyResult<Self> {
        Ok(RunState {
            inner: run::RunState::start(&options.inner, &pinned.inner).py()?,
        })
    }

    /// A saved state (`to_dict()`), validated: a bad one raises
    /// `InvalidArgumentError` naming the key and what would be valid.
    #[staticmethod]
    fn from_dict(state: &Bound<'_, PyAny>) -> PyResult<Self> {
        if !state.is_instance_of::<PyDict>() {
            let kind = state.get_type().name()?.to_string();
            return Err(Error::invalid(format!(
                "a loader state is a dict (from state_dict()), got {kind}"
            )))
            .py();
        }
        let value = to_json(state)
            .map_err(|detail| Error::invalid(format!("a loader state value {detail}")))
            .py()?;
        Ok(RunState {
            inner: run::RunState::from_value(value).py()?,
        })
    }

    /// A state saved by `to_json`.
    #[staticmethod]
    fn from_json(raw: &[u8]) -> PyResult<Self> {
        Ok(RunState {
            inner: run::RunState::from_json(raw).py()?,
        })
    }

    /// The state as plain JSON-serialisable data.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let raw = self.inner.to_json().py()?;
        let value: Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::internal(format!("a state's own JSON: {e}")))
            .py()?;
        to_python(py, &value)
    }

    fn to_json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.inner.to_json().py()?))
    }

    /// Pickled as its JSON (DataLoader workers get a copy).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Py<PyAny>, (Bound<'py, PyBytes>,))> {
        let from_json = slf.get_type().getattr("from_json")?.unbind();
        Ok((from_json, (slf.borrow().to_json(slf.py())?,)))
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn copy(&self) -> Self {
        self.clone()
    }

    #[getter]
    fn dataset(&self) -> &str {
        self.inner.dataset()
    }
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }
    #[getter]
    fn shuffle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.inner.shuffle().into_pyobject(py)?)
    }
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.inner.columns().to_vec()
    }
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.inner.epoch_len().get()
    }
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }
    /// Epoch-relative: every position of the epoch before it has been consumed.
    #[getter]
    fn position(&self) -> u64 {
        self.inner.position()
    }
    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }
    #[getter]
    fn epoch_start(&self) -> u64 {
        self.inner.epoch_start()
    }
    #[getter]
    fn run(&self) -> &str {
        self.inner.run().as_str()
    }
    #[getter]
    fn world_size(&self) -> PyResult<u64> {
        Ok(self.inner.current().py()?.world_size.get())
    }
    #[getter]
    fn batch_size(&self) -> PyResult<u64> {
        Ok(self.inner.current().py()?.batch_size.get())
    }
    #[getter]
    fn workers(&self) -> PyResult<u64> {
        Ok(self.inner.current().py()?.workers)
    }
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(self.inner.current().py()?.generation)
    }
    /// `(from_position, population_id)` pairs, ascending from 0.
    #[getter]
    fn segments(&self) -> Vec<(u64, String)> {
        self.inner
            .segments()
            .iter()
            .map(|s| (s.0, s.1.as_str().to_string()))
            .collect()
    }

    /// The population drawing the absolute `position`.
    fn population_at(&self, position: u64) -> String {
        self.inner.population_at(position).as_str().to_string()
    }

    /// The rest of the epoch as `(start, stop, population)` ranges, one per segment.
    fn parts(&self) -> Vec<(u64, u64, String)> {
        self.inner
            .parts()
            .into_iter()
            .map(|p| (p.start, p.stop, p.population.as_str().to_string()))
            .collect()
    }

    /// Batches each rank still takes in the current epoch.
    fn batches_left(&self) -> PyResult<u64> {
        self.inner.batches_left().py()
    }

    /// The tickets of DataLoader worker `worker` of `workers` of rank `rank`
    /// for the rest of the epoch, in order.
    #[pyo3(signature = (rank, worker=0, workers=1, *, payload=true))]
    fn requests(
        &self,
        rank: u64,
        worker: u64,
        workers: u64,
        payload: bool,
    ) -> PyResult<Vec<StreamRequest>> {
        Ok(self
            .inner
            .requests(rank, worker, workers, payload)
            .py()?
            .into_iter()
            .map(|inner| StreamRequest { inner })
            .collect())
    }

    /// The run's epoch over `population` as a command (no rank).
    fn command(&self, population: &str) -> PyResult<StreamRequest> {
        Ok(StreamRequest {
            inner: self.inner.command(&population_id(population)?),
        })
    }

    /// An epoch must hold at least one batch for every rank.
    fn check_share(&self) -> PyResult<()> {
        self.inner.check_share().py()
    }

    /// Move past the batch whose first sample is the absolute `first_position`.
    fn advance(&mut self, first_position: u64) -> PyResult<()> {
        self.inner.advance(first_position).py()
    }

    /// Every rank has read its share of the epoch (the rest is the dropped tail).
    fn finish_epoch(&mut self) {
        self.inner.finish_epoch();
    }

    /// Read epoch `epoch` next, from its start (the current epoch keeps its place).
    fn set_epoch(&mut self, epoch: u64) -> PyResult<()> {
        self.inner.set_epoch(epoch).py()
    }

    /// Resume the run here as generation `generation` (> every earlier one).
    fn resume(
        &mut self,
        world_size: u64,
        batch_size: u64,
        workers: u64,
        generation: u64,
    ) -> PyResult<()> {
        self.inner
            .resume(world_size, batch_size, workers, generation)
            .py()
    }

    /// Draw from `population` from the absolute position `at` on (a batch boundary).
    fn switch(&mut self, at: u64, population: &str) -> PyResult<()> {
        self.inner.switch(at, population_id(population)?).py()
    }

    /// The spans of what the run had consumed when this state was saved, every
    /// resume of the chain cut by its own world size and batch size (only
    /// `epochs` if given).
    #[pyo3(signature = (epochs=None))]
    fn seen(&self, epochs: Option<Vec<u64>>) -> PyResult<Vec<RunSpan>> {
        Ok(self
            .inner
            .seen(epochs.as_deref())
            .py()?
            .into_iter()
            .map(|inner| RunSpan { inner })
            .collect())
    }

    /// The spans a run resumed from this state at `world_size` x `batch_size`
    /// reads of `epochs`.
    fn ahead(&self, epochs: Vec<u64>, world_size: u64, batch_size: u64) -> PyResult<Vec<RunSpan>> {
        Ok(self
            .inner
            .ahead(
                &epochs,
                positive("world_size", world_size)?,
                positive("batch_size", batch_size)?,
            )
            .py()?
            .into_iter()
            .map(|inner| RunSpan { inner })
            .collect())
    }

    /// Rank `rank`'s ticket for `span` (ids and columns only unless `payload`),
    /// with `columns` instead of the run's if given.
    #[pyo3(signature = (span, rank, *, payload=false, columns=None))]
    fn span_ticket(
        &self,
        span: &RunSpan,
        rank: u64,
        payload: bool,
        columns: Option<Vec<String>>,
    ) -> PyResult<StreamRequest> {
        let mut ticket = self.inner.span_ticket(&span.inner, rank, payload).py()?;
        if let Some(columns) = columns {
            ticket.columns = columns;
        }
        Ok(StreamRequest { inner: ticket })
    }

    fn __repr__(&self) -> String {
        let json = self.inner.to_json().unwrap_or_default();
        format!("RunState({})", String::from_utf8_lossy(&json))
    }
}

#[pymethods]
impl RunSpan {
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch
    }
    #[getter]
    fn start(&self) -> u64 {
        self.inner.part.start
    }
    #[getter]
    fn stop(&self) -> u64 {
        self.inner.part.stop
    }
    #[getter]
    fn population(&self) -> &str {
        self.inner.part.population.as_str()
    }
    #[getter]
    fn world_size(&self) -> u64 {
        self.inner.world_size.get()
    }
    #[getter]
    fn batch_size(&self) -> u64 {
        self.inner.batch_size.get()
    }
    /// Each rank's step of the epoch at its first batch of the span.
    #[getter]
    fn first_step(&self) -> u64 {
        self.inner.first_step
    }
    /// Which of the run's resumes (spans of `resumes`) this is part of.
    #[getter]
    fn span(&self) -> usize {
        self.inner.span
    }
    #[getter]
    fn generation(&self) -> u64 {
        self.inner.generation
    }
    /// Batches each rank takes.
    fn steps(&self) -> u64 {
        self.inner.steps()
    }
    /// Samples all ranks take together.
    fn rows(&self) -> u64 {
        self.inner.rows()
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "RunSpan(epoch={}, start={}, stop={}, world_size={}, batch_size={}, first_step={})",
            s.epoch, s.part.start, s.part.stop, s.world_size, s.batch_size, s.first_step
        )
    }
}
