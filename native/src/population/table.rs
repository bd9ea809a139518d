//! A stored population table (`<id>.arrow`, one record batch of an Arrow IPC
//! stream) mapped and read in place: its arrays are views of the file.
//!
//! Mapping checks the file's structure and every buffer's extent, O(columns):
//! a truncated or malformed file is refused at once. The values of a column
//! (offsets monotonic and in bounds, UTF-8) are checked in full the first time
//! the column is read (`MappedTable::column`), once per population, so that
//! serving draws from a 10^9-row population starts without reading it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_ipc::reader::StreamDecoder;
use arrow_schema::SchemaRef;

use crate::error::{Error, IoContext, Result};
use crate::storage::mapped::MappedFile;

pub struct MappedTable {
    table: RecordBatch,
    path: PathBuf,
    /// Per column: its values checked in full (or why they failed).
    checked: Vec<OnceLock<std::result::Result<(), String>>>,
    map: Arc<MappedFile>,
}

impl MappedTable {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).at("cannot open", path)?;
        let damaged = |detail: String| Error::corrupt(path, detail);
        if file.metadata().at("cannot stat", path)?.len() == 0 {
            return Err(damaged("the file is empty".into()));
        }
        let map = Arc::new(MappedFile::map(&file).at("cannot map", path)?);
        let mut buffer = crate::storage::arrow_buffer(&map, 0, map.len())
            .ok_or_else(|| damaged("cannot be mapped".into()))?;
        // SAFETY: the values are checked before they are read: the structure
        // below (every buffer inside the file), the values per column in
        // `column` / `checked_table`. Skipping the decoder's full validation
        // keeps opening O(columns) instead of a read of the whole file.
        let mut decoder = unsafe { StreamDecoder::new().with_skip_validation(true) };
        let mut batches = Vec::new();
        while !buffer.is_empty() {
            // arrow-ipc trusts a message's buffer offsets and panics on one
            // past the body; the file is not hashed when it is opened (that is
            // `verify`), so a damaged one must end here as an error.
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                decoder.decode(&mut buffer)
            }));
            match decoded {
                Ok(Ok(Some(batch))) => batches.push(batch),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => return Err(damaged(format!("not an Arrow IPC stream: {e}"))),
                Err(_) => return Err(damaged("a message's buffers lie outside it".into())),
            }
        }
        decoder
            .finish()
            .map_err(|e| damaged(format!("the Arrow IPC stream is cut short: {e}")))?;
        let table = match batches.len() {
            1 => batches.remove(0),
            0 => return Err(damaged("the Arrow IPC stream holds no record batch".into())),
            _ => {
                // Not written by this engine: checked in full and joined.
                for batch in &batches {
                    for column in batch.columns() {
                        column
                            .to_data()
                            .validate_full()
                            .map_err(|e| damaged(e.to_string()))?;
                    }
                }
                let schema = batches[0].schema();
                arrow_select::concat::concat_batches(&schema, &batches)?
            }
        };
        for column in table.columns() {
            column
                .to_data()
                .validate()
                .map_err(|e| damaged(format!("a column's buffers do not fit: {e}")))?;
        }
        let checked = (0..table.num_columns()).map(|_| OnceLock::new()).collect();
        Ok(MappedTable {
            table,
            path: path.to_path_buf(),
            checked,
            map,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    pub fn num_rows(&self) -> usize {
        self.table.num_rows()
    }

    /// The file, if a read found it cut short under its mapping.
    pub fn truncated(&self) -> Option<&Path> {
        self.map.truncated().then_some(self.path.as_path())
    }

    /// Column `i`, its values checked in full on first use.
    pub fn column(&self, i: usize) -> Result<ArrayRef> {
        let column = self
            .table
            .columns()
            .get(i)
            .ok_or_else(|| Error::internal(format!("no column {i}")))?;
        let checked = self.checked[i]
            .get_or_init(|| column.to_data().validate_full().map_err(|e| e.to_string()));
        match checked {
            Ok(()) => Ok(column.clone()),
            Err(e) => Err(Error::corrupt(
                &self.path,
                format!("column '{}': {e}", self.table.schema().field(i).name()),
            )),
        }
    }

    /// The whole table, its values not checked yet (see `checked_slices`).
    pub fn unchecked(&self) -> RecordBatch {
        self.table.clone()
    }

    /// The whole table, every column checked.
    pub fn checked_table(&self) -> Result<RecordBatch> {
        for i in 0..self.table.num_columns() {
            self.column(i)?;
        }
        Ok(self.table.clone())
    }

    /// The index of the column called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.table.schema().index_of(name).ok()
    }
}

/// `table` in slices of `BATCH_ROWS` rows, without a copy, each slice's values
/// checked in full before it is handed on (offsets in bounds, UTF-8): the way
/// a mapped table leaves the engine for Python or Flight, reading nothing up
/// front.
pub fn checked_slices(
    table: RecordBatch,
) -> impl Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>> + Send {
    let rows = table.num_rows();
    (0..rows).step_by(super::BATCH_ROWS).map(move |start| {
        let slice = table.slice(start, super::BATCH_ROWS.min(rows - start));
        for (column, field) in slice.columns().iter().zip(slice.schema().fields()) {
            column.to_data().validate_full().map_err(|e| {
                arrow_schema::ArrowError::InvalidArgumentError(format!(
                    "the population's stored table is damaged at rows {start}.., column '{}': \
                     {e}",
                    field.name()
                ))
            })?;
        }
        Ok(slice)
    })
}
