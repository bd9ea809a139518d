//! `Partition` for Python: one rank's share of an epoch (the partition rule of
//! docs/sampling.md), the one object both faces take instead of six keyword
//! arguments with their own defaults.

use std::num::NonZeroU64;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::{positive, unsigned};
use super::errors::IntoPyResult;
use crate::sampling;

/// Rank `rank` of `world_size`'s share of the epoch-relative range
/// `[start, stop)`, cut into blocks of `block` consecutive positions, from
/// the share's sample `offset` on. The defaults read the whole epoch.
#[pyclass(frozen, eq, module = "dataset_rt._native", name = "Partition")]
#[derive(PartialEq)]
pub struct Partition {
    pub(super) inner: sampling::Partition,
}

#[pymethods]
impl Partition {
    #[new]
    #[pyo3(signature = (*, rank=None, world_size=None, start=None, stop=None, block=None, offset=None))]
    fn new(
        rank: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        start: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
        block: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // A Python None arrives as None: the default.
        let or_zero = |name, value: Option<&Bound<'_, PyAny>>| {
            value
                .map(|v| unsigned(name, v))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        // The rule checks the world size with the rank (`sampling::Partition`).
        let world = world_size.map(|w| unsigned("world_size", w)).transpose()?;
        let block = block.map(|b| positive("block", b)).transpose()?;
        let stop = stop.map(|s| unsigned("stop", s)).transpose()?;
        let inner = sampling::Partition::new(
            or_zero("rank", rank)?,
            world.unwrap_or(1),
            or_zero("offset", offset)?,
        )
        .py()?
        .range(or_zero("start", start)?, stop)
        .blocks(block.unwrap_or(NonZeroU64::MIN));
        inner.check_range(None).py()?;
        Ok(Partition { inner })
    }

    #[getter]
    fn rank(&self) -> u64 {
        self.inner.rank()
    }
    #[getter]
    fn world_size(&self) -> u64 {
        self.inner.world_size()
    }
    #[getter]
    fn start(&self) -> u64 {
        self.inner.start()
    }
    #[getter]
    fn stop(&self) -> Option<u64> {
        self.inner.stop()
    }
    #[getter]
    fn block(&self) -> u64 {
        self.inner.block()
    }
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    /// The ticket keys of this partition (`stop` only when set).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let keys = PyDict::new(py);
        keys.set_item("rank", self.rank())?;
        keys.set_item("world_size", self.world_size())?;
        keys.set_item("start", self.start())?;
        if let Some(stop) = self.stop() {
            keys.set_item("stop", stop)?;
        }
        keys.set_item("block", self.block())?;
        keys.set_item("offset", self.offset())?;
        Ok(keys)
    }

    fn __repr__(&self) -> String {
        let stop = self.stop().map_or("None".to_string(), |s| s.to_string());
        format!(
            "Partition(rank={}, world_size={}, start={}, stop={stop}, block={}, offset={})",
            self.rank(),
            self.world_size(),
            self.start(),
            self.block(),
            self.offset()
        )
    }
}
