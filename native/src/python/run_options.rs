//! `RunOptions` for Python: a loader's run-start options, parsed by the core's
//! one type (`crate::run::RunOptions`), so every loader and the audit take
//! the same keys by the same rules.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};

use super::errors::IntoPyResult;
use super::json::{to_python, with_keywords};
use super::request::StreamRequest;
use crate::error::Error;
use crate::run;

/// A run's start options, built from keyword arguments (`None` means "not
/// given"); an instance is always valid.
#[pyclass(frozen, eq, module = "dataset_rt._native", name = "RunOptions")]
#[derive(PartialEq)]
pub struct RunOptions {
    pub(super) inner: run::RunOptions,
}

#[pymethods]
impl RunOptions {
    #[new]
    #[pyo3(signature = (**keys))]
    fn new(keys: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let object = with_keywords(Map::new(), keys)
            .map_err(|detail| Error::invalid(format!("loader option {detail}")))
            .py()?;
        Ok(RunOptions {
            inner: run::RunOptions::from_value(Value::Object(object)).py()?,
        })
    }

    /// The stream the run reads, as a command for the source to pin.
    fn request(&self) -> StreamRequest {
        StreamRequest {
            inner: self.inner.request(),
        }
    }

    /// The keys, defaults filled in.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = serde_json::to_value(&self.inner)
            .map_err(|e| Error::internal(format!("cannot encode the options: {e}")))
            .py()?;
        to_python(py, &value)
    }

    #[getter]
    fn dataset(&self) -> &str {
        &self.inner.dataset
    }

    #[getter]
    fn batch_size(&self) -> u64 {
        self.inner.batch_size.get()
    }

    #[getter]
    fn rank(&self) -> u64 {
        self.inner.rank
    }

    #[getter]
    fn world_size(&self) -> u64 {
        self.inner.world_size.get()
    }

    #[getter]
    fn population(&self) -> Option<&str> {
        self.inner.population.as_ref().map(|p| p.as_str())
    }

    fn __repr__(&self) -> String {
        let json = serde_json::to_string(&self.inner).unwrap_or_default();
        format!("RunOptions({json})")
    }
}
