//! PyO3 bindings: the only module that knows about Python. Each function
//! converts arguments, releases the GIL around engine work, and maps errors
//! through `errors::to_pyerr`.

mod arrow;
mod dataset;
mod errors;
mod service;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::storage::{Cache, FORMAT_VERSION};
use crate::stream::WorkerPool;
use errors::IntoPyResult;

/// A fixed pool of worker threads shared by everything created from it.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct Runtime {
    pool: Arc<WorkerPool>,
}

#[pymethods]
impl Runtime {
    #[new]
    fn new(num_workers: i64) -> PyResult<Self> {
        if num_workers < 1 {
            return Err(crate::Error::invalid(format!(
                "num_workers must be >= 1, got {num_workers}"
            )))
            .py();
        }
        Ok(Runtime {
            pool: Arc::new(WorkerPool::new(num_workers as usize).py()?),
        })
    }

    #[getter]
    fn num_workers(&self) -> usize {
        self.pool.size()
    }
}

/// Open a cache as a reader would; with `full`, verify every file's checksum.
#[pyfunction]
fn check_cache(py: Python<'_>, path: PathBuf, full: bool) -> PyResult<()> {
    py.detach(|| Cache::open(&path, full).map(|_| ())).py()
}

/// Verify every file and every record; returns what was checked.
#[pyfunction]
fn verify_cache<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let (cache_id, report) = py
        .detach(|| {
            let cache = Cache::open(&path, false)?;
            cache.verify().map(|r| (cache.cache_id(), r))
        })
        .py()?;
    let out = PyDict::new(py);
    out.set_item("path", path.to_string_lossy().into_owned())?;
    out.set_item("cache_id", cache_id)?;
    out.set_item("files", report.files)?;
    out.set_item("bytes", report.bytes)?;
    out.set_item("records", report.records)?;
    Ok(out)
}

/// The manifest of a cache as a dict (after the open-time checks).
#[pyfunction]
fn inspect_cache<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let manifest = py
        .detach(|| Cache::open(&path, false).map(|c| c.manifest().clone()))
        .py()?;
    let text = serde_json::to_string(&manifest)
        .map_err(|e| errors::value_error(format!("cannot encode the manifest: {e}")))?;
    let out = py.import("json")?.call_method1("loads", (text,))?;
    out.set_item("format_version", FORMAT_VERSION)?;
    out.set_item("path", path.to_string_lossy().into_owned())?;
    Ok(out)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", FORMAT_VERSION)?;
    m.add_class::<Runtime>()?;
    m.add_class::<dataset::Dataset>()?;
    m.add_class::<dataset::BatchStream>()?;
    m.add_class::<dataset::SampleIterator>()?;
    m.add_class::<arrow::ArrowTable>()?;
    m.add_class::<service::DatasetService>()?;
    m.add_function(wrap_pyfunction!(writer::write_cache, m)?)?;
    m.add_function(wrap_pyfunction!(writer::validate_source_name_py, m)?)?;
    m.add_function(wrap_pyfunction!(check_cache, m)?)?;
    m.add_function(wrap_pyfunction!(verify_cache, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_cache, m)?)?;
    Ok(())
}
