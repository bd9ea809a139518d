//! Integer arguments from Python: the one place that turns a Python value into
//! the engine's unsigned and non-zero types, with a message that names the
//! argument, the value and what is valid. `bool` is refused although Python
//! counts it as an int: `epoch_len=True` is a mistake, not 1.

use std::num::{NonZeroU64, NonZeroUsize};

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use super::errors::IntoPyResult;
use crate::error::Error;
use crate::sampling::ShuffleMode;

pub fn integer(name: &str, value: &Bound<'_, PyAny>, valid: &str) -> PyResult<i128> {
    if value.cast::<PyBool>().is_ok() || value.cast::<PyInt>().is_err() {
        let kind = value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        return Err(Error::invalid(format!(
            "'{name}' must be an int {valid}, got {kind} {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        )))
        .py();
    }
    value.extract::<i128>().map_err(|_| {
        super::errors::to_pyerr(Error::invalid(format!(
            "'{name}' must be an int {valid} that fits in 64 bits"
        )))
    })
}

/// An int `>= 0` that fits in 64 bits.
pub fn unsigned(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let n = integer(name, value, ">= 0")?;
    u64::try_from(n)
        .map_err(|_| Error::invalid(format!("'{name}' must be between 0 and 2**64 - 1, got {n}")))
        .py()
}

/// An int `>= 1` that fits in 64 bits.
pub fn positive(name: &str, value: &Bound<'_, PyAny>) -> PyResult<NonZeroU64> {
    let n = integer(name, value, ">= 1")?;
    u64::try_from(n)
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| Error::invalid(format!("'{name}' must be >= 1, got {n}")))
        .py()
}

/// A worker count: an int `>= 1` that fits in a `usize` ("num_workers must be
/// greater than zero", dataset-rt 0.4.8's words, which its users match on).
pub fn num_workers(value: &Bound<'_, PyAny>) -> PyResult<NonZeroUsize> {
    let n = integer("num_workers", value, ">= 1")?;
    if n < 1 {
        return Err(Error::invalid(format!(
            "num_workers must be greater than zero (>= 1), got {n}"
        )))
        .py();
    }
    usize::try_from(n)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| Error::invalid(format!("num_workers is too large, got {n}")))
        .py()
}

/// An epoch length: an int `>= 1` ("epoch_len must be at least 1", 0.4.8's words).
pub fn epoch_len(value: &Bound<'_, PyAny>) -> PyResult<NonZeroU64> {
    let n = integer("epoch_len", value, ">= 1")?;
    u64::try_from(n)
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| Error::invalid(format!("epoch_len must be at least 1, got {n}")))
        .py()
}

/// An int `>= 1` that fits in a `usize`.
pub fn positive_usize(name: &str, value: &Bound<'_, PyAny>) -> PyResult<NonZeroUsize> {
    let n = positive(name, value)?;
    usize::try_from(n.get())
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| Error::invalid(format!("'{name}' is too large, got {n}")))
        .py()
}

/// `positive_usize` of an optional argument, `default` when it is not given.
pub fn positive_usize_or(
    name: &str,
    value: Option<&Bound<'_, PyAny>>,
    default: NonZeroUsize,
) -> PyResult<NonZeroUsize> {
    value.map_or(Ok(default), |v| positive_usize(name, v))
}

/// A seed: any int that fits in 64 bits, signed or not; a negative seed is
/// taken modulo 2**64 (so -1 and 2**64 - 1 name the same stream).
pub fn seed(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let n = integer(name, value, "that fits in 64 bits")?;
    if let Ok(unsigned) = u64::try_from(n) {
        return Ok(unsigned);
    }
    i64::try_from(n)
        .map(|signed| signed as u64)
        .map_err(|_| {
            Error::invalid(format!(
                "'{name}' must fit in 64 bits (-2**63 <= seed < 2**64), got {n}"
            ))
        })
        .py()
}

/// A bool (an int is refused: `shuffle=1` is a mistake, not `True`).
pub fn boolean(name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    match value.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) => {
            let kind = value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            Err(Error::invalid(format!(
                "'{name}' must be a bool, got {kind} {}",
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            )))
            .py()
        }
    }
}

/// A stream mode: `True` (weighted draws), `False` (table order) or
/// `"permutation"` (every row once per cycle).
pub fn shuffle_mode(name: &str, value: &Bound<'_, PyAny>) -> PyResult<ShuffleMode> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(if b.is_true() {
            ShuffleMode::Weighted
        } else {
            ShuffleMode::Ordered
        });
    }
    match value.extract::<String>() {
        Ok(text) if text == "permutation" => Ok(ShuffleMode::Permutation),
        _ => Err(Error::invalid(format!(
            "'{name}' must be True (weighted draws), False (table order) or \"permutation\" \
             (every row once per cycle), got {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        )))
        .py(),
    }
}

impl<'py> IntoPyObject<'py> for ShuffleMode {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = std::convert::Infallible;

    /// The spelling `shuffle_mode` accepts: a bool, or "permutation".
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(match self {
            ShuffleMode::Weighted => PyBool::new(py, true).to_owned().into_any(),
            ShuffleMode::Ordered => PyBool::new(py, false).to_owned().into_any(),
            ShuffleMode::Permutation => pyo3::types::PyString::new(py, "permutation").into_any(),
        })
    }
}

/// A record identity (`cache_id` or `sample_id`) of `get_item`, with the
/// exception classes of a Python sequence: `TypeError` for anything but an
/// `int` (`bool`, `str` and `float` included), `IndexError` for an int that is
/// negative or does not fit in 64 bits. Messages keep dataset-rt 0.4.8's words
/// ("must be integers", "is out of range").
pub fn identity(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let repr = || value.repr().map(|r| r.to_string()).unwrap_or_default();
    if value.cast::<PyBool>().is_ok() || value.cast::<PyInt>().is_err() {
        let kind = value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        return Err(PyTypeError::new_err(format!(
            "cache_id and sample_id must be integers; {name} is {kind} {}",
            repr()
        )));
    }
    value.extract::<u64>().map_err(|_| {
        PyIndexError::new_err(format!(
            "{name} {} is out of range (identities are integers from 0 to 2**64 - 1)",
            repr()
        ))
    })
}
