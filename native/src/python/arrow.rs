//! Arrow across the boundary through the C stream interface (PyCapsules):
//! zero-copy, streaming, and understood by pyarrow, Polars and any other
//! `__arrow_c_stream__` producer or consumer.

use std::ffi::CStr;

use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::errors::{to_pyerr, IntoPyResult};
use crate::error::Error;
use crate::population::Chunks;

const STREAM_CAPSULE: &CStr = c"arrow_array_stream";

/// Wrap a reader in an `arrow_array_stream` capsule.
pub fn export_stream<'py>(
    py: Python<'py>,
    reader: Box<dyn RecordBatchReader + Send>,
) -> PyResult<Bound<'py, PyCapsule>> {
    PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(reader), STREAM_CAPSULE)
}

/// A batch of an imported stream, or the population error that it could not
/// be read (the source failed: a LazyFrame's query, a file).
pub fn stream_batch(
    batch: std::result::Result<RecordBatch, arrow_schema::ArrowError>,
) -> crate::error::Result<RecordBatch> {
    batch.map_err(|e| Error::population(format!("cannot read the Arrow stream: {e}")))
}

/// The stream of any object exporting `__arrow_c_stream__`, read batch by
/// batch; `error` makes the error of the caller's kind from a message.
pub fn import_stream(
    obj: &Bound<'_, PyAny>,
    error: fn(String) -> Error,
) -> PyResult<RecordBatchStreamReader> {
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    if !obj.hasattr("__arrow_c_stream__")? {
        return Err(to_pyerr(error(format!(
            "expected a table that exports the Arrow C stream interface (a polars.DataFrame, \
             a pyarrow.Table or RecordBatchReader), got {type_name}"
        ))));
    }
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
        to_pyerr(error(format!(
            "{type_name}.__arrow_c_stream__() did not return a PyCapsule"
        )))
    })?;
    let pointer = capsule.pointer_checked(Some(STREAM_CAPSULE))?;
    // SAFETY: the capsule is named "arrow_array_stream", so by the Arrow PyCapsule
    // interface it holds an ArrowArrayStream; `from_raw` moves it out and marks the
    // capsule's copy released, so the producer's destructor will not free it twice.
    unsafe { RecordBatchStreamReader::from_raw(pointer.as_ptr().cast::<FFI_ArrowArrayStream>()) }
        .map_err(|e| to_pyerr(error(format!("cannot read the Arrow stream: {e}"))))
}

/// A table held by Rust, exported as a fresh C stream on every request.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct ArrowTable {
    table: Chunks,
}

impl ArrowTable {
    pub fn new(table: Chunks) -> Self {
        ArrowTable { table }
    }

    pub fn into_chunks(self) -> Chunks {
        self.table
    }
}

#[pymethods]
impl ArrowTable {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The table is exported in its own schema.
        let _ = requested_schema;
        // In slices of the (mapped) table, without a copy, each checked as it
        // goes: a consumer holds a slice at a time, a Flight stream sends
        // bounded messages, and nothing reads the whole table up front.
        let slices = self.table.clone().checked_slices();
        let reader = RecordBatchIterator::new(slices, self.table.schema());
        export_stream(py, Box::new(reader))
    }

    /// The columns `columns`, in that order, without a copy (a reader that
    /// needs a few columns checks and exports those only).
    fn select(&self, columns: Vec<String>) -> PyResult<ArrowTable> {
        Ok(ArrowTable::new(self.table.project(&columns).py()?))
    }

    #[getter]
    fn num_rows(&self) -> usize {
        self.table.num_rows()
    }

    fn __len__(&self) -> usize {
        self.table.num_rows()
    }
}
