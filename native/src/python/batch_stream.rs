//! `BatchStream`: a one-shot stream of record batches, consumed through
//! `__arrow_c_stream__`, that a server can watch and cancel from another thread.
//!
//! The Flight server hands gRPC the pyarrow reader of this stream through a bare
//! generator (`flight_server.server`), so no Python runs per batch. What its
//! stream slot needs per batch is kept here instead, in atomics: rows and bytes
//! handed out, when the first batch was, and how long the consumer has held the
//! last one (the idle deadline). `cancel` ends the stream from any thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::arrow::export_stream;
use super::errors::{to_pyerr, Failure};
use crate::error::{Error, Result};
use crate::stream::served::{lock, sent_bytes};
use crate::stream::EpochStream;

type Source = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// `BatchStream` and the C stream it exports share this.
struct Shared {
    schema: SchemaRef,
    /// None once exhausted, failed or cancelled (dropping an epoch stream stops its workers).
    source: Mutex<Option<Source>>,
    /// The error that ended the stream, with its class.
    failure: Mutex<Option<Failure>>,
    cancelled: AtomicBool,
    began: Instant,
    /// Nanoseconds from `began` to when the last batch was handed out (to when
    /// the stream was made, before the first), or `PRODUCING`.
    handed: AtomicU64,
    /// Nanoseconds from `began` to the first batch, or `NONE`.
    first: AtomicU64,
    rows: AtomicU64,
    bytes: AtomicU64,
}

const PRODUCING: u64 = u64::MAX;
const NONE: u64 = u64::MAX;

impl Shared {
    fn now(&self) -> u64 {
        self.began
            .elapsed()
            .as_nanos()
            .min(u128::from(PRODUCING - 1)) as u64
    }

    fn next(&self) -> Option<std::result::Result<RecordBatch, ArrowError>> {
        let mut source = lock(&self.source);
        if self.cancelled.load(Ordering::Acquire) {
            *source = None;
            return Some(Err(ArrowError::ExternalError(Box::new(Error::internal(
                "the stream was cancelled",
            )))));
        }
        let item = source.as_mut()?;
        self.handed.store(PRODUCING, Ordering::Release);
        let item = item.next();
        match &item {
            Some(Ok(batch)) => {
                self.rows
                    .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                self.bytes.fetch_add(sent_bytes(batch), Ordering::Relaxed);
                let now = self.now();
                let _ = self
                    .first
                    .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Relaxed);
            }
            Some(Err(error)) => {
                lock(&self.failure).get_or_insert_with(|| Failure::of(error));
                *source = None;
            }
            None => *source = None,
        }
        self.handed.store(self.now(), Ordering::Release);
        item.map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

/// What pyarrow reads: the shared stream.
struct Reader(Arc<Shared>);

impl Iterator for Reader {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next()
    }
}

impl RecordBatchReader for Reader {
    fn schema(&self) -> SchemaRef {
        self.0.schema.clone()
    }
}

/// A one-shot stream of record batches, consumed through `__arrow_c_stream__`.
///
/// An error met while streaming leaves the C stream as text; the stream also
/// keeps it with its class, and `raise_failure` raises it as the engine's own
/// exception (`CorruptCacheError`, `InternalError`, ...).
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct BatchStream {
    shared: Arc<Shared>,
    exported: AtomicBool,
}

impl BatchStream {
    pub(super) fn new(mut stream: EpochStream) -> Self {
        let schema = stream.schema();
        Self::of(
            schema,
            Box::new(std::iter::from_fn(move || stream.next_batch())),
        )
    }

    /// A table in slices, each checked as it goes (`Population::table_slices`).
    pub(super) fn of_slices(
        schema: SchemaRef,
        slices: impl Iterator<Item = crate::error::Result<RecordBatch>> + Send + 'static,
    ) -> Self {
        Self::of(schema, Box::new(slices))
    }

    fn of(schema: SchemaRef, source: Source) -> Self {
        BatchStream {
            shared: Arc::new(Shared {
                schema,
                source: Mutex::new(Some(source)),
                failure: Mutex::new(None),
                cancelled: AtomicBool::new(false),
                began: Instant::now(),
                handed: AtomicU64::new(0),
                first: AtomicU64::new(NONE),
                rows: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
            exported: AtomicBool::new(false),
        }
    }
}

/// What a stream handed out so far, for the server's slot and its log line.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct StreamProgress {
    rows: u64,
    /// The Arrow data of the batches (`RecordBatch.nbytes`).
    bytes: u64,
    /// Seconds from the stream's making to its first batch (None before it).
    first_batch_seconds: Option<f64>,
    /// Seconds since the last batch was handed out (since the stream was made,
    /// before the first); None while the next one is being produced.
    idle_seconds: Option<f64>,
}

#[pymethods]
impl BatchStream {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema; // batches are produced in their own schema
        if self.exported.swap(true, Ordering::AcqRel) {
            return Err(to_pyerr(Error::invalid("this stream was already consumed")));
        }
        export_stream(py, Box::new(Reader(self.shared.clone())))
    }

    /// Raise the error that ended the stream, if one did (as its own class).
    fn raise_failure(&self, py: Python<'_>) -> PyResult<()> {
        match lock(&self.shared.failure).clone() {
            Some(failure) => Err(failure.to_pyerr(py)),
            None => Ok(()),
        }
    }

    /// End the stream: its next read fails, and when no batch is being
    /// produced right now its source (workers, prefetched batches) is freed at once.
    fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Release);
        if let Ok(mut source) = self.shared.source.try_lock() {
            *source = None;
        }
    }

    fn progress(&self) -> StreamProgress {
        let shared = &self.shared;
        let seconds = |nanos: u64| nanos as f64 / 1e9;
        let first = shared.first.load(Ordering::Acquire);
        let handed = shared.handed.load(Ordering::Acquire);
        StreamProgress {
            rows: shared.rows.load(Ordering::Relaxed),
            bytes: shared.bytes.load(Ordering::Relaxed),
            first_batch_seconds: (first != NONE).then(|| seconds(first)),
            idle_seconds: (handed != PRODUCING)
                .then(|| seconds(shared.now().saturating_sub(handed))),
        }
    }
}
