//! The active population: the metadata table whose rows the stream draws from.
//!
//! A population is immutable once built. Building one validates the table
//! against the caches (see `validate.rs`); a rejected table changes nothing
//! because the caller only swaps in a population that was built successfully.

mod column_types;
mod store;
mod validate;

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch, UInt64Array};
use arrow_schema::{Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::sampling::AliasTable;
use crate::storage::CacheSet;

pub use store::{
    canonical, check_population_id, ActivationLock, ActivePopulation, PopulationStore,
};
pub use validate::validate_table;

pub struct Population {
    /// The table as supplied (or the default table), returned by `get_metadata`.
    table: RecordBatch,
    /// Per row: the position of its cache in the `CacheSet`.
    cache_index: Vec<u32>,
    sample_ids: Vec<u64>,
    /// Columns in canonical types (identities UInt64, stored columns as in the
    /// cache, weight Float64), used to assemble stream batches.
    canonical: Vec<(String, ArrayRef)>,
    alias: AliasTable,
}

impl Population {
    /// Every record of every cache once, weight 1.0. The columns are
    /// `cache_id`, `sample_id`, the stored columns by name (as dataset-rt 0.4.8
    /// ordered them), `weight`.
    pub fn full(caches: &CacheSet) -> Result<Self> {
        let total = caches.total_records() as usize;
        let mut cache_index = Vec::with_capacity(total);
        let mut sample_ids = Vec::with_capacity(total);
        let mut cache_ids = Vec::with_capacity(total);
        for (i, cache) in caches.caches().iter().enumerate() {
            cache_index.extend(std::iter::repeat_n(i as u32, cache.len() as usize));
            cache_ids.extend(std::iter::repeat_n(cache.cache_id(), cache.len() as usize));
            sample_ids.extend(0..cache.len());
        }
        let mut fields = vec![
            Field::new("cache_id", arrow_schema::DataType::UInt64, false),
            Field::new("sample_id", arrow_schema::DataType::UInt64, false),
        ];
        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(cache_ids)),
            Arc::new(UInt64Array::from(sample_ids.clone())),
        ];
        let mut stored: Vec<(usize, &crate::storage::ColumnSpec)> =
            caches.columns().iter().enumerate().collect();
        stored.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        for (k, spec) in stored {
            let parts: Vec<&dyn arrow_array::Array> = caches
                .caches()
                .iter()
                .map(|c| c.metadata().column(k + 1).as_ref())
                .collect();
            arrays.push(arrow_select::concat::concat(&parts)?);
            fields.push(Field::new(&spec.name, spec.dtype.arrow(), false));
        }
        arrays.push(Arc::new(Float64Array::from(vec![1.0; total])));
        fields.push(Field::new("weight", arrow_schema::DataType::Float64, false));
        let table = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?;
        let weights = vec![1.0; total];
        Self::assemble(caches, table, cache_index, sample_ids, &weights)
    }

    /// Validate `table` against `caches` and build a population from it.
    pub fn from_table(caches: &CacheSet, table: RecordBatch) -> Result<Self> {
        let checked = validate_table(caches, &table)?;
        Self::assemble(
            caches,
            table,
            checked.cache_index,
            checked.sample_ids,
            &checked.weights,
        )
    }

    fn assemble(
        caches: &CacheSet,
        table: RecordBatch,
        cache_index: Vec<u32>,
        sample_ids: Vec<u64>,
        weights: &[f64],
    ) -> Result<Self> {
        let alias = AliasTable::new(weights)?;
        let cache_ids: Vec<u64> = cache_index
            .iter()
            .map(|&i| caches.get(i).cache_id())
            .collect();
        let mut canonical: Vec<(String, ArrayRef)> = vec![
            ("cache_id".into(), Arc::new(UInt64Array::from(cache_ids))),
            (
                "sample_id".into(),
                Arc::new(UInt64Array::from(sample_ids.clone())),
            ),
        ];
        for spec in caches.columns() {
            let column = table
                .column_by_name(&spec.name)
                .ok_or_else(|| Error::population(format!("missing column '{}'", spec.name)))?;
            canonical.push((
                spec.name.clone(),
                arrow_cast::cast(column, &spec.dtype.arrow())?,
            ));
        }
        canonical.push((
            "weight".into(),
            Arc::new(Float64Array::from(weights.to_vec())),
        ));
        crate::prefetch::huge_pages(&cache_index);
        crate::prefetch::huge_pages(&sample_ids);
        Ok(Population {
            table,
            cache_index,
            sample_ids,
            canonical,
            alias,
        })
    }

    pub fn table(&self) -> &RecordBatch {
        &self.table
    }

    pub fn num_rows(&self) -> usize {
        self.cache_index.len()
    }

    pub fn alias(&self) -> &AliasTable {
        &self.alias
    }

    /// The record of population row `row`: (cache position, sample id).
    #[inline]
    pub fn record(&self, row: usize) -> (u32, u64) {
        (self.cache_index[row], self.sample_ids[row])
    }

    /// Ask for row `row`'s `record` ahead of reading it (`crate::prefetch`).
    #[inline]
    pub fn prefetch(&self, row: usize) {
        if let (Some(ci), Some(sid)) = (self.cache_index.get(row), self.sample_ids.get(row)) {
            crate::prefetch::prefetch_line(ci);
            crate::prefetch::prefetch_line(sid);
        }
    }

    /// A column for stream batches: canonical for identities, stored columns and
    /// `weight`, as supplied for extra columns.
    pub fn column(&self, name: &str) -> Option<(Field, ArrayRef)> {
        if let Some((_, array)) = self.canonical.iter().find(|(n, _)| n == name) {
            return Some((
                Field::new(name, array.data_type().clone(), false),
                array.clone(),
            ));
        }
        let schema = self.table.schema();
        let (i, field) = schema.column_with_name(name)?;
        Some((field.as_ref().clone(), self.table.column(i).clone()))
    }

    /// The names of the columns a stream may carry: everything in the table.
    pub fn column_names(&self) -> Vec<String> {
        self.table
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub fn schema(&self) -> SchemaRef {
        self.table.schema()
    }
}
