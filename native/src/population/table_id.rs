//! A population's id: the xxh3-128 of its canonical table written as an Arrow
//! IPC stream of one record batch, by arrow-rs's `StreamWriter`. Stores
//! before the table was stored in chunks held exactly that stream, so their
//! ids are the hashes of their files (`MappedTable::bytes`) and stay valid.
//!
//! A table stored in chunks (`table.rs`) is hashed as that one-batch stream
//! without writing it: a whole-table batch is assembled whose large buffers
//! are placeholders (anonymous memory of the right length, never touched,
//! reserving no swap), arrow-rs writes it into a sink that hashes what it is
//! given, and the sink hashes each placeholder's real bytes in its place,
//! generated from the chunks (values joined, validity bits packed on, string
//! offsets rebased). The header bytes, padding and layout therefore come from
//! arrow-rs itself; the tests compare the ids with those of tables written
//! whole, for every column type and batching. Columns of nested and other
//! encoded types are joined in memory instead (docs/large-datasets.md).

use std::io::Write;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{make_array, Array, ArrayRef, RecordBatch};
use arrow_buffer::{bit_mask, BooleanBuffer, Buffer, NullBuffer};
use arrow_data::{ArrayData, ArrayDataBuilder};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};

use super::ids::{IdColumn, KeysFile};
use super::table::{Chunks, MappedTable};
use crate::error::{Error, Result};
use crate::hash::xxh3_128;
use crate::ids::PopulationId;

/// The representation a population is stored and named in, so that the same
/// logical table gets the same id whichever client encoded it: every string
/// column (view, large or dictionary-encoded) as plain Utf8, every field
/// nullable, no schema metadata.
pub fn canonical(table: &RecordBatch) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(table.num_columns());
    let mut columns = Vec::with_capacity(table.num_columns());
    for (field, column) in table.schema().fields().iter().zip(table.columns()) {
        let is_string =
            |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        let target = match field.data_type() {
            DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
            DataType::Dictionary(_, value) if is_string(value) => DataType::Utf8,
            other => other.clone(),
        };
        let column = if &target == column.data_type() {
            column.clone()
        } else {
            arrow_cast::cast(column, &target)?
        };
        fields.push(Field::new(field.name(), target, true));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// The id of the table stored in `table` (see the module's header). A table
/// that leaves its identity columns out (`ids.rs`) is hashed with them, made
/// from `keys`, its rows file's.
pub fn table_id(table: &MappedTable, keys: Option<&KeysFile>) -> Result<PopulationId> {
    if !table.is_chunked() {
        return Ok(PopulationId::of_hash(xxh3_128(table.bytes())));
    }
    let chunks = table.unchecked();
    let rows = chunks.num_rows();
    if !table.left_out().is_empty() {
        let Some(keys) = keys else {
            return Err(Error::internal(
                "a table without its identities was hashed without its keys",
            ));
        };
        if keys.rows != rows {
            return Err(Error::corrupt_population(
                &keys.path,
                format!("it holds {} rows and its table {rows}", keys.rows),
            ));
        }
    }
    let mut placeholders = Vec::new();
    let mut fields = Vec::new();
    let mut arrays = Vec::new();
    for (i, field) in chunks.schema().fields().iter().enumerate() {
        let column = match chunks.column_parts(i) {
            Ok(parts) => whole_column(i, field, &parts, rows, &mut placeholders),
            Err(id) => identity_column(i, field, id, rows, &mut placeholders),
        };
        let (field, array) =
            column.map_err(|detail| Error::corrupt_population(table.path(), detail))?;
        fields.push(field);
        arrays.push(array);
    }
    let schema = Arc::new(Schema::new(fields).with_metadata(chunks.schema().metadata().clone()));
    let whole = RecordBatch::try_new(schema.clone(), arrays)?;
    let mut sink = HashSink {
        hash: twox_hash::XxHash3_128::new(),
        placeholders: &placeholders,
        chunks: &chunks,
        keys,
        file: FileBytes {
            path: table.path(),
            map: table.bytes(),
        },
        failure: None,
    };
    let written = (|| {
        let mut writer = StreamWriter::try_new(&mut sink, &schema)?;
        writer.write(&whole)?;
        writer.finish()
    })();
    if let Some(detail) = sink.failure.take() {
        return Err(Error::corrupt_population(table.path(), detail));
    }
    written?;
    Ok(PopulationId::of_hash(sink.hash.finish_128()))
}

/// How a placeholder's bytes are made from column `column` of the chunks.
#[derive(Clone, Copy)]
enum Make {
    /// The validity bits, packed on (a chunk without nulls gives set bits).
    Validity,
    /// A boolean column's value bits.
    Bools,
    /// Fixed-width values, `width` bytes each.
    Values { width: usize },
    /// String or binary offsets rebased, 64-bit if `wide`.
    Offsets { wide: bool },
    /// String or binary bytes.
    Bytes,
    /// An identity made from the keys, `width` bytes each.
    Identity { id: IdColumn, width: usize },
}

struct Placeholder {
    start: usize,
    len: usize,
    column: usize,
    make: Make,
}

/// Anonymous memory that stands in for a buffer of `len` bytes: never
/// written but for the few bytes arrow-rs reads (a string column's last
/// offset), so it costs no memory whatever its length.
fn placeholder(
    len: usize,
    column: usize,
    make: Make,
    out: &mut Vec<Placeholder>,
) -> std::result::Result<Option<memmap2::MmapMut>, String> {
    if len == 0 {
        return Ok(None);
    }
    let map = memmap2::MmapOptions::new()
        .len(len)
        .no_reserve_swap()
        .map_anon()
        .map_err(|e| format!("cannot reserve {len} bytes of address space: {e}"))?;
    out.push(Placeholder {
        start: map.as_ptr() as usize,
        len,
        column,
        make,
    });
    Ok(Some(map))
}

/// An Arrow buffer over a placeholder (which it keeps alive), or an empty one.
fn as_buffer(map: Option<memmap2::MmapMut>) -> Buffer {
    let Some(map) = map else {
        return Buffer::from_vec(Vec::<u8>::new());
    };
    let len = map.len();
    let owner = Arc::new(map);
    let ptr = NonNull::new(owner.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
    // SAFETY: `ptr..ptr + len` is the mapping, kept alive by `owner` for as
    // long as the buffer lives.
    unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
}

/// Column `column` of the whole table: placeholders for its flat buffers, or
/// its chunks joined in memory. An error is a damaged file.
fn whole_column(
    column: usize,
    field: &Field,
    parts: &[ArrayData],
    rows: usize,
    out: &mut Vec<Placeholder>,
) -> std::result::Result<(Field, ArrayRef), String> {
    let dtype = field.data_type().clone();
    let nulls: usize = parts.iter().map(ArrayData::null_count).sum();
    let buffer = |len: usize, make: Make, out: &mut Vec<Placeholder>| {
        placeholder(len, column, make, out).map(as_buffer)
    };
    let (dtype, buffers) = match &dtype {
        DataType::Null => return Ok((field.clone(), arrow_array::new_null_array(&dtype, rows))),
        DataType::Boolean => (
            dtype.clone(),
            vec![buffer(rows.div_ceil(8), Make::Bools, out)?],
        ),
        DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
            let mut total: i64 = 0;
            for part in parts {
                let (first, last) = offset_range(part)?;
                total = total
                    .checked_add(last - first)
                    .ok_or("the strings' lengths overflow")?;
            }
            // More than 2 GiB of bytes: 32-bit offsets cannot hold them.
            let wide = i32::try_from(total).is_err()
                || matches!(dtype, DataType::LargeUtf8 | DataType::LargeBinary);
            let dtype = match (&dtype, wide) {
                (DataType::Utf8, true) => DataType::LargeUtf8,
                (DataType::Binary, true) => DataType::LargeBinary,
                (other, _) => other.clone(),
            };
            let width = if wide { 8 } else { 4 };
            let offsets_len = (rows + 1) * width;
            let mut offsets = placeholder(offsets_len, column, Make::Offsets { wide }, out)?;
            if let Some(map) = &mut offsets {
                // arrow-rs reads the first offset (zero already) and the last.
                let last = &mut map[offsets_len - width..];
                if wide {
                    last.copy_from_slice(&total.to_le_bytes());
                } else {
                    last.copy_from_slice(&(total as i32).to_le_bytes());
                }
            }
            let values = buffer(total as usize, Make::Bytes, out)?;
            (dtype, vec![as_buffer(offsets), values])
        }
        DataType::FixedSizeBinary(width) if *width > 0 => {
            let width = *width as usize;
            let values = buffer(rows * width, Make::Values { width }, out)?;
            (dtype.clone(), vec![values])
        }
        t if t.is_primitive() => {
            let width = t.primitive_width().unwrap_or(0);
            let values = buffer(rows * width, Make::Values { width }, out)?;
            (dtype.clone(), vec![values])
        }
        _ => {
            let arrays: Vec<ArrayRef> = parts.iter().cloned().map(make_array).collect();
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            let whole = arrow_select::concat::concat(&refs).map_err(|e| e.to_string())?;
            return Ok((field.clone(), whole));
        }
    };
    let mut builder = ArrayDataBuilder::new(dtype.clone())
        .len(rows)
        .buffers(buffers);
    if nulls > 0 {
        let bits = buffer(rows.div_ceil(8), Make::Validity, out)?;
        // SAFETY: `nulls` is the sum of the chunks' null counts, which the
        // sink's packed validity bits hold; arrow-rs writes it as given.
        let nulls = unsafe { NullBuffer::new_unchecked(BooleanBuffer::new(bits, 0, rows), nulls) };
        builder = builder.nulls(Some(nulls));
    }
    // SAFETY: the buffers have the lengths of the whole column's buffers; the
    // placeholders' contents are never read as values (only written out by
    // arrow-rs, into the sink that replaces them).
    let data = unsafe { builder.build_unchecked() };
    Ok((field.clone().with_data_type(dtype), make_array(data)))
}

/// A left-out identity column of the whole table: a placeholder for its
/// values (it has no nulls).
fn identity_column(
    column: usize,
    field: &Field,
    id: IdColumn,
    rows: usize,
    out: &mut Vec<Placeholder>,
) -> std::result::Result<(Field, ArrayRef), String> {
    let dtype = field.data_type().clone();
    let width = dtype
        .primitive_width()
        .ok_or_else(|| format!("identity column '{}' is not an integer", field.name()))?;
    let values = as_buffer(placeholder(
        rows * width,
        column,
        Make::Identity { id, width },
        out,
    )?);
    let builder = ArrayDataBuilder::new(dtype).len(rows).buffers(vec![values]);
    // SAFETY: as in `whole_column`.
    let data = unsafe { builder.build_unchecked() };
    Ok((field.clone(), make_array(data)))
}

/// A chunk's first and last string offsets.
fn offset_range(part: &ArrayData) -> std::result::Result<(i64, i64), String> {
    let offsets = offsets_of(part)?;
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
        return Err("a string column has no offsets".into());
    };
    if last < first {
        return Err("a string column's offsets decrease".into());
    }
    Ok((first, last))
}

/// A chunk's string offsets (`len + 1` of them), widened to i64.
fn offsets_of(part: &ArrayData) -> std::result::Result<Vec<i64>, String> {
    let range = part.offset()..part.offset() + part.len() + 1;
    let short = || "a string column's offsets are cut short".to_string();
    let buffer = part.buffers().first().ok_or_else(short)?;
    Ok(match part.data_type() {
        DataType::Utf8 | DataType::Binary => buffer
            .typed_data::<i32>()
            .get(range)
            .ok_or_else(short)?
            .iter()
            .map(|&o| i64::from(o))
            .collect(),
        _ => buffer
            .typed_data::<i64>()
            .get(range)
            .ok_or_else(short)?
            .to_vec(),
    })
}

/// The sink arrow-rs writes the whole table into: it hashes what it is
/// given, and a placeholder's real bytes in its place.
struct HashSink<'a> {
    hash: twox_hash::XxHash3_128,
    placeholders: &'a [Placeholder],
    chunks: &'a Chunks,
    keys: Option<&'a KeysFile>,
    file: FileBytes<'a>,
    /// Why the chunks could not be read (a damaged file).
    failure: Option<String>,
}

/// The table's file and its mapping, which the chunks' buffers lie in: the
/// large ones are read from the file (`storage::ranges`), not the mapping.
struct FileBytes<'a> {
    path: &'a std::path::Path,
    map: &'a [u8],
}

impl FileBytes<'_> {
    /// Feed `slices` (of the mapping) to `out` in order, read from the file.
    fn feed(
        &self,
        slices: &[&[u8]],
        out: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<(), String> {
        let base = self.map.as_ptr() as usize;
        let mut ranges = Vec::with_capacity(slices.len());
        for slice in slices {
            let at = (slice.as_ptr() as usize).wrapping_sub(base);
            if slice.is_empty() {
                continue;
            }
            if at
                .checked_add(slice.len())
                .is_none_or(|end| end > self.map.len())
            {
                return Err("a chunk's buffer lies outside the file".into());
            }
            ranges.push(at as u64..(at + slice.len()) as u64);
        }
        crate::storage::ranges::read_ranges(self.path, &ranges, out)
            .map_err(|e| format!("cannot read the table: {e}"))
    }
}

impl Write for HashSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let at = bytes.as_ptr() as usize;
        let found = self
            .placeholders
            .iter()
            .find(|p| at >= p.start && at < p.start + p.len);
        match found {
            None => self.hash.write(bytes),
            Some(p) if at == p.start && bytes.len() == p.len => {
                let hash = &mut self.hash;
                let mut out = |b: &[u8]| hash.write(b);
                let fed = match (p.make, self.chunks.column_parts(p.column), self.keys) {
                    (Make::Identity { id, width }, _, Some(keys)) => keys.feed(id, width, &mut out),
                    (make, Ok(parts), _) => generate(make, &parts, &self.file, &mut out),
                    _ => Err("a column's values cannot be found".to_string()),
                };
                if let Err(detail) = fed {
                    self.failure = Some(detail);
                    return Err(std::io::Error::other("a chunk cannot be read"));
                }
            }
            Some(_) => {
                return Err(std::io::Error::other(
                    "arrow-rs wrote part of a placeholder buffer; the table cannot be hashed",
                ))
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Feed a whole column's buffer, made from its chunks, to `out`.
fn generate(
    make: Make,
    parts: &[ArrayData],
    file: &FileBytes<'_>,
    out: &mut dyn FnMut(&[u8]),
) -> std::result::Result<(), String> {
    let short = |what: &str| format!("a chunk's {what} are cut short");
    match make {
        Make::Values { width } => {
            let mut slices = Vec::with_capacity(parts.len());
            for part in parts {
                let range = part.offset() * width..(part.offset() + part.len()) * width;
                let buffer = part.buffers().first().ok_or_else(|| short("values"))?;
                slices.push(
                    buffer
                        .as_slice()
                        .get(range)
                        .ok_or_else(|| short("values"))?,
                );
            }
            file.feed(&slices, out)?;
        }
        Make::Validity | Make::Bools => {
            let mut bits = PackedBits::default();
            for part in parts {
                let source = match make {
                    Make::Validity => part.nulls().map(|n| (n.buffer().as_slice(), n.offset())),
                    _ => {
                        let buffer = part.buffers().first().ok_or_else(|| short("bits"))?;
                        Some((buffer.as_slice(), part.offset()))
                    }
                };
                bits.append(source, part.len(), out)
                    .ok_or_else(|| short("bits"))?;
            }
            bits.finish(out);
        }
        Make::Offsets { wide } => {
            let mut end: i64 = 0;
            out(&if wide {
                0i64.to_le_bytes().to_vec()
            } else {
                0i32.to_le_bytes().to_vec()
            });
            let mut chunk = Vec::with_capacity(CHUNK);
            for part in parts {
                let offsets = offsets_of(part)?;
                let base = end - offsets[0];
                for &o in &offsets[1..] {
                    let o = o + base;
                    if wide {
                        chunk.extend_from_slice(&o.to_le_bytes());
                    } else {
                        chunk.extend_from_slice(&(o as i32).to_le_bytes());
                    }
                    if chunk.len() >= CHUNK {
                        out(&chunk);
                        chunk.clear();
                    }
                }
                end = base + offsets[offsets.len() - 1];
            }
            out(&chunk);
        }
        Make::Identity { .. } => return Err("an identity is made from the keys".into()),
        Make::Bytes => {
            let mut slices = Vec::with_capacity(parts.len());
            for part in parts {
                let (first, last) = offset_range(part)?;
                let buffer = part.buffers().get(1).ok_or_else(|| short("strings"))?;
                slices.push(
                    buffer
                        .as_slice()
                        .get(first as usize..last as usize)
                        .ok_or_else(|| short("strings"))?,
                );
            }
            file.feed(&slices, out)?;
        }
    }
    Ok(())
}

/// Bytes of generated offsets handed to the hash at a time.
const CHUNK: usize = 1 << 16;

/// Bits appended at any bit offset, whole bytes handed on as they fill.
#[derive(Default)]
struct PackedBits {
    pending: Vec<u8>,
    bits: usize,
}

impl PackedBits {
    /// Append bits `offset..offset + len` of `source` (or `len` set bits);
    /// `None` if `source` is shorter than that.
    fn append(
        &mut self,
        source: Option<(&[u8], usize)>,
        len: usize,
        out: &mut dyn FnMut(&[u8]),
    ) -> Option<()> {
        let total = self.bits + len;
        self.pending.resize(total.div_ceil(8), 0);
        match source {
            Some((data, offset)) => {
                if data.len() * 8 < offset + len {
                    return None;
                }
                bit_mask::set_bits(&mut self.pending, data, self.bits, offset, len);
            }
            None => set_ones(&mut self.pending, self.bits, total),
        }
        self.bits = total;
        let whole = self.bits / 8;
        if whole >= CHUNK {
            out(&self.pending[..whole]);
            self.pending.drain(..whole);
            self.bits -= whole * 8;
        }
        Some(())
    }

    /// The last bits, the unused ones of the last byte zero (as Arrow builds
    /// a bitmap).
    fn finish(mut self, out: &mut dyn FnMut(&[u8])) {
        let bytes = self.bits.div_ceil(8);
        if !self.bits.is_multiple_of(8) {
            self.pending[bytes - 1] &= (1u8 << (self.bits % 8)) - 1;
        }
        out(&self.pending[..bytes]);
    }
}

/// Set bits `from..to` of `bytes`, whole bytes at a time where it can.
fn set_ones(bytes: &mut [u8], from: usize, to: usize) {
    let mut i = from;
    while i < to && !i.is_multiple_of(8) {
        arrow_buffer::bit_util::set_bit(bytes, i);
        i += 1;
    }
    let whole = (to - i) / 8;
    bytes[i / 8..i / 8 + whole].fill(0xff);
    for j in i + whole * 8..to {
        arrow_buffer::bit_util::set_bit(bytes, j);
    }
}
