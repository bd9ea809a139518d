//! `StreamRequest` and `MetadataRequest` for Python: the server, the client and
//! tests build and read the engine's own request type (see `crate::request`).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};

use super::errors::IntoPyResult;
use super::json::{to_python, with_keywords};
use crate::error::Error;
use crate::request::{self, Ticket};

/// A stream request (a `get_flight_info` command, or a `do_get` ticket when it
/// has a rank). Built from keyword arguments or parsed from JSON; either way the
/// engine's rules apply, so an instance is always valid.
#[pyclass(frozen, eq, module = "dataset_rt._native", name = "StreamRequest")]
#[derive(PartialEq)]
pub struct StreamRequest {
    pub(super) inner: request::StreamRequest,
}

#[pymethods]
impl StreamRequest {
    /// Keyword arguments are the protocol's keys (`None` means "not given").
    #[new]
    #[pyo3(signature = (**keys))]
    fn new(keys: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        with_keys(Map::new(), keys)
    }

    /// Parse a `get_flight_info` command.
    #[staticmethod]
    fn from_command(raw: &[u8]) -> PyResult<Self> {
        Ok(StreamRequest {
            inner: request::StreamRequest::from_command(raw).py()?,
        })
    }

    /// The same request with `keys` changed (`None` removes a key: its
    /// default applies), checked by the same rules; a request with a rank is
    /// a ticket.
    #[pyo3(signature = (**keys))]
    fn replace(&self, keys: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Value::Object(object) = serde_json::to_value(&self.inner)
            .map_err(|e| Error::internal(format!("cannot encode the request: {e}")))
            .py()?
        else {
            return Err(Error::internal("a request encodes as a JSON object")).py();
        };
        with_keys(object, keys)
    }

    /// The keys that are set, as a dict (what `to_json` encodes).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = serde_json::to_value(&self.inner)
            .map_err(|e| Error::internal(format!("cannot encode the request: {e}")))
            .py()?;
        to_python(py, &value)
    }

    /// The ticket of rank `rank` (offset 0 unless this request has one).
    fn for_rank(&self, rank: u64) -> PyResult<Self> {
        Ok(StreamRequest {
            inner: self.inner.for_rank(rank).py()?,
        })
    }

    /// The same ticket, resumed `offset` samples into its partition.
    fn resumed(&self, offset: u64) -> Self {
        StreamRequest {
            inner: self.inner.resumed(offset),
        }
    }

    /// The JSON bytes of a command or ticket.
    fn to_json(&self) -> PyResult<Vec<u8>> {
        self.inner.to_json().py()
    }

    #[getter]
    fn dataset(&self) -> &str {
        &self.inner.dataset
    }

    #[getter]
    fn world_size(&self) -> u64 {
        self.inner.world_size
    }

    #[getter]
    fn rank(&self) -> u64 {
        self.inner.rank.unwrap_or(0)
    }

    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset.unwrap_or(0)
    }

    #[getter]
    fn epoch_len(&self) -> Option<u64> {
        self.inner.epoch_len.map(|n| n.get())
    }

    #[getter]
    fn population(&self) -> Option<&str> {
        self.inner.population.as_ref().map(|p| p.as_str())
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    #[getter]
    fn start(&self) -> u64 {
        self.inner.start
    }

    #[getter]
    fn stop(&self) -> Option<u64> {
        self.inner.stop
    }

    #[getter]
    fn block(&self) -> u64 {
        self.inner.block.get()
    }

    #[getter]
    fn payload(&self) -> bool {
        self.inner.payload
    }

    #[getter]
    fn columns(&self) -> Vec<String> {
        self.inner.columns.clone()
    }

    #[getter]
    fn shuffle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.inner.shuffle.into_pyobject(py)?)
    }

    /// Samples each rank's partition holds (before `offset`); needs the epoch
    /// length, so call it on a pinned request.
    fn samples_per_rank(&self) -> PyResult<u64> {
        let epoch_len = self
            .inner
            .epoch_len
            .ok_or_else(|| {
                Error::invalid("samples_per_rank() needs the epoch length: pin the request first")
            })
            .py()?;
        self.inner.partition().py()?.per_rank(epoch_len.get()).py()
    }

    fn __repr__(&self) -> String {
        let json = self.inner.to_json().unwrap_or_default();
        format!("StreamRequest({})", String::from_utf8_lossy(&json))
    }
}

/// `object` with `keys` set (a `None` value removes its key: its default
/// applies), checked by the engine's rules; with a rank it is a ticket.
fn with_keys(
    object: Map<String, Value>,
    keys: Option<&Bound<'_, PyDict>>,
) -> PyResult<StreamRequest> {
    let object = with_keywords(object, keys).map_err(Error::invalid).py()?;
    let what = if object.contains_key("rank") {
        "ticket"
    } else {
        "command"
    };
    Ok(StreamRequest {
        inner: request::StreamRequest::from_value(Value::Object(object), what).py()?,
    })
}

/// A `do_get` ticket for a population's metadata table.
#[pyclass(frozen, module = "dataset_rt._native", name = "MetadataRequest")]
pub struct MetadataRequest {
    #[pyo3(get)]
    dataset: String,
    population: Option<request::PopulationId>,
    /// The columns to send, in order (None: every column).
    #[pyo3(get)]
    columns: Option<Vec<String>>,
}

#[pymethods]
impl MetadataRequest {
    #[getter]
    fn population(&self) -> Option<&str> {
        self.population.as_ref().map(|p| p.as_str())
    }
}

/// Parse a `do_get` ticket into a `StreamRequest` or a `MetadataRequest`.
#[pyfunction]
pub fn parse_ticket(py: Python<'_>, raw: &[u8]) -> PyResult<Py<PyAny>> {
    Ok(match Ticket::parse(raw).py()? {
        Ticket::Stream(inner) => Py::new(py, StreamRequest { inner })?.into_any(),
        Ticket::Metadata(m) => Py::new(
            py,
            MetadataRequest {
                dataset: m.dataset,
                population: m.population,
                columns: m.columns,
            },
        )?
        .into_any(),
    })
}
