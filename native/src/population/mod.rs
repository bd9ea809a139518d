//! The active population: the metadata table whose rows the stream draws from.
//!
//! A population is immutable once built. Building one validates the table
//! against the caches (see `validate.rs`); a rejected table changes nothing
//! because the caller only swaps in a population that was built successfully.

mod column_types;
mod ids;
mod key;
mod remote;
mod rows;
mod scratch;
mod store;
mod table;
mod table_file;
mod table_id;
mod validate;
mod writer;

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::sampling::AliasTable;
use crate::storage::CacheSet;

pub use remote::ActivePopulation;
pub use rows::{caches_key, PopulationRows};
pub use scratch::{library_scratch_dir, TEMP_PREFIX};
pub use store::{ActivationLock, PopulationStore};
pub use table::{ChunkedColumn, Chunks, MappedTable};
pub use table_id::{canonical, table_id};
pub use validate::validate_table;
pub use writer::{write_population, PopulationWriter, WrittenPopulation};

/// Rows per batch of the default population as it is generated, and of a
/// population's table as it is read back.
pub const BATCH_ROWS: usize = 64 * 1024;

/// A population: its table (as supplied, canonical) and its rows file
/// (records, alias table), both mapped and read in place.
pub struct Population {
    table: MappedTable,
    rows: PopulationRows,
    /// The stored columns and the types the caches hold them in.
    stored: Vec<(String, DataType)>,
}

/// A column a stream carries, taken from the population's table by row and
/// cast to `cast` (a stored column's cache type, Float64 for the weight).
pub struct PopulationColumn {
    pub field: Field,
    column: ChunkedColumn,
    cast: Option<DataType>,
}

impl Population {
    /// Map a stored population: its table and rows files (O(1): see
    /// `MappedTable` and `PopulationRows`).
    pub fn open(table: &Path, rows: &Path, caches: &CacheSet) -> Result<Self> {
        let mut table = MappedTable::open(table)?;
        let rows = PopulationRows::open(rows, caches)?;
        table.set_keys(rows.keys(caches.cache_ids().into()))?;
        let stored = caches
            .columns()
            .iter()
            .map(|c| (c.name.clone(), c.dtype.arrow()))
            .collect();
        Ok(Population {
            table,
            rows,
            stored,
        })
    }

    /// Every record of every cache once, weight 1.0, in the library's
    /// scratch directory (`write_full`, `library_scratch_dir`).
    pub fn full(caches: &Arc<CacheSet>) -> Result<Self> {
        Self::write_full(caches, &library_scratch_dir()?)?.open_unnamed(caches)
    }

    /// `table` validated and opened as a population, in the library's
    /// scratch directory (`write_population` streams any number of batches).
    pub fn from_table(caches: &Arc<CacheSet>, table: RecordBatch) -> Result<Self> {
        write_population(caches.clone(), &library_scratch_dir()?, [Ok(table)])?.open_unnamed(caches)
    }

    /// Every record of every cache once, weight 1.0, written to `dir` batch
    /// by batch. The columns are `cache_id`, `sample_id`, the stored columns
    /// by name (as dataset-rt 0.4.8 ordered them), `weight`.
    pub fn write_full(caches: &Arc<CacheSet>, dir: &Path) -> Result<WrittenPopulation> {
        let mut fields = vec![
            Field::new("cache_id", DataType::UInt64, false),
            Field::new("sample_id", DataType::UInt64, false),
        ];
        let mut stored: Vec<(usize, &crate::storage::ColumnSpec)> =
            caches.columns().iter().enumerate().collect();
        stored.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        for (_, spec) in &stored {
            fields.push(Field::new(&spec.name, spec.dtype.arrow(), false));
        }
        fields.push(Field::new("weight", DataType::Float64, false));
        let schema = Arc::new(Schema::new(fields));
        let batches = caches.caches().iter().flat_map(|cache| {
            let len = cache.len() as usize;
            let schema = schema.clone();
            let stored = &stored;
            (0..len).step_by(BATCH_ROWS).map(move |start| {
                let n = BATCH_ROWS.min(len - start);
                let mut arrays: Vec<ArrayRef> = vec![
                    Arc::new(UInt64Array::from(vec![cache.cache_id(); n])),
                    Arc::new(UInt64Array::from_iter_values(
                        start as u64..(start + n) as u64,
                    )),
                ];
                for (k, _) in stored {
                    // A view of the cache's file: windows never cross its batches.
                    arrays.push(cache.metadata().column_slice(k + 1, start, n)?);
                }
                arrays.push(Arc::new(Float64Array::from(vec![1.0; n])));
                Ok(RecordBatch::try_new(schema.clone(), arrays)?)
            })
        });
        write_population(caches.clone(), dir, batches)
    }

    /// The table as supplied (canonical), its values checked; its arrays are
    /// views of the mapped file.
    pub fn table(&self) -> Result<Chunks> {
        self.table.checked()
    }

    /// The table, its values not checked yet: for `Chunks::checked_slices`,
    /// which checks each slice as it is read instead of the whole table.
    pub fn unchecked_table(&self) -> Chunks {
        self.table.unchecked()
    }

    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    pub fn alias(&self) -> &AliasTable {
        self.rows.alias()
    }

    /// Why the population's files cannot be served as read: a file a read
    /// found cut short under its mapping (its pages now read as zeros), or a
    /// page of the rows file that does not match its sum. Asked before a
    /// batch that read from them is handed out.
    pub fn damage(&self) -> Option<Error> {
        // Named by file (the population's id), not by the state volume's path.
        let named =
            |path: &Path| Path::new("populations").join(path.file_name().unwrap_or_default());
        if let Some(path) = self.rows.truncated().or_else(|| self.table.truncated()) {
            return Some(Error::corrupt_population(
                named(path),
                "the population's file was cut short while it was being read; the next \
                 request opens it again (and refuses it if it is still damaged)",
            ));
        }
        let detail = self.rows.damage()?;
        Some(Error::corrupt_population(named(self.rows.path()), detail))
    }

    /// The table in checked slices (`Chunks::checked_slices`; `table` is
    /// this population's table, projected as asked), for readers outside
    /// the engine (Python, a Flight stream) that read a slice's bytes after
    /// it is handed out: the population is checked before each slice and once
    /// after the last, so a file cut or changed while a reader read ends the
    /// stream with the damage instead of its end.
    pub fn table_slices(
        self: &Arc<Self>,
        table: Chunks,
    ) -> impl Iterator<Item = Result<RecordBatch>> + Send {
        let population = self.clone();
        let mut slices = table.checked_slices();
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let next = match population.served_damage() {
                Some(error) => Some(Err(error)),
                None => slices
                    .next()
                    .map(|slice| slice.map_err(Error::from))
                    .or_else(|| population.served_damage().map(Err)),
            };
            done = !matches!(next, Some(Ok(_)));
            next
        })
    }

    /// `damage`, or the table file changed on disk since it was mapped.
    fn served_damage(&self) -> Option<Error> {
        self.damage().or_else(|| {
            self.table.changed().then(|| {
                Error::corrupt_population(
                    Path::new("populations")
                        .join(self.table.path().file_name().unwrap_or_default()),
                    "the population's table file changed on disk while it was served; the \
                     next request opens it again (and refuses it if it is damaged)",
                )
            })
        })
    }

    /// Whether the population must be opened again: a read found one of its
    /// files cut short under its mapping, or its table file on disk is no
    /// longer the one mapped (one `stat`; its values leave the engine as
    /// views of the mapping, read after every check of ours).
    pub fn cut(&self) -> bool {
        self.rows.truncated().is_some() || self.table.truncated().is_some() || self.table.changed()
    }

    /// Whether the rows file on disk is no longer the one opened (one
    /// `stat`); its pages are then verified again (`PopulationRows::recheck`).
    pub fn recheck(&self) -> bool {
        self.rows.recheck()
    }

    /// Verify every page of the rows file not verified yet (a full read of
    /// the rest); the damage found, if any.
    pub fn verify_pages(&self) -> Option<Error> {
        self.rows.verify_pages();
        self.damage()
    }

    /// Whether every page of the rows file is verified (reads then check
    /// nothing): at once for a file this process wrote, else once read.
    pub fn pages_verified(&self) -> bool {
        self.rows.pages_verified()
    }

    /// The record of population row `row`: (cache position, sample id).
    #[inline]
    pub fn record(&self, row: usize) -> (u32, u64) {
        self.rows.record(row)
    }

    /// Ask for row `row`'s `record` ahead of reading it (`crate::os::prefetch`).
    #[inline]
    pub fn prefetch(&self, row: usize) {
        self.rows.prefetch(row)
    }

    /// Start reading the records of `rows` from the disk if the population's
    /// file is not in memory yet (`PopulationRows::read_ahead`).
    pub fn read_ahead(&self, rows: &[u32]) {
        self.rows.read_ahead(rows)
    }

    /// A column for stream batches: stored columns in their cache type,
    /// `weight` as Float64, extra columns as supplied.
    pub fn column(&self, name: &str) -> Result<Option<PopulationColumn>> {
        let Some(i) = self.table.index_of(name) else {
            return Ok(None);
        };
        let schema = self.table.schema();
        let column = self.table.column(i)?;
        // The weight as validated: Float64 (every accepted type widens
        // exactly); stored columns in their cache's type.
        let cast = match name {
            "weight" => Some(DataType::Float64),
            _ => self
                .stored
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone()),
        };
        let field = match &cast {
            Some(dtype) => Field::new(name, dtype.clone(), false),
            None => schema.field(i).clone(),
        };
        Ok(Some(PopulationColumn {
            field,
            column,
            cast,
        }))
    }

    /// The names of the columns a stream may carry: everything in the table.
    pub fn column_names(&self) -> Vec<String> {
        self.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub fn schema(&self) -> SchemaRef {
        self.table.schema()
    }
}

impl PopulationColumn {
    /// The column's values at population rows `rows`.
    pub fn take(&self, rows: &[u32]) -> Result<ArrayRef> {
        let taken = self.column.take(rows)?;
        match &self.cast {
            Some(dtype) if taken.data_type() != dtype => Ok(arrow_cast::cast(&taken, dtype)?),
            _ => Ok(taken),
        }
    }
}
