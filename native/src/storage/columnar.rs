//! Records from Arrow record batches: one binary column is the payload, every
//! other column is stored metadata.
//!
//! The columnar counterpart of the iterable path's record conversion
//! (`python/writer.rs`): the same metadata types (bool, int, float, str), the
//! same rules on names (`SchemaBinder::from_columns`) and the same errors,
//! which name the column and the record. Types are checked once per column
//! (an Arrow column has one type); values once per batch (nulls, unsigned
//! integers past the 64-bit signed range). A record's payload stays a slice
//! of its batch's value buffer until it reaches a shard.

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, FixedSizeBinaryArray,
    Float64Array, Int64Array, LargeBinaryArray, LargeStringArray, RecordBatch, StringArray,
    StringViewArray,
};
use std::sync::Arc;

use arrow_schema::{DataType, Schema};
use bytes::Bytes;

use super::gather::{StoredBytes, SHARED_MIN};
use super::schema::{ColumnSpec, MetaType, MetaValue, SchemaBinder};
use crate::error::{Error, Result};

/// The payload types: what `CacheInput.data` is in Arrow (bytes-like).
const PAYLOAD_TYPES: &str = "binary, large_binary, binary_view or fixed_size_binary";
/// The metadata types, as the iterable path words them, and their Arrow types.
const METADATA_TYPES: &str = "metadata values must be bool, int, float or str (Arrow: bool, \
                              int8..int64, uint8..uint64, float16..float64, utf8, large_utf8, \
                              utf8_view or a dictionary of strings)";

/// How a stream's columns become records, fixed by its schema.
#[derive(Debug)]
pub struct ColumnarSchema {
    payload: usize,
    payload_name: String,
    /// Stream column index of each stored column, in cache column order.
    metadata: Vec<usize>,
    columns: Vec<ColumnSpec>,
    types: Vec<DataType>,
}

impl ColumnarSchema {
    /// Check `schema`: `payload_column` is there and binary; every other
    /// column has a metadata type and a name `SchemaBinder` accepts.
    pub fn new(schema: &Schema, payload_column: &str) -> Result<Self> {
        let fields = schema.fields();
        let names = || {
            fields
                .iter()
                .map(|f| format!("'{}'", f.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let found: Vec<usize> = (0..fields.len())
            .filter(|&i| fields[i].name() == payload_column)
            .collect();
        let payload = match found.as_slice() {
            [] => {
                return Err(Error::Source(format!(
                    "the payload column '{payload_column}' is not in the data; its columns \
                     are [{}]",
                    names()
                )))
            }
            [one] => *one,
            _ => {
                return Err(Error::Source(format!(
                    "the payload column '{payload_column}' appears {} times; column names \
                     must be unique",
                    found.len()
                )))
            }
        };
        if !is_payload_type(fields[payload].data_type()) {
            return Err(Error::Source(format!(
                "the payload column '{payload_column}' is {}; it must be {PAYLOAD_TYPES} \
                 (CacheInput.data must be bytes-like)",
                fields[payload].data_type()
            )));
        }
        let mut metadata = Vec::new();
        let mut columns = Vec::new();
        for (at, field) in fields.iter().enumerate() {
            if at == payload {
                continue;
            }
            let Some(dtype) = meta_type(field.data_type()) else {
                return Err(Error::Source(format!(
                    "metadata column '{}' is {}; {METADATA_TYPES}",
                    field.name(),
                    field.data_type()
                )));
            };
            metadata.push(at);
            columns.push(ColumnSpec {
                name: field.name().clone(),
                dtype,
            });
        }
        SchemaBinder::from_columns(columns.clone())?;
        Ok(ColumnarSchema {
            payload,
            payload_name: payload_column.to_string(),
            metadata,
            columns,
            types: fields.iter().map(|f| f.data_type().clone()).collect(),
        })
    }

    /// The cache's stored columns, in the stream's order without the payload.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// The records of `batch`, numbered from `first`: refuses null payloads
    /// and values no metadata type holds, naming the column and the record.
    pub fn rows(&self, batch: &RecordBatch, first: u64) -> Result<ColumnarRows> {
        let same = batch.num_columns() == self.types.len()
            && batch
                .columns()
                .iter()
                .zip(&self.types)
                .all(|(c, t)| c.data_type() == t);
        if !same {
            return Err(Error::Source(format!(
                "record {first}: a batch of the Arrow stream does not have the stream's schema"
            )));
        }
        let payload_array = batch.column(self.payload);
        if let Some(row) = first_null(payload_array.as_ref()) {
            return Err(Error::Source(format!(
                "record {}: the payload column '{}' is null; every record needs a payload \
                 (bytes, possibly empty)",
                first + row as u64,
                self.payload_name
            )));
        }
        let payload = Payload::new(payload_array)?;
        let columns = self
            .metadata
            .iter()
            .zip(&self.columns)
            .map(|(&at, spec)| Column::new(batch.column(at), &spec.name, first))
            .collect::<Result<Vec<_>>>()?;
        Ok(ColumnarRows {
            len: batch.num_rows(),
            payload,
            columns,
        })
    }
}

/// One batch's records, checked: shared by the workers (which hash and
/// compress payloads) and the writer (which appends them in order).
#[derive(Debug)]
pub struct ColumnarRows {
    len: usize,
    payload: Payload,
    columns: Vec<Column>,
}

impl ColumnarRows {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Record `row`'s payload: a slice of the batch.
    pub fn payload(&self, row: usize) -> &[u8] {
        match &self.payload {
            Payload::Binary(a) => a.value(row),
            Payload::Large(a) => a.value(row),
            Payload::View(a) => a.value(row),
            Payload::Fixed(a) => a.value(row),
        }
    }

    /// Record `row`'s payload as the shard writer takes it: shared with the
    /// batch (which it keeps alive) when large enough to be queued, not copied.
    pub fn stored_payload(rows: &Arc<ColumnarRows>, row: usize) -> StoredBytes<'_> {
        let payload = rows.payload(row);
        if payload.len() < SHARED_MIN {
            return StoredBytes::Borrowed(payload);
        }
        StoredBytes::Shared(Bytes::from_owner(RowPayload {
            rows: rows.clone(),
            row,
        }))
    }

    /// Record `row`'s metadata values, in cache column order, into `out`.
    pub fn values_into(&self, row: usize, out: &mut Vec<MetaValue>) {
        out.clear();
        out.extend(self.columns.iter().map(|column| match column {
            Column::Int(a) => MetaValue::Int(a.value(row)),
            Column::Float(a) => MetaValue::Float(a.value(row)),
            Column::Bool(a) => MetaValue::Bool(a.value(row)),
            Column::Str(a) => MetaValue::Str(a.value(row).to_string()),
            Column::LargeStr(a) => MetaValue::Str(a.value(row).to_string()),
            Column::StrView(a) => MetaValue::Str(a.value(row).to_string()),
        }));
    }
}

/// One row's payload, owning a reference to its batch.
struct RowPayload {
    rows: Arc<ColumnarRows>,
    row: usize,
}

impl AsRef<[u8]> for RowPayload {
    fn as_ref(&self) -> &[u8] {
        self.rows.payload(self.row)
    }
}

#[derive(Debug)]
enum Payload {
    Binary(BinaryArray),
    Large(LargeBinaryArray),
    View(BinaryViewArray),
    Fixed(FixedSizeBinaryArray),
}

impl Payload {
    fn new(array: &ArrayRef) -> Result<Self> {
        Ok(match array.data_type() {
            DataType::Binary => Payload::Binary(array.as_binary::<i32>().clone()),
            DataType::LargeBinary => Payload::Large(array.as_binary::<i64>().clone()),
            DataType::BinaryView => Payload::View(array.as_binary_view().clone()),
            DataType::FixedSizeBinary(_) => Payload::Fixed(array.as_fixed_size_binary().clone()),
            other => return Err(Error::internal(format!("payload type {other} not checked"))),
        })
    }
}

#[derive(Debug)]
enum Column {
    Int(Int64Array),
    Float(Float64Array),
    Bool(BooleanArray),
    Str(StringArray),
    LargeStr(LargeStringArray),
    StrView(StringViewArray),
}

impl Column {
    /// Check one metadata column of a batch (records numbered from `first`) and
    /// widen it to its metadata type (lossless: narrower integers and floats).
    fn new(array: &ArrayRef, name: &str, first: u64) -> Result<Self> {
        let array = match array.data_type() {
            DataType::Dictionary(_, _) => arrow_cast::cast(array, &DataType::Utf8)?,
            _ => array.clone(),
        };
        if let Some(row) = first_null(array.as_ref()) {
            return Err(Error::Source(format!(
                "record {}: metadata '{name}' is null; {METADATA_TYPES}",
                first + row as u64
            )));
        }
        if let DataType::UInt64 = array.data_type() {
            let values = array.as_primitive::<UInt64Type>().values();
            if let Some(row) = values.iter().position(|&v| v > i64::MAX as u64) {
                // The iterable path's words for a Python int past the range.
                return Err(Error::Source(format!(
                    "record {}: metadata '{name}' is an int outside the 64-bit signed range",
                    first + row as u64
                )));
            }
        }
        Ok(match array.data_type() {
            DataType::Boolean => Column::Bool(array.as_boolean().clone()),
            DataType::Utf8 => Column::Str(array.as_string::<i32>().clone()),
            DataType::LargeUtf8 => Column::LargeStr(array.as_string::<i64>().clone()),
            DataType::Utf8View => Column::StrView(array.as_string_view().clone()),
            DataType::Float16 | DataType::Float32 | DataType::Float64 => {
                let wide = arrow_cast::cast(&array, &DataType::Float64)?;
                Column::Float(wide.as_primitive().clone())
            }
            _ => {
                let wide = arrow_cast::cast(&array, &DataType::Int64)?;
                Column::Int(wide.as_primitive().clone())
            }
        })
    }
}

fn is_payload_type(dtype: &DataType) -> bool {
    matches!(
        dtype,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    ) || matches!(dtype, DataType::FixedSizeBinary(_))
}

/// The metadata type an Arrow column holds, if any.
fn meta_type(dtype: &DataType) -> Option<MetaType> {
    use DataType as D;
    match dtype {
        D::Boolean => Some(MetaType::Bool),
        D::Int8 | D::Int16 | D::Int32 | D::Int64 => Some(MetaType::Int64),
        D::UInt8 | D::UInt16 | D::UInt32 | D::UInt64 => Some(MetaType::Int64),
        D::Float16 | D::Float32 | D::Float64 => Some(MetaType::Float64),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => Some(MetaType::String),
        D::Dictionary(_, values) if matches!(**values, D::Utf8 | D::LargeUtf8 | D::Utf8View) => {
            Some(MetaType::String)
        }
        _ => None,
    }
}

/// The first null row of `array`, if any.
fn first_null(array: &dyn Array) -> Option<usize> {
    let nulls = array.logical_nulls()?;
    if nulls.null_count() == 0 {
        return None;
    }
    nulls.iter().position(|valid| !valid)
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int32Array, UInt64Array};
    use std::sync::Arc;

    use arrow_schema::Field;

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        let arrays = columns.into_iter().map(|(_, a)| a).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
    }

    fn payloads() -> ArrayRef {
        Arc::new(BinaryArray::from_vec(vec![b"a", b"", b"ccc"]))
    }

    #[test]
    fn rows_are_slices_and_values_in_column_order() {
        let b = batch(vec![
            ("label", Arc::new(Int32Array::from(vec![1, 2, 3]))),
            ("data", payloads()),
            ("split", Arc::new(StringArray::from(vec!["x", "y", "z"]))),
        ]);
        let schema = ColumnarSchema::new(&b.schema(), "data").unwrap();
        let names: Vec<_> = schema.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["label", "split"]);
        let rows = schema.rows(&b, 10).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows.payload(2), b"ccc");
        assert_eq!(rows.payload(1), b"");
        let mut values = Vec::new();
        rows.values_into(1, &mut values);
        assert_eq!(values, [MetaValue::Int(2), MetaValue::Str("y".into())]);
    }

    #[test]
    fn refusals_name_the_column_and_the_record() {
        let b = batch(vec![("data", payloads())]);
        let err = ColumnarSchema::new(&b.schema(), "payload").unwrap_err();
        assert!(matches!(err, Error::Source(_)), "{err:?}");
        assert!(
            err.to_string().contains("'payload' is not in the data"),
            "{err}"
        );

        let b = batch(vec![("data", Arc::new(StringArray::from(vec!["a"])))]);
        let err = ColumnarSchema::new(&b.schema(), "data").unwrap_err();
        assert!(err.to_string().contains("must be binary"), "{err}");

        let nulls: ArrayRef = Arc::new(BinaryArray::from(vec![Some(&b"a"[..]), None]));
        let b = batch(vec![("data", nulls)]);
        let schema = ColumnarSchema::new(&b.schema(), "data").unwrap();
        let err = schema.rows(&b, 5).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("record 6: the payload column 'data' is null"));

        let b = batch(vec![
            ("data", payloads()),
            (
                "n",
                Arc::new(UInt64Array::from(vec![0, u64::MAX, 1])) as ArrayRef,
            ),
        ]);
        let schema = ColumnarSchema::new(&b.schema(), "data").unwrap();
        let err = schema.rows(&b, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "record 1: metadata 'n' is an int outside the 64-bit signed range"
        );

        let b = batch(vec![
            ("data", payloads()),
            ("weight", Arc::new(Int32Array::from(vec![1, 2, 3]))),
        ]);
        let err = ColumnarSchema::new(&b.schema(), "data").unwrap_err();
        assert!(matches!(err, Error::Schema(_)), "{err:?}");
        assert!(err.to_string().contains("'weight' is reserved"), "{err}");
    }
}
