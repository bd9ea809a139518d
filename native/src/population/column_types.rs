//! The rule for the column types of a population's identities and weight
//! (docs/storage-format.md, "Column types of a population"): every accepted
//! type gives exactly the values supplied, every cast that could change a value
//! is checked value by value or refused by its type, and each refusal names the
//! column, the type it has and the valid ones (or the first offending row).

use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Float64Type};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch};
use arrow_schema::DataType;

use crate::error::{Error, Result};

/// The types an identity column may have: every Arrow integer type, its values
/// checked one by one (docs/storage-format.md, "Column types of a population").
const IDENTITY_TYPES: &str = "Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32 or UInt64";

/// The types a weight column may have (the same section).
const WEIGHT_TYPES: &str = "Float16, Float32, Float64, or an integer type with values of at most \
                            2^53 = 9007199254740992 in magnitude";

/// The largest magnitude up to which Float64 holds every integer (pyarrow's
/// safe cast of integers to float64 has the same bound).
const EXACT_INTEGER_WEIGHT: u128 = 1 << 53;

/// For an encoded column, how to make it a plain one: encodings are not unpacked.
fn decode_hint(dtype: &DataType) -> &'static str {
    match dtype {
        DataType::Dictionary(..) | DataType::RunEndEncoded(..) => {
            "; the column is encoded: decode it to its value type first"
        }
        _ => "",
    }
}

/// `$scan(array)` with `array` the column downcast to its Arrow integer type,
/// or `$otherwise` when the column is not of an integer type.
macro_rules! match_integer {
    ($column:expr, $scan:ident, $otherwise:expr) => {{
        use arrow_array::types::*;
        let column = $column;
        match column.data_type() {
            DataType::Int8 => $scan(column.as_primitive::<Int8Type>()),
            DataType::Int16 => $scan(column.as_primitive::<Int16Type>()),
            DataType::Int32 => $scan(column.as_primitive::<Int32Type>()),
            DataType::Int64 => $scan(column.as_primitive::<Int64Type>()),
            DataType::UInt8 => $scan(column.as_primitive::<UInt8Type>()),
            DataType::UInt16 => $scan(column.as_primitive::<UInt16Type>()),
            DataType::UInt32 => $scan(column.as_primitive::<UInt32Type>()),
            DataType::UInt64 => $scan(column.as_primitive::<UInt64Type>()),
            _ => $otherwise,
        }
    }};
}

/// A column converted value by value: the converted values, and the rows whose
/// value the rule refused (how many, the first and its value).
struct Converted<V> {
    values: Vec<V>,
    refused: u64,
    first_refused: Option<(usize, i128)>,
}

impl<V> Converted<V> {
    /// Convert every value of a null-free integer column with `convert`, which
    /// returns `None` for a value that it cannot take without changing it.
    fn scan<T>(array: &PrimitiveArray<T>, convert: impl Fn(i128) -> Option<V>) -> Self
    where
        T: ArrowPrimitiveType,
        T::Native: Into<i128>,
    {
        let mut values = Vec::with_capacity(array.len());
        let mut refused = 0u64;
        let mut first_refused = None;
        for (row, &v) in array.values().iter().enumerate() {
            let v: i128 = v.into();
            match convert(v) {
                Some(converted) => values.push(converted),
                None => {
                    refused += 1;
                    first_refused.get_or_insert((row, v));
                }
            }
        }
        Converted {
            values,
            refused,
            first_refused,
        }
    }
}

/// An identity column as u64 values. Every integer type is accepted, each value
/// checked: a negative value (or null) is refused, never wrapped or dropped.
/// Anything else (floats, decimals, strings, booleans, dictionary-encoded
/// integers) is refused by its type.
pub(super) fn identity_column(table: &RecordBatch, name: &str) -> Result<Vec<u64>> {
    let column = table
        .column_by_name(name)
        .ok_or_else(|| Error::population(format!("samples metadata missing '{name}' column")))?;
    let refuse_type = || {
        Error::population_column(
            name,
            format!(
                "samples metadata column '{name}' must be an integer: it is {}; identities are \
                 {IDENTITY_TYPES} with non-negative values (get_metadata returns them as \
                 UInt64){}",
                column.data_type(),
                decode_hint(column.data_type())
            ),
        )
    };
    if !column.data_type().is_integer() {
        return Err(refuse_type());
    }
    reject_nulls(name, column, "identities must be set")?;
    fn to_u64<T>(array: &PrimitiveArray<T>) -> Converted<u64>
    where
        T: ArrowPrimitiveType,
        T::Native: Into<i128>,
    {
        Converted::scan(array, |v| u64::try_from(v).ok())
    }
    let converted = match_integer!(column, to_u64, return Err(refuse_type()));
    if let Some((row, value)) = converted.first_refused {
        return Err(Error::population_rows(
            name,
            row as u64,
            converted.refused,
            &format!(
                "samples metadata column '{name}' must be non-negative: it holds {value}; \
                 identities are unsigned 64-bit integers"
            ),
        ));
    }
    Ok(converted.values)
}

/// Refuse null cells; `rule` says why values are needed.
pub(super) fn reject_nulls(name: &str, column: &ArrayRef, rule: &str) -> Result<()> {
    if column.null_count() == 0 {
        return Ok(());
    }
    let first = (0..column.len()).find(|&i| column.is_null(i)).unwrap_or(0);
    Err(Error::population_rows(
        name,
        first as u64,
        column.null_count() as u64,
        &format!("samples metadata column '{name}' contains null; {rule}"),
    ))
}

/// The weights as f64, exactly as supplied: floats widen (Float16 and Float32
/// to Float64 lose nothing), integers are taken only up to 2^53 in magnitude,
/// where Float64 holds every integer (checked value by value). Anything else is
/// refused by its type.
pub(super) fn weight_column(table: &RecordBatch) -> Result<Vec<f64>> {
    let column = table
        .column_by_name("weight")
        .ok_or_else(|| Error::population("samples metadata missing 'weight' column"))?;
    let refuse_type = || {
        Error::population_column(
            "weight",
            format!(
                "samples metadata column 'weight' must be numeric: it is {}; weights are \
                 {WEIGHT_TYPES}, finite and > 0 (cast the column to Float64){}",
                column.data_type(),
                decode_hint(column.data_type())
            ),
        )
    };
    if !(column.data_type().is_floating() || column.data_type().is_integer()) {
        return Err(refuse_type());
    }
    reject_nulls("weight", column, "weights must be finite and > 0")?;
    fn to_f64<T>(array: &PrimitiveArray<T>) -> Converted<f64>
    where
        T: ArrowPrimitiveType,
        T::Native: Into<i128>,
    {
        Converted::scan(array, |v| {
            (v.unsigned_abs() <= EXACT_INTEGER_WEIGHT).then_some(v as f64)
        })
    }
    let values: Vec<f64> = match column.data_type() {
        DataType::Float64 => column.as_primitive::<Float64Type>().values().to_vec(),
        DataType::Float32 => {
            let array = column.as_primitive::<Float32Type>();
            array.values().iter().map(|&w| f64::from(w)).collect()
        }
        DataType::Float16 => {
            let array = column.as_primitive::<Float16Type>();
            array.values().iter().map(|w| w.to_f64()).collect()
        }
        _ => {
            let converted = match_integer!(column, to_f64, return Err(refuse_type()));
            if let Some((row, value)) = converted.first_refused {
                return Err(Error::population_rows(
                    "weight",
                    row as u64,
                    converted.refused,
                    &format!(
                        "samples metadata column 'weight' holds {value}, past 2^53 = \
                         9007199254740992 in magnitude, where Float64 no longer holds every \
                         integer: integer weights must be within 2^53 (cast the column to \
                         Float64 yourself if rounding is acceptable)"
                    ),
                ));
            }
            converted.values
        }
    };
    let mut bad = 0u64;
    let mut first: Option<(usize, f64)> = None;
    for (row, &w) in values.iter().enumerate() {
        if !(w.is_finite() && w > 0.0) {
            bad += 1;
            first.get_or_insert((row, w));
        }
    }
    if let Some((row, w)) = first {
        let kind = if w.is_nan() {
            "NaN".to_string()
        } else if w.is_infinite() {
            format!("{w}")
        } else if w == 0.0 {
            "zero".to_string()
        } else {
            format!("negative ({w})")
        };
        return Err(Error::population_rows(
            "weight",
            row as u64,
            bad,
            &format!(
                "samples metadata column 'weight' must be positive and finite: weight is {kind} \
                 (weights must be finite and > 0)"
            ),
        ));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    //! The rule of docs/storage-format.md, "Column types of a population": each
    //! accepted type gives exactly the values supplied, each refused type is
    //! refused naming the column and the valid types, and a value that would
    //! change in conversion is refused naming its row.

    use std::num::NonZeroU64;
    use std::sync::Arc;

    use arrow_array::types::*;
    use arrow_array::{
        BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float32Array, Float64Array,
        Int32Array, Int64Array, Int8Array, NullArray, StringArray, UInt64Array,
    };
    use arrow_schema::{Field, Schema};
    use proptest::prelude::*;

    use super::*;
    use crate::population::validate_table;
    use crate::storage::{
        CacheSet, CacheWriter, ColumnSpec, EncodedRecord, MetaType, MetaValue, WriterOptions,
    };

    /// A one-column table.
    fn table(name: &str, column: ArrayRef) -> RecordBatch {
        let field = Field::new(name, column.data_type().clone(), true);
        RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![column]).unwrap()
    }

    fn identities(column: ArrayRef) -> Result<Vec<u64>> {
        identity_column(&table("sample_id", column), "sample_id")
    }

    fn weights(column: ArrayRef) -> Result<Vec<f64>> {
        weight_column(&table("weight", column))
    }

    /// (column, first row, count, message) of a population error.
    fn refusal<T>(result: Result<T>) -> (String, Option<u64>, Option<u64>, String) {
        match result {
            Err(Error::InvalidPopulation {
                column,
                first_row,
                count,
                message,
            }) => (column.unwrap(), first_row, count, message),
            Err(other) => panic!("expected an invalid population, got {other}"),
            Ok(_) => panic!("expected an invalid population, the table was accepted"),
        }
    }

    /// A refusal by type: names the column, the type it has, and the valid types.
    fn assert_type_refused<T>(result: Result<T>, column: &str, valid: &str) {
        let (name, row, count, message) = refusal(result);
        assert_eq!(
            (name.as_str(), row, count),
            (column, None, None),
            "{message}"
        );
        assert!(message.contains(&format!("'{column}'")), "{message}");
        assert!(message.contains(valid), "{message}");
    }

    /// A Float16 column of `values` (rounded to the nearest half).
    fn halves(values: &[f32]) -> ArrayRef {
        arrow_cast::cast(&Float32Array::from(values.to_vec()), &DataType::Float16).unwrap()
    }

    fn dictionary<V: ArrowPrimitiveType>(values: PrimitiveArray<V>) -> ArrayRef {
        let keys = Int32Array::from((0..values.len() as i32).collect::<Vec<_>>());
        Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap())
    }

    /// Columns of every type the rule refuses for both identities and weights.
    fn neither_identity_nor_weight() -> Vec<ArrayRef> {
        vec![
            Arc::new(BooleanArray::from(vec![true, false])),
            Arc::new(StringArray::from(vec!["1", "2"])),
            Arc::new(arrow_array::LargeStringArray::from(vec!["1", "2"])),
            Arc::new(
                Decimal128Array::from(vec![1, 2])
                    .with_precision_and_scale(20, 0)
                    .unwrap(),
            ),
            Arc::new(Date32Array::from(vec![1, 2])),
            Arc::new(NullArray::new(2)),
            dictionary(UInt64Array::from(vec![1, 2])),
            dictionary(Float64Array::from(vec![1.0, 2.0])),
        ]
    }

    #[test]
    fn encoded_columns_are_refused_saying_to_decode_them() {
        let encoded = dictionary(UInt64Array::from(vec![1, 2]));
        let (_, _, _, message) = refusal(identities(encoded.clone()));
        assert!(message.contains("decode it"), "{message}");
        let (_, _, _, message) = refusal(weights(encoded));
        assert!(message.contains("decode it"), "{message}");
        let (_, _, _, message) = refusal(weights(Arc::new(StringArray::from(vec!["1"]))));
        assert!(!message.contains("decode it"), "{message}");
    }

    // -- identities -------------------------------------------------------------

    /// The Arrow integer types, each with the largest value it holds.
    const INTEGER_TYPES: [(DataType, u64); 8] = [
        (DataType::Int8, i8::MAX as u64),
        (DataType::Int16, i16::MAX as u64),
        (DataType::Int32, i32::MAX as u64),
        (DataType::Int64, i64::MAX as u64),
        (DataType::UInt8, u8::MAX as u64),
        (DataType::UInt16, u16::MAX as u64),
        (DataType::UInt32, u32::MAX as u64),
        (DataType::UInt64, u64::MAX),
    ];

    #[test]
    fn identities_of_every_integer_type_are_the_values_supplied() {
        for (dtype, max) in INTEGER_TYPES {
            let supplied = vec![0, 1, 7, 100, max];
            let column = arrow_cast::cast(&UInt64Array::from(supplied.clone()), &dtype).unwrap();
            assert_eq!(column.data_type(), &dtype);
            assert_eq!(identities(column).unwrap(), supplied, "{dtype}");
        }
    }

    #[test]
    fn negative_identities_are_refused_naming_the_first_row_and_count() {
        let column = Arc::new(Int8Array::from(vec![0, 1, -1, 3, 4, i8::MIN]));
        let (name, row, count, message) = refusal(identities(column));
        assert_eq!((name.as_str(), row, count), ("sample_id", Some(2), Some(2)));
        assert!(message.contains("must be non-negative"), "{message}");
        assert!(message.contains("holds -1"), "{message}");
        let column = Arc::new(Int64Array::from(vec![i64::MIN]));
        let (_, row, count, message) = refusal(identities(column));
        assert_eq!((row, count), (Some(0), Some(1)));
        assert!(message.contains(&i64::MIN.to_string()), "{message}");
    }

    #[test]
    fn null_identities_are_refused() {
        let column = Arc::new(Int32Array::from(vec![Some(0), None, Some(2), None]));
        let (_, row, count, message) = refusal(identities(column));
        assert_eq!((row, count), (Some(1), Some(2)));
        assert!(message.contains("null"), "{message}");
    }

    #[test]
    fn identities_of_other_types_are_refused_naming_the_valid_ones() {
        let floats: Vec<ArrayRef> = vec![
            halves(&[1.0]),
            Arc::new(Float32Array::from(vec![1.0])),
            Arc::new(Float64Array::from(vec![1.0])),
        ];
        for column in floats.into_iter().chain(neither_identity_nor_weight()) {
            let dtype = column.data_type().to_string();
            let (_, _, _, message) = refusal(identities(column.clone()));
            assert!(message.contains(&dtype), "{message}");
            assert!(message.contains("must be an integer"), "{message}");
            assert_type_refused(identities(column), "sample_id", IDENTITY_TYPES);
        }
    }

    // -- weights ----------------------------------------------------------------

    #[test]
    fn float_weights_widen_to_the_values_supplied() {
        let column = halves(&[0.5, 1.0, 3.25, 65504.0, 6.0e-8]);
        let expected: Vec<f64> = (column.as_primitive::<Float16Type>().values().iter())
            .map(|h| h.to_f64())
            .collect();
        assert_eq!(expected[..4], [0.5, 1.0, 3.25, 65504.0]);
        assert_eq!(weights(column).unwrap(), expected);
        let singles = vec![0.1f32, 1.0, f32::MAX, f32::MIN_POSITIVE];
        let expected: Vec<f64> = singles.iter().map(|&w| f64::from(w)).collect();
        assert_eq!(
            weights(Arc::new(Float32Array::from(singles))).unwrap(),
            expected
        );
        let doubles = vec![0.1, 1e300, f64::MIN_POSITIVE];
        assert_eq!(
            weights(Arc::new(Float64Array::from(doubles.clone()))).unwrap(),
            doubles
        );
    }

    #[test]
    fn integer_weights_up_to_2_pow_53_are_accepted() {
        for (dtype, max) in INTEGER_TYPES {
            let max = max.min(1 << 53);
            let supplied = vec![1, 2, 100, max];
            let column = arrow_cast::cast(&UInt64Array::from(supplied.clone()), &dtype).unwrap();
            let expected: Vec<f64> = supplied.iter().map(|&w| w as f64).collect();
            assert_eq!(weights(column).unwrap(), expected, "{dtype}");
        }
        let edge = weights(Arc::new(Int64Array::from(vec![(1 << 53) - 1, 1 << 53]))).unwrap();
        assert_eq!(edge, [9007199254740991.0, 9007199254740992.0]);
    }

    #[test]
    fn integer_weights_past_2_pow_53_are_refused() {
        // 2^53 + 1 would round; 2^60 would not, but past 2^53 the rule is by range.
        let column = Int64Array::from(vec![1, (1 << 53) + 1, 2, 1 << 60, i64::MIN]);
        let (name, row, count, message) = refusal(weights(Arc::new(column)));
        assert_eq!((name.as_str(), row, count), ("weight", Some(1), Some(3)));
        assert!(message.contains("holds 9007199254740993"), "{message}");
        assert!(message.contains("2^53"), "{message}");
        let column = UInt64Array::from(vec![1, u64::MAX]);
        let (_, row, count, message) = refusal(weights(Arc::new(column)));
        assert_eq!((row, count), (Some(1), Some(1)));
        assert!(message.contains(&u64::MAX.to_string()), "{message}");
    }

    #[test]
    fn weights_of_other_types_are_refused_naming_the_valid_ones() {
        for column in neither_identity_nor_weight() {
            let dtype = column.data_type().to_string();
            let (_, _, _, message) = refusal(weights(column.clone()));
            assert!(message.contains(&dtype), "{message}");
            assert!(message.contains("must be numeric"), "{message}");
            assert_type_refused(weights(column), "weight", WEIGHT_TYPES);
        }
    }

    #[test]
    fn integer_and_half_weights_still_must_be_positive() {
        let column = Int32Array::from(vec![1, 0, -3]);
        let (_, row, count, message) = refusal(weights(Arc::new(column)));
        assert_eq!((row, count), (Some(1), Some(2)));
        assert!(message.contains("zero"), "{message}");
        let (_, row, count, message) = refusal(weights(halves(&[1.0, f32::NAN])));
        assert_eq!((row, count), (Some(1), Some(1)));
        assert!(message.contains("NaN"), "{message}");
    }

    proptest! {
        #[test]
        fn an_accepted_identity_column_is_the_values_supplied(
            values in prop::collection::vec(prop_oneof![0i64..1000, any::<i64>()], 1..64),
        ) {
            let negative: Vec<usize> = (0..values.len()).filter(|&i| values[i] < 0).collect();
            let result = identities(Arc::new(Int64Array::from(values.clone())));
            if let Some(&first) = negative.first() {
                let (_, row, count, _) = refusal(result);
                prop_assert_eq!((row, count), (Some(first as u64), Some(negative.len() as u64)));
            } else {
                let expected: Vec<u64> = values.iter().map(|&v| v as u64).collect();
                prop_assert_eq!(result.unwrap(), expected);
            }
        }

        #[test]
        fn an_accepted_integer_weight_column_is_the_values_supplied(
            values in prop::collection::vec(
                prop_oneof![1i64..1 << 20, (1i64 << 52)..(1 << 54), any::<i64>()],
                1..64,
            ),
        ) {
            let fits = |v: i64| v.unsigned_abs() <= 1 << 53;
            let past: Vec<usize> = (0..values.len()).filter(|&i| !fits(values[i])).collect();
            let result = weights(Arc::new(Int64Array::from(values.clone())));
            if let Some(&first) = past.first() {
                let (_, row, count, _) = refusal(result);
                prop_assert_eq!((row, count), (Some(first as u64), Some(past.len() as u64)));
            } else if values.iter().all(|&v| v > 0) {
                let back: Vec<i64> = result.unwrap().iter().map(|&w| w as i64).collect();
                prop_assert_eq!(back, values);
            } else {
                prop_assert!(result.is_err());
            }
        }

        #[test]
        fn an_accepted_float32_weight_column_is_the_values_supplied(
            values in prop::collection::vec(f32::MIN_POSITIVE..f32::MAX, 1..64),
        ) {
            let accepted = weights(Arc::new(Float32Array::from(values.clone()))).unwrap();
            let back: Vec<f32> = accepted.iter().map(|&w| w as f32).collect();
            prop_assert_eq!(back, values);
        }
    }

    // -- through validate_table -------------------------------------------------

    #[test]
    fn a_table_of_narrow_identities_and_integer_weights_validates_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let columns = vec![ColumnSpec {
            name: "label".into(),
            dtype: MetaType::Int64,
        }];
        let options = WriterOptions {
            max_shard_bytes: NonZeroU64::new(1 << 20).unwrap(),
            ..WriterOptions::default()
        };
        let mut writer = CacheWriter::create(dir.path(), "c", columns, options).unwrap();
        for i in 0..4 {
            let record = EncodedRecord::encode(vec![i as u8], options.compression).unwrap();
            writer.append(&record, &[MetaValue::Int(i)]).unwrap();
        }
        let path = writer.finish().unwrap().0;
        let caches = CacheSet::open(&[path], true).unwrap();
        let cache_id = caches.cache_ids()[0];
        let rows = [3i32, 0, 3, 1];
        let schema = Schema::new(vec![
            Field::new("cache_id", DataType::UInt64, false),
            Field::new("sample_id", DataType::Int32, false),
            Field::new("label", DataType::Int64, false),
            Field::new("weight", DataType::Int64, false),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(vec![cache_id; 4])),
            Arc::new(Int32Array::from(rows.to_vec())),
            Arc::new(Int64Array::from(
                rows.iter().map(|&r| i64::from(r)).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(vec![1, 2, 1 << 53, 5])),
        ];
        let batch = RecordBatch::try_new(Arc::new(schema.clone()), columns.clone()).unwrap();
        let checked = validate_table(&caches, &batch).unwrap();
        assert_eq!(checked.sample_ids, [3, 0, 3, 1]);
        assert_eq!(checked.weights, [1.0, 2.0, 9007199254740992.0, 5.0]);

        // One weight past 2^53 (Float64 would round it): the table is refused.
        let mut columns = columns;
        columns[3] = Arc::new(Int64Array::from(vec![1, 2, (1 << 53) + 1, 5]));
        let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
        let (name, row, count, _) = refusal(validate_table(&caches, &batch));
        assert_eq!((name.as_str(), row, count), ("weight", Some(2), Some(1)));
    }
}
