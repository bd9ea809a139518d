//! `MetadataOut`: `metadata.arrow` written as records are appended. The
//! stored columns are built one batch at a time (`METADATA_BATCH_ROWS` rows,
//! fewer when their values reach `METADATA_BATCH_BYTES`) and each batch goes
//! to the Arrow IPC file when it is full, hashed on its way, so a writer holds
//! one batch of metadata instead of the whole cache's (for 10^8 records of
//! one int column, 1.6 GB of columns were held to the end, then encoded into
//! a copy and that into a 1.6 GB buffer: 5.3 GB at the peak of an import).
//!
//! Readers take the file's batches as they lie (`storage::CacheMetadata`).
//! A cache of up to `METADATA_BATCH_ROWS` records has one batch, the file
//! earlier writers wrote for any number of records (docs/storage-format.md).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::hex64;
use super::manifest::FileEntry;
use super::schema::{ColumnBuilders, ColumnSpec, MetaValue};
use super::METADATA_FILE;
use crate::error::{Error, IoContext, Result};
use crate::hash::Xxh3;

/// Rows of one record batch of `metadata.arrow`: the population's
/// `BATCH_ROWS` (its windows of a cache's metadata are views of one batch),
/// and at 16 bytes a row (one int column) a batch of 1 MiB, built and encoded
/// while the next is read.
pub const METADATA_BATCH_ROWS: usize = 1 << 16;
/// A batch is also written once its values reach about this many bytes
/// (long strings), whatever its rows.
pub const METADATA_BATCH_BYTES: usize = 64 << 20;
/// The file's write buffer.
const BUFFER_BYTES: usize = 1 << 20;

/// Where the batches go: the file, its xxh3 and length computed as written.
struct Hashed {
    out: BufWriter<File>,
    hash: Xxh3,
    bytes: u64,
}

impl Write for Hashed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

pub(super) struct MetadataOut {
    path: PathBuf,
    columns: Vec<ColumnSpec>,
    schema: SchemaRef,
    builders: ColumnBuilders,
    /// Rows in `builders`, and about how many bytes their values take.
    pending: usize,
    pending_bytes: usize,
    /// Rows written to the file: the `sample_id` of the first pending row.
    written: u64,
    batch_rows: usize,
    batch_bytes: usize,
    /// `None` once finished.
    out: Option<FileWriter<Hashed>>,
}

impl MetadataOut {
    /// Create `dir/metadata.arrow` for `columns` (after `sample_id`), to be
    /// written a batch every `batch_rows` rows or `batch_bytes` bytes of values.
    pub(super) fn with_batches(
        dir: &Path,
        columns: &[ColumnSpec],
        batch_rows: usize,
        batch_bytes: usize,
    ) -> Result<Self> {
        let path = dir.join(METADATA_FILE);
        let mut fields = vec![Field::new("sample_id", DataType::UInt64, false)];
        fields.extend(
            columns
                .iter()
                .map(|c| Field::new(&c.name, c.dtype.arrow(), false)),
        );
        let schema = Arc::new(Schema::new(fields));
        let file = File::create(&path).at("cannot create", &path)?;
        let hashed = Hashed {
            out: BufWriter::with_capacity(BUFFER_BYTES, file),
            hash: Xxh3::new(),
            bytes: 0,
        };
        let out = FileWriter::try_new(hashed, &schema).map_err(|e| write_error(&path, e))?;
        let batch_rows = batch_rows.max(1);
        Ok(MetadataOut {
            builders: ColumnBuilders::new(columns),
            columns: columns.to_vec(),
            path,
            schema,
            pending: 0,
            pending_bytes: 0,
            written: 0,
            batch_rows,
            batch_bytes,
            out: Some(out),
        })
    }

    /// Append the next record's values (bound, in column order); writes a
    /// batch when it is full.
    pub(super) fn push(&mut self, values: &[MetaValue]) -> Result<()> {
        self.builders.push(values)?;
        self.pending += 1;
        self.pending_bytes += 8 + values.iter().map(value_bytes).sum::<usize>();
        if self.pending >= self.batch_rows || self.pending_bytes >= self.batch_bytes {
            // The next batch is likely as long: its builders never grow.
            self.write_batch(self.pending)?;
        }
        Ok(())
    }

    /// Write the pending rows as one record batch; the next one's builders
    /// have room for `capacity` rows.
    fn write_batch(&mut self, capacity: usize) -> Result<()> {
        let builders = std::mem::replace(
            &mut self.builders,
            ColumnBuilders::with_capacity(&self.columns, capacity),
        );
        let end = self.written + self.pending as u64;
        let mut arrays: Vec<ArrayRef> =
            vec![Arc::new(UInt64Array::from_iter_values(self.written..end))];
        arrays.extend(builders.finish());
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)?;
        let out = self.out.as_mut().ok_or_else(|| finished(&self.path))?;
        out.write(&batch).map_err(|e| write_error(&self.path, e))?;
        self.written = end;
        self.pending = 0;
        self.pending_bytes = 0;
        Ok(())
    }

    /// Write the last batch and the footer, fsync: the manifest's entry for the file.
    pub(super) fn finish(&mut self) -> Result<FileEntry> {
        if self.pending > 0 || self.written == 0 {
            self.write_batch(0)?;
        }
        let out = self.out.take().ok_or_else(|| finished(&self.path))?;
        let hashed = out.into_inner().map_err(|e| write_error(&self.path, e))?;
        let (hash, bytes) = (hashed.hash, hashed.bytes);
        let file = hashed
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .at("cannot write", &self.path)?;
        file.sync_all().at("cannot fsync", &self.path)?;
        Ok(FileEntry {
            file: METADATA_FILE.to_string(),
            bytes,
            xxh3: hex64(hash.digest()),
            records: None,
        })
    }
}

fn finished(path: &Path) -> Error {
    Error::internal(format!("{} is written already", path.display()))
}

/// About how many bytes `value` takes in its column.
fn value_bytes(value: &MetaValue) -> usize {
    match value {
        MetaValue::Int(_) | MetaValue::Float(_) => 8,
        MetaValue::Bool(_) => 1,
        MetaValue::Str(s) => 4 + s.len(),
    }
}

/// An Arrow error writing `path`, as the I/O error it usually is.
fn write_error(path: &Path, error: arrow_schema::ArrowError) -> Error {
    match error {
        arrow_schema::ArrowError::IoError(_, e) => Error::io("cannot write", path, e),
        other => Error::from(other),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt64Type};

    use super::*;
    use crate::hash::xxh3_64;
    use crate::storage::cache::fixture::label_split_columns;

    fn values(i: usize) -> Vec<MetaValue> {
        vec![
            MetaValue::Int(i as i64 * 3),
            MetaValue::Str("x".repeat(i % 5)),
        ]
    }

    /// Write `rows` rows; returns the file's entry, its bytes and its batches' rows.
    fn write(
        rows: usize,
        batch_rows: usize,
        batch_bytes: usize,
    ) -> (FileEntry, Vec<u8>, Vec<RecordBatch>) {
        let dir = tempfile::tempdir().unwrap();
        let mut out =
            MetadataOut::with_batches(dir.path(), &label_split_columns(), batch_rows, batch_bytes)
                .unwrap();
        for i in 0..rows {
            out.push(&values(i)).unwrap();
        }
        let entry = out.finish().unwrap();
        let bytes = std::fs::read(dir.path().join(METADATA_FILE)).unwrap();
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes.clone()), None)
                .unwrap();
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>().unwrap();
        (entry, bytes, batches)
    }

    #[test]
    fn batches_are_written_as_they_fill_and_the_entry_is_the_files() {
        let (entry, bytes, batches) = write(10, 4, usize::MAX);
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [4, 4, 2]
        );
        assert_eq!(entry.file, METADATA_FILE);
        assert_eq!(entry.bytes, bytes.len() as u64);
        assert_eq!(entry.xxh3, hex64(xxh3_64(&bytes)));
        let ids: Vec<u64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, (0..10).collect::<Vec<u64>>());
        let labels: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(labels, (0..10).map(|i| i * 3).collect::<Vec<i64>>());
        let splits: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                b.column(2)
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.unwrap().to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            splits,
            (0..10).map(|i| "x".repeat(i % 5)).collect::<Vec<_>>()
        );

        // Exactly full batches leave no empty one behind.
        let (_, _, batches) = write(8, 4, usize::MAX);
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [4, 4]
        );
    }

    #[test]
    fn long_values_close_a_batch_early_and_one_batch_is_the_one_batch_file() {
        // 8 bytes of sample_id + 8 of label + 4 of offset + up to 4 characters a row.
        let (_, _, batches) = write(10, 1000, 60);
        assert!(batches.len() > 2, "{} batches", batches.len());
        assert!(batches.iter().all(|b| b.num_rows() <= 3));

        // Up to a batch of rows, the file is the one a single batch makes.
        let (entry, bytes, batches) = write(10, 1000, usize::MAX);
        assert_eq!(batches.len(), 1);
        let mut single = Vec::new();
        let mut writer = FileWriter::try_new(&mut single, &batches[0].schema()).unwrap();
        writer.write(&batches[0]).unwrap();
        writer.finish().unwrap();
        drop(writer);
        assert_eq!(bytes, single);
        assert_eq!(entry.xxh3, hex64(xxh3_64(&single)));
    }
}
