//! Immutable caches: one directory per source, published by rename when complete.
//! `WritePipeline` writes one from a sequence of records, encoding on the worker
//! threads, or from Arrow record batches (`ColumnarSchema`, `push_rows`);
//! `CacheWriter` appends already encoded records in order.
//!
//! ```text
//! <base>/<name>/manifest.json    format version, identity, schema, file checksums
//! <base>/<name>/index.bin        one 40-byte entry per record (see index.rs)
//! <base>/<name>/metadata.arrow   Arrow IPC file: sample_id + stored metadata columns,
//!                                in record batches of up to 2^16 rows
//! <base>/<name>/shard-00000.bin  concatenated (optionally compressed) payload records
//! ```
//! `docs/storage-format.md` is the normative description.

mod cache;
mod codec;
mod columnar;
pub mod descriptor;
mod direct;
mod gather;
mod index;
mod lend;
mod live;
pub mod location;
mod manifest;
mod metadata_out;
pub mod mirror;
pub mod pages;
mod pipeline;
mod profile;
pub(crate) mod publish;
pub mod ranges;
mod schema;
mod slab;
pub(crate) mod temp;
pub mod upload;
mod writeback;
mod writer;

pub use cache::{file_stamp, Cache, CacheMetadata, CacheSet, Stamp, TypedColumn, VerifyReport};
pub use codec::{check_ratio, Codec, Compression, EncodedRecord, Encoding};
pub use columnar::{ColumnarRows, ColumnarSchema};
pub use direct::DirectWriter;
pub use gather::{StoredBytes, SHARED_MIN};
pub use index::{IndexEntry, INDEX_ENTRY_BYTES};
pub use live::LiveCaches;
pub use manifest::{FileEntry, Manifest, FORMAT_VERSION};
pub use metadata_out::METADATA_BATCH_ROWS;
pub use pages::{page_sums, CheckedPages};
pub use pipeline::WritePipeline;
pub use profile::{timed, Stage, StageTotals, WriteProfile};
pub use publish::{check_source_names, validate_source_name, EMPTY_SOURCE};
pub use schema::{ColumnSpec, MetaType, MetaValue, SchemaBinder};
pub use slab::{arrow_buffer, Plain, Slab};
pub use writeback::Writeback;
pub use writer::{CacheWriter, WriterOptions};

/// Records at least this large are read with `pread` rather than through the
/// memory map (one copy either way, but mapped pages would stay resident in
/// the reader and count against its memory), or lent from the mapping without
/// a copy (`lend`; a stream that lends gives each its own batch).
pub const LARGE_RECORD: u64 = 256 << 10;

pub const MANIFEST_FILE: &str = "manifest.json";
pub const INDEX_FILE: &str = "index.bin";
pub const METADATA_FILE: &str = "metadata.arrow";

pub fn shard_file_name(shard: u32) -> String {
    format!("shard-{shard:05}.bin")
}

/// Hex of an xxh3-64 digest as it appears in the manifest.
pub fn hex64(value: u64) -> String {
    format!("{value:016x}")
}
