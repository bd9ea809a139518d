//! Metadata schemas: the first record of a source fixes the column names, their
//! order and their types; every later record must match.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::ArrayRef;
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Column names the population table uses for its own columns.
pub const RESERVED_COLUMNS: [&str; 5] = ["cache_id", "sample_id", "weight", "position", "payload"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetaType {
    Int64,
    Float64,
    Bool,
    String,
}

impl MetaType {
    pub fn arrow(self) -> DataType {
        match self {
            MetaType::Int64 => DataType::Int64,
            MetaType::Float64 => DataType::Float64,
            MetaType::Bool => DataType::Boolean,
            MetaType::String => DataType::Utf8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MetaType::Int64 => "int",
            MetaType::Float64 => "float",
            MetaType::Bool => "bool",
            MetaType::String => "str",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    pub name: String,
    pub dtype: MetaType,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::Int(_) => MetaType::Int64,
            MetaValue::Float(_) => MetaType::Float64,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::Str(_) => MetaType::String,
        }
    }

    /// Feed the value into the cache identity hash, with a type tag so that
    /// `1` and `1.0` and `"1"` hash differently.
    pub fn hash_into(&self, hasher: &mut crate::hash::Xxh3) {
        match self {
            MetaValue::Int(v) => {
                hasher.update(&[1]);
                hasher.update(&v.to_le_bytes());
            }
            MetaValue::Float(v) => {
                hasher.update(&[2]);
                hasher.update(&v.to_bits().to_le_bytes());
            }
            MetaValue::Bool(v) => hasher.update(&[3, u8::from(*v)]),
            MetaValue::Str(v) => {
                hasher.update(&[4]);
                hasher.update(&(v.len() as u64).to_le_bytes());
                hasher.update(v.as_bytes());
            }
        }
    }
}

/// Fixes a source's schema from its first record and checks the others.
#[derive(Debug, Default)]
pub struct SchemaBinder {
    columns: Vec<ColumnSpec>,
    positions: HashMap<String, usize>,
}

impl SchemaBinder {
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Fix the schema from the first record's `(key, value)` pairs.
    pub fn from_first(fields: &[(String, MetaValue)]) -> Result<Self> {
        Self::from_columns(
            fields
                .iter()
                .map(|(name, value)| ColumnSpec {
                    name: name.clone(),
                    dtype: value.meta_type(),
                })
                .collect(),
        )
    }

    /// Fix the schema from its columns (a columnar source's, which carries
    /// its types): the same rules on names as `from_first`.
    pub fn from_columns(columns: Vec<ColumnSpec>) -> Result<Self> {
        let mut binder = SchemaBinder::default();
        for ColumnSpec { name, dtype } in columns {
            let name = &name;
            if RESERVED_COLUMNS.contains(&name.as_str()) {
                return Err(Error::Schema(format!(
                    "record 0: metadata key '{name}' is reserved (reserved keys: {}): the \
                     population table and the stream already have a column of that name; rename \
                     the key (for example 'source_{name}')",
                    RESERVED_COLUMNS.join(", ")
                )));
            }
            if name.is_empty() {
                return Err(Error::Schema(
                    "record 0: metadata keys must be non-empty".into(),
                ));
            }
            if binder.positions.contains_key(name) {
                return Err(Error::Schema(format!(
                    "record 0: metadata key '{name}' appears twice; metadata keys must be unique"
                )));
            }
            binder.positions.insert(name.clone(), binder.columns.len());
            binder.columns.push(ColumnSpec {
                name: name.clone(),
                dtype,
            });
        }
        Ok(binder)
    }

    /// Order `fields` by the schema, checking names and types. An int is accepted
    /// in a float column (converted); nothing else is converted.
    pub fn bind(&self, record: u64, fields: Vec<(String, MetaValue)>) -> Result<Vec<MetaValue>> {
        let mut slots: Vec<Option<MetaValue>> = vec![None; self.columns.len()];
        for (name, value) in fields {
            let Some(&at) = self.positions.get(&name) else {
                return Err(Error::Schema(format!(
                    "record {record}: unexpected metadata key '{name}'; every record of a source \
                     must have the keys of the first record: [{}]",
                    self.key_list()
                )));
            };
            let expected = self.columns[at].dtype;
            let value = match (expected, value) {
                (MetaType::Float64, MetaValue::Int(i)) => MetaValue::Float(i as f64),
                (_, v) if v.meta_type() == expected => v,
                (_, v) => {
                    return Err(Error::Schema(format!(
                        "record {record}: metadata key '{name}' is {} but the first record made \
                         it {}",
                        v.meta_type().name(),
                        expected.name()
                    )))
                }
            };
            if slots[at].replace(value).is_some() {
                return Err(Error::Schema(format!(
                    "record {record}: metadata key '{name}' appears twice; metadata keys must \
                     be unique"
                )));
            }
        }
        slots
            .into_iter()
            .enumerate()
            .map(|(at, v)| {
                v.ok_or_else(|| {
                    Error::Schema(format!(
                        "record {record}: metadata key '{}' is missing; every record of a source \
                         must have the keys of the first record: [{}]",
                        self.columns[at].name,
                        self.key_list()
                    ))
                })
            })
            .collect()
    }

    fn key_list(&self) -> String {
        self.columns
            .iter()
            .map(|c| format!("'{}'", c.name))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Arrow builders for the stored columns of one cache.
pub struct ColumnBuilders {
    builders: Vec<TypedBuilder>,
}

enum TypedBuilder {
    Int(Int64Builder),
    Float(Float64Builder),
    Bool(BooleanBuilder),
    Str(StringBuilder),
}

impl ColumnBuilders {
    pub fn new(columns: &[ColumnSpec]) -> Self {
        Self::with_capacity(columns, 0)
    }

    /// Builders with room for `rows` values each (strings: their offsets).
    pub fn with_capacity(columns: &[ColumnSpec], rows: usize) -> Self {
        let builders = columns
            .iter()
            .map(|c| match c.dtype {
                MetaType::Int64 => TypedBuilder::Int(Int64Builder::with_capacity(rows)),
                MetaType::Float64 => TypedBuilder::Float(Float64Builder::with_capacity(rows)),
                MetaType::Bool => TypedBuilder::Bool(BooleanBuilder::with_capacity(rows)),
                MetaType::String => TypedBuilder::Str(StringBuilder::with_capacity(rows, 0)),
            })
            .collect();
        ColumnBuilders { builders }
    }

    /// Append one bound record (values in schema order, types already checked).
    pub fn push(&mut self, values: &[MetaValue]) -> Result<()> {
        for (builder, value) in self.builders.iter_mut().zip(values) {
            match (builder, value) {
                (TypedBuilder::Int(b), MetaValue::Int(v)) => b.append_value(*v),
                (TypedBuilder::Float(b), MetaValue::Float(v)) => b.append_value(*v),
                (TypedBuilder::Bool(b), MetaValue::Bool(v)) => b.append_value(*v),
                (TypedBuilder::Str(b), MetaValue::Str(v)) => b.append_value(v),
                _ => {
                    return Err(Error::Schema(
                        "a value does not match its column type".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    pub fn finish(self) -> Vec<ArrayRef> {
        self.builders
            .into_iter()
            .map(|b| -> ArrayRef {
                match b {
                    TypedBuilder::Int(mut b) => Arc::new(b.finish()),
                    TypedBuilder::Float(mut b) => Arc::new(b.finish()),
                    TypedBuilder::Bool(mut b) => Arc::new(b.finish()),
                    TypedBuilder::Str(mut b) => Arc::new(b.finish()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pairs: &[(&str, MetaValue)]) -> Vec<(String, MetaValue)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn binds_in_schema_order_and_promotes_ints_to_floats() {
        let b = SchemaBinder::from_first(&rec(&[
            ("label", MetaValue::Int(1)),
            ("score", MetaValue::Float(0.5)),
        ]))
        .unwrap();
        let bound = b
            .bind(
                1,
                rec(&[("score", MetaValue::Int(2)), ("label", MetaValue::Int(3))]),
            )
            .unwrap();
        assert_eq!(bound, vec![MetaValue::Int(3), MetaValue::Float(2.0)]);
    }

    #[test]
    fn rejects_missing_extra_retyped_and_reserved_keys() {
        let b = SchemaBinder::from_first(&rec(&[("label", MetaValue::Int(1))])).unwrap();
        assert!(b.bind(1, rec(&[])).is_err());
        assert!(b
            .bind(
                1,
                rec(&[("label", MetaValue::Int(1)), ("x", MetaValue::Int(1))])
            )
            .is_err());
        let err = b
            .bind(5, rec(&[("label", MetaValue::Str("a".into()))]))
            .unwrap_err();
        assert!(err.to_string().contains("record 5"), "{err}");
        assert!(SchemaBinder::from_first(&rec(&[("weight", MetaValue::Int(1))])).is_err());
    }

    #[test]
    fn rejects_duplicate_keys() {
        let twice = rec(&[("label", MetaValue::Int(1)), ("label", MetaValue::Int(2))]);
        let err = SchemaBinder::from_first(&twice).unwrap_err();
        assert!(err.to_string().contains("'label' appears twice"), "{err}");
        let b = SchemaBinder::from_first(&rec(&[("label", MetaValue::Int(1))])).unwrap();
        let err = b.bind(3, twice).unwrap_err();
        assert!(
            err.to_string()
                .contains("record 3: metadata key 'label' appears twice"),
            "{err}"
        );
    }
}
