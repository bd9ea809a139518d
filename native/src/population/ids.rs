//! The identity columns a population's table file leaves out.
//!
//! A population row's `cache_id` and `sample_id` are already in its rows
//! file, as the row's key (cache position << 40 | sample id, `rows.rs`), and
//! the cache position names one of the dataset's cache ids. Storing them in
//! the table as well cost 16 bytes a row, twice what the keys do; so the
//! table file holds the other columns, and its schema's metadata
//! (`dataset_rt.ids`) says where each left-out column goes and which integer
//! type it was supplied as. Reading the table puts them back, exactly the
//! values validated (`Keys`); hashing it feeds them to the id in their place
//! (`KeysFile`), so a population's id is the same either way.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{ArrayRef, ArrowPrimitiveType, Int64Array, PrimitiveArray, UInt64Array};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema};

use super::key::{split_key, ROWS_HEADER, SAMPLE_BITS};
use crate::error::{Error, Result};
use crate::os::mapped::MappedFile;
use crate::storage::{CheckedPages, Slab};

/// The schema metadata that lists a table file's left-out identity columns.
pub const IDS_KEY: &str = "dataset_rt.ids";

/// Which identity a left-out column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdColumn {
    Cache,
    Sample,
}

impl IdColumn {
    fn name(self) -> &'static str {
        match self {
            IdColumn::Cache => "cache_id",
            IdColumn::Sample => "sample_id",
        }
    }
}

/// A left-out column: its place in the table and its type as supplied.
#[derive(Clone, Debug, PartialEq)]
pub struct LeftOut {
    pub index: usize,
    pub column: IdColumn,
    pub dtype: DataType,
}

impl LeftOut {
    /// Its field in the canonical table (every field nullable, no metadata).
    pub fn field(&self) -> Field {
        Field::new(self.column.name(), self.dtype.clone(), true)
    }
}

/// The integer types an identity is accepted as (`column_types.rs`), by name.
const INTEGERS: [DataType; 8] = [
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::UInt8,
    DataType::UInt16,
    DataType::UInt32,
    DataType::UInt64,
];

/// The identity columns of a canonical (validated) table's `schema`, which
/// its file leaves out.
pub fn left_out(schema: &Schema) -> Vec<LeftOut> {
    schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(index, field)| {
            let column = match field.name().as_str() {
                "cache_id" => IdColumn::Cache,
                "sample_id" => IdColumn::Sample,
                _ => return None,
            };
            INTEGERS.contains(field.data_type()).then(|| LeftOut {
                index,
                column,
                dtype: field.data_type().clone(),
            })
        })
        .collect()
}

/// The metadata value: `cache_id:0:UInt64,sample_id:1:Int32`.
pub fn describe(left_out: &[LeftOut]) -> String {
    left_out
        .iter()
        .map(|c| format!("{}:{}:{}", c.column.name(), c.index, c.dtype))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parse a metadata value of `describe`, for a table of `stored` columns in
/// its file: the left-out columns by index. An error says what is wrong.
pub fn parse(value: &str, stored: usize) -> std::result::Result<Vec<LeftOut>, String> {
    let mut columns: Vec<LeftOut> = Vec::new();
    for part in value.split(',') {
        let bad = || format!("'{IDS_KEY}' is not a list of name:index:type ({value:?})");
        let mut fields = part.split(':');
        let (Some(name), Some(index), Some(dtype), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(bad());
        };
        let column = match name {
            "cache_id" => IdColumn::Cache,
            "sample_id" => IdColumn::Sample,
            _ => return Err(bad()),
        };
        let index: usize = index.parse().map_err(|_| bad())?;
        let dtype = INTEGERS
            .iter()
            .find(|t| t.to_string() == dtype)
            .ok_or_else(bad)?
            .clone();
        if columns
            .iter()
            .any(|c| c.column == column || c.index == index)
        {
            return Err(format!(
                "'{IDS_KEY}' names a column or a place twice ({value:?})"
            ));
        }
        columns.push(LeftOut {
            index,
            column,
            dtype,
        });
    }
    columns.sort_by_key(|c| c.index);
    let width = stored + columns.len();
    if let Some(c) = columns.iter().find(|c| c.index >= width) {
        return Err(format!(
            "'{IDS_KEY}' puts '{}' at column {} of a table of {width}",
            c.column.name(),
            c.index
        ));
    }
    Ok(columns)
}

/// The identities of a mapped population: its rows file's keys and the
/// dataset's cache ids, for reading its table.
#[derive(Clone)]
pub struct Keys {
    keys: Slab<u64>,
    /// The rows file's mapping, which `keys` lie in at `ROWS_HEADER`.
    map: Arc<MappedFile>,
    /// Its pages, verified on first touch.
    pages: Arc<CheckedPages>,
    cache_ids: Arc<[u64]>,
    /// The rows file, for errors.
    path: PathBuf,
}

impl Keys {
    pub fn new(
        keys: Slab<u64>,
        map: Arc<MappedFile>,
        pages: Arc<CheckedPages>,
        cache_ids: Arc<[u64]>,
        path: &Path,
    ) -> Self {
        Keys {
            keys,
            map,
            pages,
            cache_ids,
            path: path.to_path_buf(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Column `column` at rows `rows`, in `dtype`. A key that names no cache,
    /// or a value `dtype` cannot hold, is a damaged rows file.
    pub fn values(
        &self,
        column: IdColumn,
        rows: Range<usize>,
        dtype: &DataType,
    ) -> Result<ArrayRef> {
        let keys = self
            .keys
            .get(rows.clone())
            .ok_or_else(|| self.past(rows.end))?;
        self.pages
            .touch_range(ROWS_HEADER + rows.start * 8..ROWS_HEADER + rows.end * 8);
        self.check_pages()?;
        // Keys of the first cache are their sample ids: a 64-bit sample id
        // column of them is a view of the rows file, no copy (a dataset of
        // one cache, the common case, never makes its sample ids).
        let wide = matches!(dtype, DataType::UInt64 | DataType::Int64);
        if column == IdColumn::Sample
            && wide
            && keys.iter().fold(0, |any, &k| any | k) >> SAMPLE_BITS == 0
        {
            let at = ROWS_HEADER + rows.start * 8;
            let view = crate::storage::arrow_buffer(&self.map, at, keys.len() * 8)
                .ok_or_else(|| self.past(rows.end))?;
            let view = ScalarBuffer::<u64>::new(view, 0, keys.len());
            return Ok(match dtype {
                DataType::Int64 => Arc::new(Int64Array::new(view.into_inner().into(), None)),
                _ => Arc::new(UInt64Array::new(view, None)),
            });
        }
        self.make(column, keys.iter().copied(), dtype)
    }

    /// Column `column` at rows `rows` (each less than the table's length).
    pub fn take(&self, column: IdColumn, rows: &[u32], dtype: &DataType) -> Result<ArrayRef> {
        let keys = rows
            .iter()
            .map(|&row| {
                self.keys
                    .get(row as usize)
                    .copied()
                    .ok_or_else(|| self.past(row as usize))
            })
            .collect::<Result<Vec<u64>>>()?;
        for &row in rows {
            self.pages.touch(ROWS_HEADER + row as usize * 8);
        }
        self.check_pages()?;
        self.make(column, keys.into_iter(), dtype)
    }

    /// The rows file's damage, if a read found a page that does not match
    /// its sum.
    fn check_pages(&self) -> Result<()> {
        match self.pages.damage() {
            Some(detail) => Err(Error::corrupt_population(
                Path::new("populations").join(self.path.file_name().unwrap_or_default()),
                detail,
            )),
            None => Ok(()),
        }
    }

    fn past(&self, row: usize) -> Error {
        Error::internal(format!("row {row} is past the table's {} rows", self.len()))
    }

    /// The values of `column` for `keys`, built in `dtype` at once (one
    /// allocation, no cast). A key naming no cache, or a value `dtype`
    /// cannot hold, is flagged as the values are made, without a branch per
    /// value, and refused as a damaged rows file.
    fn make(
        &self,
        column: IdColumn,
        keys: impl Iterator<Item = u64>,
        dtype: &DataType,
    ) -> Result<ArrayRef> {
        let ids = &self.cache_ids;
        let last = ids.len().saturating_sub(1);
        let (mut no_cache, mut too_large) = (false, false);
        let values = keys.map(|key| {
            let (position, sample) = split_key(key);
            match column {
                IdColumn::Sample => sample,
                IdColumn::Cache => {
                    no_cache |= position as usize > last;
                    ids.get((position as usize).min(last)).copied().unwrap_or(0)
                }
            }
        });
        macro_rules! typed {
            ($t:ty) => {{
                let max = <$t as ArrowPrimitiveType>::Native::MAX as u64;
                Arc::new(PrimitiveArray::<$t>::from_iter_values(values.map(|v| {
                    too_large |= v > max;
                    v as <$t as ArrowPrimitiveType>::Native
                }))) as ArrayRef
            }};
        }
        let array = match dtype {
            DataType::UInt64 => typed!(UInt64Type),
            DataType::Int64 => typed!(Int64Type),
            DataType::UInt32 => typed!(UInt32Type),
            DataType::Int32 => typed!(Int32Type),
            DataType::UInt16 => typed!(UInt16Type),
            DataType::Int16 => typed!(Int16Type),
            DataType::UInt8 => typed!(UInt8Type),
            DataType::Int8 => typed!(Int8Type),
            other => {
                return Err(Error::internal(format!(
                    "an identity column of type {other}"
                )))
            }
        };
        let damaged = |detail: String| Error::corrupt_population(&self.path, detail);
        if no_cache {
            return Err(damaged(format!(
                "a key names a cache position past the dataset's {} caches",
                ids.len()
            )));
        }
        if too_large {
            return Err(damaged(format!(
                "a key's {} does not fit the column's type {dtype}",
                column.name()
            )));
        }
        Ok(array)
    }
}

/// The cache id a key names, or why it names none.
fn cache_id(cache_ids: &[u64], key: u64) -> std::result::Result<u64, String> {
    let position = split_key(key).0;
    cache_ids.get(position as usize).copied().ok_or_else(|| {
        format!(
            "a key names cache position {position}; the dataset has {} caches",
            cache_ids.len()
        )
    })
}

/// A rows file's keys, read from the file once in order (around the page
/// cache, `storage::ranges`): for hashing a table that leaves its
/// identities out.
pub struct KeysFile {
    pub path: PathBuf,
    pub rows: usize,
    pub cache_ids: Vec<u64>,
}

/// Bytes of identities handed to the hash at a time.
const FEED: usize = 1 << 16;

impl KeysFile {
    /// Feed column `column`, each value as `width` little-endian bytes (the
    /// integer type's; every value is non-negative and fits it once
    /// validated), to `out`.
    pub fn feed(
        &self,
        column: IdColumn,
        width: usize,
        out: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<(), String> {
        let start = ROWS_HEADER as u64;
        let range = start..start + self.rows as u64 * 8;
        let mut pending: Vec<u8> = Vec::with_capacity(8);
        let mut chunk: Vec<u8> = Vec::with_capacity(FEED + 8);
        let mut failure = None;
        let mut convert = |bytes: &[u8]| {
            if failure.is_some() {
                return;
            }
            // A piece may end inside a key: its bytes wait for the next.
            let mut bytes = bytes;
            if !pending.is_empty() {
                let take = (8 - pending.len()).min(bytes.len());
                pending.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if pending.len() < 8 {
                    return;
                }
            }
            let whole = std::mem::take(&mut pending);
            let (keys, rest) = bytes.split_at(bytes.len() / 8 * 8);
            for key in whole.chunks_exact(8).chain(keys.chunks_exact(8)) {
                let key = u64::from_le_bytes(key.try_into().unwrap_or_default());
                let value = match column {
                    IdColumn::Sample => split_key(key).1,
                    IdColumn::Cache => match cache_id(&self.cache_ids, key) {
                        Ok(id) => id,
                        Err(e) => {
                            failure = Some(e);
                            return;
                        }
                    },
                };
                chunk.extend_from_slice(&value.to_le_bytes()[..width]);
                if chunk.len() >= FEED {
                    out(&chunk);
                    chunk.clear();
                }
            }
            pending.extend_from_slice(rest);
        };
        crate::storage::ranges::read_ranges(&self.path, &[range], &mut convert)
            .map_err(|e| format!("cannot read the keys of {}: {e}", self.path.display()))?;
        if let Some(failure) = failure {
            return Err(format!("{}: {failure}", self.path.display()));
        }
        out(&chunk);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_reads_back_and_a_bad_one_is_refused() {
        let schema = Schema::new(vec![
            Field::new("label", DataType::Int64, true),
            Field::new("sample_id", DataType::Int32, true),
            Field::new("cache_id", DataType::UInt64, true),
            Field::new("weight", DataType::Float64, true),
        ]);
        let left = left_out(&schema);
        assert_eq!(describe(&left), "sample_id:1:Int32,cache_id:2:UInt64");
        assert_eq!(parse(&describe(&left), 2).unwrap(), left);
        for bad in [
            "",
            "cache_id:0",
            "cache_id:0:Float64",
            "label:0:Int64",
            "cache_id:0:UInt64,cache_id:1:UInt64",
            "cache_id:0:UInt64,sample_id:0:UInt64",
            "cache_id:x:UInt64",
        ] {
            assert!(parse(bad, 2).is_err(), "{bad:?} was taken");
        }
        let past = parse("cache_id:5:UInt64", 2).unwrap_err();
        assert!(past.contains("column 5 of a table of 3"), "{past}");
    }
}
