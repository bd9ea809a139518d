//! What a service's streams served, per population: streams, rows, bytes and,
//! with a grouping column, rows per value of that column (the Flight server's
//! `stats` action and `/metrics`).
//!
//! Counted on the consumer's thread as each batch is handed out, so the counts
//! move while a stream runs and a stream dropped midway counts what it handed
//! out. One byte measure everywhere: the Arrow data of the batch as handed out
//! (`sent_bytes`), which is what `pyarrow.RecordBatch.nbytes` reports on either
//! side of the wire. Memory is bounded: at most `max_groups` values per
//! population get a key (the rest count under `OVERFLOW`), and the
//! `MAX_POPULATIONS` most recently streamed populations are kept.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Schema, SchemaRef};

use crate::error::{Error, Result};

/// The key of the rows whose value got none (past `max_groups`).
pub const OVERFLOW: &str = "(other)";
/// The key of null values.
pub const NULL: &str = "(null)";
/// Populations kept per service, most recently streamed first.
pub const MAX_POPULATIONS: usize = 64;
/// Values counted per population unless the server says otherwise.
pub const DEFAULT_MAX_GROUPS: usize = 64;

/// The counts of one population.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub streams: u64,
    pub rows: u64,
    pub bytes: u64,
    /// Rows per value of the grouping column (its string form).
    pub groups: HashMap<String, u64>,
    /// Rows of the values that got no key.
    pub overflow: u64,
    /// The population has no grouping column, or one that cannot be grouped.
    pub group_column_missing: bool,
}

/// The column whose values are counted, and how many values get a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouping {
    pub column: Option<String>,
    pub max_groups: usize,
}

impl Default for Grouping {
    fn default() -> Self {
        Grouping {
            column: None,
            max_groups: DEFAULT_MAX_GROUPS,
        }
    }
}

impl Grouping {
    pub fn new(column: Option<String>, max_groups: usize) -> Result<Self> {
        if max_groups < 1 {
            return Err(Error::invalid(format!(
                "max_groups must be >= 1, got {max_groups}"
            )));
        }
        if let Some(name) = &column {
            if name.is_empty() || name == "payload" {
                return Err(Error::invalid(format!(
                    "the grouping column cannot be {name:?}; name a population column"
                )));
            }
        }
        Ok(Grouping { column, max_groups })
    }
}

type Entry = (String, Arc<Mutex<Served>>);

/// A service's counts: totals, and per population (least recently streamed first).
#[derive(Debug, Default)]
pub struct ServedLedger {
    grouping: RwLock<Grouping>,
    populations: Mutex<VecDeque<Entry>>,
    rows: AtomicU64,
    bytes: AtomicU64,
}

impl ServedLedger {
    pub fn grouping(&self) -> Grouping {
        self.grouping.read().map(|g| g.clone()).unwrap_or_default()
    }

    /// Count by `grouping` from the next stream on.
    pub fn set_grouping(&self, grouping: Grouping) {
        if let Ok(mut held) = self.grouping.write() {
            *held = grouping;
        }
    }

    /// Rows and bytes handed out by every stream.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.rows.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Every population's counts, most recently streamed first.
    pub fn served(&self) -> Vec<(String, Served)> {
        let populations = lock(&self.populations);
        populations
            .iter()
            .rev()
            .map(|(id, served)| (id.clone(), lock(served).clone()))
            .collect()
    }

    /// A new stream of `population` whose batches have `schema`; `dropped`
    /// names a column added only for counting, removed from every batch.
    pub fn open(
        self: &Arc<Self>,
        population: &str,
        schema: &SchemaRef,
        dropped: Option<&str>,
    ) -> Tally {
        let grouping = self.grouping();
        let group = grouping.column.as_deref().and_then(|column| {
            let (index, field) = schema.column_with_name(column)?;
            groupable(field.data_type()).then_some(index)
        });
        let served = {
            let mut populations = lock(&self.populations);
            let served = match populations.iter().position(|(id, _)| id == population) {
                Some(at) => populations.remove(at).map(|(_, s)| s).unwrap_or_default(),
                None => Arc::default(),
            };
            populations.push_back((population.to_string(), served.clone()));
            while populations.len() > MAX_POPULATIONS {
                populations.pop_front();
            }
            served
        };
        {
            let mut counts = lock(&served);
            counts.streams += 1;
            counts.group_column_missing = grouping.column.is_some() && group.is_none();
        }
        let drop = dropped.and_then(|name| schema.index_of(name).ok());
        let schema = match drop {
            Some(index) => {
                let mut fields = schema.fields().to_vec();
                fields.remove(index);
                Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
            }
            None => schema.clone(),
        };
        Tally {
            ledger: self.clone(),
            served,
            group,
            drop,
            max_groups: grouping.max_groups,
            schema,
        }
    }
}

/// The counting of one stream.
#[derive(Debug)]
pub struct Tally {
    ledger: Arc<ServedLedger>,
    served: Arc<Mutex<Served>>,
    group: Option<usize>,
    drop: Option<usize>,
    max_groups: usize,
    /// The schema of the batches as handed out.
    schema: SchemaRef,
}

impl Tally {
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Count `batch` and return it as it is handed out. Counting never fails
    /// a stream: values that cannot be formatted flag the column as missing.
    pub fn count(&self, mut batch: RecordBatch) -> RecordBatch {
        let groups = self
            .group
            .map(|index| group_counts(batch.column(index)).ok());
        if let Some(index) = self.drop {
            batch.remove_column(index);
        }
        let rows = batch.num_rows() as u64;
        let bytes = sent_bytes(&batch);
        self.ledger.rows.fetch_add(rows, Ordering::Relaxed);
        self.ledger.bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut served = lock(&self.served);
        served.rows += rows;
        served.bytes += bytes;
        if groups == Some(None) {
            served.group_column_missing = true;
        }
        for (key, count) in groups.flatten().unwrap_or_default() {
            // First come, first kept: the first max_groups values seen get a key.
            if let Some(kept) = served.groups.get_mut(&key) {
                *kept += count;
            } else if served.groups.len() < self.max_groups {
                served.groups.insert(key, count);
            } else {
                served.overflow += count;
            }
        }
        batch
    }
}

/// A poisoned lock still holds counts worth reporting: a panic elsewhere
/// cannot leave them half-updated in a way that matters.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether values of `data_type` can be counted: not lists, structs, maps or unions.
pub fn groupable(data_type: &DataType) -> bool {
    match data_type {
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::FixedSizeList(_, _)
        | DataType::Struct(_)
        | DataType::Map(_, _)
        | DataType::Union(_, _)
        | DataType::RunEndEncoded(_, _) => false,
        DataType::Dictionary(_, values) => groupable(values),
        _ => true,
    }
}

/// The Arrow data of `batch` as a consumer receives it: each buffer range its
/// rows reference (a validity bitmap only when there are nulls), as
/// `pyarrow.RecordBatch.nbytes` counts it; the wire size less the IPC framing.
pub fn sent_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|column| referenced_bytes(&column.to_data()))
        .sum::<usize>() as u64
}

fn referenced_bytes(data: &ArrayData) -> usize {
    let slice_size = |d: &ArrayData| {
        d.get_slice_memory_size()
            .unwrap_or_else(|_| d.get_buffer_memory_size())
    };
    let children = data.child_data();
    let own = slice_size(data) - children.iter().map(slice_size).sum::<usize>();
    // A bitmap of no nulls is not sent (Arrow's C and IPC readers drop it).
    let bitmap = match data.nulls() {
        Some(nulls) if nulls.null_count() == 0 => data.len().div_ceil(8),
        _ => 0,
    };
    // Arrow C++ counts one offset per row, arrow-rs one more (the end of the last).
    let end_offset = match data.data_type() {
        DataType::Utf8 | DataType::Binary | DataType::List(_) | DataType::Map(_, _) => 4,
        DataType::LargeUtf8 | DataType::LargeBinary | DataType::LargeList(_) => 8,
        _ => 0,
    };
    own.saturating_sub(bitmap + end_offset) + children.iter().map(referenced_bytes).sum::<usize>()
}

/// `(key, rows)` per distinct value of `column`: the value's Arrow string form
/// ("3", "true", "0.5", "2024-01-31"); Python's bytes literal (`b'ab'`) for
/// binary values; `NULL` for nulls.
fn group_counts(column: &ArrayRef) -> Result<Vec<(String, u64)>> {
    let nulls = column.logical_nulls();
    let is_null = |row: usize| nulls.as_ref().is_some_and(|n| n.is_null(row));
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut add = |key: &str| match counts.get_mut(key) {
        Some(count) => *count += 1,
        None => {
            counts.insert(key.to_string(), 1);
        }
    };
    let mut key = String::new();
    if let Some(values) = binary_values(column) {
        for (row, value) in values.enumerate() {
            match value {
                Some(bytes) if !is_null(row) => {
                    key.clear();
                    python_bytes_literal(bytes, &mut key);
                    add(&key);
                }
                _ => add(NULL),
            }
        }
    } else {
        let formatter = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
        for row in 0..column.len() {
            if is_null(row) {
                add(NULL);
                continue;
            }
            key.clear();
            write!(key, "{}", formatter.value(row))
                .map_err(|e| Error::internal(format!("cannot format a group value: {e}")))?;
            add(&key);
        }
    }
    Ok(counts.into_iter().collect())
}

/// The values of a binary column, or None for any other type.
fn binary_values(column: &ArrayRef) -> Option<Box<dyn Iterator<Item = Option<&[u8]>> + '_>> {
    use arrow_array::cast::AsArray;
    Some(match column.data_type() {
        DataType::Binary => Box::new(column.as_binary::<i32>().iter()),
        DataType::LargeBinary => Box::new(column.as_binary::<i64>().iter()),
        DataType::BinaryView => Box::new(column.as_binary_view().iter()),
        DataType::FixedSizeBinary(_) => Box::new(column.as_fixed_size_binary().iter()),
        _ => return None,
    })
}

/// `bytes` as Python writes it (`repr(b"...")`), so that a binary group's key
/// reads the same as before the counting moved into the engine.
fn python_bytes_literal(bytes: &[u8], out: &mut String) {
    let quote = if bytes.contains(&b'\'') && !bytes.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    out.push('b');
    out.push(quote);
    for &byte in bytes {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\'' if quote == '\'' => out.push_str("\\'"),
            0x20..=0x7e => out.push(byte as char),
            _ => {
                let _ = write!(out, "\\x{byte:02x}");
            }
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Float64Array, Int64Array, StringArray, UInt64Array};
    use arrow_schema::Field;

    fn batch(labels: Vec<Option<i64>>) -> RecordBatch {
        let ids = UInt64Array::from_iter_values(0..labels.len() as u64);
        RecordBatch::try_from_iter([
            ("cache_id", Arc::new(ids) as ArrayRef),
            ("label", Arc::new(Int64Array::from(labels)) as ArrayRef),
        ])
        .unwrap()
    }

    fn ledger(column: Option<&str>, max_groups: usize) -> Arc<ServedLedger> {
        let ledger = Arc::new(ServedLedger::default());
        ledger.set_grouping(Grouping::new(column.map(str::to_string), max_groups).unwrap());
        ledger
    }

    #[test]
    fn counts_rows_bytes_and_groups_and_drops_the_added_column() {
        let ledger = ledger(Some("label"), 64);
        let b = batch(vec![Some(1), Some(2), Some(1), None]);
        let tally = ledger.open("p", &b.schema(), Some("label"));
        assert_eq!(tally.schema().fields().len(), 1);
        let out = tally.count(b);
        assert_eq!(out.num_columns(), 1);
        let (id, served) = ledger.served().remove(0);
        assert_eq!(id, "p");
        assert_eq!((served.streams, served.rows, served.bytes), (1, 4, 32));
        let expected: HashMap<String, u64> = [("1", 2), ("2", 1), (NULL, 1)]
            .map(|(k, v)| (k.to_string(), v))
            .into();
        assert_eq!(served.groups, expected);
        assert_eq!(ledger.totals(), (4, 32));
    }

    #[test]
    fn values_past_max_groups_count_as_overflow() {
        let ledger = ledger(Some("label"), 2);
        let b = batch((0..10).map(Some).collect());
        let tally = ledger.open("p", &b.schema(), None);
        tally.count(b);
        let served = ledger.served().remove(0).1;
        assert_eq!(served.groups.len(), 2);
        assert_eq!(served.overflow, 8);
        assert_eq!(served.groups.values().sum::<u64>() + served.overflow, 10);
    }

    #[test]
    fn only_the_most_recent_populations_are_kept_most_recent_first() {
        let ledger = ledger(None, 64);
        for i in 0..MAX_POPULATIONS + 2 {
            let b = batch(vec![Some(0)]);
            ledger.open(&format!("p{i}"), &b.schema(), None).count(b);
        }
        let b = batch(vec![Some(0)]);
        ledger.open("p2", &b.schema(), None).count(b);
        let served = ledger.served();
        assert_eq!(served.len(), MAX_POPULATIONS);
        assert_eq!(served[0].0, "p2");
        assert_eq!((served[0].1.streams, served[0].1.rows), (2, 2));
        assert!(served.iter().all(|(id, _)| id != "p0" && id != "p1"));
    }

    #[test]
    fn a_missing_or_nested_column_is_flagged_and_rows_still_count() {
        let ledger = ledger(Some("tags"), 64);
        let b = batch(vec![Some(1)]);
        ledger.open("p", &b.schema(), None).count(b);
        let served = ledger.served().remove(0).1;
        assert!(served.group_column_missing);
        assert_eq!((served.rows, served.groups.len()), (1, 0));
        assert!(!groupable(&DataType::List(Arc::new(Field::new(
            "item",
            DataType::Int64,
            true
        )))));
    }

    #[test]
    fn keys_are_arrow_string_forms_and_python_bytes_literals() {
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 0.5, 1.0]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        let binary: ArrayRef = Arc::new(BinaryArray::from(vec![&b"a'\x00"[..], b"ab"]));
        let keys = |c: &ArrayRef| {
            let mut keys: Vec<String> = group_counts(c)
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            keys.sort();
            keys
        };
        assert_eq!(keys(&floats), ["0.5", "1.0"]);
        assert_eq!(keys(&strings), ["a", "b"]);
        assert_eq!(keys(&binary), ["b\"a'\\x00\"", "b'ab'"]);
    }

    #[test]
    fn sent_bytes_count_what_pyarrow_counts() {
        // The figures pyarrow's `nbytes` gives for the same arrays.
        let size = |array: ArrayRef| referenced_bytes(&array.to_data());
        let binary = arrow_array::LargeBinaryArray::from(vec![Some(&b"ab"[..]), None, Some(b"c")]);
        assert_eq!(size(Arc::new(binary.clone())), 28);
        assert_eq!(size(Arc::new(binary.slice(1, 2))), 18);
        assert_eq!(size(Arc::new(StringArray::from(vec!["x", "yy"]))), 11);
        let dictionary: arrow_array::DictionaryArray<arrow_array::types::Int32Type> =
            vec!["a", "b", "a"].into_iter().collect();
        assert_eq!(size(Arc::new(dictionary)), 22);
        let empty = arrow_array::LargeBinaryArray::from(Vec::<&[u8]>::new());
        assert_eq!(size(Arc::new(empty)), 0);
    }

    #[test]
    fn sent_bytes_skips_a_bitmap_without_nulls() {
        let with_null = batch(vec![Some(1), None]);
        let without = batch(vec![Some(1), Some(2)]);
        assert_eq!(sent_bytes(&with_null), 16 + 16 + 1);
        assert_eq!(sent_bytes(&without), 32);
    }
}
