//! Batch assembly: planning which positions go in a batch (on the consumer's
//! thread, cheap) and building the Arrow record batch (on a worker thread).

use std::sync::Arc;

use arrow_array::{ArrayRef, LargeBinaryArray, RecordBatch, UInt64Array};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::buffers::BufferPool;
use crate::error::{Error, Result};
use crate::os::mapped;
use crate::population::{Population, PopulationColumn};
use crate::sampling::{StreamOrder, StreamWindow};
use crate::storage::{CacheSet, IndexEntry, LARGE_RECORD};

/// Columns every stream batch starts with, in this order (the population's
/// requested columns follow). `BASE_COLUMNS[c as usize]` names column `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseColumn {
    /// The draw's position in the stream.
    Position = 0,
    CacheId = 1,
    SampleId = 2,
    /// The record's bytes (large_binary).
    Payload = 3,
}

pub const BASE_COLUMNS: [&str; 4] = ["position", "cache_id", "sample_id", "payload"];

/// A drawn population row and the record it names, read by the planner: the
/// row's population entry and the record's index entry are random reads,
/// made once (with their lines asked for ahead), so that the batch builder on
/// another thread reads only the records' bytes.
#[derive(Debug, Clone, Copy)]
pub struct Draw {
    pub row: u32,
    /// The record's cache, by its position in the stream's `CacheSet`.
    cache: u32,
    sample_id: u64,
    /// The record's index entry; None when the stream reads no payloads (or
    /// the sample id is out of range, which the builder reports).
    entry: Option<IndexEntry>,
}

impl Draw {
    /// The record's payload length (0 without an entry: batch sizes then
    /// follow rows alone).
    #[inline]
    pub fn payload_len(&self) -> u64 {
        self.entry.map_or(0, |entry| entry.raw_len)
    }
}

/// How many records ahead `BatchContext::build` asks for a record's memory:
/// far enough that a random record's cache and TLB misses are over when it is
/// verified, near enough that the lines are still in cache.
const PREFETCH_DISTANCE: usize = 8;

impl BaseColumn {
    pub const ALL: [BaseColumn; 4] = [
        BaseColumn::Position,
        BaseColumn::CacheId,
        BaseColumn::SampleId,
        BaseColumn::Payload,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn field(self) -> Field {
        let dtype = match self {
            BaseColumn::Payload => DataType::LargeBinary,
            _ => DataType::UInt64,
        };
        Field::new(BASE_COLUMNS[self.index()], dtype, false)
    }
}

/// Everything a worker needs to build any batch of one stream.
pub struct BatchContext {
    pub caches: Arc<CacheSet>,
    pub population: Arc<Population>,
    pub order: StreamOrder,
    pub window: StreamWindow,
    /// Extra columns, taken from the population by row.
    pub columns: Vec<PopulationColumn>,
    pub schema: SchemaRef,
    /// Whether batches carry the records' bytes; without, no record is read.
    pub payload: bool,
    /// Payload buffers the consumer has dropped, for the next batches.
    buffers: Arc<BufferPool>,
    /// Large records are verified where they are stored and left out of the
    /// batch (a null payload): for the per-sample iterator, which copies each
    /// from its shard straight into its Python `bytes` (one copy, not two).
    large_in_place: bool,
    /// Large records are lent from their mapped shards, not copied
    /// (`Cache::lend`), each in a batch of its own.
    lend_large: bool,
}

impl BatchContext {
    pub fn new(
        caches: Arc<CacheSet>,
        population: Arc<Population>,
        order: StreamOrder,
        window: StreamWindow,
        column_names: &[String],
    ) -> Result<Self> {
        let mut fields: Vec<Field> = BaseColumn::ALL.iter().map(|c| c.field()).collect();
        let mut columns = Vec::with_capacity(column_names.len());
        for name in column_names {
            if BASE_COLUMNS.contains(&name.as_str())
                || columns
                    .iter()
                    .any(|c: &PopulationColumn| c.field.name() == name)
            {
                return Err(Error::invalid(format!(
                    "column '{name}' is requested twice or is always included ({})",
                    BASE_COLUMNS.join(", ")
                )));
            }
            let column = population.column(name)?.ok_or_else(|| {
                Error::invalid(format!(
                    "unknown column '{name}'; the population's columns are [{}]",
                    population.column_names().join(", ")
                ))
            })?;
            fields.push(column.field.clone());
            columns.push(column);
        }
        Ok(BatchContext {
            caches,
            population,
            order,
            window,
            columns,
            schema: Arc::new(Schema::new(fields)),
            payload: true,
            buffers: Arc::default(),
            large_in_place: false,
            lend_large: false,
        })
    }

    /// Leave the `payload` column out (`payload = false`): batches of ids and
    /// population columns, built from the population alone.
    pub fn with_payload(mut self, payload: bool) -> Self {
        if !payload && self.payload {
            let fields: Vec<Field> = self
                .schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != BaseColumn::Payload.index())
                .map(|(_, f)| f.as_ref().clone())
                .collect();
            self.schema = Arc::new(Schema::new(fields));
        }
        self.payload = payload;
        self
    }

    /// Leave large records out of the batches, verified where they are stored
    /// (a null payload; `Cache::stored_as_is` has their bytes). Only for a
    /// consumer in this process that knows this: the payload column becomes
    /// nullable.
    pub fn with_large_in_place(mut self) -> Self {
        if self.payload && !self.large_in_place {
            let fields: Vec<Field> = self
                .schema
                .fields()
                .iter()
                .map(|f| {
                    let field = f.as_ref().clone();
                    if f.name() == BASE_COLUMNS[BaseColumn::Payload.index()] {
                        field.with_nullable(true)
                    } else {
                        field
                    }
                })
                .collect();
            self.schema = Arc::new(Schema::new(fields));
            self.large_in_place = true;
        }
        self
    }

    /// Lend large records from their shards instead of copying them, each in
    /// a batch of its own (a batch's payload column is one buffer). For a
    /// consumer that passes the bytes on and lets go (the Flight server).
    pub fn with_lending(mut self, lend: bool) -> Self {
        self.lend_large = lend && self.payload && !self.large_in_place;
        self
    }

    /// Whether a record of `len` payload bytes goes in a batch of its own.
    pub fn alone(&self, len: u64) -> bool {
        self.lend_large && len >= LARGE_RECORD
    }

    /// The rows of window indices `first..first + n`, appended to `out` (one
    /// batched draw: about twice as fast per row as drawing one position at a time,
    /// and a permutation is built once per cycle, not once per position).
    pub fn rows_at(&self, first: u64, n: u64, out: &mut Vec<u32>) {
        // A rows file written over since it was opened has its pages
        // verified again before these draws read them (one `stat`).
        self.population.recheck();
        self.order.rows_at(
            self.population.alias(),
            self.window.positions(first, n),
            out,
        );
    }

    /// The draws of `rows`, appended to `out`: each row's record and (when the
    /// stream carries payloads) its index entry, for the planner to size
    /// batches by and the builder to read. Each row's population entry and
    /// index entry are random reads: they are asked for ahead, a step before
    /// each is needed.
    pub fn locate(&self, rows: &[u32], out: &mut Vec<Draw>) {
        let first = out.len();
        self.locate_rows(rows, out);
        // What these draws read, asked for now: records on object storage
        // are fetched while the batches before them are built (`planned`).
        self.caches.plan(
            out[first..]
                .iter()
                .filter_map(|d| d.entry.map(|entry| (d.cache, entry))),
        );
    }

    fn locate_rows(&self, rows: &[u32], out: &mut Vec<Draw>) {
        self.population.read_ahead(rows);
        let steps = if self.payload { 2 } else { 1 };
        // Step 2, a row's population entry; step 1, its index entry.
        for step in (1..=steps).rev() {
            for &row in rows.iter().take(step * PREFETCH_DISTANCE) {
                self.prefetch(step, row);
            }
        }
        for (i, &row) in rows.iter().enumerate() {
            for step in 1..=steps {
                if let Some(&ahead) = rows.get(i + step * PREFETCH_DISTANCE) {
                    self.prefetch(step, ahead);
                }
            }
            let (cache, sample_id) = self.population.record(row as usize);
            let entry = if self.payload {
                self.caches.get(cache).entry(sample_id)
            } else {
                None
            };
            out.push(Draw {
                row,
                cache,
                sample_id,
                entry,
            });
        }
    }

    /// A step of a row's prefetch, a step before `locate` reads it: 2 (with
    /// payloads) or 1 (without), its population entry; 1 with payloads, its
    /// index entry.
    fn prefetch(&self, step: usize, row: u32) {
        if step == 2 || !self.payload {
            self.population.prefetch(row as usize);
            return;
        }
        let (cache, sample_id) = self.population.record(row as usize);
        self.caches.get(cache).prefetch_entry(sample_id);
    }

    /// Build the batch of window indices `first..first + draws.len()`.
    /// `payload_bytes` is the sum of the draws' `payload_len` (the planner has
    /// it already).
    pub fn build(&self, first: u64, draws: &[Draw], payload_bytes: u64) -> Result<RecordBatch> {
        let built = self.build_rows(first, draws, payload_bytes);
        // A file cut short under its mapping reads as zeros (`os::mapped`),
        // whichever thread met the cut (the planner reads index entries too):
        // once any mapping of the process was cut, a batch is refused whole
        // when a file it reads from (a shard, an index, a metadata file, the
        // population's) is marked cut, with the error that names the file. A
        // few atomic loads, and none while nothing was ever cut.
        if mapped::any_cut() {
            if let Some(error) = self.truncation() {
                return Err(error);
            }
        }
        // A page of the population's rows file that these draws read and
        // that does not match its sum (`storage::pages`): the batch would be
        // another epoch's. Two atomic loads.
        if let Some(error) = self.population.damage() {
            return Err(error);
        }
        built
    }

    /// The error for a file this stream reads that was cut under its mapping.
    pub fn truncation(&self) -> Option<Error> {
        self.caches
            .truncation()
            .or_else(|| self.population.damage())
    }

    fn build_rows(&self, first: u64, draws: &[Draw], payload_bytes: u64) -> Result<RecordBatch> {
        if let [draw] = draws {
            if self.alone(payload_bytes) {
                if let Some(batch) = self.build_lent(first, draw)? {
                    return Ok(batch);
                }
            }
        }
        let n = draws.len();
        let mut offsets = Vec::with_capacity(if self.payload { n + 1 } else { 0 });
        offsets.push(0i64);
        let mut values = self.buffers.take(payload_bytes as usize);
        let mut nulls = self.large_in_place.then(|| NullBufferBuilder::new(n));
        if self.payload {
            let prefetch = |draw: &Draw| {
                if let Some(entry) = &draw.entry {
                    self.caches.get(draw.cache).prefetch(entry);
                }
            };
            draws.iter().take(PREFETCH_DISTANCE).for_each(prefetch);
            for (i, draw) in draws.iter().enumerate() {
                // A random record's bytes: asked for a few records before
                // they are read.
                if let Some(ahead) = draws.get(i + PREFETCH_DISTANCE) {
                    prefetch(ahead);
                }
                let cache = self.caches.get(draw.cache);
                let in_place = match nulls.as_mut() {
                    Some(nulls) => {
                        let in_place = cache.verify_in_place(draw.sample_id)?;
                        nulls.append(!in_place);
                        in_place
                    }
                    None => false,
                };
                if !in_place {
                    cache.read_entry_into(draw.sample_id, draw.entry, &mut values)?;
                }
                offsets.push(values.len() as i64);
            }
        }
        let payload = self.payload.then(|| {
            Arc::new(LargeBinaryArray::new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                self.buffers.share(values),
                nulls.and_then(|mut nulls| nulls.finish()),
            )) as ArrayRef
        });
        self.assemble(first, draws, payload)
    }

    /// The one-row batch of a record lent from its shard (None: it cannot be
    /// lent now, and is copied).
    fn build_lent(&self, first: u64, draw: &Draw) -> Result<Option<RecordBatch>> {
        let Some(lent) = self.caches.get(draw.cache).lend(draw.sample_id)? else {
            return Ok(None);
        };
        let len = lent.len() as i64;
        let payload = LargeBinaryArray::new(
            OffsetBuffer::new(ScalarBuffer::from(vec![0i64, len])),
            lent,
            None,
        );
        let batch = self.assemble(first, std::slice::from_ref(draw), Some(Arc::new(payload)))?;
        Ok(Some(batch))
    }

    /// The batch of window indices `first..first + draws.len()` from its
    /// draws' ids and (when the stream carries it) payload column.
    fn assemble(
        &self,
        first: u64,
        draws: &[Draw],
        payload: Option<ArrayRef>,
    ) -> Result<RecordBatch> {
        let positions = self.window.positions(first, draws.len() as u64);
        let cache_ids = draws
            .iter()
            .map(|draw| self.caches.get(draw.cache).cache_id());
        let sample_ids = draws.iter().map(|draw| draw.sample_id);
        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from_iter_values(positions)),
            Arc::new(UInt64Array::from_iter_values(cache_ids)),
            Arc::new(UInt64Array::from_iter_values(sample_ids)),
        ];
        arrays.extend(payload);
        if !self.columns.is_empty() {
            let rows: Vec<u32> = draws.iter().map(|draw| draw.row).collect();
            for column in &self.columns {
                arrays.push(column.take(&rows)?);
            }
        }
        Ok(RecordBatch::try_new(self.schema.clone(), arrays)?)
    }
}
