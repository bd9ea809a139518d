//! The exception classes and the one conversion from engine errors to them.
//!
//! The classes are created here, when the extension loads, so that raising one
//! never depends on importing the Python package above this module;
//! `dataset_rt.errors` re-exports them. Each also derives from the builtin whose
//! meaning fits (`ValueError`, `OSError`, `LookupError`, `RuntimeError`), so
//! callers can catch either.

use pyo3::exceptions::{PyException, PyLookupError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::Error;

/// (name, builtin base, docstring) of every subclass of `DatasetRTError`.
const CLASSES: [(&str, Builtin, &str); 11] = [
    (
        "CorruptCacheError",
        Builtin::OSError,
        "A cache directory is incomplete, malformed, of an unknown format version, or \
         fails a checksum. The message names the file and the problem.",
    ),
    (
        "CacheIOError",
        Builtin::OSError,
        "The operating system refused a read or write (permissions, disk full, ...).",
    ),
    (
        "SchemaMismatchError",
        Builtin::ValueError,
        "Records or caches disagree about the metadata schema.",
    ),
    (
        "InvalidPopulationError",
        Builtin::ValueError,
        "A metadata table was rejected; the active population is unchanged.\n\n\
         ``column``, ``row`` (first offending row) and ``count`` (how many rows fail) \
         are set when the failure is about rows of a column.",
    ),
    (
        "InvalidArgumentError",
        Builtin::ValueError,
        "An argument is out of range or of the wrong kind.",
    ),
    (
        "NotFoundError",
        Builtin::LookupError,
        "A named dataset, population or cache does not exist.",
    ),
    (
        "SourceError",
        Builtin::None,
        "A cache source raised while it was being iterated, or yielded a bad record.",
    ),
    (
        "InternalError",
        Builtin::RuntimeError,
        "Something broke inside the engine (a worker failed, a lock was poisoned). \
         Not caused by the caller's input; over Flight it is INTERNAL, which clients \
         retry on another replica.",
    ),
    (
        "StorageFullError",
        Builtin::CacheIOError,
        "The volume a write needed is full (no space left on the device, or a quota). \
         Nothing was written; free space and retry. Over Flight it is UNAVAILABLE (the \
         server's state volume is full), which clients retry on another replica.",
    ),
    (
        "FencedError",
        Builtin::RuntimeError,
        "This loader's training run was resumed elsewhere: a newer generation of the \
         run exists (docs/training.md, \"Fencing\"). The loader stops instead of \
         training on, and its state cannot be saved. Over Flight it is CANCELLED, which \
         clients never retry.",
    ),
    (
        "StoreUnavailableError",
        Builtin::CacheIOError,
        "Object storage could not be reached or refused a request (network, credentials, \
         a store that is down). Nothing changed; retry when it is back. Over Flight it is \
         UNAVAILABLE, which clients retry.",
    ),
];

#[derive(Clone, Copy)]
enum Builtin {
    None,
    /// `CacheIOError` (defined before it in `CLASSES`).
    CacheIOError,
    ValueError,
    OSError,
    LookupError,
    RuntimeError,
}

/// `DatasetRTError` followed by the classes of `CLASSES`, in that order.
static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let base = new_class(
            py,
            "DatasetRTError",
            "Base class of every error raised by DatasetRT.",
            &[py.get_type::<PyException>()],
        )?;
        let mut all = vec![base.clone().unbind()];
        for (name, builtin, doc) in CLASSES {
            let mut bases = vec![base.clone()];
            match builtin {
                Builtin::None => {}
                Builtin::ValueError => bases.push(py.get_type::<PyValueError>()),
                Builtin::OSError => bases.push(py.get_type::<PyOSError>()),
                Builtin::LookupError => bases.push(py.get_type::<PyLookupError>()),
                Builtin::RuntimeError => bases.push(py.get_type::<PyRuntimeError>()),
                Builtin::CacheIOError => bases = vec![all[2].bind(py).clone()],
            }
            let class = new_class(py, name, doc, &bases)?;
            if name == "InvalidPopulationError" {
                for attribute in ["column", "row", "count"] {
                    class.setattr(attribute, py.None())?;
                }
            }
            all.push(class.unbind());
        }
        Ok(all)
    })
}

fn new_class<'py>(
    py: Python<'py>,
    name: &str,
    doc: &str,
    bases: &[Bound<'py, PyType>],
) -> PyResult<Bound<'py, PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", doc)?;
    namespace.set_item("__module__", "dataset_rt.errors")?;
    py.get_type::<PyType>()
        .call1((name, PyTuple::new(py, bases)?, namespace))?
        .cast_into::<PyType>()
        .map_err(PyErr::from)
}

/// Add the exception classes to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for class in types(m.py())? {
        let class = class.bind(m.py());
        m.add(class.name()?, class)?;
    }
    Ok(())
}

fn class_of(error: &Error) -> usize {
    match error {
        Error::Arrow(_) => 0,
        Error::CorruptCache { .. } => 1,
        Error::Io { .. } => 2,
        Error::Schema(_) => 3,
        Error::InvalidPopulation { .. } => 4,
        Error::InvalidArgument(_) => 5,
        Error::NotFound(_) => 6,
        Error::Source(_) => 7,
        Error::Internal(_) => 8,
        Error::StorageFull { .. } => 9,
        Error::Fenced(_) => 10,
        Error::Unavailable(_) => 11,
    }
}

pub fn to_pyerr(error: Error) -> PyErr {
    Python::attach(|py| build(py, &error).unwrap_or_else(|e| e))
}

fn build(py: Python<'_>, error: &Error) -> PyResult<PyErr> {
    let class = types(py)?[class_of(error)].bind(py);
    let instance = class.call1((bounded(error.to_string()),))?;
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

/// Messages longer than this are cut: a message may quote what it refuses
/// (a value, a name, an object's contents), and no client, log line or
/// readiness body should carry megabytes of it.
const MAX_MESSAGE_BYTES: usize = 4096;

fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let cut = (0..=MAX_MESSAGE_BYTES)
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0);
        let dropped = message.len() - cut;
        message.truncate(cut);
        message.push_str(&format!("… ({dropped} more bytes)"));
    }
    message
}

/// An engine error kept as its class and message, to be raised later (an error
/// met inside an Arrow C stream leaves it as text; this keeps its class).
#[derive(Debug, Clone)]
pub struct Failure {
    class: usize,
    message: String,
}

impl Failure {
    pub fn of(error: &Error) -> Self {
        Failure {
            class: class_of(error),
            message: bounded(error.to_string()),
        }
    }

    pub fn to_pyerr(&self, py: Python<'_>) -> PyErr {
        let raised = types(py).and_then(|t| t[self.class].bind(py).call1((self.message.clone(),)));
        match raised {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        }
    }
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
