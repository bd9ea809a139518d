#![allow(clippy::unwrap_used, clippy::manual_is_multiple_of)]
//! Populations as files, written as they stream: the id of a table streamed
//! in any batching is the id of the table stored whole (old ids stay valid),
//! refusals count the failing rows of the whole table, a store written before
//! rows files existed still opens, and a damaged file is refused, not a crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, DictionaryArray,
    FixedSizeBinaryArray, Float32Array, Float64Array, Int64Array, LargeStringArray, NullArray,
    RecordBatch, StringArray, StringViewArray, UInt64Array,
};
use dataset_rt_native::ids::PopulationId;
use dataset_rt_native::population::{write_population, Population, PopulationStore};
use dataset_rt_native::sampling::StreamOrder;
use dataset_rt_native::storage::{
    CacheSet, CacheWriter, ColumnSpec, Compression, EncodedRecord, MetaType, MetaValue,
};
use dataset_rt_native::Error;

const RECORDS: usize = 100;

fn caches(base: &Path) -> Arc<CacheSet> {
    let columns = vec![ColumnSpec {
        name: "label".into(),
        dtype: MetaType::Int64,
    }];
    let mut writer = CacheWriter::create(base, "c", columns, Default::default()).unwrap();
    for i in 0..RECORDS {
        let record = EncodedRecord::encode(vec![i as u8; 8], Compression::default()).unwrap();
        writer
            .append(&record, &[MetaValue::Int(i as i64 % 7)])
            .unwrap();
    }
    let path: PathBuf = writer.finish().unwrap().0;
    Arc::new(CacheSet::open(&[path], true).unwrap())
}

/// A table of every kind of column a user might send: identities and weight
/// in other types than the canonical ones, nulls, strings of every encoding,
/// and a nested column (gathered in memory rather than spilled).
fn table(caches: &CacheSet) -> RecordBatch {
    let n = 3 * RECORDS;
    let cache_id = caches.caches()[0].cache_id();
    let rows: Vec<usize> = (0..n).map(|i| (i * 37) % RECORDS).collect();
    let text = |i: usize| (i % 5 != 0).then(|| format!("row {i} {}", "x".repeat(i % 13)));
    let mut list = ListBuilder::new(Int32Builder::new());
    for i in 0..n {
        if i % 4 == 0 {
            list.append_null();
        } else {
            list.append_value((0..i % 3).map(|v| Some(v as i32)));
        }
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("cache_id", Arc::new(UInt64Array::from(vec![cache_id; n]))),
        (
            "sample_id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|&r| r as i64))),
        ),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&r| r as i64 % 7),
            )),
        ),
        (
            "weight",
            Arc::new(Float32Array::from_iter_values(
                (0..n).map(|i| 0.5 + (i % 9) as f32),
            )),
        ),
        ("note", Arc::new(StringArray::from_iter((0..n).map(text)))),
        (
            "large",
            Arc::new(LargeStringArray::from_iter((0..n).map(text))),
        ),
        (
            "view",
            Arc::new(StringViewArray::from_iter((0..n).map(text))),
        ),
        (
            "tag",
            Arc::new(
                (0..n)
                    .map(|i| ["a", "b", "c"][i % 3])
                    .collect::<DictionaryArray<Int32Type>>(),
            ),
        ),
        (
            "flag",
            Arc::new(BooleanArray::from_iter(
                (0..n).map(|i| (i % 3 != 0).then_some(i % 2 == 0)),
            )),
        ),
        (
            "bytes",
            Arc::new(BinaryArray::from_iter(
                (0..n).map(|i| (i % 6 != 0).then(|| vec![i as u8; i % 4])),
            )),
        ),
        (
            "fixed",
            Arc::new(FixedSizeBinaryArray::try_from_iter((0..n).map(|i| [i as u8, 1, 2])).unwrap()),
        ),
        (
            "day",
            Arc::new(Date32Array::from_iter(
                (0..n).map(|i| (i % 7 != 0).then_some(i as i32)),
            )),
        ),
        (
            "price",
            Arc::new(
                Decimal128Array::from_iter((0..n).map(|i| Some(i as i128 * 101)))
                    .with_precision_and_scale(20, 2)
                    .unwrap(),
            ),
        ),
        ("nothing", Arc::new(NullArray::new(n))),
        ("list", Arc::new(list.finish())),
    ];
    RecordBatch::try_from_iter(columns).unwrap()
}

/// `table` written as a population in batches of `sizes` and kept in `store`:
/// its id.
fn keep(
    store: &PopulationStore,
    caches: &Arc<CacheSet>,
    table: &RecordBatch,
    sizes: &[usize],
) -> PopulationId {
    let written =
        write_population(caches.clone(), &store.scratch_dir(), batches(table, sizes)).unwrap();
    store.keep(written).unwrap()
}

fn batches(table: &RecordBatch, sizes: &[usize]) -> Vec<dataset_rt_native::Result<RecordBatch>> {
    let mut out = Vec::new();
    let (mut start, mut k) = (0, 0);
    while start < table.num_rows() {
        let n = sizes[k % sizes.len()].min(table.num_rows() - start);
        out.push(Ok(table.slice(start, n)));
        start += n;
        k += 1;
    }
    out
}

#[test]
fn a_streamed_table_has_the_id_of_the_table_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let whole = store.put_table(&table).unwrap();
    for sizes in [&[300][..], &[1], &[7], &[64, 3, 1, 100], &[8, 16]] {
        let written =
            write_population(caches.clone(), &store.scratch_dir(), batches(&table, sizes)).unwrap();
        assert_eq!(written.id, whole, "batches of {sizes:?}");
        assert_eq!(written.rows, table.num_rows() as u64);
    }
}

#[test]
fn large_batches_written_on_two_threads_keep_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let one = table(&caches);
    let table =
        arrow_select::concat::concat_batches(&one.schema(), &vec![one.clone(); 40]).unwrap();
    let whole = store.put_table(&table).unwrap();
    let written = write_population(
        caches.clone(),
        &store.scratch_dir(),
        batches(&table, &[5000, 4096]),
    )
    .unwrap();
    assert_eq!(written.id, whole);
    let id = store.keep(written).unwrap();
    let streamed = store.open_population(&id, &caches).unwrap();
    let reference = Population::from_table(&caches, table).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let order = StreamOrder::Weighted { key: 5 };
    order.rows_at(streamed.alias(), 0..20_000, &mut a);
    order.rows_at(reference.alias(), 0..20_000, &mut b);
    assert_eq!(a, b);
}

#[test]
fn a_table_of_several_chunks_keeps_the_id_and_reads_back_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let one = table(&caches);
    // 150,000 rows: chunks of 65,536, 65,536 and 18,928, cut across batches.
    let table =
        arrow_select::concat::concat_batches(&one.schema(), &vec![one.clone(); 500]).unwrap();
    let old = PopulationStore::open(&dir.path().join("old")).unwrap();
    let whole = old.put_table(&table).unwrap();
    let written = write_population(
        caches.clone(),
        &store.scratch_dir(),
        batches(&table, &[70_001, 4_096, 13, 65_536]),
    )
    .unwrap();
    assert_eq!(written.id, whole);
    let id = store.keep(written).unwrap();
    store.verify(&id, &caches).unwrap();
    let streamed = store.open_population(&id, &caches).unwrap();
    let chunks = streamed.table().unwrap();
    assert_eq!(chunks.num_chunks(), 3);
    let canonical = dataset_rt_native::population::canonical(&table).unwrap();
    assert_eq!(chunks.concat().unwrap(), canonical);
    let rows: Vec<u32> = vec![0, 65_535, 65_536, 149_999, 131_072, 7, 131_071];
    for field in canonical.schema().fields() {
        let column = streamed.column(field.name()).unwrap().unwrap();
        let expected = arrow_select::take::take(
            canonical.column_by_name(field.name()).unwrap().as_ref(),
            &arrow_array::UInt32Array::from(rows.clone()),
            None,
        )
        .unwrap();
        let expected = match field.name().as_str() {
            // Streams carry the weight as Float64 and stored columns in the cache's type.
            "weight" => arrow_cast::cast(&expected, &arrow_schema::DataType::Float64).unwrap(),
            _ => expected,
        };
        assert_eq!(
            column.take(&rows).unwrap().as_ref(),
            expected.as_ref(),
            "{field}"
        );
    }
    let slices: Vec<RecordBatch> = chunks.checked_slices().map(|s| s.unwrap()).collect();
    assert_eq!(
        slices.iter().map(RecordBatch::num_rows).sum::<usize>(),
        150_000
    );
    assert!(slices.iter().all(|s| s.schema().metadata().is_empty()));
}

#[test]
fn a_streamed_population_reads_back_as_the_table_and_draws_alike() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let written =
        write_population(caches.clone(), &store.scratch_dir(), batches(&table, &[13])).unwrap();
    let id = store.keep(written).unwrap();
    let streamed = store.open_population(&id, &caches).unwrap();
    let whole = Population::from_table(&caches, table.clone()).unwrap();
    assert_eq!(
        streamed.table().unwrap().concat().unwrap(),
        whole.table().unwrap().concat().unwrap()
    );
    let order = StreamOrder::Weighted { key: 11 };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    order.rows_at(streamed.alias(), 0..5000, &mut a);
    order.rows_at(whole.alias(), 0..5000, &mut b);
    assert_eq!(a, b);
    for row in [0, 1, 150, 299] {
        assert_eq!(streamed.record(row), whole.record(row));
    }
    store.verify(&id, &caches).unwrap();
}

#[test]
fn refusals_count_the_failing_rows_of_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let mut columns = table.columns().to_vec();
    let bad: Vec<i64> = (0..table.num_rows() as i64)
        .map(|i| {
            if [5, 50, 290].contains(&i) {
                1000
            } else {
                (i * 37) % RECORDS as i64
            }
        })
        .collect();
    columns[1] = Arc::new(Int64Array::from(bad));
    let bad = RecordBatch::try_new(table.schema(), columns).unwrap();
    let whole = match Population::from_table(&caches, bad.clone()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(
        whole.contains("first offending row 5, 3 rows fail"),
        "{whole}"
    );
    for sizes in [&[1][..], &[10], &[64, 7]] {
        match write_population(caches.clone(), &store.scratch_dir(), batches(&bad, sizes)) {
            Err(e) => assert_eq!(e.to_string(), whole, "batches of {sizes:?}"),
            Ok(_) => panic!("accepted"),
        }
    }
    let left: Vec<_> = std::fs::read_dir(store.scratch_dir()).unwrap().collect();
    assert!(left.is_empty(), "a refused put leaves no file: {left:?}");
}

#[test]
fn a_store_without_rows_files_builds_them_once() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let id = store.put_table(&table).unwrap();
    let rows = store.scratch_dir().join(format!("{id}.rows"));
    assert!(!rows.exists());
    let opened = store.open_population(&id, &caches).unwrap();
    assert!(rows.exists());
    assert_eq!(opened.num_rows(), table.num_rows());
}

#[test]
fn damaged_population_files_are_refused_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let id = keep(&store, &caches, &table(&caches), &[50]);
    let table_path = store.scratch_dir().join(format!("{id}.arrow"));
    let rows_path = store.scratch_dir().join(format!("{id}.rows"));
    let refused = |what: &str| match store.open_population(&id, &caches) {
        Err(e @ Error::CorruptCache { .. }) => e.to_string(),
        Err(other) => panic!("{what}: {other}"),
        Ok(_) => panic!("{what}: opened"),
    };
    let rows_bytes = std::fs::read(&rows_path).unwrap();
    std::fs::write(&rows_path, &rows_bytes[..rows_bytes.len() - 8]).unwrap();
    assert!(refused("cut rows").contains("truncated"));
    std::fs::write(&rows_path, &rows_bytes).unwrap();
    let table_bytes = std::fs::read(&table_path).unwrap();
    for cut in [10, table_bytes.len() / 2, table_bytes.len() - 9] {
        std::fs::write(&table_path, &table_bytes[..cut]).unwrap();
        assert!(refused("cut table").contains(id.as_str()), "cut at {cut}");
    }
    // A byte flipped in the rows' values is found by verify.
    let mut flipped = rows_bytes.clone();
    flipped[100] ^= 0x40;
    std::fs::write(&rows_path, &flipped).unwrap();
    std::fs::write(&table_path, &table_bytes).unwrap();
    assert!(store.verify(&id, &caches).is_err());
}

/// Any byte of a stored table set to 0xFF: opening refuses it or opens it,
/// and then reading it (its slices as they leave the engine, its columns as
/// streams take them) gives values or an error, never a panic or a bad read.
#[test]
fn a_damaged_table_file_is_refused_or_read_with_errors_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let id = keep(&store, &caches, &table, &[100]);
    let path = store.scratch_dir().join(format!("{id}.arrow"));
    let rows = store.scratch_dir().join(format!("{id}.rows"));
    let original = std::fs::read(&path).unwrap();
    let names: Vec<String> = table
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let (mut opened, mut refused) = (0, 0);
    for at in (0..original.len()).step_by(23) {
        let mut damaged = original.clone();
        damaged[at] = 0xFF;
        let copy = dir.path().join("damaged.arrow");
        std::fs::write(&copy, &damaged).unwrap();
        match Population::open(&copy, &rows, &caches) {
            Err(_) => refused += 1,
            Ok(population) => {
                opened += 1;
                let _ = population
                    .unchecked_table()
                    .checked_slices()
                    .collect::<Vec<_>>();
                for name in &names {
                    if let Ok(Some(column)) = population.column(name) {
                        let _ = column.take(&[0, 5, 299]);
                    }
                }
            }
        }
    }
    assert!(
        opened > 0 && refused > 0,
        "opened {opened}, refused {refused}"
    );
}

/// A population's files hold its identities once, as the rows file's keys:
/// the table file leaves `cache_id` and `sample_id` out (naming them in its
/// schema's metadata), so identities, weight and sampler take 24 bytes a
/// row on disk; reading the table puts them back as supplied (types too).
#[test]
fn identities_weight_and_sampler_take_24_bytes_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let cache_id = caches.caches()[0].cache_id();
    let n = 300_000;
    let table = RecordBatch::try_from_iter(vec![
        (
            "sample_id",
            Arc::new(arrow_array::UInt32Array::from_iter_values(
                (0..n).map(|i| (i * 7 % RECORDS) as u32),
            )) as ArrayRef,
        ),
        ("cache_id", Arc::new(UInt64Array::from(vec![cache_id; n]))),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| (i * 7 % RECORDS) as i64 % 7),
            )),
        ),
        (
            "weight",
            Arc::new(arrow_array::Float64Array::from_iter_values(
                (0..n).map(|i| 1.0 + (i % 3) as f64),
            )),
        ),
    ])
    .unwrap();
    let whole = PopulationStore::open(&dir.path().join("old"))
        .unwrap()
        .put_table(&table)
        .unwrap();
    let id = keep(&store, &caches, &table, &[100_000]);
    assert_eq!(id, whole, "the id of the table stored whole");
    let table_path = store.scratch_dir().join(format!("{id}.arrow"));
    let rows_path = store.scratch_dir().join(format!("{id}.rows"));
    let bytes = std::fs::metadata(&table_path).unwrap().len()
        + std::fs::metadata(&rows_path).unwrap().len();
    // The stored column (`label`, Int64) is the user's 8 bytes a row.
    let per_row = bytes as f64 / n as f64 - 8.0;
    assert!(per_row <= 24.1, "{per_row:.2} bytes a row on disk");

    let file = std::fs::File::open(&table_path).unwrap();
    let reader = arrow_ipc::reader::StreamReader::try_new(file, None).unwrap();
    let stored = reader.schema();
    let names: Vec<&str> = stored.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["label", "weight"]);
    assert_eq!(
        stored.metadata().get("dataset_rt.ids").map(String::as_str),
        Some("sample_id:0:UInt32,cache_id:1:UInt64")
    );

    let canonical = dataset_rt_native::population::canonical(&table).unwrap();
    assert_eq!(store.load(&id, &caches).unwrap(), canonical);
    let population = store.open_population(&id, &caches).unwrap();
    let slices: Vec<RecordBatch> = population
        .unchecked_table()
        .checked_slices()
        .map(|s| s.unwrap())
        .collect();
    let back = arrow_select::concat::concat_batches(&slices[0].schema(), &slices).unwrap();
    assert_eq!(back, canonical);
    let rows = [0u32, 65_535, 65_536, 299_999, 7];
    let taken = population
        .column("sample_id")
        .unwrap()
        .unwrap()
        .take(&rows)
        .unwrap();
    let expected: Vec<u32> = rows
        .iter()
        .map(|&r| (r as usize * 7 % RECORDS) as u32)
        .collect();
    assert_eq!(
        taken
            .as_any()
            .downcast_ref::<arrow_array::UInt32Array>()
            .unwrap()
            .values()
            .to_vec(),
        expected
    );
    store.verify(&id, &caches).unwrap();
}

/// A rows file as version 2 wrote it (no page sums): `bytes` of a version 3
/// file with its sums cut off and its header rewritten.
fn as_version_2(bytes: &[u8]) -> Vec<u8> {
    let word = |i: usize| u64::from_le_bytes(bytes[16 + 8 * i..24 + 8 * i].try_into().unwrap());
    let (rows, alias) = (word(0), word(2));
    let end = (alias + rows * 8) as usize;
    let mut out = bytes[..end].to_vec();
    out[8..12].copy_from_slice(&2u32.to_le_bytes());
    out[40..48].copy_from_slice(&(end as u64).to_le_bytes());
    let sum = dataset_rt_native::hash::xxh3_64(&out[64..]);
    out[48..56].copy_from_slice(&sum.to_le_bytes());
    out
}

/// A key damaged in the rows file: the page it is in no longer matches its
/// sum, so reading it is the population's damage naming the rows file (a
/// `CorruptCache`, never a wrong value or a crash); in a file of version 2
/// (no sums) a key that names no cache is refused where identities are read.
#[test]
fn a_damaged_key_is_an_error_where_the_identities_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let id = keep(&store, &caches, &table(&caches), &[100]);
    let rows_path = store.scratch_dir().join(format!("{id}.rows"));
    let good = std::fs::read(&rows_path).unwrap();
    for (version, expected) in [
        (3, "do not match their checksum"),
        (2, "cache position past"),
    ] {
        let mut bytes = if version == 3 {
            good.clone()
        } else {
            as_version_2(&good)
        };
        // Row 3's key: its cache position (bits 40..) set to 5 of 1 cache.
        bytes[64 + 3 * 8 + 5] = 5;
        std::fs::write(&rows_path, &bytes).unwrap();
        let population = store.open_population(&id, &caches).unwrap();
        let read: Result<Vec<RecordBatch>, _> =
            population.unchecked_table().checked_slices().collect();
        let error = Error::from(read.unwrap_err());
        assert!(matches!(error, Error::CorruptCache { .. }), "{error:?}");
        let error = error.to_string();
        assert!(
            error.contains(&format!("{id}.rows")) && error.contains(expected),
            "version {version}: {error}"
        );
        let column = population.column("cache_id").unwrap().unwrap();
        assert!(column.take(&[3]).is_err());
        assert!(store.verify(&id, &caches).is_err());
    }
}

/// The finding behind page sums: a rows file written over in place while
/// its population is served. The draws that read a damaged page fail with
/// the population's damage (before the batch is handed out), never a
/// different epoch; draws that read no damaged page are exact; putting the
/// file back serves the same epoch again.
/// A table of `weights.len()` rows over the cache's records, in turn.
fn weighted_table(caches: &CacheSet, weights: Vec<f64>) -> RecordBatch {
    let n = weights.len();
    RecordBatch::try_from_iter([
        (
            "cache_id",
            Arc::new(UInt64Array::from(vec![caches.caches()[0].cache_id(); n])) as ArrayRef,
        ),
        (
            "sample_id",
            Arc::new(UInt64Array::from_iter_values(
                (0..n as u64).map(|i| i % RECORDS as u64),
            )),
        ),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(
                (0..n as i64).map(|i| i % RECORDS as i64 % 7),
            )),
        ),
        ("weight", Arc::new(Float64Array::from(weights))),
    ])
    .unwrap()
}

/// A population of equal weights draws without reading its alias table (its
/// rows file says so in its header, with a tag of its checksum), and draws
/// the rows the table gives. A damaged or foreign value in that field loses
/// the shortcut, never invents it.
#[test]
fn equal_weights_draw_the_rows_of_the_alias_table_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let order = StreamOrder::Weighted { key: 5 };
    let draws = |id: &PopulationId| {
        let population = store.open_population(id, &caches).unwrap();
        let mut rows = Vec::new();
        order.rows_at(population.alias(), 0..50_000, &mut rows);
        rows
    };
    let uniform_field = |path: &Path| {
        let bytes = std::fs::read(path).unwrap();
        u32::from_le_bytes(bytes[12..16].try_into().unwrap())
    };
    let set_uniform_field = |path: &Path, value: u32| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[12..16].copy_from_slice(&value.to_le_bytes());
        std::fs::write(path, bytes).unwrap();
    };

    let equal = store
        .put_table(&weighted_table(&caches, vec![2.5; 7_000]))
        .unwrap();
    let equal_path = store.scratch_dir().join(format!("{equal}.rows"));
    let shortcut = draws(&equal); // builds the rows file
    let tag = uniform_field(&equal_path);
    assert_ne!(tag, 0, "an equal-weight table is marked");
    let whole = Population::from_table(&caches, weighted_table(&caches, vec![2.5; 7_000])).unwrap();
    let mut in_memory = Vec::new();
    order.rows_at(whole.alias(), 0..50_000, &mut in_memory);
    assert_eq!(shortcut, in_memory);
    // As a build before the field wrote it (0), or damaged: the table is
    // read, and gives the same rows.
    for value in [0, tag ^ 0x100, u32::MAX] {
        set_uniform_field(&equal_path, value);
        assert_eq!(draws(&equal), shortcut, "field {value:#x}");
    }
    store.verify(&equal, &caches).unwrap();

    let weights: Vec<f64> = (0..7_000).map(|i| 1.0 + (i % 10) as f64).collect();
    let weighted = store.put_table(&weighted_table(&caches, weights)).unwrap();
    let weighted_path = store.scratch_dir().join(format!("{weighted}.rows"));
    let drawn = draws(&weighted);
    assert_eq!(
        uniform_field(&weighted_path),
        0,
        "unequal weights are not marked"
    );
    // Another file's tag, or any other value, is not this file's tag.
    for value in [tag, 1, u32::MAX] {
        set_uniform_field(&weighted_path, value);
        assert_eq!(draws(&weighted), drawn, "field {value:#x}");
    }
}

#[test]
fn a_rows_file_written_over_in_place_fails_the_draws_that_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let n = 20_000usize;
    let table = weighted_table(&caches, (0..n).map(|i| 1.0 + (i % 10) as f64).collect());
    let id = store.put_table(&table).unwrap();
    let rows_path = store.scratch_dir().join(format!("{id}.rows"));
    let population = store.open_population(&id, &caches).unwrap();
    assert!(
        population.pages_verified(),
        "a file this process wrote is trusted"
    );
    let order = StreamOrder::Weighted { key: 7 };
    let draw = |population: &Population| {
        let mut rows = Vec::new();
        order.rows_at(population.alias(), 0..n as u64, &mut rows);
        let records: Vec<(u32, u64)> = rows
            .iter()
            .map(|&r| population.record(r as usize))
            .collect();
        (records, population.damage())
    };
    let (epoch, damage) = draw(&population);
    assert!(damage.is_none());

    // 4 KiB written over in place in the alias table (another modification
    // time, same inode and length): the open population sees it on recheck.
    let good = std::fs::read(&rows_path).unwrap();
    let mut bytes = good.clone();
    let alias_at = 64 + (n * 8).div_ceil(64) * 64;
    for b in &mut bytes[alias_at + 8192..alias_at + 12288] {
        *b = b.wrapping_add(1);
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&rows_path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .unwrap();
    assert!(population.recheck(), "the write is seen");
    let (_, damage) = draw(&population);
    let damage = damage.expect("the damaged page is found").to_string();
    assert!(
        damage.contains(&format!("{id}.rows")) && damage.contains("checksum"),
        "{damage}"
    );
    // A population opened now finds it too, and verifying the store fails.
    let reopened = store.open_population(&id, &caches).unwrap();
    assert!(reopened.verify_pages().is_some());
    assert!(store.verify(&id, &caches).is_err());

    // Put back: the same epoch. Not written by this process any more: its
    // pages are verified in the background.
    std::fs::write(&rows_path, &good).unwrap();
    let restored = store.open_population(&id, &caches).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !restored.pages_verified() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(restored.pages_verified(), "verified in the background");
    let (again, damage) = draw(&restored);
    assert!(damage.is_none());
    assert_eq!(again, epoch);
}

/// Stores written before the identities were left out (tables with their
/// `cache_id` and `sample_id`, rows files of version 1) are read as they are;
/// a rows file of a version this build does not know is refused by it.
#[test]
fn a_store_of_the_last_format_still_reads_and_a_newer_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let caches = caches(&dir.path().join("caches"));
    let store = PopulationStore::open(&dir.path().join("state")).unwrap();
    let table = table(&caches);
    let id = store.put_table(&table).unwrap();
    store.open_population(&id, &caches).unwrap();
    let rows_path = store.scratch_dir().join(format!("{id}.rows"));
    let current = std::fs::read(&rows_path).unwrap();
    assert_eq!(&current[8..12], &3u32.to_le_bytes());
    std::fs::write(&rows_path, as_version_2(&current)).unwrap();
    store.verify(&id, &caches).unwrap();
    let mut bytes = as_version_2(&current);
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&rows_path, &bytes).unwrap();
    let population = store.open_population(&id, &caches).unwrap();
    assert_eq!(
        population.table().unwrap().concat().unwrap(),
        dataset_rt_native::population::canonical(&table).unwrap()
    );
    store.verify(&id, &caches).unwrap();
    bytes[8..12].copy_from_slice(&4u32.to_le_bytes());
    std::fs::write(&rows_path, &bytes).unwrap();
    let refused = store
        .open_population(&id, &caches)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("rows file version 4; this build reads versions 1 to 3"),
        "{refused}"
    );
}
