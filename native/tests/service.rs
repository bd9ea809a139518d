#![allow(clippy::unwrap_used)]
//! `DatasetService` over a shared population store: duplicate columns are
//! refused, activations take effect in the order they are acknowledged, and
//! populations that are not active can be removed.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use dataset_rt_native::ids::PopulationId;
use dataset_rt_native::service::DatasetService;
use dataset_rt_native::storage::{
    CacheWriter, ColumnSpec, Compression, EncodedRecord, MetaType, MetaValue, WriterOptions,
};
use dataset_rt_native::Error;

const RECORDS: u64 = 20;

fn write_cache(base: &Path) -> PathBuf {
    let columns = vec![ColumnSpec {
        name: "label".into(),
        dtype: MetaType::Int64,
    }];
    let options = WriterOptions::default();
    let mut writer = CacheWriter::create(base, "c", columns, options).unwrap();
    for i in 0..RECORDS {
        let record = EncodedRecord::encode(vec![i as u8; 8], Compression::default()).unwrap();
        writer
            .append(&record, &[MetaValue::Int(i as i64 % 3)])
            .unwrap();
    }
    writer.finish().unwrap().0
}

struct Fixture {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    state: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cache = write_cache(&dir.path().join("caches"));
        let state = dir.path().join("state");
        Fixture {
            _dir: dir,
            cache,
            state,
        }
    }

    /// A service over the shared store: opening another is a replica (or a restart).
    fn open(&self) -> DatasetService {
        DatasetService::open("d", std::slice::from_ref(&self.cache), &self.state, false).unwrap()
    }
}

/// The active table with every weight set to `weight` (a distinct population per value).
fn weighted(service: &DatasetService, weight: f64) -> RecordBatch {
    let active = service.active().unwrap();
    let table = service
        .population(&active.population)
        .unwrap()
        .table()
        .unwrap()
        .concat()
        .unwrap();
    with_column(&table, "weight", vec![weight; table.num_rows()])
}

fn with_column(table: &RecordBatch, name: &str, values: Vec<f64>) -> RecordBatch {
    let mut fields: Vec<Field> = table
        .schema()
        .fields()
        .iter()
        .filter(|f| f.name() != name)
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns: Vec<ArrayRef> = fields
        .iter()
        .map(|f| table.column_by_name(f.name()).unwrap().clone())
        .collect();
    fields.push(Field::new(name, DataType::Float64, true));
    columns.push(Arc::new(Float64Array::from(values)));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn appended(table: &RecordBatch, name: &str, values: Vec<f64>) -> RecordBatch {
    let mut fields: Vec<Field> = table
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns = table.columns().to_vec();
    fields.push(Field::new(name, DataType::Float64, true));
    columns.push(Arc::new(Float64Array::from(values)));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

#[test]
fn a_duplicate_column_is_refused_and_changes_nothing() {
    let fixture = Fixture::new();
    let service = fixture.open();
    let before = service.active().unwrap();
    let stored = service.populations().unwrap();
    let good = weighted(&service, 2.0);
    let rows = good.num_rows();
    let noted = appended(&good, "note", vec![1.0; rows]);
    for (base, name, value) in [
        (&good, "weight", -5.0),
        (&good, "label", 0.0),
        (&noted, "note", 2.0),
    ] {
        let twice = appended(base, name, vec![value; rows]);
        match service.put([Ok(twice)], true) {
            Err(Error::InvalidPopulation {
                column, message, ..
            }) => {
                assert_eq!(column.as_deref(), Some(name));
                assert!(
                    message.contains(&format!("column '{name}' appears 2 times")),
                    "{message}"
                );
                assert!(message.contains("must be unique"), "{message}");
            }
            other => panic!("a second '{name}' column was not refused: {other:?}"),
        }
    }
    assert_eq!(service.active().unwrap(), before);
    assert_eq!(service.populations().unwrap(), stored);
}

#[test]
fn the_last_acknowledged_activation_wins() {
    let fixture = Fixture::new();
    let service = Arc::new(fixture.open());
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (service, acknowledged) = (service.clone(), acknowledged.clone());
            let tables: Vec<RecordBatch> = (0..8)
                .map(|i| weighted(&service, f64::from(1 + t * 100 + i)))
                .collect();
            std::thread::spawn(move || {
                for table in tables {
                    let (id, _, lock) = service.put_holding_activation([Ok(table)], true).unwrap();
                    assert!(lock.is_some());
                    acknowledged.lock().unwrap().push(id);
                    // The lock goes here, after the acknowledgement was recorded.
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let last = acknowledged.lock().unwrap().last().cloned().unwrap();
    assert_eq!(fixture.open().active().unwrap().population, last);
}

#[test]
fn set_epoch_len_never_undoes_an_activation() {
    let fixture = Fixture::new();
    let service = Arc::new(fixture.open());
    let changer = {
        let service = service.clone();
        std::thread::spawn(move || {
            for n in 1..=40 {
                service.set_epoch_len(NonZeroU64::new(n).unwrap()).unwrap();
            }
        })
    };
    let mut last = PopulationId::of_hash(0);
    for i in 0..10 {
        last = service
            .put([Ok(weighted(&service, f64::from(i + 2)))], true)
            .unwrap()
            .0;
    }
    changer.join().unwrap();
    assert_eq!(fixture.open().active().unwrap().population, last);
}

#[test]
fn opening_never_replaces_an_active_population() {
    let fixture = Fixture::new();
    let first = fixture.open();
    let (id, _) = first.put([Ok(weighted(&first, 3.0))], true).unwrap();
    assert_eq!(fixture.open().active().unwrap().population, id);
}

#[test]
fn removed_populations_are_gone_on_every_replica() {
    let fixture = Fixture::new();
    let (one, two) = (fixture.open(), fixture.open());
    let original = one.active().unwrap().population;
    let (other, _) = one.put([Ok(weighted(&one, 4.0))], false).unwrap();
    two.population(&other).unwrap(); // now in the replica's memory too

    let err = one.remove_population(&original).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let message = err.to_string();
    assert!(message.contains("is the active population"), "{message}");
    assert!(
        message.contains("activate another population first"),
        "{message}"
    );
    assert!(matches!(
        one.remove_population(&PopulationId::of_hash(0)),
        Err(Error::NotFound(_))
    ));

    one.remove_population(&other).unwrap();
    for service in [&one, &two] {
        assert!(matches!(
            service.population(&other),
            Err(Error::NotFound(_))
        ));
        assert_eq!(service.populations().unwrap(), vec![original.clone()]);
    }
    assert!(matches!(
        two.remove_population(&other),
        Err(Error::NotFound(_))
    ));
    // Putting the same table again stores it again, under the same id.
    assert_eq!(one.put([Ok(weighted(&one, 4.0))], false).unwrap().0, other);
    two.population(&other).unwrap();
}
