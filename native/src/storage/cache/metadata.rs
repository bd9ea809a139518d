//! `metadata.arrow`: the Arrow IPC file of `sample_id` and the stored
//! metadata columns, decoded without a copy from its mapping (every block
//! checked to lie inside the file) and checked against the manifest: its
//! column names and types, its row count, no nulls.
//!
//! The file holds one record batch or several (the writer writes one every
//! 2^16 records, `storage::metadata_out`); `CacheMetadata` reads them where
//! they lie, by row, instead of concatenating them into one copy.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{new_empty_array, Array, ArrayAccessor, ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;

use super::checked::map_checked;
use crate::error::{Error, Result};
use crate::os::mapped::MappedFile;
use crate::storage::manifest::Manifest;
use crate::storage::METADATA_FILE;

/// `sample_id` followed by the stored columns of one cache, one row per
/// record: the record batches of `metadata.arrow`, views of its mapping.
#[derive(Debug, Clone)]
pub struct CacheMetadata {
    schema: SchemaRef,
    /// The file's batches that have rows, in order.
    batches: Vec<RecordBatch>,
    /// The first row of each batch.
    starts: Vec<usize>,
    num_rows: usize,
    /// The rows of every batch but the last, when they all have as many (and
    /// the last no more): a row's batch is then a division away.
    uniform: Option<usize>,
}

impl CacheMetadata {
    /// The rows of `batches` (each of `schema`), in order.
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<Self> {
        if let Some(other) = batches.iter().find(|b| b.schema() != schema) {
            return Err(Error::internal(format!(
                "a metadata batch has the schema {:?}, not {:?}",
                other.schema(),
                schema
            )));
        }
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let mut starts = Vec::with_capacity(batches.len());
        let mut num_rows = 0;
        for batch in &batches {
            starts.push(num_rows);
            num_rows += batch.num_rows();
        }
        let uniform = batches.split_last().and_then(|(last, others)| {
            let rows = others.first().unwrap_or(last).num_rows();
            let same = others.iter().all(|b| b.num_rows() == rows);
            (same && last.num_rows() <= rows).then_some(rows)
        });
        Ok(CacheMetadata {
            schema,
            batches,
            starts,
            num_rows,
            uniform,
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    pub fn num_columns(&self) -> usize {
        self.schema.fields().len()
    }

    /// The record batches, as the file holds them (those with rows).
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The batch that holds `row`, and the row's position in it.
    pub fn batch_of(&self, row: usize) -> Option<(&RecordBatch, usize)> {
        let (batch, at) = self.locate(row)?;
        Some((&self.batches[batch], at))
    }

    /// Rows `start..start + len` of column `k`: a view of the file when they
    /// lie in one batch, concatenated (copied) when they cross batches.
    pub fn column_slice(&self, k: usize, start: usize, len: usize) -> Result<ArrayRef> {
        let out_of_range = || {
            Error::internal(format!(
                "metadata rows {start}..+{len} of column {k}: the cache has {} rows and {} \
                 columns",
                self.num_rows,
                self.num_columns()
            ))
        };
        let field = self.schema.fields().get(k).ok_or_else(out_of_range)?;
        let end = start
            .checked_add(len)
            .filter(|&end| end <= self.num_rows)
            .ok_or_else(out_of_range)?;
        if len == 0 {
            return Ok(new_empty_array(field.data_type()));
        }
        let (first, at) = self.locate(start).ok_or_else(out_of_range)?;
        if at + len <= self.batches[first].num_rows() {
            return Ok(self.batches[first].column(k).slice(at, len));
        }
        let mut pieces: Vec<ArrayRef> = Vec::new();
        for (batch, &batch_start) in self.batches.iter().zip(&self.starts).skip(first) {
            if batch_start >= end {
                break;
            }
            let from = start.max(batch_start) - batch_start;
            let to = end.min(batch_start + batch.num_rows()) - batch_start;
            pieces.push(batch.column(k).slice(from, to - from));
        }
        let pieces: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
        Ok(arrow_select::concat::concat(&pieces)?)
    }

    /// Column `k` as arrays of type `A` (one per batch), to read by row:
    /// an error when the column is not of that type.
    pub fn typed<A: Array + 'static>(&self, k: usize) -> Result<TypedColumn<'_, A>> {
        let chunks = self
            .batches
            .iter()
            .map(|b| {
                b.columns()
                    .get(k)
                    .and_then(|c| c.as_any().downcast_ref::<A>())
            })
            .collect::<Option<Vec<&A>>>()
            .ok_or_else(|| {
                Error::internal(format!(
                    "metadata column {k} is not a {}",
                    std::any::type_name::<A>()
                ))
            })?;
        Ok(TypedColumn {
            metadata: self,
            chunks,
        })
    }

    /// `row`'s batch and its position there (None past the end).
    fn locate(&self, row: usize) -> Option<(usize, usize)> {
        if row >= self.num_rows {
            return None;
        }
        let batch = match self.uniform {
            Some(rows) => row / rows,
            None => self.starts.partition_point(|&s| s <= row) - 1,
        };
        Some((batch, row - self.starts[batch]))
    }
}

/// One column of a `CacheMetadata`, typed, read by row.
pub struct TypedColumn<'a, A> {
    metadata: &'a CacheMetadata,
    chunks: Vec<&'a A>,
}

impl<'a, A> TypedColumn<'a, A>
where
    &'a A: ArrayAccessor,
{
    /// The value of `row`. Panics past the end, as `Array::value` does.
    pub fn value(&self, row: usize) -> <&'a A as ArrayAccessor>::Item {
        let (batch, at) = self
            .metadata
            .locate(row)
            .unwrap_or((self.chunks.len(), row));
        self.chunks[batch].value(at)
    }
}

/// `dir/metadata.arrow` as views of its mapping, which is returned with it
/// (to tell, later, whether it was cut under a read).
pub(super) fn read_metadata(
    dir: &Path,
    manifest: &Manifest,
) -> Result<(CacheMetadata, Arc<MappedFile>)> {
    let path = dir.join(METADATA_FILE);
    let corrupt = |detail: String| Error::corrupt(&path, detail);
    let map = map_checked(dir, &manifest.metadata, METADATA_FILE)?
        .ok_or_else(|| corrupt("the file is empty; it holds an Arrow IPC file".into()))?;
    let buffer = crate::storage::arrow_buffer(&map, 0, map.len())
        .ok_or_else(|| corrupt("cannot be mapped".into()))?;
    // The arrays are views of the mapped file, batch by batch.
    let (schema, batches) = decode_ipc_file(&buffer)
        .map_err(|e| corrupt(format!("not a valid Arrow IPC file: {e}")))?;
    let fields = schema.fields();
    let expected_names: Vec<&str> = std::iter::once("sample_id")
        .chain(manifest.columns.iter().map(|c| c.name.as_str()))
        .collect();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    if names != expected_names {
        return Err(corrupt(format!(
            "columns {names:?} differ from the manifest's {expected_names:?}"
        )));
    }
    for (field, spec) in fields.iter().skip(1).zip(&manifest.columns) {
        if field.data_type() != &spec.dtype.arrow() {
            return Err(corrupt(format!(
                "column '{}' is {}, the manifest says {}",
                spec.name,
                field.data_type(),
                spec.dtype.arrow()
            )));
        }
    }
    let metadata = CacheMetadata::new(schema, batches)?;
    if metadata.num_rows() as u64 != manifest.record_count {
        return Err(corrupt(format!(
            "{} rows, the manifest says {} records",
            metadata.num_rows(),
            manifest.record_count
        )));
    }
    let nulls = metadata.batches().iter().flat_map(|b| b.columns());
    if nulls.into_iter().any(|c| c.null_count() > 0) {
        return Err(corrupt(
            "contains nulls; stored metadata is never null".into(),
        ));
    }
    Ok((metadata, map))
}

/// The schema and record batches of an Arrow IPC file held in `buffer`,
/// decoded without a copy; every block is checked to lie inside the buffer.
fn decode_ipc_file(
    buffer: &arrow_buffer::Buffer,
) -> std::result::Result<(arrow_schema::SchemaRef, Vec<RecordBatch>), String> {
    use arrow_ipc::reader::{read_footer_length, FileDecoder};
    let len = buffer.len();
    let trailer: [u8; 10] = buffer
        .get(len.saturating_sub(10)..)
        .and_then(|t| t.try_into().ok())
        .ok_or("shorter than an Arrow IPC file's trailer")?;
    let footer_len = read_footer_length(trailer).map_err(|e| e.to_string())?;
    let start = (len - 10)
        .checked_sub(footer_len)
        .ok_or("the footer is longer than the file")?;
    let footer = arrow_ipc::root_as_footer(&buffer[start..len - 10]).map_err(|e| e.to_string())?;
    let schema = Arc::new(
        arrow_ipc::convert::try_fb_to_schema(footer.schema().ok_or("the footer has no schema")?)
            .map_err(|e| e.to_string())?,
    );
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let block_data = |block: &arrow_ipc::Block| {
        let offset = usize::try_from(block.offset()).ok()?;
        let block_len = usize::try_from(block.bodyLength()).ok()?
            + usize::try_from(block.metaDataLength()).ok()?;
        (offset.checked_add(block_len)? <= len).then(|| buffer.slice_with_length(offset, block_len))
    };
    for block in footer.dictionaries().into_iter().flatten() {
        let data = block_data(block).ok_or("a dictionary block lies outside the file")?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| e.to_string())?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().into_iter().flatten() {
        let data = block_data(block).ok_or("a record batch lies outside the file")?;
        if let Some(batch) = decoder
            .read_record_batch(block, &data)
            .map_err(|e| e.to_string())?
        {
            batches.push(batch);
        }
    }
    if batches.is_empty() {
        return Err("the file holds no record batch".into());
    }
    Ok((schema, batches))
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::UInt64Array;
    use arrow_buffer::Buffer;
    use arrow_ipc::writer::FileWriter;
    use arrow_schema::{DataType, Field, Schema};

    use super::super::fixture;
    use super::*;
    use crate::storage::{Codec, MetaType};

    /// An Arrow IPC file of `batches` batches of one `sample_id` column.
    fn ipc_file(batches: u64) -> Vec<u8> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "sample_id",
            DataType::UInt64,
            false,
        )]));
        let mut writer = FileWriter::try_new(Vec::new(), &schema).unwrap();
        for b in 0..batches {
            let ids = UInt64Array::from(vec![2 * b, 2 * b + 1]);
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).unwrap();
            writer.write(&batch).unwrap();
        }
        writer.into_inner().unwrap()
    }

    #[test]
    fn an_ipc_file_decodes_in_place_and_a_damaged_one_says_why() {
        let bytes = ipc_file(2);
        let (schema, batches) = decode_ipc_file(&Buffer::from(bytes.clone())).unwrap();
        assert_eq!(schema.field(0).name(), "sample_id");
        let ids: Vec<u64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);

        let decode = |bytes: &[u8]| decode_ipc_file(&Buffer::from(bytes.to_vec())).unwrap_err();
        assert_eq!(
            decode(b"ARROW1"),
            "shorter than an Arrow IPC file's trailer"
        );
        let mut long_footer = bytes.clone();
        let at = long_footer.len() - 10;
        long_footer[at..at + 4].copy_from_slice(&(1u32 << 30).to_le_bytes());
        assert_eq!(decode(&long_footer), "the footer is longer than the file");
        assert_eq!(decode(&ipc_file(0)), "the file holds no record batch");
    }

    #[test]
    fn metadata_that_disagrees_with_the_manifest_is_refused_naming_the_difference() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[1, 2, 3], Codec::None, 1 << 20);
        let manifest = Manifest::read(&dir).unwrap();
        let (metadata, _map) = read_metadata(&dir, &manifest).unwrap();
        assert_eq!(metadata.num_rows(), 3);

        let mut renamed = manifest.clone();
        renamed.columns[0].name = "tag".into();
        let mut retyped = manifest.clone();
        retyped.columns[0].dtype = MetaType::String;
        let mut longer = manifest.clone();
        longer.record_count = 4;
        for (manifest, expected) in [
            (
                renamed,
                "differ from the manifest's [\"sample_id\", \"tag\"]",
            ),
            (retyped, "column 'label' is Int64, the manifest says Utf8"),
            (longer, "3 rows, the manifest says 4 records"),
        ] {
            let err = read_metadata(&dir, &manifest).err().unwrap();
            assert!(matches!(err, Error::CorruptCache { .. }), "{err:?}");
            assert!(err.to_string().contains(expected), "{err}");
            assert!(err.to_string().contains(METADATA_FILE), "{err}");
        }
    }

    /// Metadata of `sample_id` and a string column, in batches of `sizes` rows.
    fn chunked(sizes: &[usize]) -> CacheMetadata {
        use arrow_array::StringArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("sample_id", DataType::UInt64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let mut first = 0u64;
        let batches = sizes
            .iter()
            .map(|&n| {
                let ids = first..first + n as u64;
                first += n as u64;
                let names = StringArray::from_iter_values(ids.clone().map(|i| format!("n{i}")));
                let ids = UInt64Array::from_iter_values(ids);
                RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(names)]).unwrap()
            })
            .collect();
        CacheMetadata::new(schema, batches).unwrap()
    }

    #[test]
    fn rows_are_read_where_they_lie_whatever_the_batches() {
        use arrow_array::StringArray;
        for sizes in [&[8][..], &[3, 3, 2], &[2, 0, 5, 1], &[1, 4, 3]] {
            let metadata = chunked(sizes);
            assert_eq!((metadata.num_rows(), metadata.num_columns()), (8, 2));
            let ids = metadata.typed::<UInt64Array>(0).unwrap();
            let names = metadata.typed::<StringArray>(1).unwrap();
            for row in 0..8 {
                assert_eq!(ids.value(row), row as u64, "{sizes:?}");
                assert_eq!(names.value(row), format!("n{row}"), "{sizes:?}");
                let (batch, at) = metadata.batch_of(row).unwrap();
                let id = batch.column(0).as_primitive::<UInt64Type>().value(at);
                assert_eq!(id, row as u64, "{sizes:?}");
            }
            assert!(metadata.batch_of(8).is_none());
            for start in 0..=8 {
                for len in 0..=8 - start {
                    let slice = metadata.column_slice(0, start, len).unwrap();
                    let values = slice.as_primitive::<UInt64Type>().values().to_vec();
                    let expected: Vec<u64> = (start as u64..(start + len) as u64).collect();
                    assert_eq!(values, expected, "{sizes:?} {start}..+{len}");
                }
            }
            assert!(metadata.column_slice(0, 7, 2).is_err(), "past the end");
            assert!(metadata.column_slice(2, 0, 1).is_err(), "no such column");
            assert!(metadata.typed::<UInt64Array>(1).is_err(), "not that type");
        }
    }

    #[test]
    fn a_slice_inside_one_batch_is_a_view_of_it() {
        let metadata = chunked(&[3, 3, 2]);
        let second = metadata.batches()[1].column(0).as_primitive::<UInt64Type>();
        let slice = metadata.column_slice(0, 4, 2).unwrap();
        let slice = slice.as_primitive::<UInt64Type>();
        assert_eq!(slice.values().as_ptr(), second.values()[1..].as_ptr());
        let across = metadata.column_slice(0, 2, 2).unwrap();
        assert_eq!(
            across.as_primitive::<UInt64Type>().values().to_vec(),
            [2, 3]
        );
    }

    #[test]
    fn metadata_of_several_batches_reads_from_the_mapping() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write_batched(base.path(), "c", 10, 4);
        let manifest = Manifest::read(&dir).unwrap();
        let (metadata, map) = read_metadata(&dir, &manifest).unwrap();
        let sizes: Vec<usize> = metadata.batches().iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        let mapped = map.as_ptr_range();
        for batch in metadata.batches() {
            let values = batch
                .column(1)
                .as_primitive::<arrow_array::types::Int64Type>();
            assert!(
                mapped.contains(&values.values().as_ptr().cast()),
                "not copied"
            );
        }
        let labels = metadata.typed::<arrow_array::Int64Array>(1).unwrap();
        assert_eq!(
            (0..10).map(|i| labels.value(i)).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
    }
}
