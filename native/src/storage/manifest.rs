//! `manifest.json`: the cache's table of contents, written last.
//!
//! The file is `{"format_version": N, "manifest": {...}, "checksum": "<xxh3 hex>"}`
//! where the checksum covers the canonical JSON of `manifest`, so a flipped byte
//! anywhere in the file is detected.

use std::path::Path;

use crate::hash::xxh3_64;
use serde::{Deserialize, Serialize};

use super::codec::Compression;
use super::schema::{ColumnSpec, RESERVED_COLUMNS};
use super::{hex64, MANIFEST_FILE};
use crate::error::{Error, IoContext, Result};

/// The cache format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub file: String,
    pub bytes: u64,
    /// xxh3-64 of the whole file, hex.
    pub xxh3: String,
    /// Records in this file (shards only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub source_name: String,
    /// Derived from the source name and the content (see writer.rs); the same
    /// source gives the same id on any machine.
    pub cache_id: u64,
    pub record_count: u64,
    pub columns: Vec<ColumnSpec>,
    pub compression: Compression,
    pub payload_bytes: u64,
    pub stored_bytes: u64,
    pub index: FileEntry,
    pub metadata: FileEntry,
    pub shards: Vec<FileEntry>,
    pub writer: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format_version: u32,
    manifest: serde_json::Value,
    checksum: String,
}

impl Manifest {
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_value(self)
            .map_err(|e| Error::internal(format!("cannot encode manifest: {e}")))?;
        let checksum = hex64(xxh3_64(&canonical(&body)?));
        let envelope = Envelope {
            format_version: FORMAT_VERSION,
            manifest: body,
            checksum,
        };
        let mut bytes = serde_json::to_vec_pretty(&envelope)
            .map_err(|e| Error::internal(format!("cannot encode manifest: {e}")))?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// Read and check `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST_FILE);
        if !path.exists() {
            return Err(Error::corrupt(
                &path,
                "missing: the directory is not a complete dataset_rt cache \
                 (an interrupted write or another kind of directory)",
            ));
        }
        let bytes = std::fs::read(&path).at("cannot read", &path)?;
        Self::parse(&bytes).map_err(|detail| Error::corrupt(&path, detail))
    }

    fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
        let version = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or("no integer 'format_version'")?;
        if version != u64::from(FORMAT_VERSION) {
            return Err(format!(
                "unsupported format version {version}; this build of dataset_rt reads \
                 version {FORMAT_VERSION} (write the cache again with this version, or use \
                 the dataset_rt release that wrote it)"
            ));
        }
        let envelope: Envelope =
            serde_json::from_value(value).map_err(|e| format!("malformed envelope: {e}"))?;
        let computed = hex64(xxh3_64(
            &canonical(&envelope.manifest).map_err(|e| e.to_string())?,
        ));
        if computed != envelope.checksum {
            return Err(format!(
                "checksum mismatch (recorded {}, computed {computed}): the file was modified",
                envelope.checksum
            ));
        }
        let manifest: Manifest = serde_json::from_value(envelope.manifest)
            .map_err(|e| format!("malformed manifest: {e}"))?;
        manifest.check_columns()?;
        Ok(manifest)
    }

    /// The column names a writer can produce: unique, and none of the names
    /// the population table uses for its own columns. The checksum cannot
    /// tell a hand-made manifest, so a cache whose names would make an
    /// ambiguous population table is refused here.
    fn check_columns(&self) -> std::result::Result<(), String> {
        for (i, column) in self.columns.iter().enumerate() {
            let name = column.name.as_str();
            if RESERVED_COLUMNS.contains(&name) {
                return Err(format!(
                    "column '{name}' has a reserved name ({}); a writer never stores it",
                    RESERVED_COLUMNS.join(", ")
                ));
            }
            if self.columns[..i].iter().any(|c| c.name == name) {
                return Err(format!(
                    "column '{name}' is listed twice; a writer stores every metadata key once"
                ));
            }
        }
        Ok(())
    }
}

/// serde_json's `Value` keeps object keys sorted, so this encoding is canonical.
fn canonical(value: &serde_json::Value) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::internal(format!("cannot encode manifest: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Codec, MetaType};

    fn sample() -> Manifest {
        let entry = |f: &str| FileEntry {
            file: f.into(),
            bytes: 10,
            xxh3: "00".into(),
            records: None,
        };
        Manifest {
            source_name: "s".into(),
            cache_id: u64::MAX - 3,
            record_count: 2,
            columns: vec![ColumnSpec {
                name: "label".into(),
                dtype: MetaType::Int64,
            }],
            compression: Compression::new(Codec::Lz4, 3).unwrap(),
            payload_bytes: 5,
            stored_bytes: 5,
            index: entry("index.bin"),
            metadata: entry("metadata.arrow"),
            shards: vec![entry("shard-00000.bin")],
            writer: "test".into(),
        }
    }

    #[test]
    fn round_trips_and_detects_flips() {
        let m = sample();
        let bytes = m.to_bytes().unwrap();
        assert_eq!(Manifest::parse(&bytes).unwrap(), m);
        for i in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[i] ^= 0x01;
            assert!(
                Manifest::parse(&flipped).is_err(),
                "flip at byte {i} undetected"
            );
        }
    }

    #[test]
    fn rejects_duplicate_and_reserved_columns() {
        for (extra, problem) in [("label", "listed twice"), ("weight", "reserved name")] {
            let mut m = sample();
            m.columns.push(ColumnSpec {
                name: extra.into(),
                dtype: MetaType::Float64,
            });
            let err = Manifest::parse(&m.to_bytes().unwrap()).unwrap_err();
            assert!(err.contains(&format!("column '{extra}'")), "{err}");
            assert!(err.contains(problem), "{err}");
        }
    }

    #[test]
    fn rejects_unknown_versions() {
        let text = String::from_utf8(sample().to_bytes().unwrap()).unwrap();
        let text = text.replace("\"format_version\": 1", "\"format_version\": 99");
        let err = Manifest::parse(text.as_bytes()).unwrap_err();
        assert!(err.contains("unsupported format version 99"), "{err}");
    }
}
