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
//! After any error the pipeline refuses further work; dropping it removes the
//! unfinished cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::codec::{Compression, EncodedRecord};
use super::manifest::Manifest;
use super::profile::{timed, Stage, WriteProfile};
use super::schema::{ColumnSpec, MetaValue};
use super::writer::{CacheWriter, WriterOptions};
use crate::error::{Error, Result};
use crate::workers::{ReorderBuffer, WorkerPool};

/// Records per chunk handed to one worker job.
const CHUNK_RECORDS: usize = 16;
/// A chunk also closes once its payloads reach this many bytes.
const CHUNK_BYTES: usize = 1 << 20;
/// How long `commit` waits for the next chunk before it gives up on the workers.
const WORKER_TIMEOUT: Duration = Duration::from_secs(600);

/// A payload and its metadata values, in the cache's column order.
type Record = (Vec<u8>, Vec<MetaValue>);
type Encoded = Vec<(EncodedRecord, Vec<MetaValue>)>;
/// How a worker encodes one payload (replaced by failing encoders in tests).
type Encoder = fn(Vec<u8>, Compression) -> Result<EncodedRecord>;

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
            encode: EncodedRecord::encode,
            chunk: Vec::new(),
            chunk_bytes: 0,
            in_flight_records: 0,
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

    /// Draw a progress bar on stderr (only when stderr is a terminal); `total`
    /// is the number of records expected, if known.
    pub fn with_progress(mut self, total: Option<u64>) -> Self {
        self.progress = progress_bar(&self.name, total);
        self
    }

    /// Add the next record. Hands a full chunk to the workers; never waits
    /// unless a commit is due (see the module docs).
    pub fn push(&mut self, payload: Vec<u8>, metadata: Vec<MetaValue>) -> Result<()> {
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
                .collect();
            ticket.send(encoded);
        }))
    }

    fn commit_ready(&mut self) -> Result<()> {
        self.commit_due = false;
        loop {
            let next = if self.in_flight_records > self.prefetch_records {
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
        let profile = self.profile.clone();
        for (record, values) in &encoded {
            let bytes = record.stored.len() as u64;
            timed(profile.as_deref(), Stage::DiskWrite, bytes, || {
                self.writer.append(record, values)
            })?;
        }
        self.progress.set_position(self.writer.records());
        let seconds = self.progress.elapsed().as_secs_f64().max(1e-3);
        let rate = self.writer.payload_bytes() as f64 / 1e6 / seconds;
        self.progress.set_message(format!("{rate:.1} MB/s"));
        Ok(())
    }
}

fn progress_bar(name: &str, total: Option<u64>) -> ProgressBar {
    // The stderr target draws only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = if total.is_some() {
        "{prefix} {bar:30} {pos}/{len} records · {per_sec} · {msg} · ETA {eta}"
    } else {
        "{prefix} {spinner} {pos} records · {per_sec} · {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(format!("writing {name}"));
    bar
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::storage::{Cache, Codec, MetaType};

    fn columns() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec {
                name: "label".into(),
                dtype: MetaType::Int64,
            },
            ColumnSpec {
                name: "split".into(),
                dtype: MetaType::String,
            },
        ]
    }

    /// Payloads of varied sizes (some empty, some compressible) and their metadata.
    fn records(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let payload = format!("record-{i};").repeat(i % 9).into_bytes();
                let split = if i % 3 == 0 { "val" } else { "train" };
                (
                    payload,
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
            WritePipeline::create(pool, base, "src", columns(), options(prefetch)).unwrap();
        pipeline.chunk_records = chunk;
        pipeline
    }

    /// Encodes after a pause that depends on the payload, so that chunks finish
    /// out of order.
    fn jittered(payload: Vec<u8>, compression: Compression) -> Result<EncodedRecord> {
        let pause = (payload.len() * 7919) % 400;
        std::thread::sleep(Duration::from_micros(pause as u64));
        EncodedRecord::encode(payload, compression)
    }

    fn slow(payload: Vec<u8>, compression: Compression) -> Result<EncodedRecord> {
        std::thread::sleep(Duration::from_millis(1));
        EncodedRecord::encode(payload, compression)
    }

    fn failing(payload: Vec<u8>, compression: Compression) -> Result<EncodedRecord> {
        if payload == b"bad" {
            return Err(Error::internal("zstd compression failed: test"));
        }
        EncodedRecord::encode(payload, compression)
    }

    fn panicking(payload: Vec<u8>, compression: Compression) -> Result<EncodedRecord> {
        if payload == b"bad" {
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
            let labels = metadata.column(1).as_primitive::<Int64Type>();
            let splits = metadata.column(2).as_string::<i32>();
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
        let mut writer = CacheWriter::create(&base, "src", columns(), options(4)).unwrap();
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
        let files = |dir: &Path| {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        assert_eq!(files(&parallel), files(&sequential));
        assert!(files(&parallel).len() > 4, "several shards");
        for file in files(&parallel) {
            let ours = std::fs::read(parallel.join(&file)).unwrap();
            let theirs = std::fs::read(sequential.join(&file)).unwrap();
            assert!(ours == theirs, "{file:?} differs");
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
        input[23].0 = b"bad".to_vec();
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
