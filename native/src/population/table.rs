//! A stored population table (`<id>.arrow`, an Arrow IPC stream) mapped and
//! read in place: its arrays are views of the file.
//!
//! A table is stored in chunks: record batches of `BATCH_ROWS` rows each (the
//! last one shorter), written as the table streams in (`table_file.rs`), the
//! schema marked `dataset_rt.layout = chunks`. A store written before that
//! holds one record batch per table, the whole table; both are read alike
//! (one chunk of all the rows). A chunked file may leave the identity
//! columns out (`ids.rs`): they are put back from the rows file's keys,
//! which `Population::open` hands the table (`MappedTable::set_keys`).
//!
//! Mapping checks the file's structure and every buffer's extent, O(chunks):
//! a truncated or malformed file is refused at once. The values of a column
//! (offsets monotonic and in bounds, UTF-8) are checked in full the first time
//! the column is read (`MappedTable::column`), once per population, so that
//! serving draws from a 10^9-row population starts without reading it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_data::ArrayData;
use arrow_ipc::reader::StreamDecoder;
use arrow_schema::{Field, Schema, SchemaRef};

use super::ids::{self, IdColumn, Keys, LeftOut, IDS_KEY};
use super::BATCH_ROWS;
use crate::error::{Error, IoContext, Result};
use crate::os::mapped::MappedFile;

/// The schema metadata that marks a table stored in chunks.
pub const LAYOUT_KEY: &str = "dataset_rt.layout";
pub const CHUNKED: &str = "chunks";

/// A table as a sequence of record batches of equal length (all but the last):
/// the chunks of a mapped table, views of its file. Identity columns its file
/// leaves out (`ids.rs`) are made from the rows file's keys, a chunk at a time.
#[derive(Clone)]
pub struct Chunks {
    schema: SchemaRef,
    /// The chunks as stored: the columns the file holds.
    stored: Vec<RecordBatch>,
    /// Per column of `schema`: where its values are.
    sources: Vec<Source>,
    /// The identities of left-out columns (set when the population is opened
    /// with its rows file).
    keys: Option<Keys>,
    /// Rows of every chunk but the last.
    chunk_rows: usize,
    rows: usize,
}

/// Where a column's values are.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Column `n` of the stored chunks.
    Stored(usize),
    /// Left out of the file, made from the keys.
    Id(IdColumn),
}

impl From<RecordBatch> for Chunks {
    /// A table of one chunk.
    fn from(batch: RecordBatch) -> Self {
        let rows = batch.num_rows();
        Chunks {
            schema: batch.schema(),
            sources: (0..batch.num_columns()).map(Source::Stored).collect(),
            stored: vec![batch],
            keys: None,
            chunk_rows: rows.max(1),
            rows,
        }
    }
}

impl Chunks {
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    pub fn num_rows(&self) -> usize {
        self.rows
    }

    pub fn num_chunks(&self) -> usize {
        self.stored.len()
    }

    /// Chunk `i`, its left-out columns made from the keys.
    pub fn chunk(&self, i: usize) -> Result<RecordBatch> {
        let stored = &self.stored[i];
        let start = i * self.chunk_rows;
        let mut columns = Vec::with_capacity(self.sources.len());
        for (source, field) in self.sources.iter().zip(self.schema.fields()) {
            columns.push(match *source {
                Source::Stored(n) => stored.column(n).clone(),
                Source::Id(column) => {
                    let keys = self.keys.as_ref().ok_or_else(|| {
                        Error::internal("a table without its identities was read without its keys")
                    })?;
                    keys.values(column, start..start + stored.num_rows(), field.data_type())?
                }
            });
        }
        let options =
            arrow_array::RecordBatchOptions::new().with_row_count(Some(stored.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }

    /// The columns `names`, in that order, without a copy.
    pub fn project(&self, names: &[String]) -> Result<Chunks> {
        let mut indices = Vec::with_capacity(names.len());
        for name in names {
            let index = self.schema.index_of(name).map_err(|_| {
                let known: Vec<&str> = self
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect();
                Error::invalid(format!(
                    "unknown column '{name}'; the population's columns are [{}]",
                    known.join(", ")
                ))
            })?;
            if indices.contains(&index) {
                return Err(Error::invalid(format!(
                    "column '{name}' is named twice; name each column once"
                )));
            }
            indices.push(index);
        }
        Ok(Chunks {
            schema: Arc::new(self.schema.project(&indices)?),
            sources: indices.iter().map(|&i| self.sources[i]).collect(),
            ..self.clone()
        })
    }

    /// The whole table as one batch, in memory (tests and small tables).
    pub fn concat(&self) -> Result<RecordBatch> {
        let chunks = (0..self.num_chunks())
            .map(|i| self.chunk(i))
            .collect::<Result<Vec<_>>>()?;
        Ok(arrow_select::concat::concat_batches(&self.schema, &chunks)?)
    }

    /// The table in slices of at most `BATCH_ROWS` rows, made a chunk at a
    /// time, each slice's values checked in full before it is handed on
    /// (offsets in bounds, UTF-8): the way a mapped table leaves the engine
    /// for Python or Flight, reading nothing up front.
    pub fn checked_slices(
        self,
    ) -> impl Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>> + Send
    {
        let chunk_rows = self.chunk_rows;
        (0..self.num_chunks()).flat_map(move |i| {
            let start = i * chunk_rows;
            let slices: Vec<std::result::Result<RecordBatch, arrow_schema::ArrowError>> = match self
                .chunk(i)
            {
                Err(e) => vec![Err(arrow_schema::ArrowError::ExternalError(Box::new(e)))],
                Ok(chunk) => {
                    let rows = chunk.num_rows();
                    (0..rows)
                        .step_by(BATCH_ROWS)
                        .map(|at| checked(chunk.slice(at, BATCH_ROWS.min(rows - at)), start + at))
                        .collect()
                }
            };
            slices
        })
    }

    /// Column `i`'s stored chunks, or the identity it is made from.
    pub(super) fn column_parts(&self, i: usize) -> std::result::Result<Vec<ArrayData>, IdColumn> {
        match self.sources[i] {
            Source::Stored(n) => Ok(self.stored.iter().map(|b| b.column(n).to_data()).collect()),
            Source::Id(column) => Err(column),
        }
    }
}

/// `slice` (at row `at` of its table), its values checked in full.
fn checked(
    slice: RecordBatch,
    at: usize,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    for (column, field) in slice.columns().iter().zip(slice.schema().fields()) {
        column.to_data().validate_full().map_err(|e| {
            arrow_schema::ArrowError::InvalidArgumentError(format!(
                "the population's stored table is damaged at rows {at}.., column '{}': {e}",
                field.name()
            ))
        })?;
    }
    Ok(slice)
}

/// One column of a chunked table.
#[derive(Clone)]
pub struct ChunkedColumn {
    chunks: Vec<ArrayRef>,
    chunk_rows: usize,
    /// An identity column the file leaves out: made from the keys.
    identity: Option<(Keys, IdColumn, arrow_schema::DataType)>,
}

impl ChunkedColumn {
    /// The values at rows `rows` (each less than the table's length).
    pub fn take(&self, rows: &[u32]) -> Result<ArrayRef> {
        if let Some((keys, column, dtype)) = &self.identity {
            return keys.take(*column, rows, dtype);
        }
        if let [whole] = self.chunks.as_slice() {
            let indices = arrow_array::UInt32Array::from(rows.to_vec());
            let options = arrow_select::take::TakeOptions { check_bounds: true };
            return Ok(arrow_select::take::take(
                whole.as_ref(),
                &indices,
                Some(options),
            )?);
        }
        let mut indices = Vec::with_capacity(rows.len());
        for &row in rows {
            let (chunk, at) = (
                row as usize / self.chunk_rows,
                row as usize % self.chunk_rows,
            );
            if self.chunks.get(chunk).is_none_or(|c| at >= c.len()) {
                return Err(Error::internal(format!(
                    "row {row} is past the table's end"
                )));
            }
            indices.push((chunk, at));
        }
        // Only the chunks the rows are in (a 10^9-row table has 15,259).
        let mut used: Vec<usize> = indices.iter().map(|&(chunk, _)| chunk).collect();
        used.sort_unstable();
        used.dedup();
        for (chunk, _) in &mut indices {
            *chunk = used.binary_search(chunk).unwrap_or_default();
        }
        let chunks: Vec<&dyn Array> = used.iter().map(|&c| self.chunks[c].as_ref()).collect();
        Ok(arrow_select::interleave::interleave(&chunks, &indices)?)
    }
}

pub struct MappedTable {
    chunks: Chunks,
    /// Stored in chunks (else one batch, as stores were before).
    chunked: bool,
    left_out: Vec<LeftOut>,
    path: PathBuf,
    /// Per stored column: its values checked in full (or why they failed).
    checked: Vec<OnceLock<std::result::Result<(), String>>>,
    map: Arc<MappedFile>,
    /// The file as it was opened (`changed`).
    stamp: Opened,
}

/// A table file's identity and length: a cut or a replacement changes it; a
/// new modification time alone does not (the store marks a table stored
/// again as recent by its time, `PopulationStore::keep`).
type Opened = ((u64, u64), u64);

fn opened(stat: &std::fs::Metadata) -> Opened {
    let (dev, ino, _) = crate::storage::file_stamp(stat);
    ((dev, ino), stat.len())
}

impl MappedTable {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).at("cannot open", path)?;
        let damaged = |detail: String| Error::corrupt_population(path, detail);
        if file.metadata().at("cannot stat", path)?.len() == 0 {
            return Err(damaged("the file is empty".into()));
        }
        let stamp = opened(&file.metadata().at("cannot stat", path)?);
        let map = Arc::new(MappedFile::map(&file).at("cannot map", path)?);
        // Opening reads one message header per chunk (2 MiB apart at 32 bytes a
        // row). With the kernel's read-around each of those faults would read
        // the readahead window around it (8 MiB on some disks): the whole file,
        // O(rows), at every start. Random advice reads just the header's pages;
        // normal readahead returns for the scans and streams that follow.
        let _ = map.advise(memmap2::Advice::Random);
        let opened = Self::decode(path, &map, stamp);
        let _ = map.advise(memmap2::Advice::Normal);
        opened
    }

    fn decode(path: &Path, map: &Arc<MappedFile>, stamp: Opened) -> Result<Self> {
        let damaged = |detail: String| Error::corrupt_population(path, detail);
        let mut buffer = crate::storage::arrow_buffer(map, 0, map.len())
            .ok_or_else(|| damaged("cannot be mapped".into()))?;
        // SAFETY: the values are checked before they are read: the structure
        // below (every buffer inside the file), the values per column in
        // `column` / `checked_slices`. Skipping the decoder's full validation
        // keeps opening O(chunks) instead of a read of the whole file.
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
        let Some(first) = batches.first() else {
            return Err(damaged("the Arrow IPC stream holds no record batch".into()));
        };
        let stored = first.schema();
        let chunked = stored.metadata().get(LAYOUT_KEY).map(String::as_str) == Some(CHUNKED);
        if !chunked && batches.len() > 1 {
            return Err(damaged(format!(
                "the Arrow IPC stream holds {} record batches without the '{LAYOUT_KEY}: \
                 {CHUNKED}' mark; a population table is one batch or marked chunks",
                batches.len()
            )));
        }
        let chunk_rows = first.num_rows();
        let last = batches.len() - 1;
        for (i, batch) in batches.iter().enumerate() {
            let rows = batch.num_rows();
            if rows == 0 || (i < last && rows != chunk_rows) || rows > chunk_rows {
                return Err(damaged(format!(
                    "chunk {i} holds {rows} rows; every chunk but the last holds {chunk_rows} \
                     and none is empty"
                )));
            }
            for column in batch.columns() {
                column
                    .to_data()
                    .validate()
                    .map_err(|e| damaged(format!("a column's buffers do not fit: {e}")))?;
            }
        }
        let mut metadata = stored.metadata().clone();
        metadata.remove(LAYOUT_KEY);
        let left_out = match metadata.remove(IDS_KEY) {
            Some(value) if chunked => ids::parse(&value, stored.fields().len()).map_err(damaged)?,
            Some(_) => return Err(damaged(format!("'{IDS_KEY}' in a table of one batch"))),
            None => Vec::new(),
        };
        let mut fields: Vec<Field> = Vec::with_capacity(stored.fields().len() + left_out.len());
        let mut sources = Vec::with_capacity(fields.capacity());
        let mut next_stored = 0..stored.fields().len();
        for i in 0..stored.fields().len() + left_out.len() {
            match left_out.iter().find(|c| c.index == i) {
                Some(c) => {
                    fields.push(c.field());
                    sources.push(Source::Id(c.column));
                }
                None => {
                    let n = next_stored.next().unwrap_or_default();
                    fields.push(stored.field(n).clone());
                    sources.push(Source::Stored(n));
                }
            }
        }
        let schema = Arc::new(Schema::new(fields).with_metadata(metadata));
        let names: std::collections::HashSet<&String> =
            schema.fields().iter().map(|f| f.name()).collect();
        if names.len() != schema.fields().len() {
            return Err(damaged("a column name is used twice".into()));
        }
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        let checked = (0..stored.fields().len())
            .map(|_| OnceLock::new())
            .collect();
        Ok(MappedTable {
            chunks: Chunks {
                schema,
                stored: batches,
                sources,
                keys: None,
                chunk_rows,
                rows,
            },
            chunked,
            left_out,
            path: path.to_path_buf(),
            checked,
            map: map.clone(),
            stamp,
        })
    }

    /// The identity columns the file leaves out (`ids.rs`).
    pub fn left_out(&self) -> &[LeftOut] {
        &self.left_out
    }

    /// Give a table that leaves its identities out the keys they are made
    /// from (its population's rows file).
    pub fn set_keys(&mut self, keys: Keys) -> Result<()> {
        if keys.len() != self.num_rows() {
            return Err(Error::internal(format!(
                "a population's table has {} rows and its rows file {}",
                self.num_rows(),
                keys.len()
            )));
        }
        if !self.left_out.is_empty() {
            self.chunks.keys = Some(keys);
        }
        Ok(())
    }

    pub fn schema(&self) -> SchemaRef {
        self.chunks.schema()
    }

    pub fn num_rows(&self) -> usize {
        self.chunks.rows
    }

    /// Stored in chunks (hashed as its canonical stream, `table_id`), not as
    /// one batch (hashed as its bytes).
    pub fn is_chunked(&self) -> bool {
        self.chunked
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes, mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file, if a read found it cut short under its mapping.
    pub fn truncated(&self) -> Option<&Path> {
        self.map.truncated().then_some(self.path.as_path())
    }

    /// Whether the file on disk is no longer the one opened (one `stat`): cut
    /// or written over in place, replaced, or removed. A table's values are
    /// handed out as views of its mapping (a metadata stream), read after
    /// they leave the engine, so a changed file is opened again instead.
    pub fn changed(&self) -> bool {
        std::fs::metadata(&self.path).map_or(true, |m| opened(&m) != self.stamp)
    }

    /// Column `i`, its values checked in full on first use.
    pub fn column(&self, i: usize) -> Result<ChunkedColumn> {
        let n = match self.chunks.sources.get(i).copied() {
            Some(Source::Stored(n)) => n,
            Some(Source::Id(column)) => {
                let keys = self.chunks.keys.clone().ok_or_else(|| {
                    Error::internal("a table without its identities was read without its keys")
                })?;
                let dtype = self.schema().field(i).data_type().clone();
                return Ok(ChunkedColumn {
                    chunks: Vec::new(),
                    chunk_rows: self.chunks.chunk_rows,
                    identity: Some((keys, column, dtype)),
                });
            }
            None => return Err(Error::internal(format!("no column {i}"))),
        };
        let chunks: Vec<ArrayRef> = self
            .chunks
            .stored
            .iter()
            .map(|b| b.column(n).clone())
            .collect();
        let checked = self.checked[n].get_or_init(|| {
            chunks
                .iter()
                .try_for_each(|c| c.to_data().validate_full())
                .map_err(|e| e.to_string())
        });
        match checked {
            Ok(()) => Ok(ChunkedColumn {
                chunks,
                chunk_rows: self.chunks.chunk_rows,
                identity: None,
            }),
            Err(e) => Err(Error::corrupt_population(
                &self.path,
                format!("column '{}': {e}", self.schema().field(i).name()),
            )),
        }
    }

    /// The table, its values not checked yet (see `Chunks::checked_slices`).
    pub fn unchecked(&self) -> Chunks {
        self.chunks.clone()
    }

    /// The table, every stored column checked.
    pub fn checked(&self) -> Result<Chunks> {
        for (i, source) in self.chunks.sources.iter().enumerate() {
            if let Source::Stored(_) = source {
                self.column(i)?;
            }
        }
        Ok(self.chunks.clone())
    }

    /// The index of the column called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.chunks.schema.index_of(name).ok()
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {

    use arrow_array::{Float64Array, Int64Array, UInt64Array};

    use super::*;
    use crate::population::table_file::TableWriter;

    /// Pages of `path` in the page cache (`mincore` through a mapping of our own,
    /// which reads nothing).
    fn resident_pages(path: &Path) -> (usize, usize) {
        let map = MappedFile::map(&File::open(path).unwrap()).unwrap();
        let resident = crate::os::pages::resident(map.as_ptr() as usize, map.len());
        (resident, map.len().div_ceil(crate::os::mapped::page_size()))
    }

    #[test]
    fn opening_reads_the_chunk_headers_not_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            arrow_schema::Field::new("a", arrow_schema::DataType::UInt64, false),
            arrow_schema::Field::new("b", arrow_schema::DataType::UInt64, false),
            arrow_schema::Field::new("label", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("weight", arrow_schema::DataType::Float64, false),
        ]));
        let rows = BATCH_ROWS as u64;
        let chunk = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(UInt64Array::from_iter_values(0..rows)),
                Arc::new(UInt64Array::from_iter_values(0..rows)),
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(Float64Array::from(vec![1.0; rows as usize])),
            ],
        )
        .unwrap();
        let mut writer = TableWriter::create(dir.path(), &schema).unwrap();
        for _ in 0..32 {
            writer.append(&chunk).unwrap(); // 32 chunks of 2 MiB
        }
        // No identity columns: no keys to hash.
        let keys = crate::population::ids::KeysFile {
            path: dir.path().join("none"),
            rows: 0,
            cache_ids: Vec::new(),
        };
        let stored = writer.finish(&keys).unwrap();
        let path = stored.file.path().to_path_buf();
        let file = File::open(&path).unwrap();
        crate::os::files::evict_from_page_cache(&file);
        let (before, pages) = resident_pages(&path);
        if before > pages / 8 {
            eprintln!(
                "skipped: this file system keeps the file's pages cached ({before} of {pages})"
            );
            return;
        }
        let table = MappedTable::open(&path).unwrap();
        assert_eq!(table.num_rows(), 32 * BATCH_ROWS);
        let (after, pages) = resident_pages(&path);
        // A page or a few per chunk header; the kernel's read-around would
        // bring in its whole window (up to the file) around each one.
        assert!(
            after - before <= 32 * 8,
            "opening a table of 32 chunks brought {} of its {pages} pages into memory",
            after - before
        );
    }

    /// A projection keeps the rows and the named columns in the order named,
    /// and refuses an unknown or repeated name with the columns there are.
    #[test]
    fn a_projection_keeps_the_named_columns_in_their_order() {
        let schema = Arc::new(Schema::new(vec![
            arrow_schema::Field::new("cache_id", arrow_schema::DataType::UInt64, true),
            arrow_schema::Field::new("label", arrow_schema::DataType::Int64, true),
            arrow_schema::Field::new("weight", arrow_schema::DataType::Float64, true),
        ]));
        let part = |from: u64| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(UInt64Array::from_iter_values(from..from + 3)),
                    Arc::new(Int64Array::from_iter_values(from as i64..from as i64 + 3)),
                    Arc::new(Float64Array::from(vec![0.5; 3])),
                ],
            )
            .unwrap()
        };
        let chunks = Chunks {
            schema: schema.clone(),
            stored: vec![part(0), part(3)],
            sources: (0..3).map(Source::Stored).collect(),
            keys: None,
            chunk_rows: 3,
            rows: 6,
        };
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let projected = chunks.project(&names(&["weight", "cache_id"])).unwrap();
        assert_eq!(projected.num_rows(), 6);
        let whole = projected.concat().unwrap();
        assert_eq!(whole.schema().field(0).name(), "weight");
        assert_eq!(whole.schema().field(1).name(), "cache_id");
        let ids = whole
            .column(1)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap();
        assert_eq!(ids.values().to_vec(), vec![0, 1, 2, 3, 4, 5]);
        let refused = |names: Vec<String>| chunks.project(&names).err().unwrap().to_string();
        let unknown = refused(names(&["label", "nope"]));
        assert_eq!(
            unknown,
            "unknown column 'nope'; the population's columns are [cache_id, label, weight]"
        );
        let twice = refused(names(&["label", "label"]));
        assert!(twice.contains("'label' is named twice"), "{twice}");
    }
}
