//! The one conversion from engine errors to Python exceptions. The classes live
//! in `dataset_rt/errors.py` so that Python code can subclass and document them.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::error::Error;

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    py.import("dataset_rt.errors")?
        .getattr(name)?
        .cast_into::<PyType>()
        .map_err(PyErr::from)
}

pub fn to_pyerr(error: Error) -> PyErr {
    Python::attach(|py| build(py, &error).unwrap_or_else(|e| e))
}

fn build(py: Python<'_>, error: &Error) -> PyResult<PyErr> {
    let message = error.to_string();
    let name = match error {
        Error::CorruptCache { .. } => "CorruptCacheError",
        Error::Io { .. } => "CacheIOError",
        Error::Schema(_) => "SchemaMismatchError",
        Error::InvalidPopulation { .. } => "InvalidPopulationError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Source(_) => "SourceError",
        Error::NotFound(_) => "NotFoundError",
        Error::Internal(_) => "InternalError",
        Error::Arrow(_) => "DatasetRTError",
    };
    let instance = class(py, name)?.call1((message,))?;
    if let Error::InvalidPopulation {
        column,
        first_row,
        count,
        ..
    } = error
    {
        instance.setattr("column", column.clone())?;
        instance.setattr("row", *first_row)?;
        instance.setattr("count", *count)?;
    }
    Ok(PyErr::from_value(instance))
}

/// For `Result`s of the engine inside binding code.
pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::error::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
