//! Epoch streams: a window of positions read as Arrow record batches by the
//! runtime's worker threads.
//!
//! The consumer's thread plans batches (which rows, where the batch ends) and
//! submits them to the `WorkerPool`; workers read, verify and decode payloads and
//! build the batches; a reorder buffer hands them back in position order. At
//! most `prefetch_rows` rows (and at least one batch per worker) are in flight, so memory
//! depends on the prefetch settings, never on the epoch length, and a slow
//! consumer stops the workers (backpressure).
//!
//! A record lent from its shard (`StreamOptions::lend_large`) is the exception:
//! the consumer's thread verifies it as it hands the batch out. Its only work
//! is that read, and it leaves the record in this core's cache just before the
//! consumer (gRPC) copies it into a socket, instead of in a worker's a while
//! before; and no worker is woken for it (`benchmarks/README.md`).

mod batch;
mod buffers;
mod draws;
pub mod served;

use std::collections::VecDeque;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};

pub use crate::workers::WorkerPool;
pub use batch::{BaseColumn, BatchContext, Draw, BASE_COLUMNS};
pub use draws::draw_rows;

use crate::error::{Error, Result};
use crate::run::fence::Fence;
use crate::workers::ReorderBuffer;
use served::Tally;

#[derive(Debug, Clone, Copy)]
pub struct StreamOptions {
    /// Most rows in one batch.
    pub batch_rows: NonZeroUsize,
    /// A batch closes before it would pass this many payload bytes (a single
    /// larger record still gets a batch of its own).
    pub max_batch_bytes: NonZeroU64,
    /// Rows decoded ahead of the consumer.
    pub prefetch_rows: NonZeroUsize,
    /// Payload bytes in flight, whatever the row budget says (at least one
    /// batch is always in flight).
    pub max_in_flight_bytes: NonZeroU64,
    /// Send records of `storage::LARGE_RECORD` bytes or more from their
    /// mapped shards without a copy, each in a batch of its own (`Cache::lend`).
    pub lend_large: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            batch_rows: nonzero(1024),
            max_batch_bytes: nonzero64(4 << 20),
            prefetch_rows: nonzero(64),
            max_in_flight_bytes: nonzero64(64 << 20),
            lend_large: false,
        }
    }
}

/// A non-zero constant (`None` cannot happen for the literals used here).
const fn nonzero(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    }
}

const fn nonzero64(n: u64) -> NonZeroU64 {
    match NonZeroU64::new(n) {
        Some(n) => n,
        None => NonZeroU64::MIN,
    }
}

pub struct EpochStream {
    ctx: Arc<BatchContext>,
    pool: Arc<WorkerPool>,
    options: StreamOptions,
    /// Next window index to plan.
    planned: u64,
    /// The draws of window indices `planned..planned + drawn.len()` (rows,
    /// their records and index entries), drawn in bulk ahead of planning (one
    /// batched draw instead of one per position).
    drawn: VecDeque<Draw>,
    /// Each planned batch not yet handed out, in sequence order.
    in_flight: VecDeque<Planned>,
    in_flight_rows: usize,
    in_flight_bytes: u64,
    /// Batches built by the workers, handed back in position order.
    built: ReorderBuffer<Result<RecordBatch>>,
    cancelled: Arc<AtomicBool>,
    finished: bool,
    /// A served stream counts what it hands out (`served`).
    tally: Option<Tally>,
    /// A training run's stream ends before a batch once the run is resumed elsewhere.
    fence: Option<Fence>,
}

/// A planned batch: its rows and payload bytes, and who builds it.
struct Planned {
    rows: usize,
    bytes: u64,
    /// The window index and draw of a record to lend, built on the consumer's
    /// thread as it is handed out; None: a worker builds the batch.
    lent: Option<(u64, Draw)>,
}

impl EpochStream {
    pub fn new(ctx: BatchContext, pool: Arc<WorkerPool>, options: StreamOptions) -> Result<Self> {
        Ok(EpochStream {
            ctx: Arc::new(ctx.with_lending(options.lend_large)),
            pool,
            options,
            planned: 0,
            drawn: VecDeque::new(),
            in_flight: VecDeque::new(),
            in_flight_rows: 0,
            in_flight_bytes: 0,
            built: ReorderBuffer::new(),
            cancelled: Arc::new(AtomicBool::new(false)),
            finished: false,
            tally: None,
            fence: None,
        })
    }

    /// Check `fence` before handing out each batch.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Count each batch handed out with `tally` (which may drop a column
    /// that was added only to be counted).
    pub fn with_tally(mut self, tally: Tally) -> Self {
        self.tally = Some(tally);
        self
    }

    /// The schema of the batches as handed out.
    pub fn schema(&self) -> SchemaRef {
        match &self.tally {
            Some(tally) => tally.schema(),
            None => self.ctx.schema.clone(),
        }
    }

    /// Samples not yet handed to the consumer.
    pub fn remaining(&self) -> u64 {
        let emitted_rows: u64 = self.planned - self.in_flight_rows as u64;
        self.ctx.window.count - emitted_rows
    }

    /// The next batch in position order; blocks while workers build it.
    pub fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        if self.finished {
            return None;
        }
        if let Err(e) = self.fill() {
            self.finished = true;
            return Some(Err(e));
        }
        let Some(planned) = self.in_flight.pop_front() else {
            self.finished = true;
            return None;
        };
        self.in_flight_rows -= planned.rows;
        self.in_flight_bytes -= planned.bytes;
        let result = match planned.lent {
            Some((first, draw)) => self.ctx.build(first, &[draw], planned.bytes),
            // A job that panicked arrives as an internal error in its place.
            None => match self.built.next_blocking(None) {
                Some(result) => result.and_then(|built| built),
                None => Err(Error::internal("a planned batch was never submitted")),
            },
        };
        let fenced = self.fence.as_ref().map_or(Ok(()), Fence::check);
        let result = fenced.and(result);
        if result.is_err() {
            self.finished = true;
            self.cancelled.store(true, Ordering::Relaxed);
            return Some(result);
        }
        if let Err(e) = self.fill() {
            self.finished = true;
            return Some(Err(e));
        }
        match &self.tally {
            Some(tally) => Some(result.map(|batch| tally.count(batch))),
            None => Some(result),
        }
    }

    /// Plan and submit batches while the prefetch budget allows.
    fn fill(&mut self) -> Result<()> {
        let count = self.ctx.window.count;
        // Keep every worker busy even when one batch holds more rows than the
        // prefetch budget: memory stays bounded by max(prefetch, workers x batch).
        let min_batches = self.pool.size();
        while self.planned < count
            && (self.in_flight.is_empty()
                || ((self.in_flight_rows < self.options.prefetch_rows.get()
                    || self.in_flight.len() < min_batches)
                    && self.in_flight_bytes < self.options.max_in_flight_bytes.get()))
        {
            let first = self.planned;
            let mut draws: Vec<Draw> = Vec::new();
            let mut bytes = 0u64;
            while draws.len() < self.options.batch_rows.get() && self.planned < count {
                if self.drawn.is_empty() {
                    let n = (count - self.planned).min(self.options.batch_rows.get() as u64);
                    let mut fresh = Vec::with_capacity(n as usize);
                    self.ctx.rows_at(self.planned, n, &mut fresh);
                    let mut located = Vec::with_capacity(fresh.len());
                    self.ctx.locate(&fresh, &mut located);
                    self.drawn.extend(located);
                }
                let Some(&draw) = self.drawn.front() else {
                    break; // unreachable: `n` >= 1 rows were just drawn
                };
                let len = draw.payload_len();
                let alone = self.ctx.alone(len);
                if !draws.is_empty() && (alone || bytes + len > self.options.max_batch_bytes.get())
                {
                    break;
                }
                self.drawn.pop_front();
                draws.push(draw);
                bytes += len;
                self.planned += 1;
                if alone {
                    break;
                }
            }
            let rows = draws.len();
            self.in_flight_rows += rows;
            self.in_flight_bytes += bytes;
            let lent = match draws[..] {
                [draw] if self.ctx.alone(bytes) => Some((first, draw)),
                _ => None,
            };
            self.in_flight.push_back(Planned { rows, bytes, lent });
            if lent.is_some() {
                continue; // built as it is handed out
            }
            let ctx = self.ctx.clone();
            let ticket = self.built.ticket();
            let cancelled = self.cancelled.clone();
            // A panic in `build` drops the ticket, which reports the batch as lost.
            self.pool.submit(Box::new(move || {
                if cancelled.load(Ordering::Relaxed) {
                    return;
                }
                ticket.send(ctx.build(first, &draws, bytes));
            }))?;
        }
        Ok(())
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        // Queued jobs of an abandoned stream return without reading anything.
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

impl Iterator for EpochStream {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch()
            .map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

impl RecordBatchReader for EpochStream {
    fn schema(&self) -> SchemaRef {
        EpochStream::schema(self)
    }
}
