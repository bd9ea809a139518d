//! `PopulationWriter`: a population validated, stored and hashed batch by
//! batch, with memory bounded by one batch.
//!
//! Each batch is validated as a table of its own (`validate_table`) and, if
//! it passes, written to the table's file (`table_file.rs`) and the rows
//! file (`rows.rs`). A batch that fails does not stop the count: the remaining
//! batches are still checked, so that the refusal names the first offending
//! row of the whole table and how many rows fail, as for a table validated
//! whole. Nothing is stored unless every row passes (`finish`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::ids::KeysFile;
use super::rows::RowsWriter;
use super::scratch::{naming_dir, ScratchFile};
use super::table_file::TableWriter;
use super::table_id::canonical;
use super::validate::{check_unique_columns, validate_table, EMPTY_TABLE};
use super::Population;
use crate::error::{Error, Result};
use crate::ids::PopulationId;
use crate::storage::CacheSet;

/// The first failing rows seen so far, merged over batches.
struct RowFailure {
    rank: usize,
    column: String,
    first_row: u64,
    count: u64,
    problem: String,
}

pub struct PopulationWriter {
    caches: Arc<CacheSet>,
    dir: PathBuf,
    /// The schema of the batches as supplied (every batch must have it).
    supplied: Option<SchemaRef>,
    table: Option<TableWriter>,
    rows: Option<RowsWriter>,
    count: u64,
    failure: Option<RowFailure>,
}

/// A population written to scratch files: its id and row count, ready to be
/// renamed into a store (`keep_in`) or opened where it lies (`open_unnamed`).
pub struct WrittenPopulation {
    pub id: PopulationId,
    pub rows: u64,
    table: ScratchFile,
    rows_file: ScratchFile,
}

impl PopulationWriter {
    /// A writer whose scratch files go to `dir` (the store's directory, so
    /// that keeping them is a rename).
    pub fn create(caches: Arc<CacheSet>, dir: &Path) -> Result<Self> {
        Ok(PopulationWriter {
            rows: Some(RowsWriter::create(dir)?),
            caches,
            dir: dir.to_path_buf(),
            supplied: None,
            table: None,
            count: 0,
            failure: None,
        })
    }

    /// Validate and write one batch. An error here is final (the table's
    /// shape, a write that failed); rows that fail are counted and reported
    /// by `finish`.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        match &self.supplied {
            None => {
                check_unique_columns(&batch.schema())?;
                self.supplied = Some(batch.schema());
            }
            Some(schema) if schema.fields() != batch.schema().fields() => {
                return Err(Error::population(format!(
                    "batch at row {} has the columns {:?}; every batch of a table must have \
                     the first batch's columns {:?}",
                    self.count,
                    field_list(&batch.schema()),
                    field_list(schema)
                )));
            }
            Some(_) => {}
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let offset = self.count;
        self.count += batch.num_rows() as u64;
        if self.count > u32::MAX as u64 {
            return Err(Error::population(format!(
                "the table has more than {} rows; a population holds at most {}",
                u32::MAX,
                u32::MAX
            )));
        }
        let validated = validate_table(&self.caches, batch);
        // Stored values read as zeros from a cut metadata file would be
        // compared as if they were the cache's (`os::mapped`).
        if crate::os::mapped::any_cut() {
            if let Some(error) = self.caches.truncation() {
                return Err(error);
            }
        }
        match validated {
            Ok(checked) if self.failure.is_none() => {
                let canonical = canonical(batch)?;
                if self.table.is_none() {
                    self.table = Some(TableWriter::create(&self.dir, &canonical.schema())?);
                }
                let (Some(table), Some(rows)) = (&mut self.table, &mut self.rows) else {
                    return Ok(());
                };
                let mut push_rows =
                    || rows.push(&checked.cache_index, &checked.sample_ids, &checked.weights);
                // A put is bound by its writes (page-cache copies): the table's
                // and the rows file's go on two threads for a batch of any size.
                if batch.num_rows() < PARALLEL_ROWS {
                    table.append(&canonical)?;
                    return push_rows();
                }
                std::thread::scope(|scope| {
                    let table = scope.spawn(|| table.append(&canonical));
                    let pushed = push_rows();
                    join(table).and(pushed)
                })
            }
            Ok(_) => Ok(()),
            Err(error) => self.fail(error, offset),
        }
    }

    /// Count a batch's failing rows; nothing more is written.
    fn fail(&mut self, error: Error, offset: u64) -> Result<()> {
        let Some((column, row, count, problem)) = error.row_failure() else {
            return Err(error);
        };
        self.table = None;
        self.rows = None;
        let rank = self.rank_of(column);
        match &mut self.failure {
            Some(seen) if seen.rank == rank && seen.column == column => seen.count += count,
            Some(seen) if seen.rank <= rank => {}
            _ => {
                self.failure = Some(RowFailure {
                    rank,
                    column: column.to_string(),
                    first_row: offset + row,
                    count,
                    problem: problem.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Where a column's checks come in `validate_table`: identities, the
    /// stored columns, the weight.
    fn rank_of(&self, column: &str) -> usize {
        let stored = self.caches.columns().iter().position(|c| c.name == column);
        match column {
            "cache_id" => 0,
            "sample_id" => 1,
            "weight" => usize::MAX,
            _ => 2 + stored.unwrap_or(usize::MAX - 3),
        }
    }

    /// The population, if every row passed: the table and its rows file in
    /// scratch files, complete and fsynced.
    pub fn finish(self) -> Result<WrittenPopulation> {
        if let Some(f) = self.failure {
            return Err(Error::population_rows(
                &f.column,
                f.first_row,
                f.count,
                &f.problem,
            ));
        }
        let (Some(table), Some(mut rows)) = (self.table, self.rows) else {
            return Err(Error::population(EMPTY_TABLE));
        };
        let caches = &self.caches;
        let keys = KeysFile {
            path: rows.flush_keys()?.to_path_buf(),
            rows: self.count as usize,
            cache_ids: caches.cache_ids(),
        };
        // The table's id (a read of its file and the keys) and the alias
        // table (built in place after the keys) are independent: two threads.
        let (table, rows_file) = std::thread::scope(|scope| {
            let table = scope.spawn(|| table.finish(&keys));
            let rows_file = rows.finish(caches);
            (join(table), rows_file)
        });
        // The rows file's error first: a refused alias table (weights whose
        // sum overflows) removes the file the hash may still be reading.
        let rows_file = rows_file?;
        let table = table?;
        Ok(WrittenPopulation {
            id: table.id,
            rows: self.count,
            table: table.file,
            rows_file,
        })
    }
}

impl WrittenPopulation {
    /// Rename the files to `table` and `rows` (the rows file first: a table
    /// is stored when its `.arrow` file is there).
    pub fn keep_as(self, table: &Path, rows: &Path) -> Result<()> {
        self.rows_file.keep_as(rows)?;
        self.table.keep_as(table)?;
        Ok(())
    }

    /// Open the population where its scratch files lie, then remove their
    /// names (the mappings keep the files): for the in-process library,
    /// whose populations are not stored.
    pub fn open_unnamed(self, caches: &CacheSet) -> Result<Population> {
        Population::open(self.table.path(), self.rows_file.path(), caches)
    }
}

/// Batches of at least this many rows are written on two threads.
const PARALLEL_ROWS: usize = 4096;

/// The result of a scoped thread; a panic in it becomes an internal error.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    handle
        .join()
        .unwrap_or_else(|_| Err(Error::internal("a population writer thread panicked")))
}

fn field_list(schema: &SchemaRef) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect()
}

/// Write `batches` as a population: the one streaming path of every put. A
/// full volume is named at `dir`, not at the scratch file that the failed
/// write removed (`scratch::naming_dir`).
pub fn write_population(
    caches: Arc<CacheSet>,
    dir: &Path,
    batches: impl IntoIterator<Item = Result<RecordBatch>>,
) -> Result<WrittenPopulation> {
    let written = (|| {
        let mut writer = PopulationWriter::create(caches, dir)?;
        for batch in batches {
            writer.push(&batch?)?;
        }
        writer.finish()
    })();
    written.map_err(|error| naming_dir(error, dir))
}
