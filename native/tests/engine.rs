#![allow(clippy::unwrap_used)]
//! End-to-end tests of the pure-Rust engine: write caches, open them, validate
//! populations and read windows of the stream.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use dataset_rt_native::population::Population;
use dataset_rt_native::sampling::{Partition, ShuffleMode, StreamOrder, StreamWindow};
use dataset_rt_native::storage::{Cache, CacheSet, Codec, Compression, WriterOptions};
use dataset_rt_native::stream::{BatchContext, EpochStream, StreamOptions, WorkerPool};
use dataset_rt_native::Error;
use proptest::prelude::*;

#[path = "common/mod.rs"]
mod common;

/// A labelled cache of `n` records (`common::write_cache`); record `i` is
/// `"{name}-{i}-"` repeated `1 + i % 5` times.
fn write_cache(base: &Path, name: &str, n: u64, codec: Codec, max_shard_bytes: u64) -> PathBuf {
    let options = WriterOptions {
        max_shard_bytes: NonZeroU64::new(max_shard_bytes).unwrap(),
        compression: Compression::new(codec, 3).unwrap(),
        ..WriterOptions::default()
    };
    common::write_cache(base, name, n, options, true, |i| {
        format!("{name}-{i}-")
            .repeat(1 + (i % 5) as usize)
            .into_bytes()
    })
}

fn caches(base: &Path) -> Arc<CacheSet> {
    let a = write_cache(base, "a", 40, Codec::Lz4, 256);
    let b = write_cache(base, "b", 25, Codec::Zstd, 1 << 20);
    Arc::new(CacheSet::open(&[a, b], true).unwrap())
}

fn read_ids(
    caches: &Arc<CacheSet>,
    population: &Arc<Population>,
    order: StreamOrder,
    window: StreamWindow,
    pool: &Arc<WorkerPool>,
    options: StreamOptions,
) -> Vec<(u64, u64, u64)> {
    let ctx = BatchContext::new(caches.clone(), population.clone(), order, window, &[]).unwrap();
    let stream = EpochStream::new(ctx, pool.clone(), options).unwrap();
    let mut out = Vec::new();
    for batch in stream {
        let batch = batch.unwrap();
        let col = |i: usize| batch.column(i).as_primitive::<UInt64Type>().clone();
        let (p, c, s) = (col(0), col(1), col(2));
        for r in 0..batch.num_rows() {
            out.push((p.value(r), c.value(r), s.value(r)));
        }
    }
    out
}

#[test]
fn payloads_round_trip_across_codecs_and_shards() {
    let dir = tempfile::tempdir().unwrap();
    let set = caches(dir.path());
    assert!(
        set.get(0).manifest().shards.len() > 1,
        "small shards rotate"
    );
    for cache in set.caches() {
        let name = &cache.manifest().source_name;
        for i in 0..cache.len() {
            let expected = format!("{name}-{i}-").repeat(1 + (i % 5) as usize);
            assert_eq!(cache.read(i).unwrap(), expected.as_bytes());
        }
        cache.verify().unwrap();
    }
}

#[test]
fn cache_ids_depend_on_name_and_content_only() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let a1 = write_cache(one.path(), "a", 10, Codec::None, 1 << 20);
    let a2 = write_cache(two.path(), "a", 10, Codec::Zstd, 64);
    let b = write_cache(one.path(), "b", 10, Codec::None, 1 << 20);
    let a11 = write_cache(two.path(), "a_more", 11, Codec::None, 1 << 20);
    let id = |p: &Path| Cache::open(p, false).unwrap().cache_id();
    assert_eq!(id(&a1), id(&a2), "same source, other place and codec");
    assert_ne!(id(&a1), id(&b));
    assert_ne!(id(&a1), id(&a11));
}

#[test]
fn flipped_shard_bytes_are_errors_never_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_cache(dir.path(), "a", 30, Codec::None, 1 << 20);
    let shard = path.join("shard-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[0] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    let cache = Cache::open(&path, false).unwrap();
    let err = cache.read(0).unwrap_err();
    assert!(matches!(err, Error::CorruptCache { .. }), "{err}");
    assert!(err.to_string().contains("shard-00000.bin"), "{err}");
    assert!(
        Cache::open(&path, true).is_err(),
        "full verification at open"
    );
}

#[test]
fn populations_reject_changed_stored_values() {
    let dir = tempfile::tempdir().unwrap();
    let set = caches(dir.path());
    let full = Population::full(&set).unwrap();
    let table = full.table().unwrap().concat().unwrap();
    let label_at = table.schema().index_of("label").unwrap();
    let mut labels: Vec<i64> = table
        .column(label_at)
        .as_primitive::<arrow_array::types::Int64Type>()
        .values()
        .to_vec();
    labels[3] += 1;
    labels[9] += 1;
    let mut columns: Vec<ArrayRef> = table.columns().to_vec();
    columns[label_at] = Arc::new(Int64Array::from(labels));
    let changed = RecordBatch::try_new(table.schema(), columns).unwrap();
    match Population::from_table(&set, changed) {
        Err(Error::InvalidPopulation {
            column,
            first_row,
            count,
            ..
        }) => {
            assert_eq!(column.as_deref(), Some("label"));
            assert_eq!(first_row, Some(3));
            assert_eq!(count, Some(2));
        }
        Err(other) => panic!("wrong error {other}"),
        Ok(_) => panic!("changed stored values were accepted"),
    }
}

#[test]
fn populations_accept_duplicates_reorders_and_extras() {
    let dir = tempfile::tempdir().unwrap();
    let set = caches(dir.path());
    let first = set.get(0);
    let rows = [5u64, 5, 1];
    let schema = Arc::new(Schema::new(vec![
        Field::new("sample_id", DataType::UInt64, false),
        Field::new("cache_id", DataType::UInt64, false),
        Field::new("note", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("label", DataType::Int64, false),
        Field::new("weight", DataType::Float64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(UInt64Array::from(rows.to_vec())),
            Arc::new(UInt64Array::from(vec![first.cache_id(); 3])),
            Arc::new(StringArray::from(vec!["x", "y", "z"])),
            Arc::new(StringArray::from(vec!["val", "val", "val"])),
            Arc::new(Int64Array::from(vec![2, 2, 1])),
            Arc::new(Float64Array::from(vec![1.0, 2.0, 0.5])),
        ],
    )
    .unwrap();
    let population = Population::from_table(&set, batch).unwrap();
    assert_eq!(population.num_rows(), 3);
    assert_eq!(population.record(1), (0, 5));
    assert!(population.column("note").unwrap().is_some());
}

/// Records of 1 KiB and 300 KiB alternating (stored as is or compressed).
fn write_mixed_cache(base: &Path, name: &str, codec: Codec) -> PathBuf {
    let options = WriterOptions {
        compression: Compression::new(codec, 1).unwrap(),
        ..WriterOptions::default()
    };
    common::write_cache(base, name, 6, options, false, |i| {
        let len = if i % 2 == 0 { 1 << 10 } else { 300 << 10 };
        (0..len).map(|j| (j % 251) as u8 ^ i as u8).collect()
    })
}

/// The payloads of one in-order epoch with large records left in place,
/// taken from the batch or, where it is null, from the shard.
fn read_in_place(path: &Path) -> dataset_rt_native::Result<Vec<(bool, Vec<u8>)>> {
    let set = Arc::new(CacheSet::open(&[path.to_path_buf()], false)?);
    let population = Arc::new(Population::full(&set)?);
    let order = StreamOrder::new(ShuffleMode::Ordered, 0);
    let window = StreamWindow::new(0, 6, 1)?;
    let ctx = BatchContext::new(set.clone(), population, order, window, &[])?.with_large_in_place();
    let pool = Arc::new(WorkerPool::new(NonZeroUsize::new(2).unwrap())?);
    let mut out = Vec::new();
    for batch in EpochStream::new(ctx, pool, StreamOptions::default())? {
        let batch = batch.map_err(|e| Error::internal(e.to_string()))?;
        let payloads = batch.column(3).as_binary::<i64>();
        let ids = batch.column(2).as_primitive::<UInt64Type>();
        for row in 0..batch.num_rows() {
            out.push(if payloads.is_null(row) {
                let stored = set.get(0).stored_as_is(ids.value(row)).unwrap();
                (true, stored.to_vec())
            } else {
                (false, payloads.value(row).to_vec())
            });
        }
    }
    Ok(out)
}

/// Each batch of a shuffled epoch over `path`: its rows as (position, sample
/// id, payload).
fn read_batches(path: &Path, options: StreamOptions) -> Vec<Vec<(u64, u64, Vec<u8>)>> {
    let set = Arc::new(CacheSet::open(&[path.to_path_buf()], false).unwrap());
    let population = Arc::new(Population::full(&set).unwrap());
    let order = StreamOrder::new(ShuffleMode::Weighted, 5);
    let window = StreamWindow::new(3, 40, 1).unwrap();
    let ctx = BatchContext::new(set, population, order, window, &[]).unwrap();
    let pool = Arc::new(WorkerPool::new(NonZeroUsize::new(2).unwrap()).unwrap());
    let stream = EpochStream::new(ctx, pool, options).unwrap();
    stream
        .map(|batch| {
            let batch = batch.unwrap();
            let positions = batch.column(0).as_primitive::<UInt64Type>();
            let ids = batch.column(2).as_primitive::<UInt64Type>();
            let payloads = batch.column(3).as_binary::<i64>();
            (0..batch.num_rows())
                .map(|r| (positions.value(r), ids.value(r), payloads.value(r).to_vec()))
                .collect()
        })
        .collect()
}

#[test]
fn a_lending_stream_hands_out_the_copying_streams_rows_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write_mixed_cache(dir.path(), "plain", Codec::None);
    let cache = Cache::open(&plain, true).unwrap();
    // Lent records are built on the consumer's thread as they are handed out,
    // the others by the workers: the order must not change, whatever the
    // budget of batches in flight.
    for prefetch_rows in [1, 4, 64] {
        let options = StreamOptions {
            batch_rows: NonZeroUsize::new(3).unwrap(),
            prefetch_rows: NonZeroUsize::new(prefetch_rows).unwrap(),
            ..StreamOptions::default()
        };
        let copied = read_batches(&plain, options);
        let lent = read_batches(
            &plain,
            StreamOptions {
                lend_large: true,
                ..options
            },
        );
        let rows = |batches: &[Vec<(u64, u64, Vec<u8>)>]| batches.concat();
        assert_eq!(rows(&lent), rows(&copied));
        assert_eq!(rows(&lent).len(), 40);
        for batch in &lent {
            let large = batch.iter().any(|(_, id, _)| id % 2 == 1);
            assert!(!large || batch.len() == 1, "a large record shares a batch");
            for (_, id, payload) in batch {
                assert_eq!(payload, &cache.read(*id).unwrap());
            }
        }
    }
}

#[test]
fn large_records_are_verified_in_place_for_the_per_sample_reader() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write_mixed_cache(dir.path(), "plain", Codec::None);
    let cache = Cache::open(&plain, true).unwrap();
    let read = read_in_place(&plain).unwrap();
    for (i, (in_place, payload)) in read.iter().enumerate() {
        assert_eq!(
            *in_place,
            i % 2 == 1,
            "only large records are left in place"
        );
        assert_eq!(payload, &cache.read(i as u64).unwrap());
    }
    // Compressed records are decoded into the batch, whatever their size.
    let packed = write_mixed_cache(dir.path(), "packed", Codec::Zstd);
    let read = read_in_place(&packed).unwrap();
    assert!(read.iter().all(|(in_place, _)| !in_place));
    // A damaged large record is an error, never bytes handed out.
    let shard = plain.join("shard-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let err = read_in_place(&plain).unwrap_err();
    assert!(err.to_string().contains("fails its checksum"), "{err}");
}

#[test]
fn ranks_cover_an_epoch_and_prefetch_never_changes_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let set = caches(dir.path());
    let population = Arc::new(Population::full(&set).unwrap());
    let order = StreamOrder::new(ShuffleMode::Weighted, 11);
    let epoch = StreamWindow::new(130, 65, 1).unwrap();
    let pool = Arc::new(WorkerPool::new(NonZeroUsize::new(3).unwrap()).unwrap());
    let full = read_ids(
        &set,
        &population,
        order,
        epoch,
        &pool,
        StreamOptions::default(),
    );
    let tiny = StreamOptions {
        batch_rows: NonZeroUsize::new(3).unwrap(),
        max_batch_bytes: NonZeroU64::new(16).unwrap(),
        prefetch_rows: NonZeroUsize::MIN,
        max_in_flight_bytes: NonZeroU64::MIN,
        lend_large: false,
    };
    assert_eq!(full, read_ids(&set, &population, order, epoch, &pool, tiny));
    let mut merged: Vec<(u64, u64, u64)> = (0..4)
        .flat_map(|rank| {
            let part = Partition::new(rank, 4, 0).unwrap().of(&epoch).unwrap();
            read_ids(&set, &population, order, part, &pool, tiny)
        })
        .collect();
    merged.sort();
    // 65 = 4 * 16 + 1: the last position is the remainder that no rank takes.
    assert_eq!(merged, full[..64].to_vec());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn windows_concatenate_to_the_stream(start in 0u64..1000, n in 0u64..60, m in 0u64..60, seed: u64, mode in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let set = caches(dir.path());
        let population = Arc::new(Population::full(&set).unwrap());
        let mode = [ShuffleMode::Ordered, ShuffleMode::Weighted, ShuffleMode::Permutation][mode];
        let order = StreamOrder::new(mode, seed);
        let pool = Arc::new(WorkerPool::new(NonZeroUsize::new(2).unwrap()).unwrap());
        let opts = StreamOptions { batch_rows: NonZeroUsize::new(7).unwrap(), ..StreamOptions::default() };
        let whole = read_ids(&set, &population, order, StreamWindow::new(start, n + m, 1).unwrap(), &pool, opts);
        let mut parts = read_ids(&set, &population, order, StreamWindow::new(start, n, 1).unwrap(), &pool, opts);
        parts.extend(read_ids(&set, &population, order, StreamWindow::new(start + n, m, 1).unwrap(), &pool, opts));
        prop_assert_eq!(whole, parts);
    }
}
