//! Criterion benchmarks of the engine's hot paths, through the crate's public API
//! only (issue 11). Run them with
//!
//! ```sh
//! cargo bench -p dataset_rt_native --bench hot_paths
//! cargo bench -p dataset_rt_native --bench hot_paths -- batch_build   # one group
//! ```
//!
//! Groups (see `benchmarks/README.md` for figures):
//!
//! - `draws`: the rows of 10^6 stream positions over a weighted population of
//!   10^6 rows, per shuffle mode, three ways (batched kernel, per position as
//!   the stream planner does, and `draw_rows` on the worker pool).
//! - `batch_build`: epochs drained through `EpochStream` and single
//!   `BatchContext::build` calls, over caches of 1 KiB and 1 MiB records,
//!   shuffled and ordered; every record is checksummed as it is read.
//! - `record_read`: `Cache::read_into` of random records (checksum verified).
//! - `population_validation`: validating a 10^6-row table against its cache.
//!
//! The caches are written once per run into a temporary directory, outside the
//! timed code, and only for the groups that are selected; they are removed when
//! the run ends. Defaults are short (1 s warm-up, 3 s measurement, 10 samples)
//! so that a run stays within a few minutes on 2 cores; the usual criterion
//! options (`--warm-up-time`, `--measurement-time`, `--sample-size`) override
//! them.

// A benchmark has no caller to report to: a setup failure aborts the run with
// its message.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::cell::OnceCell;
use std::hint::black_box;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use dataset_rt_native::population::{canonical, validate_table, Population};
use dataset_rt_native::sampling::{word_at, ShuffleMode, StreamOrder, StreamWindow};
use dataset_rt_native::storage::{CacheSet, WriterOptions};
use dataset_rt_native::stream::{
    draw_rows, BatchContext, Draw, EpochStream, StreamOptions, WorkerPool,
};
use tempfile::TempDir;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Records of the 1 KiB cache: 64 MiB of payloads, more than any CPU cache.
const KIB_RECORDS: u64 = 64 << 10;
/// Records of the 1 MiB cache: 256 MiB of payloads.
const MIB_RECORDS: u64 = 256;
/// Rows of the population of the `draws` and `population_validation` groups.
const ROWS: u64 = 1_000_000;
/// Worker threads of the pool (the machine the figures come from has 2 cores).
const WORKERS: usize = 2;

/// The modes a stream draws rows in, with the names the benchmark ids use
/// (`shuffle` is `shuffle=true`, weighted draws with replacement).
const MODES: [(&str, ShuffleMode); 3] = [
    ("shuffle", ShuffleMode::Weighted),
    ("permutation", ShuffleMode::Permutation),
    ("ordered", ShuffleMode::Ordered),
];

/// Caches and populations shared by the groups, built on first use.
struct Fixtures {
    dir: TempDir,
    pool: Arc<WorkerPool>,
    kib: OnceCell<Arc<CacheSet>>,
    mib: OnceCell<Arc<CacheSet>>,
    /// A cache of `ROWS` 16-byte records with stored `label` and `split` columns.
    rows: OnceCell<Arc<CacheSet>>,
    /// The table of `rows` with varied weights, as a client would put it.
    table: OnceCell<RecordBatch>,
    /// `table` as a population (validated, with its alias table).
    population: OnceCell<Arc<Population>>,
}

impl Fixtures {
    fn new() -> Self {
        Fixtures {
            dir: tempfile::tempdir().expect("a temporary directory for the caches"),
            pool: Arc::new(
                WorkerPool::new(NonZeroUsize::new(WORKERS).expect("WORKERS > 0"))
                    .expect("the worker pool"),
            ),
            kib: OnceCell::new(),
            mib: OnceCell::new(),
            rows: OnceCell::new(),
            table: OnceCell::new(),
            population: OnceCell::new(),
        }
    }

    fn payload_cache(&self, size: usize) -> &Arc<CacheSet> {
        let (cell, name, records) = match size {
            KIB => (&self.kib, "kib", KIB_RECORDS),
            _ => (&self.mib, "mib", MIB_RECORDS),
        };
        cell.get_or_init(|| {
            let dir = write_cache(self.dir.path(), name, records, size, false);
            Arc::new(CacheSet::open(&[dir], false).expect("open the cache"))
        })
    }

    fn rows(&self) -> &Arc<CacheSet> {
        self.rows.get_or_init(|| {
            let dir = write_cache(self.dir.path(), "rows", ROWS, 16, true);
            Arc::new(CacheSet::open(&[dir], false).expect("open the cache"))
        })
    }

    /// The full table of `rows` (cache_id, sample_id, label, split, weight) with
    /// weights 1..=100 instead of 1.0, in the canonical form the service stores.
    fn table(&self) -> &RecordBatch {
        self.table.get_or_init(|| {
            let full = Population::full(self.rows()).expect("the full population");
            let table = full
                .table()
                .and_then(|t| t.concat())
                .expect("the full table");
            let weight_at = table.schema().index_of("weight").expect("a weight column");
            let mut columns: Vec<ArrayRef> = table.columns().to_vec();
            columns[weight_at] = Arc::new(Float64Array::from_iter_values(
                (0..table.num_rows() as u64).map(|i| 1.0 + (word_at(1, i) % 100) as f64),
            ));
            let reweighted =
                RecordBatch::try_new(table.schema(), columns).expect("the reweighted table");
            canonical(&reweighted).expect("the canonical table")
        })
    }

    fn population(&self) -> &Arc<Population> {
        self.population.get_or_init(|| {
            Arc::new(
                Population::from_table(self.rows(), self.table().clone())
                    .expect("the weighted population"),
            )
        })
    }
}

#[path = "../tests/common/mod.rs"]
mod common;

/// Write `records` records of `size` bytes (pseudo-random, uncompressed) to
/// `base/name` (`common::write_cache`), `labelled` or not.
fn write_cache(
    base: &Path,
    name: &str,
    records: u64,
    size: usize,
    labelled: bool,
) -> std::path::PathBuf {
    common::write_cache(
        base,
        name,
        records,
        WriterOptions::default(),
        labelled,
        |i| {
            let mut payload = Vec::with_capacity(size);
            let mut k = i * size as u64;
            while payload.len() < size {
                payload.extend_from_slice(&word_at(7, k).to_le_bytes());
                k += 1;
            }
            payload.truncate(size);
            payload
        },
    )
}

fn size_name(size: usize) -> &'static str {
    if size == KIB {
        "1KiB"
    } else {
        "1MiB"
    }
}

/// `draws`: which population row each of 10^6 stream positions reads, over a
/// population of 10^6 rows with weights 1..=100, for each shuffle mode.
///
/// - `rows_at`: the batched kernel (`StreamOrder::rows_at`: prefetched alias
///   table lookups, one permutation per cycle), one thread.
/// - `row_at`: one position at a time (`StreamOrder::row_at`), which is how
///   `EpochStream` plans its batches on the consumer's thread.
/// - `draw_rows`: the public `draw_rows` (the kernel in 2^20-position jobs on
///   the 2-thread worker pool), what `_native.draw_rows` runs.
///
/// Why it matters: every sample of every stream starts with a draw; draws
/// without payloads are what a sampler-only client (`draw_rows`) pays for.
fn draws(c: &mut Criterion, fx: &Fixtures) {
    let mut group = c.benchmark_group("draws");
    group.throughput(Throughput::Elements(ROWS));
    let window = StreamWindow::epoch(3, NonZeroU64::new(ROWS).expect("ROWS > 0")).expect("window");
    for (name, mode) in MODES {
        let order = StreamOrder::new(mode, 0);
        let mut out: Vec<u32> = Vec::with_capacity(ROWS as usize);
        group.bench_function(BenchmarkId::new("rows_at", name), |b| {
            let alias = fx.population().alias();
            b.iter(|| {
                out.clear();
                order.rows_at(alias, window.positions(0, window.count), &mut out);
                black_box(&out);
            })
        });
        group.bench_function(BenchmarkId::new("row_at", name), |b| {
            let alias = fx.population().alias();
            b.iter(|| {
                let mut sum = 0usize;
                for p in window.positions(0, window.count) {
                    sum = sum.wrapping_add(order.row_at(alias, p));
                }
                black_box(sum)
            })
        });
        group.bench_function(BenchmarkId::new("draw_rows", name), |b| {
            let population = fx.population();
            b.iter(|| {
                black_box(
                    draw_rows(&fx.pool, population.clone(), order, window).expect("draw_rows"),
                )
            })
        });
    }
    group.finish();
}

/// The batches of one stream over a payload cache: its context and the rows of
/// its first batches, planned as `EpochStream` plans them.
struct Planned {
    ctx: BatchContext,
    /// (first window index, draws, payload bytes) per batch.
    batches: Vec<(u64, Vec<Draw>, u64)>,
    next: usize,
}

fn plan(fx: &Fixtures, size: usize, mode: ShuffleMode, batches: usize) -> Planned {
    let caches = fx.payload_cache(size).clone();
    let population = Arc::new(Population::full(&caches).expect("the full population"));
    let rows = NonZeroU64::new(population.num_rows() as u64).expect("a non-empty cache");
    let ctx = BatchContext::new(
        caches,
        population,
        StreamOrder::new(mode, 0),
        StreamWindow::epoch(0, rows).expect("window"),
        &[],
    )
    .expect("the batch context");
    let options = StreamOptions::default();
    let mut planned = Vec::with_capacity(batches);
    let mut i = 0u64;
    while planned.len() < batches && i < ctx.window.count {
        let (first, mut rows, mut bytes) = (i, Vec::new(), 0u64);
        while rows.len() < options.batch_rows.get() && i < ctx.window.count {
            let (mut drawn, mut draws) = (Vec::with_capacity(1), Vec::with_capacity(1));
            ctx.rows_at(i, 1, &mut drawn);
            ctx.locate(&drawn, &mut draws);
            let len = draws[0].payload_len();
            if !rows.is_empty() && bytes + len > options.max_batch_bytes.get() {
                break;
            }
            rows.push(draws[0]);
            bytes += len;
            i += 1;
        }
        planned.push((first, rows, bytes));
    }
    Planned {
        ctx,
        batches: planned,
        next: 0,
    }
}

/// `batch_build`: payloads read into Arrow record batches, every record's
/// checksum verified (the engine always verifies), at 1 KiB and 1 MiB records,
/// shuffled (`shuffle=true`, weighted draws) and ordered.
///
/// - `epoch`: a whole epoch (64 MiB of 1 KiB records, 256 MiB of 1 MiB records)
///   drained through `EpochStream` with 2 worker threads and the default
///   options (1024 rows or 4 MiB per batch): planning, the workers, the
///   reorder buffer and the hand-off together, what a stream costs end to end
///   before the Flight layer.
/// - `build`: one `BatchContext::build` call, the job a worker runs (one full
///   batch: 1 MiB of 1 KiB records or 4 MiB of 1 MiB records), one thread, on
///   the next of the epoch's first batches each time.
///
/// Why it matters: this is the server's main CPU cost per byte sent (record
/// verification, prefetching of random records, the copy into the batch).
fn batch_build(c: &mut Criterion, fx: &Fixtures) {
    let mut group = c.benchmark_group("batch_build");
    group.sampling_mode(SamplingMode::Flat);
    for size in [KIB, MIB] {
        let records = if size == KIB {
            KIB_RECORDS
        } else {
            MIB_RECORDS
        };
        for (name, mode) in [MODES[0], MODES[2]] {
            let id = format!("{}/{name}", size_name(size));
            group.throughput(Throughput::Bytes(records * size as u64));
            let mut epoch = 0u64;
            group.bench_function(BenchmarkId::new("epoch", &id), |b| {
                let caches = fx.payload_cache(size).clone();
                let population = Arc::new(Population::full(&caches).expect("the full population"));
                let rows = NonZeroU64::new(records).expect("records > 0");
                let order = StreamOrder::new(mode, 0);
                b.iter(|| {
                    let window = StreamWindow::epoch(epoch, rows).expect("window");
                    epoch += 1;
                    let ctx =
                        BatchContext::new(caches.clone(), population.clone(), order, window, &[])
                            .expect("the batch context");
                    let stream = EpochStream::new(ctx, fx.pool.clone(), StreamOptions::default())
                        .expect("the stream");
                    let mut rows = 0usize;
                    for batch in stream {
                        rows += batch.expect("a batch").num_rows();
                    }
                    assert_eq!(rows as u64, records);
                    black_box(rows)
                })
            });
            let batch_bytes = if size == KIB { MIB } else { 4 * MIB };
            group.throughput(Throughput::Bytes(batch_bytes as u64));
            let mut planned: Option<Planned> = None;
            group.bench_function(BenchmarkId::new("build", &id), |b| {
                let p = planned.get_or_insert_with(|| plan(fx, size, mode, 64));
                b.iter(|| {
                    let (first, rows, bytes) = &p.batches[p.next];
                    p.next = (p.next + 1) % p.batches.len();
                    black_box(p.ctx.build(*first, rows, *bytes).expect("a batch"))
                })
            });
        }
    }
    group.finish();
}

/// `record_read`: `Cache::read_into` of one record in random order into a
/// reused buffer, checksum (xxh3-64) verified, at 1 KiB (memory-mapped shard)
/// and 1 MiB (`pread`, records from 256 KiB up).
///
/// Why it matters: a record read is the unit of every batch; at 1 KiB a random
/// read's cache and TLB misses dominate (the batch builder prefetches against
/// them, this read does not), at 1 MiB the copy and the hash do.
fn record_read(c: &mut Criterion, fx: &Fixtures) {
    let mut group = c.benchmark_group("record_read");
    for size in [KIB, MIB] {
        let records = if size == KIB {
            KIB_RECORDS
        } else {
            MIB_RECORDS
        };
        group.throughput(Throughput::Bytes(size as u64));
        let ids: Vec<u64> = (0..1u64 << 16).map(|i| word_at(3, i) % records).collect();
        let mut next = 0usize;
        let mut out: Vec<u8> = Vec::with_capacity(size);
        group.bench_function(BenchmarkId::new("read_into", size_name(size)), |b| {
            let cache = fx.payload_cache(size).get(0);
            b.iter(|| {
                out.clear();
                cache.read_into(ids[next], &mut out).expect("a record");
                next = (next + 1) % ids.len();
                black_box(&out);
            })
        });
        if size == KIB {
            // The same reads by `pread` instead of the mapping (one system call
            // per record): what reading every record by `pread` would cost, the
            // option docs/architecture.md ("Files that change under a reader")
            // weighs against the guarded mapping. 1 KiB records are stored back
            // to back, uncompressed.
            let shard =
                std::fs::File::open(fx.payload_cache(size).get(0).dir().join("shard-00000.bin"))
                    .expect("the shard");
            group.bench_function(BenchmarkId::new("pread", size_name(size)), |b| {
                b.iter(|| {
                    out.clear();
                    out.resize(size, 0);
                    std::os::unix::fs::FileExt::read_exact_at(
                        &shard,
                        &mut out,
                        ids[next] * size as u64,
                    )
                    .expect("a record");
                    next = (next + 1) % ids.len();
                    black_box(dataset_rt_native::hash::xxh3_64(&out));
                })
            });
        }
    }
    group.finish();
}

/// `population_validation`: a table of 10^6 rows (cache_id, sample_id, the
/// stored `label` Int64 and `split` String columns, weight) checked against
/// its cache.
///
/// - `validate_table`: the all-or-nothing checks alone (identities resolved,
///   sample ids in range, stored columns equal to the cache's, weights valid).
/// - `from_table`: what `DatasetService::put` does in memory before storing
///   the table: `canonical`, then `Population::from_table` (the checks, the
///   alias table and the canonical columns).
///
/// Why it matters: every `put`/`do_put` of a reweighted table pays it, and so
/// does a replica loading a population for the first time.
fn population_validation(c: &mut Criterion, fx: &Fixtures) {
    let mut group = c.benchmark_group("population_validation");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(ROWS));
    group.bench_function("validate_table", |b| {
        let (caches, table) = (fx.rows(), fx.table());
        b.iter(|| black_box(validate_table(caches, table).expect("a valid table")))
    });
    group.bench_function("from_table", |b| {
        let (caches, table) = (fx.rows(), fx.table());
        b.iter(|| {
            let table = canonical(table).expect("the canonical table");
            black_box(Population::from_table(caches, table).expect("a valid table"))
        })
    });
    group.finish();
}

fn main() {
    let fixtures = Fixtures::new();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10)
        .configure_from_args();
    draws(&mut c, &fixtures);
    batch_build(&mut c, &fixtures);
    record_read(&mut c, &fixtures);
    population_validation(&mut c, &fixtures);
    c.final_summary();
    // `fixtures` drops here, removing the caches.
}
