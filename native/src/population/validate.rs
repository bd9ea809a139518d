//! All-or-nothing validation of a metadata table against its caches.
//!
//! Every rejection names the column, the first offending row and how many rows
//! fail, and says what would be valid. Each message starts with dataset-rt
//! 0.4.8's words for the same failure ("samples metadata column 'weight'
//! contains null", ...), which its users match on, and adds ours.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;

use super::column_types::{identity_column, reject_nulls, weight_column};
use crate::error::{Error, Result};
use crate::storage::{Cache, CacheSet, MetaType, TypedColumn};

/// What validation learned about each row.
pub struct CheckedRows {
    pub cache_index: Vec<u32>,
    pub sample_ids: Vec<u64>,
    pub weights: Vec<f64>,
}

/// The refusal of a table without rows.
pub(super) const EMPTY_TABLE: &str =
    "metadata table must include at least one sample: the table is empty (0 rows)";

pub fn validate_table(caches: &CacheSet, table: &RecordBatch) -> Result<CheckedRows> {
    check_unique_columns(&table.schema())?;
    if table.num_rows() == 0 {
        return Err(Error::population(EMPTY_TABLE));
    }
    if table.num_rows() > u32::MAX as usize {
        return Err(Error::population(format!(
            "the table has {} rows; a population holds at most {}",
            table.num_rows(),
            u32::MAX
        )));
    }
    check_required_columns(caches, table)?;
    let cache_ids = identity_column(table, "cache_id")?;
    let sample_ids = identity_column(table, "sample_id")?;
    let cache_index = resolve_caches(caches, &cache_ids)?;
    check_sample_ids(caches, &cache_index, &sample_ids)?;
    for (k, spec) in caches.columns().iter().enumerate() {
        check_stored_column(
            caches,
            table,
            k,
            &spec.name,
            spec.dtype,
            &cache_index,
            &sample_ids,
        )?;
    }
    let weights = weight_column(table)?;
    Ok(CheckedRows {
        cache_index,
        sample_ids,
        weights,
    })
}

/// Columns are found by name, so a second column of the same name would be
/// stored and served without ever being checked (a second `weight` of -5.0).
pub(super) fn check_unique_columns(schema: &arrow_schema::Schema) -> Result<()> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            let times = names.iter().filter(|n| *n == name).count();
            return Err(Error::InvalidPopulation {
                column: Some(name.to_string()),
                first_row: None,
                count: None,
                message: format!(
                    "column '{name}' appears {times} times; column names must be unique \
                     (drop or rename the extra '{name}' columns)"
                ),
            });
        }
    }
    Ok(())
}

fn check_required_columns(caches: &CacheSet, table: &RecordBatch) -> Result<()> {
    let schema = table.schema();
    let required: Vec<&str> = ["cache_id", "sample_id"]
        .into_iter()
        .chain(caches.columns().iter().map(|c| c.name.as_str()))
        .chain(["weight"])
        .collect();
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|name| schema.column_with_name(name).is_none())
        .collect();
    if let Some(first) = missing.first() {
        let others = if missing.len() > 1 {
            format!(" (missing columns: {})", quote_list(&missing))
        } else {
            String::new()
        };
        return Err(Error::population_column(
            first,
            format!(
                "samples metadata missing '{first}' column{others}; a population table needs {} \
                 (extra columns are allowed)",
                quote_list(&required)
            ),
        ));
    }
    Ok(())
}

fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn resolve_caches(caches: &CacheSet, cache_ids: &[u64]) -> Result<Vec<u32>> {
    let mut out = Vec::with_capacity(cache_ids.len());
    let mut bad = 0u64;
    let mut first = None;
    // Consecutive rows usually share a cache: remember the last lookup.
    let mut last: Option<(u64, Option<u32>)> = None;
    for (row, &id) in cache_ids.iter().enumerate() {
        let found = match last {
            Some((last_id, found)) if last_id == id => found,
            _ => {
                let found = caches.index_of(id);
                last = Some((id, found));
                found
            }
        };
        match found {
            Some(i) => out.push(i),
            None => {
                bad += 1;
                first.get_or_insert((row as u64, id));
                out.push(0);
            }
        }
    }
    if let Some((row, id)) = first {
        let known: Vec<String> = caches
            .caches()
            .iter()
            .map(|c| c.cache_id().to_string())
            .collect();
        return Err(Error::population_rows(
            "cache_id",
            row,
            bad,
            &format!(
                "unknown samples metadata row identity: column 'cache_id' has unknown cache_id \
                 {id}; the dataset's caches are [{}]",
                known.join(", ")
            ),
        ));
    }
    Ok(out)
}

fn check_sample_ids(caches: &CacheSet, cache_index: &[u32], sample_ids: &[u64]) -> Result<()> {
    let mut bad = 0u64;
    let mut first = None;
    for (row, (&ci, &sid)) in cache_index.iter().zip(sample_ids).enumerate() {
        if sid >= caches.get(ci).len() {
            bad += 1;
            first.get_or_insert((row as u64, sid, ci));
        }
    }
    if let Some((row, sid, ci)) = first {
        let cache = caches.get(ci);
        return Err(Error::population_rows(
            "sample_id",
            row,
            bad,
            &format!(
                "unknown samples metadata row identity: column 'sample_id' has unknown sample_id \
                 {sid}; cache {} has sample ids 0..{}",
                cache.cache_id(),
                cache.len()
            ),
        ));
    }
    Ok(())
}

/// The stored column must have the cache's type and, for every row, the cache's
/// value for that row's identity: stored metadata is read-only.
fn check_stored_column(
    caches: &CacheSet,
    table: &RecordBatch,
    k: usize,
    name: &str,
    dtype: MetaType,
    cache_index: &[u32],
    sample_ids: &[u64],
) -> Result<()> {
    let column = table
        .column_by_name(name)
        .ok_or_else(|| Error::population(format!("samples metadata missing '{name}' column")))?;
    let accepted = match dtype {
        MetaType::String => matches!(
            column.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ),
        _ => column.data_type() == &dtype.arrow(),
    };
    if !accepted {
        return Err(Error::population_column(
            name,
            format!(
                "samples metadata column '{name}' must have Arrow type {}: the table has {} but \
                 the cache stores it as {} ({}); stored columns keep their type (add a new \
                 column for derived values)",
                dtype.arrow(),
                column.data_type(),
                dtype.arrow(),
                dtype.name()
            ),
        ));
    }
    reject_nulls(
        name,
        column,
        "stored metadata columns must equal the cache's values",
    )?;
    let caches = caches.caches();
    let rows = cache_index.iter().zip(sample_ids);
    let mismatch = match dtype {
        MetaType::Int64 => {
            let got = column.as_primitive::<Int64Type>();
            let (first, want) = stored::<Int64Array>(caches, k, cache_index)?;
            first_mismatch(rows, |row, ci, sid| {
                let (a, b) = (got.value(row), want[ci - first].value(sid));
                (a != b).then(|| (a.to_string(), b.to_string()))
            })
        }
        MetaType::Float64 => {
            let got = column.as_primitive::<Float64Type>();
            let (first, want) = stored::<Float64Array>(caches, k, cache_index)?;
            first_mismatch(rows, |row, ci, sid| {
                let (a, b) = (got.value(row), want[ci - first].value(sid));
                let same = a == b || a.to_bits() == b.to_bits();
                (!same).then(|| (a.to_string(), b.to_string()))
            })
        }
        MetaType::Bool => {
            let got: &BooleanArray = column.as_boolean();
            let (first, want) = stored::<BooleanArray>(caches, k, cache_index)?;
            first_mismatch(rows, |row, ci, sid| {
                let (a, b) = (got.value(row), want[ci - first].value(sid));
                (a != b).then(|| (a.to_string(), b.to_string()))
            })
        }
        MetaType::String => {
            let utf8 = arrow_cast::cast(column, &DataType::Utf8)?;
            let got: &StringArray = utf8.as_string::<i32>();
            let (first, want) = stored::<StringArray>(caches, k, cache_index)?;
            first_mismatch(rows, |row, ci, sid| {
                let (a, b) = (got.value(row), want[ci - first].value(sid));
                (a != b).then(|| (format!("{a:?}"), format!("{b:?}")))
            })
        }
    };
    if let Some((row, count, got, want)) = mismatch {
        return Err(Error::population_rows(
            name,
            row,
            count,
            &format!(
                "samples metadata column '{name}' differs from the cache: the table's value \
                 {got} differs from the cache's stored value {want} for that (cache_id, \
                 sample_id); stored columns are read-only (add a new column for derived values)"
            ),
        ));
    }
    Ok(())
}

/// Stored column `k` of the caches from the lowest to the highest index that
/// `cache_index` names (and that lowest index), read by sample id: a batch of
/// one cache builds one column, not one per cache of the dataset (a dataset of
/// 10^4 caches is validated batch by batch, one cache at a time, at open).
fn stored<'c, A: Array + 'static>(
    caches: &'c [Arc<Cache>],
    k: usize,
    cache_index: &[u32],
) -> Result<(usize, Vec<TypedColumn<'c, A>>)> {
    let (Some(&low), Some(&high)) = (cache_index.iter().min(), cache_index.iter().max()) else {
        return Ok((0, Vec::new()));
    };
    let columns = caches[low as usize..=high as usize]
        .iter()
        .map(|c| c.metadata().typed::<A>(k + 1))
        .collect::<Result<_>>()?;
    Ok((low as usize, columns))
}

/// Scan rows; `differs(row, cache, sample)` returns (table value, cache value)
/// when they differ. Returns (first row, count, table value, cache value).
fn first_mismatch<'a>(
    rows: impl Iterator<Item = (&'a u32, &'a u64)>,
    differs: impl Fn(usize, usize, usize) -> Option<(String, String)>,
) -> Option<(u64, u64, String, String)> {
    let mut first = None;
    let mut count = 0u64;
    for (row, (&ci, &sid)) in rows.enumerate() {
        if let Some((got, want)) = differs(row, ci as usize, sid as usize) {
            count += 1;
            first.get_or_insert((row as u64, got, want));
        }
    }
    first.map(|(row, got, want)| (row, count, got, want))
}
