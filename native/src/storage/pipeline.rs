//! `WritePipeline`: records in, a published cache out.
//!
//! The caller hands over records one at a time. The pipeline groups them into
//! chunks and gives each chunk to the `WorkerPool`, whose threads checksum and
//! compress it; encoded chunks come back in any order and are appended to the
//! `CacheWriter` in record order. At most `WriterOptions::prefetch_records`
//! records are in flight (handed to the workers and not yet committed).
//!
//! `push` does no I/O and never waits. When it has handed a chunk to the
//! workers, `commit_due` is true and `commit` (which appends to the shards and
//! may wait for the workers) should run next; the Python binding runs it with
//! the GIL released. A caller that just keeps pushing gets the same bound:
//! `push` commits first when a commit is due.
//!
//! `push_rows` is the columnar entry point: the records of one Arrow batch
//! (`ColumnarRows`), handed to the workers in chunks of up to
//! `ROW_CHUNK_RECORDS` records; each record's payload stays a slice of the
//! batch (the workers return its encoding, plus the compressed bytes when it
//! is compressed). It waits, and should run without the GIL, while more than
//! two chunks per worker are in flight. Both entry points append through the
//! same `CacheWriter::append_stored`, so a cache is the same whichever wrote it.
//!
//! After any error the pipeline refuses further work; dropping it removes the
//! unfinished cache.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use indicatif::ProgressBar;

use super::codec::{Compression, EncodedRecord, Encoding};
use super::columnar::ColumnarRows;
use super::gather::StoredBytes;
use super::manifest::Manifest;
use super::profile::{timed, Stage, WriteProfile};
use super::schema::{ColumnSpec, MetaValue};
use super::writer::{CacheWriter, WriterOptions};
use crate::error::{Error, Result};
use crate::progress::{self, Unit};
use crate::workers::{ReorderBuffer, WorkerPool};

/// Records per chunk handed to one worker job.
const CHUNK_RECORDS: usize = 16;
/// A chunk also closes once its payloads reach this many bytes.
const CHUNK_BYTES: usize = 1 << 20;
/// Records per chunk of an Arrow batch (`push_rows`): its records cost no
/// allocation, so a chunk can be large enough for the job to be cheap.
const ROW_CHUNK_RECORDS: usize = 4096;
/// `push_rows` waits while more than this many chunks per worker are in flight.
const ROW_CHUNKS_PER_WORKER: usize = 2;
/// How long `commit` waits for the next chunk before it gives up on the workers.
const WORKER_TIMEOUT: Duration = Duration::from_secs(600);

/// A payload and its metadata values, in the cache's column order.
type Record = (Bytes, Vec<MetaValue>);

/// A chunk back from the workers.
enum Encoded {
    Records(Vec<(EncodedRecord, Vec<MetaValue>)>),
    /// Records `start..` of `rows`: each one's encoding, and its stored bytes
    /// when they are not the payload itself (compressed).
    Rows {
        rows: Arc<ColumnarRows>,
        start: usize,
        encodings: Vec<(Encoding, Option<Bytes>)>,
    },
}

impl Encoded {
    fn len(&self) -> usize {
        match self {
            Encoded::Records(records) => records.len(),
            Encoded::Rows { encodings, .. } => encodings.len(),
        }
    }
}
/// How a worker encodes one payload (replaced by failing encoders in tests).
type Encoder = fn(Bytes, Compression) -> Result<EncodedRecord>;

pub struct WritePipeline {
    pool: Arc<WorkerPool>,
    writer: CacheWriter,
    name: String,
    compression: Compression,
    prefetch_records: usize,
    chunk_records: usize,
    chunk_bytes_limit: usize,
    encode: Encoder,
    /// Records not yet handed to the workers.
    chunk: Vec<Record>,
    chunk_bytes: usize,
    /// Records handed to the workers and not yet committed.
    in_flight_records: usize,
    /// Chunks handed to the workers and not yet committed.
    in_flight_chunks: usize,
    /// Set by `push_rows`: commits wait while more chunks than this are in
    /// flight (instead of more than `prefetch_records` records).
    row_chunks_limit: Option<usize>,
    /// A row's metadata values, reused from row to row.
    row_values: Vec<MetaValue>,
    encoded: ReorderBuffer<Result<Encoded>>,
    commit_due: bool,
    failed: bool,
    progress: ProgressBar,
    profile: Option<Arc<WriteProfile>>,
}

impl WritePipeline {
    /// Start writing `base/name` with `columns`; fails if the cache exists.
    pub fn create(
        pool: Arc<WorkerPool>,
        base: &Path,
        name: &str,
        columns: Vec<ColumnSpec>,
        options: WriterOptions,
    ) -> Result<Self> {
        let writer = CacheWriter::create(base, name, columns, options)?;
        Ok(WritePipeline {
            pool,
            writer,
            name: name.to_string(),
            compression: options.compression,
            prefetch_records: options.prefetch_records.get(),
            chunk_records: CHUNK_RECORDS,
            chunk_bytes_limit: CHUNK_BYTES,
            encode: |raw, compression| EncodedRecord::encode(raw, compression),
            chunk: Vec::new(),
            chunk_bytes: 0,
            in_flight_records: 0,
            in_flight_chunks: 0,
            row_chunks_limit: None,
            row_values: Vec::new(),
            encoded: ReorderBuffer::new(),
            commit_due: false,
            failed: false,
            progress: ProgressBar::hidden(),
            profile: None,
        })
    }

    /// Count the stages of this write (compression, disk writes, manifest,
    /// publication) in `profile`.
    pub fn with_profile(mut self, profile: Arc<WriteProfile>) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Draw a progress bar on stderr (only when stderr is a terminal:
    /// `crate::progress`); `total` is the number of records expected, if known.
    pub fn with_progress(mut self, total: Option<u64>) -> Self {
        let label = format!("writing {}", self.name);
        self.progress = progress::bar(true, label, total, Unit::Records);
        self
    }

    /// Add the next record. Hands a full chunk to the workers; never waits
    /// unless a commit is due (see the module docs).
    pub fn push(&mut self, payload: impl Into<Bytes>, metadata: Vec<MetaValue>) -> Result<()> {
        let payload = payload.into();
        self.guard(|pipeline| {
            if pipeline.commit_due {
                pipeline.commit_ready()?;
            }
            pipeline.chunk_bytes += payload.len();
            pipeline.chunk.push((payload, metadata));
            if pipeline.chunk.len() >= pipeline.chunk_records
                || pipeline.chunk_bytes >= pipeline.chunk_bytes_limit
            {
                pipeline.submit_chunk()?;
            }
            Ok(())
        })
    }

    /// Add the records of one Arrow batch, in order after those added before;
    /// commits as it goes, waiting for the workers while more than
    /// `ROW_CHUNKS_PER_WORKER` chunks per worker are in flight (run it without
    /// the GIL).
    pub fn push_rows(&mut self, rows: Arc<ColumnarRows>) -> Result<()> {
        self.guard(|pipeline| {
            pipeline.submit_chunk()?;
            pipeline.row_chunks_limit = Some(ROW_CHUNKS_PER_WORKER * pipeline.pool.size());
            let mut start = 0;
            while start < rows.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < rows.len() && end - start < ROW_CHUNK_RECORDS && bytes < CHUNK_BYTES {
                    bytes += rows.payload(end).len();
                    end += 1;
                }
                pipeline.submit_rows(rows.clone(), start..end)?;
                pipeline.commit_ready()?;
                start = end;
            }
            Ok(())
        })
    }

    /// Whether a chunk went to the workers since the last commit.
    pub fn commit_due(&self) -> bool {
        self.commit_due
    }

    /// Append the encoded chunks that are ready, in order; waits while more
    /// than `prefetch_records` records are in flight.
    pub fn commit(&mut self) -> Result<()> {
        self.guard(Self::commit_ready)
    }

    /// Records handed to the workers and not yet committed.
    pub fn in_flight_records(&self) -> usize {
        self.in_flight_records
    }

    /// Records appended to the cache so far.
    pub fn committed_records(&self) -> u64 {
        self.writer.records()
    }

    /// Encode and commit what is left, then publish the cache.
    pub fn finish(mut self) -> Result<(PathBuf, Manifest)> {
        self.guard(|pipeline| {
            pipeline.submit_chunk()?;
            pipeline.drain()
        })?;
        let published = self.writer.finish_profiled(self.profile.as_deref())?;
        self.progress.finish();
        Ok(published)
    }

    /// Run `step`; after an error, refuse everything (the cache would miss records).
    fn guard<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.failed {
            return Err(Error::invalid(format!(
                "the write of '{}' already failed; start it again",
                self.name
            )));
        }
        let result = step(self);
        self.failed = result.is_err();
        result
    }

    fn submit_chunk(&mut self) -> Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.chunk);
        self.chunk_bytes = 0;
        self.in_flight_records += chunk.len();
        self.in_flight_chunks += 1;
        self.commit_due = true;
        let ticket = self.encoded.ticket();
        let compression = self.compression;
        let encode = self.encode;
        let profile = self.profile.clone();
        self.pool.submit(Box::new(move || {
            let encoded = chunk
                .into_iter()
                .map(|(payload, values)| {
                    let bytes = payload.len() as u64;
                    timed(profile.as_deref(), Stage::Compression, bytes, || {
                        encode(payload, compression)
                    })
                    .map(|r| (r, values))
                })
                .collect::<Result<_>>()
                .map(Encoded::Records);
            ticket.send(encoded);
        }))
    }

    fn submit_rows(&mut self, rows: Arc<ColumnarRows>, range: Range<usize>) -> Result<()> {
        self.in_flight_records += range.len();
        self.in_flight_chunks += 1;
        let ticket = self.encoded.ticket();
        let compression = self.compression;
        let profile = self.profile.clone();
        self.pool.submit(Box::new(move || {
            let start = range.start;
            let encodings = range
                .map(|row| {
                    let raw = rows.payload(row);
                    timed(
                        profile.as_deref(),
                        Stage::Compression,
                        raw.len() as u64,
                        || Encoding::of(raw, compression),
                    )
                    .map(|(encoding, compressed)| (encoding, compressed.map(Bytes::from)))
                })
                .collect::<Result<Vec<_>>>();
            ticket.send(encodings.map(|encodings| Encoded::Rows {
                rows,
                start,
                encodings,
            }));
        }))
    }

    /// Whether a commit must wait for the workers before it may return.
    fn over_limit(&self) -> bool {
        match self.row_chunks_limit {
            Some(limit) => self.in_flight_chunks > limit,
            None => self.in_flight_records > self.prefetch_records,
        }
    }

    fn commit_ready(&mut self) -> Result<()> {
        self.commit_due = false;
        loop {
            let next = if self.over_limit() {
                self.encoded.next_blocking(Some(WORKER_TIMEOUT))
            } else {
                self.encoded.try_next()
            };
            match next {
                Some(encoded) => self.append(encoded??)?,
                None => return Ok(()),
            }
        }
    }

    fn drain(&mut self) -> Result<()> {
        self.commit_due = false;
        while let Some(encoded) = self.encoded.next_blocking(Some(WORKER_TIMEOUT)) {
            self.append(encoded??)?;
        }
        Ok(())
    }

    fn append(&mut self, encoded: Encoded) -> Result<()> {
        self.in_flight_records -= encoded.len();
        self.in_flight_chunks -= 1;
        let profile = self.profile.clone();
        match &encoded {
            Encoded::Records(records) => {
                for (record, values) in records {
                    let bytes = record.stored.len() as u64;
                    timed(profile.as_deref(), Stage::DiskWrite, bytes, || {
                        self.writer.append(record, values)
                    })?;
                }
            }
            Encoded::Rows {
                rows,
                start,
                encodings,
            } => {
                let (writer, values) = (&mut self.writer, &mut self.row_values);
                for (row, (encoding, compressed)) in (*start..).zip(encodings) {
                    let stored = match compressed {
                        Some(bytes) => StoredBytes::Shared(bytes.clone()),
                        None => ColumnarRows::stored_payload(rows, row),
                    };
                    rows.values_into(row, values);
                    timed(
                        profile.as_deref(),
                        Stage::DiskWrite,
                        stored.as_slice().len() as u64,
                        || writer.append_stored(stored, *encoding, values),
                    )?;
                }
            }
        }
        self.progress.set_position(self.writer.records());
        let seconds = self.progress.elapsed().as_secs_f64().max(1e-3);
        let mib = self.writer.payload_bytes() as f64 / f64::from(1 << 20);
        let rate = self.writer.payload_bytes() as f64 / 1e6 / seconds;
        self.progress
            .set_message(format!("{mib:.1} MiB · {rate:.1} MB/s"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use arrow_array::{Int64Array, StringArray};

    use super::*;
    use crate::storage::cache::fixture::label_split_columns;
    use crate::storage::{Cache, Codec};

    /// Payloads of varied sizes (some empty, some compressible) and their metadata.
    fn records(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let payload = format!("record-{i};").repeat(i % 9).into_bytes();
                let split = if i % 3 == 0 { "val" } else { "train" };
                (
                    payload.into(),
                    vec![MetaValue::Int(i as i64), MetaValue::Str(split.into())],
                )
            })
            .collect()
    }

    fn options(prefetch: usize) -> WriterOptions {
        WriterOptions {
            prefetch_records: NonZeroUsize::new(prefetch).unwrap(),
            max_shard_bytes: std::num::NonZeroU64::new(300).unwrap(),
            compression: Compression::new(Codec::Zstd, 3).unwrap(),
        }
    }

    fn start(base: &Path, workers: usize, prefetch: usize, chunk: usize) -> WritePipeline {
        let pool =
            Arc::new(WorkerPool::new(std::num::NonZeroUsize::new(workers).unwrap()).unwrap());
        let mut pipeline =
            WritePipeline::create(pool, base, "src", label_split_columns(), options(prefetch))
                .unwrap();
        pipeline.chunk_records = chunk;
        pipeline
    }

    /// Encodes after a pause that depends on the payload, so that chunks finish
    /// out of order.
    fn jittered(payload: Bytes, compression: Compression) -> Result<EncodedRecord> {
        let pause = (payload.len() * 7919) % 400;
        std::thread::sleep(Duration::from_micros(pause as u64));
        EncodedRecord::encode(payload, compression)
    }

    fn slow(payload: Bytes, compression: Compression) -> Result<EncodedRecord> {
        std::thread::sleep(Duration::from_millis(1));
        EncodedRecord::encode(payload, compression)
    }

    fn failing(payload: Bytes, compression: Compression) -> Result<EncodedRecord> {
        if payload[..] == b"bad"[..] {
            return Err(Error::internal("zstd compression failed: test"));
        }
        EncodedRecord::encode(payload, compression)
    }

    fn panicking(payload: Bytes, compression: Compression) -> Result<EncodedRecord> {
        if payload[..] == b"bad"[..] {
            panic!("an encoder bug");
        }
        EncodedRecord::encode(payload, compression)
    }

    /// Push everything, committing whenever a commit is due (as the binding does).
    fn write_all(pipeline: &mut WritePipeline, input: &[Record]) -> Result<()> {
        for (payload, values) in input.iter().cloned() {
            pipeline.push(payload, values)?;
            if pipeline.commit_due() {
                pipeline.commit()?;
            }
        }
        Ok(())
    }

    #[test]
    fn commits_records_in_order_with_several_workers_and_small_chunks() {
        let input = records(300);
        for chunk in [1, 2, 5] {
            let dir = tempfile::tempdir().unwrap();
            let mut pipeline = start(dir.path(), 4, 8, chunk);
            pipeline.encode = jittered;
            write_all(&mut pipeline, &input).unwrap();
            let (path, manifest) = pipeline.finish().unwrap();
            assert!(manifest.shards.len() > 1, "max_shard_bytes rotates shards");

            let cache = Cache::open(&path, true).unwrap();
            assert_eq!(cache.len(), input.len() as u64);
            for (i, (payload, _)) in input.iter().enumerate() {
                assert_eq!(&cache.read(i as u64).unwrap(), payload, "record {i}");
            }
            let metadata = cache.metadata();
            let labels = metadata.typed::<Int64Array>(1).unwrap();
            let splits = metadata.typed::<StringArray>(2).unwrap();
            for (i, (_, values)) in input.iter().enumerate() {
                assert_eq!(values[0], MetaValue::Int(labels.value(i)));
                assert_eq!(values[1], MetaValue::Str(splits.value(i).into()));
            }
            cache.verify().unwrap();
        }
    }

    #[test]
    fn writes_the_same_cache_as_a_sequential_writer() {
        let input = records(100);
        let dir = tempfile::tempdir().unwrap();
        let mut pipeline = start(&dir.path().join("parallel"), 3, 4, 3);
        pipeline.encode = jittered;
        write_all(&mut pipeline, &input).unwrap();
        let (parallel, _) = pipeline.finish().unwrap();

        let base = dir.path().join("sequential");
        let mut writer =
            CacheWriter::create(&base, "src", label_split_columns(), options(4)).unwrap();
        for (payload, values) in input {
            let compression = options(4).compression;
            writer
                .append(
                    &EncodedRecord::encode(payload, compression).unwrap(),
                    &values,
                )
                .unwrap();
        }
        let (sequential, _) = writer.finish().unwrap();
        let names = |dir: &Path| {
            files(dir)
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&parallel), names(&sequential));
        assert!(names(&parallel).len() > 4, "several shards");
        for ((file, ours), (_, theirs)) in files(&parallel).into_iter().zip(files(&sequential)) {
            assert!(ours == theirs, "{file:?} differs");
        }
    }

    fn files(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| (n.clone(), std::fs::read(dir.join(n)).unwrap()))
            .collect()
    }

    #[test]
    fn rows_of_arrow_batches_write_the_same_cache_as_records() {
        use arrow_array::{ArrayRef, BinaryArray, RecordBatch};

        let input = records(300);
        for codec in [Codec::None, Codec::Zstd] {
            let mut options = options(4);
            options.compression = Compression::new(codec, 3).unwrap();
            let pool = Arc::new(WorkerPool::new(NonZeroUsize::new(3).unwrap()).unwrap());
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path().join("records");
            let mut pipeline =
                WritePipeline::create(pool.clone(), &base, "src", label_split_columns(), options)
                    .unwrap();
            write_all(&mut pipeline, &input).unwrap();
            let (by_records, _) = pipeline.finish().unwrap();

            let base = dir.path().join("rows");
            let mut pipeline =
                WritePipeline::create(pool, &base, "src", label_split_columns(), options).unwrap();
            // Batches of uneven sizes, one of them empty.
            let mut at = 0;
            for size in [1, 0, 150, 149] {
                let part = &input[at..at + size];
                let payloads: ArrayRef = Arc::new(BinaryArray::from_iter_values(
                    part.iter().map(|(p, _)| &p[..]),
                ));
                let labels: ArrayRef = Arc::new(Int64Array::from_iter_values(part.iter().map(
                    |(_, v)| match v[0] {
                        MetaValue::Int(i) => i,
                        _ => unreachable!(),
                    },
                )));
                let splits: ArrayRef = Arc::new(StringArray::from_iter_values(part.iter().map(
                    |(_, v)| match &v[1] {
                        MetaValue::Str(s) => s.clone(),
                        _ => unreachable!(),
                    },
                )));
                let batch = RecordBatch::try_from_iter([
                    ("label", labels),
                    ("payload_bytes", payloads),
                    ("split", splits),
                ])
                .unwrap();
                let schema =
                    crate::storage::ColumnarSchema::new(&batch.schema(), "payload_bytes").unwrap();
                assert_eq!(schema.columns(), label_split_columns().as_slice());
                let rows = schema.rows(&batch, at as u64).unwrap();
                pipeline.push_rows(Arc::new(rows)).unwrap();
                at += size;
            }
            let (by_rows, _) = pipeline.finish().unwrap();
            let (ours, theirs) = (files(&by_rows), files(&by_records));
            assert!(ours.len() > 4, "several shards");
            assert!(ours == theirs, "{codec:?}: the caches differ");
        }
    }

    #[test]
    fn in_flight_records_stay_within_prefetch() {
        let input = records(80);
        let (prefetch, chunk) = (5, 2);
        // Committing whenever a commit is due, as the binding does.
        let dir = tempfile::tempdir().unwrap();
        let mut pipeline = start(dir.path(), 2, prefetch, chunk);
        pipeline.encode = slow;
        let mut most = 0;
        for (pushed, (payload, values)) in (1..).zip(input.iter().cloned()) {
            pipeline.push(payload, values).unwrap();
            if pipeline.commit_due() {
                pipeline.commit().unwrap();
            }
            let in_flight = pushed - pipeline.committed_records() as usize - pipeline.chunk.len();
            assert_eq!(in_flight, pipeline.in_flight_records());
            assert!(in_flight <= prefetch, "{in_flight} records in flight");
            most = most.max(in_flight);
        }
        assert!(
            most > chunk,
            "chunks were encoded one at a time (most {most})"
        );
        pipeline.finish().unwrap();

        // Only pushing: `push` commits first, so at most one more chunk is out.
        let dir = tempfile::tempdir().unwrap();
        let mut pipeline = start(dir.path(), 2, prefetch, chunk);
        pipeline.encode = slow;
        for (payload, values) in input.iter().cloned() {
            pipeline.push(payload, values).unwrap();
            assert!(pipeline.in_flight_records() <= prefetch + chunk);
        }
        let (path, _) = pipeline.finish().unwrap();
        assert_eq!(Cache::open(&path, true).unwrap().len(), input.len() as u64);
    }

    fn assert_fails_without_a_cache(encoder: Encoder, expected: &str) {
        let mut input = records(60);
        input[23].0 = Bytes::from_static(b"bad");
        let dir = tempfile::tempdir().unwrap();
        let mut pipeline = start(dir.path(), 3, 4, 2);
        pipeline.encode = encoder;
        let err = match write_all(&mut pipeline, &input) {
            Err(err) => {
                let again = pipeline.push(b"more".to_vec(), input[0].1.clone());
                let again = again.unwrap_err();
                assert!(matches!(again, Error::InvalidArgument(_)), "{again:?}");
                assert!(again.to_string().contains("already failed"), "{again}");
                assert!(pipeline.finish().is_err());
                err
            }
            Ok(()) => pipeline.finish().unwrap_err(),
        };
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
        assert_eq!(err.to_string(), expected);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn a_failing_encode_is_an_error_and_leaves_no_cache() {
        assert_fails_without_a_cache(failing, "internal error: zstd compression failed: test");
    }

    #[test]
    fn a_panicking_encode_is_an_error_and_leaves_no_cache() {
        assert_fails_without_a_cache(panicking, "internal error: a worker thread panicked");
    }
}
