//! `TableWriter`: a population's canonical table written as it streams in,
//! once, to the file it is stored in.
//!
//! The file is an Arrow IPC stream of chunks: record batches of `BATCH_ROWS`
//! rows (the last one shorter), the schema marked as chunked (`table.rs`).
//! Batches as supplied are cut and joined into chunks as they arrive, so that
//! a chunk's rows are found by division. The identity columns are left out:
//! the rows file holds them (`ids.rs`). The id is computed from the file and
//! the rows file's keys once both are complete (`table_id.rs`): the same id
//! as the table written whole, whatever the batching.

use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;

use super::ids::{self, KeysFile, IDS_KEY};
use super::scratch::ScratchFile;
use super::table::{MappedTable, CHUNKED, LAYOUT_KEY};
use super::table_id::table_id;
use super::BATCH_ROWS;
use crate::error::{Error, IoContext, Result};
use crate::ids::PopulationId;
use crate::storage::DirectWriter;

pub struct TableWriter {
    file: ScratchFile,
    /// Around the page cache where the file system allows it: a population
    /// of 10^9 rows with one stored column writes 16 GB here, which would otherwise evict the page
    /// cache it is served from (`storage::direct`).
    out: StreamWriter<DirectWriter>,
    /// The canonical schema without the identity columns, marked as chunked
    /// and naming them.
    schema: SchemaRef,
    /// The canonical schema's columns the file holds.
    stored: Vec<usize>,
    /// Rows of the next chunk, not written yet (fewer than `BATCH_ROWS`).
    pending: Vec<RecordBatch>,
    pending_rows: usize,
}

/// The stored table: its id and its complete file.
pub struct StoredTable {
    pub id: PopulationId,
    pub file: ScratchFile,
}

impl TableWriter {
    /// Write tables of the canonical `schema` (`store::canonical`) into `dir`.
    pub fn create(dir: &Path, schema: &SchemaRef) -> Result<Self> {
        let file = ScratchFile::create(dir)?;
        let mut metadata = schema.metadata().clone();
        metadata.insert(LAYOUT_KEY.to_string(), CHUNKED.to_string());
        let left_out = ids::left_out(schema);
        if !left_out.is_empty() {
            metadata.insert(IDS_KEY.to_string(), ids::describe(&left_out));
        }
        let stored: Vec<usize> = (0..schema.fields().len())
            .filter(|i| left_out.iter().all(|c| c.index != *i))
            .collect();
        let schema = Arc::new(schema.project(&stored)?.with_metadata(metadata));
        let out = DirectWriter::new(file.file()?, None).at("cannot write", file.path())?;
        let out = written(StreamWriter::try_new(out, &schema), file.path())?;
        Ok(TableWriter {
            file,
            out,
            schema,
            stored,
            pending: Vec::new(),
            pending_rows: 0,
        })
    }

    /// Append a canonical batch of the schema this writer was created with.
    pub fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = batch.project(&self.stored)?;
        let rows = batch.num_rows();
        let mut at = 0;
        while at < rows {
            let take = (BATCH_ROWS - self.pending_rows).min(rows - at);
            self.pending.push(batch.slice(at, take));
            self.pending_rows += take;
            at += take;
            if self.pending_rows == BATCH_ROWS {
                self.write_chunk()?;
            }
        }
        Ok(())
    }

    fn write_chunk(&mut self) -> Result<()> {
        let chunk = match self.pending.as_slice() {
            [one] => one.clone(),
            parts => arrow_select::concat::concat_batches(&parts[0].schema(), parts)?,
        };
        let chunk = RecordBatch::try_new(self.schema.clone(), chunk.columns().to_vec())?;
        written(self.out.write(&chunk), self.file.path())?;
        self.pending.clear();
        self.pending_rows = 0;
        Ok(())
    }

    /// Complete the file (fsynced) and compute its id, with the identities
    /// made from `keys` (the rows file written beside it, its keys flushed).
    pub fn finish(mut self, keys: &KeysFile) -> Result<StoredTable> {
        if self.pending_rows > 0 {
            self.write_chunk()?;
        }
        let path = self.file.path().to_path_buf();
        written(self.out.finish(), &path)?;
        let (file, _) = written(self.out.into_inner(), &path)?
            .finish()
            .at("cannot write", &path)?;
        file.sync_all().at("cannot fsync", &path)?;
        let id = table_id(&MappedTable::open(&path)?, Some(keys))?;
        Ok(StoredTable {
            id,
            file: self.file,
        })
    }
}

/// A write's result, an I/O failure as the file's (so that a full volume is
/// `StorageFull`, as for every other file the engine writes).
fn written<T>(result: std::result::Result<T, arrow_schema::ArrowError>, path: &Path) -> Result<T> {
    match result {
        Ok(value) => Ok(value),
        Err(arrow_schema::ArrowError::IoError(_, e)) => Err(Error::io("cannot write", path, e)),
        Err(other) => Err(other.into()),
    }
}
