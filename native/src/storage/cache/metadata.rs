//! `metadata.arrow`: the Arrow IPC file of `sample_id` and the stored
//! metadata columns, decoded without a copy from its mapping (every block
//! checked to lie inside the file) and checked against the manifest: its
//! column names and types, its row count, no nulls.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};

use super::open::map_checked;
use crate::error::{Error, Result};
use crate::os::mapped::MappedFile;
use crate::storage::manifest::Manifest;
use crate::storage::METADATA_FILE;

/// `dir/metadata.arrow` as one batch of views of its mapping, which is
/// returned with it (to tell, later, whether it was cut under a read).
pub(super) fn read_metadata(
    dir: &Path,
    manifest: &Manifest,
) -> Result<(RecordBatch, Arc<MappedFile>)> {
    let path = dir.join(METADATA_FILE);
    let corrupt = |detail: String| Error::corrupt(&path, detail);
    let map = map_checked(dir, &manifest.metadata, METADATA_FILE)?
        .ok_or_else(|| corrupt("the file is empty; it holds an Arrow IPC file".into()))?;
    let buffer = crate::storage::arrow_buffer(&map, 0, map.len())
        .ok_or_else(|| corrupt("cannot be mapped".into()))?;
    // The arrays are views of the mapped file (the writer writes one batch).
    let (schema, mut batches) = decode_ipc_file(&buffer)
        .map_err(|e| corrupt(format!("not a valid Arrow IPC file: {e}")))?;
    let batch = match batches.len() {
        1 => batches.remove(0),
        _ => arrow_select::concat::concat_batches(&schema, &batches)?,
    };
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
    if batch.num_rows() as u64 != manifest.record_count {
        return Err(corrupt(format!(
            "{} rows, the manifest says {} records",
            batch.num_rows(),
            manifest.record_count
        )));
    }
    if batch.columns().iter().any(|c| c.null_count() > 0) {
        return Err(corrupt(
            "contains nulls; stored metadata is never null".into(),
        ));
    }
    Ok((batch, map))
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
        let (batch, _map) = read_metadata(&dir, &manifest).unwrap();
        assert_eq!(batch.num_rows(), 3);

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
}
