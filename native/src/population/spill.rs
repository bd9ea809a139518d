//! `TableSpill`: a population table written as it streams in, to the same
//! file, and under the same id, as the table collected whole.
//!
//! A population is stored as an Arrow IPC stream of one record batch (the
//! canonical table) and named by the xxh3-128 of that stream's bytes
//! (`store.rs`). To write it without holding it, each column's buffers are
//! appended batch by batch to scratch files in the layout of the whole
//! column (validity bits packed on, offsets rebased); at the end the scratch
//! files are mapped, the whole table is assembled from them without a copy,
//! and arrow-rs's own `StreamWriter` writes it through a hasher into the
//! store. The bytes are therefore the ones the collected table gives, by
//! construction (a test compares them for every column type and batching).
//!
//! Columns of flat types spill: every fixed-width type, booleans, strings and
//! binaries, nulls. Nested and other encoded columns (lists, structs, maps,
//! unions, dictionaries of non-strings, views of binaries) are gathered in
//! memory and concatenated at the end, as before (docs/large-datasets.md).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{make_array, Array, ArrayRef, RecordBatch};
use arrow_buffer::bit_util;
use arrow_data::ArrayDataBuilder;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::scratch::ScratchFile;
use crate::error::{Error, IoContext, Result};
use crate::storage::mapped::MappedFile;

const WRITE_BUFFER: usize = 1 << 20;

/// A scratch file written through a buffer.
struct Spilled {
    file: ScratchFile,
    out: BufWriter<File>,
    len: u64,
}

impl Spilled {
    fn create(dir: &Path) -> Result<Self> {
        let file = ScratchFile::create(dir)?;
        let out = BufWriter::with_capacity(WRITE_BUFFER, file.file()?);
        Ok(Spilled { file, out, len: 0 })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.len += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .at("cannot write", self.file.path())
    }

    /// The bytes written, as an Arrow buffer over the mapped file.
    fn into_buffer(mut self) -> Result<(arrow_buffer::Buffer, ScratchFile)> {
        self.out.flush().at("cannot write", self.file.path())?;
        if self.len == 0 {
            return Ok((arrow_buffer::Buffer::from_vec(Vec::<u8>::new()), self.file));
        }
        let map = Arc::new(MappedFile::map(&self.file.file()?).at("cannot map", self.file.path())?);
        let buffer = crate::storage::arrow_buffer(&map, 0, self.len as usize)
            .ok_or_else(|| Error::internal("a spilled column is shorter than written"))?;
        Ok((buffer, self.file))
    }
}

/// Bits appended at any bit offset, whole bytes written out as they fill.
struct Bits {
    spilled: Spilled,
    /// The bits not written yet (fewer than 8 after each flush).
    pending: Vec<u8>,
    pending_bits: usize,
    len: u64,
    zeros: u64,
}

impl Bits {
    fn create(dir: &Path) -> Result<Self> {
        Ok(Bits {
            spilled: Spilled::create(dir)?,
            pending: Vec::new(),
            pending_bits: 0,
            len: 0,
            zeros: 0,
        })
    }

    /// Append bits `offset..offset + len` of `bits` (or `len` set bits).
    fn append(&mut self, bits: Option<(&[u8], usize)>, len: usize) -> Result<()> {
        let total = self.pending_bits + len;
        self.pending.resize(total.div_ceil(8), 0);
        match bits {
            Some((data, offset)) => {
                let set = arrow_buffer::bit_mask::set_bits(
                    &mut self.pending,
                    data,
                    self.pending_bits,
                    offset,
                    len,
                );
                // set_bits returns the count of unset bits it copied.
                self.zeros += set as u64;
            }
            None => {
                for i in self.pending_bits..total {
                    bit_util::set_bit(&mut self.pending, i);
                }
            }
        }
        self.pending_bits = total;
        self.len += len as u64;
        if self.pending.len() >= WRITE_BUFFER {
            let whole = self.pending_bits / 8;
            self.spilled.write(&self.pending[..whole])?;
            self.pending.drain(..whole);
            self.pending_bits -= whole * 8;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(arrow_buffer::Buffer, ScratchFile)> {
        let bytes = self.pending_bits.div_ceil(8);
        // Bits past the end are zero, as in a bitmap Arrow builds.
        if !self.pending_bits.is_multiple_of(8) {
            let last = bytes - 1;
            self.pending[last] &= (1u8 << (self.pending_bits % 8)) - 1;
        }
        let pending = std::mem::take(&mut self.pending);
        self.spilled.write(&pending[..bytes])?;
        self.spilled.into_buffer()
    }
}

enum Values {
    /// Fixed-width values, `width` bytes each.
    Fixed {
        width: usize,
        data: Spilled,
    },
    Bool(Bits),
    /// Strings or binaries: i64 offsets (rebased), then the values' bytes.
    Bytes {
        offsets: Spilled,
        data: Spilled,
        end: i64,
    },
    Null,
    /// Columns that do not spill, gathered for one concatenation at the end.
    Gathered(Vec<ArrayRef>),
}

struct ColumnSpill {
    field: Field,
    validity: Option<Bits>,
    values: Values,
}

impl ColumnSpill {
    fn create(dir: &Path, field: &Field) -> Result<Self> {
        let dtype = field.data_type();
        let values = match dtype {
            DataType::Boolean => Values::Bool(Bits::create(dir)?),
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
                let mut offsets = Spilled::create(dir)?;
                offsets.write(&0i64.to_le_bytes())?;
                Values::Bytes {
                    offsets,
                    data: Spilled::create(dir)?,
                    end: 0,
                }
            }
            DataType::Null => Values::Null,
            DataType::FixedSizeBinary(width) if *width > 0 => Values::Fixed {
                width: *width as usize,
                data: Spilled::create(dir)?,
            },
            t if t.is_primitive() => Values::Fixed {
                width: t.primitive_width().unwrap_or(0),
                data: Spilled::create(dir)?,
            },
            _ => Values::Gathered(Vec::new()),
        };
        let validity = match values {
            Values::Null | Values::Gathered(_) => None,
            _ => Some(Bits::create(dir)?),
        };
        Ok(ColumnSpill {
            field: field.clone(),
            validity,
            values,
        })
    }

    fn append(&mut self, array: &ArrayRef) -> Result<()> {
        let len = array.len();
        if let Some(validity) = &mut self.validity {
            match array.nulls() {
                Some(nulls) => {
                    validity.append(Some((nulls.buffer().as_slice(), nulls.offset())), len)?
                }
                None => validity.append(None, len)?,
            }
        }
        match &mut self.values {
            Values::Fixed { width, data } => {
                let whole = array.to_data();
                let start = whole.offset() * *width;
                data.write(&whole.buffers()[0].as_slice()[start..start + len * *width])?;
            }
            Values::Bool(bits) => {
                let values = array.as_boolean().values();
                bits.append(Some((values.inner().as_slice(), values.offset())), len)?;
            }
            Values::Bytes { offsets, data, end } => {
                let (starts, bytes) = byte_offsets(array)?;
                let (first, last) = (starts[0], starts[starts.len() - 1]);
                let base = *end - first;
                let mut rebased = Vec::with_capacity(len * 8);
                for &o in &starts[1..] {
                    rebased.extend_from_slice(&(o + base).to_le_bytes());
                }
                offsets.write(&rebased)?;
                data.write(&bytes[first as usize..last as usize])?;
                *end += last - first;
            }
            Values::Null => {}
            Values::Gathered(chunks) => chunks.push(array.clone()),
        }
        Ok(())
    }

    /// The whole column, over its mapped scratch files (kept alive in `keep`).
    fn finish(self, rows: usize, keep: &mut Vec<ScratchFile>) -> Result<(Field, ArrayRef)> {
        let mut field = self.field;
        let nulls = match self.validity {
            Some(bits) if bits.zeros > 0 => {
                let zeros = bits.zeros as usize;
                let (buffer, file) = bits.finish()?;
                keep.push(file);
                Some((buffer, zeros))
            }
            _ => None,
        };
        let mut dtype = field.data_type().clone();
        let buffers = match self.values {
            Values::Fixed { data, .. } => {
                let (buffer, file) = data.into_buffer()?;
                keep.push(file);
                vec![buffer]
            }
            Values::Bool(bits) => {
                let (buffer, file) = bits.finish()?;
                keep.push(file);
                vec![buffer]
            }
            Values::Bytes { offsets, data, end } => {
                let small = i32::try_from(end).is_ok();
                dtype = match (dtype, small) {
                    // More than 2 GiB of bytes: i32 offsets cannot hold them.
                    (DataType::Utf8, false) => DataType::LargeUtf8,
                    (DataType::Binary, false) => DataType::LargeBinary,
                    (other, _) => other,
                };
                let (wide, file) = offsets.into_buffer()?;
                let offsets = if matches!(dtype, DataType::Utf8 | DataType::Binary) {
                    let narrow = narrow_offsets(&wide, field.name(), file.path())?;
                    drop(wide);
                    drop(file);
                    keep.push(narrow.1);
                    narrow.0
                } else {
                    keep.push(file);
                    wide
                };
                let (values, file) = data.into_buffer()?;
                keep.push(file);
                vec![offsets, values]
            }
            Values::Null => Vec::new(),
            Values::Gathered(chunks) => {
                let parts: Vec<&dyn Array> = chunks.iter().map(|c| c.as_ref()).collect();
                let whole = arrow_select::concat::concat(&parts)?;
                return Ok((field, whole));
            }
        };
        field = field.with_data_type(dtype.clone());
        let mut builder = ArrayDataBuilder::new(dtype).len(rows).buffers(buffers);
        if let Some((bitmap, zeros)) = nulls {
            builder = builder.null_bit_buffer(Some(bitmap)).null_count(zeros);
        }
        let data = builder.build()?;
        Ok((field, make_array(data)))
    }
}

/// A string or binary array's offsets (widened to i64) and its values'
/// buffer: the same two buffers for the four types, 32- or 64-bit offsets.
fn byte_offsets(array: &ArrayRef) -> Result<(Vec<i64>, arrow_buffer::Buffer)> {
    let data = array.to_data();
    let range = data.offset()..data.offset() + data.len() + 1;
    let offsets = match data.data_type() {
        DataType::Utf8 | DataType::Binary => data.buffers()[0].typed_data::<i32>()[range]
            .iter()
            .map(|&o| i64::from(o))
            .collect(),
        DataType::LargeUtf8 | DataType::LargeBinary => {
            data.buffers()[0].typed_data::<i64>()[range].to_vec()
        }
        other => {
            return Err(Error::internal(format!(
                "a column of type {other} was spilled as strings"
            )))
        }
    };
    Ok((offsets, data.buffers()[1].clone()))
}

/// i64 offsets rewritten as i32 into a new scratch file beside `near`.
fn narrow_offsets(
    wide: &arrow_buffer::Buffer,
    column: &str,
    near: &Path,
) -> Result<(arrow_buffer::Buffer, ScratchFile)> {
    let dir = near.parent().unwrap_or(Path::new("."));
    let mut narrow = Spilled::create(dir)?;
    let mut chunk = Vec::with_capacity(WRITE_BUFFER);
    for &o in wide.typed_data::<i64>() {
        let o = i32::try_from(o).map_err(|_| {
            Error::internal(format!("column '{column}': an offset does not fit 32 bits"))
        })?;
        chunk.extend_from_slice(&o.to_le_bytes());
        if chunk.len() >= WRITE_BUFFER {
            narrow.write(&chunk)?;
            chunk.clear();
        }
    }
    narrow.write(&chunk)?;
    narrow.into_buffer()
}

/// A canonical table written batch by batch (see the module's header).
pub struct TableSpill {
    dir: PathBuf,
    schema: SchemaRef,
    columns: Vec<ColumnSpill>,
    rows: usize,
}

/// The stored table: its id (the xxh3-128 of its bytes) and its file.
pub struct SpilledTable {
    pub id: String,
    pub file: ScratchFile,
}

impl TableSpill {
    /// Spill tables of `schema` (canonical: see `store::canonical`) into `dir`.
    pub fn create(dir: &Path, schema: SchemaRef) -> Result<Self> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| ColumnSpill::create(dir, f))
            .collect::<Result<_>>()?;
        Ok(TableSpill {
            dir: dir.to_path_buf(),
            schema,
            columns,
            rows: 0,
        })
    }

    /// Append a canonical batch of this spill's schema.
    pub fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        for (column, array) in self.columns.iter_mut().zip(batch.columns()) {
            column.append(array)?;
        }
        self.rows += batch.num_rows();
        Ok(())
    }

    /// Write the whole table as one batch of an IPC stream to a scratch file,
    /// hashing it as it goes.
    pub fn finish(self) -> Result<SpilledTable> {
        let mut keep = Vec::new();
        let mut fields = Vec::with_capacity(self.columns.len());
        let mut arrays = Vec::with_capacity(self.columns.len());
        for column in self.columns {
            let (field, array) = column.finish(self.rows, &mut keep)?;
            fields.push(field);
            arrays.push(array);
        }
        let schema = Arc::new(Schema::new(fields).with_metadata(self.schema.metadata().clone()));
        let table = RecordBatch::try_new(schema.clone(), arrays)?;
        let file = ScratchFile::create(&self.dir)?;
        let mut out = Hashing {
            out: BufWriter::with_capacity(WRITE_BUFFER, file.file()?),
            hash: twox_hash::XxHash3_128::new(),
        };
        {
            let mut writer = StreamWriter::try_new(&mut out, &schema)?;
            writer.write(&table)?;
            writer.finish()?;
        }
        let id = format!("{:032x}", out.hash.finish_128());
        let handle = out
            .out
            .into_inner()
            .map_err(|e| Error::io("cannot write", file.path(), e.into_error()))?;
        handle.sync_all().at("cannot fsync", file.path())?;
        drop(table);
        drop(keep);
        Ok(SpilledTable { id, file })
    }
}

/// A writer that hashes what passes through it.
struct Hashing {
    out: BufWriter<File>,
    hash: twox_hash::XxHash3_128,
}

impl Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(bytes)?;
        self.hash.write(&bytes[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
