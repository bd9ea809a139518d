//! One open shard file: checked against its manifest entry when opened, then
//! mapped (with the `Lender` that lends large records from the mapping) and
//! remembered by identity, so that a shard replaced on disk is noticed
//! (`Cache::files_changed`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::checked::check_digest;
use crate::error::{Error, IoContext, Result};
use crate::hash::xxh3_64;
use crate::os::mapped::MappedFile;
use crate::storage::hex64;
use crate::storage::index::IndexEntry;
use crate::storage::lend::Lender;
use crate::storage::manifest::FileEntry;

/// One open shard file.
pub(super) struct Shard {
    /// The shard's mapping and file, and the large records lent from it
    /// (None for an empty shard, which has no records to read).
    pub(super) lender: Option<Arc<Lender>>,
    /// The file's identity and last write when it was opened (`Stamp`).
    pub(super) identity: Stamp,
}

impl Shard {
    /// Open the shard `entry` at `path`, checked against the manifest's
    /// length (and with `verify`, its checksum).
    pub(super) fn open(path: &Path, entry: &FileEntry, verify: bool) -> Result<Shard> {
        let file = File::open(path).map_err(|e| {
            Error::corrupt(
                path,
                format!("cannot open shard listed in the manifest: {e}"),
            )
        })?;
        Self::open_file(file, path, entry, verify)
    }

    /// `open` of the shard already opened as `file` (at `path`).
    pub(super) fn open_file(
        file: File,
        path: &Path,
        entry: &FileEntry,
        verify: bool,
    ) -> Result<Shard> {
        let stat = file.metadata().at("cannot stat", path)?;
        let len = stat.len();
        if len != entry.bytes {
            return Err(Error::corrupt(
                path,
                format!("{len} bytes, the manifest says {}", entry.bytes),
            ));
        }
        // Cache files are immutable once published; one cut short under
        // the mapping anyway is survived (`mapped`) and reported.
        let map = if len == 0 {
            None
        } else {
            Some(Arc::new(
                MappedFile::map(&file).at("cannot memory-map", path)?,
            ))
        };
        if verify {
            let digest = hex64(xxh3_64(map.as_deref().map_or(&[][..], |m| &m[..])));
            check_digest(path, &entry.xxh3, &digest)?;
        }
        let file = Arc::new(file);
        if let Some(map) = &map {
            // Records are read at random: 2 MiB pages where the page cache
            // has them (see `crate::os::prefetch::huge_pages`); only a hint.
            crate::os::prefetch::huge_pages_hint(&map[..]);
        }
        Ok(Shard {
            lender: map.map(|m| Lender::new(m, file)),
            identity: identity(&stat),
        })
    }

    /// The mapping (None when the shard is empty).
    pub(super) fn map(&self) -> Option<&MappedFile> {
        self.lender.as_deref().map(Lender::map)
    }

    /// The stored bytes of the record at `entry` (checked against the
    /// shard's length when the cache was opened).
    pub(super) fn bytes(&self, entry: &IndexEntry) -> &[u8] {
        match self.map() {
            Some(map) => &map[entry.offset as usize..(entry.offset + entry.stored_len) as usize],
            None => &[],
        }
    }
}

/// A file's (device, inode, modification time in ns): another value means
/// another file at that path, or the same one written in place since. Cache
/// files are never written once published, so either is damage until shown
/// otherwise (`Cache::check_shard`).
pub type Stamp = (u64, u64, i128);

#[cfg(unix)]
pub fn identity(stat: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let written = i128::from(stat.mtime()) * 1_000_000_000 + i128::from(stat.mtime_nsec());
    (stat.dev(), stat.ino(), written)
}

#[cfg(not(unix))]
pub fn identity(_stat: &std::fs::Metadata) -> Stamp {
    (0, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Codec;

    fn entry_of(path: &Path) -> FileEntry {
        let bytes = std::fs::read(path).unwrap();
        FileEntry {
            file: path.file_name().unwrap().to_string_lossy().into_owned(),
            bytes: bytes.len() as u64,
            xxh3: hex64(xxh3_64(&bytes)),
            records: None,
        }
    }

    #[test]
    fn a_shard_is_mapped_and_its_records_sliced_from_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-00000.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let shard = Shard::open(&path, &entry_of(&path), true).unwrap();
        assert_eq!(shard.map().map(|m| m.len()), Some(10));
        let record = IndexEntry {
            shard: 0,
            codec: Codec::None,
            offset: 3,
            stored_len: 4,
            raw_len: 4,
            checksum: 0,
        };
        assert_eq!(shard.bytes(&record), b"3456");
        assert_eq!(shard.identity, identity(&std::fs::metadata(&path).unwrap()));
    }

    #[test]
    fn an_empty_shard_has_no_mapping_and_no_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-00000.bin");
        std::fs::write(&path, b"").unwrap();
        let shard = Shard::open(&path, &entry_of(&path), true).unwrap();
        assert!(shard.map().is_none() && shard.lender.is_none());
        let nothing = IndexEntry {
            shard: 0,
            codec: Codec::None,
            offset: 0,
            stored_len: 0,
            raw_len: 0,
            checksum: 0,
        };
        assert!(shard.bytes(&nothing).is_empty());
    }

    #[test]
    fn a_shard_of_another_length_or_checksum_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-00000.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let entry = entry_of(&path);
        let longer = FileEntry {
            bytes: 11,
            ..entry.clone()
        };
        let err = Shard::open(&path, &longer, false).err().unwrap();
        assert!(matches!(err, Error::CorruptCache { .. }), "{err:?}");
        assert!(
            err.to_string().contains("10 bytes, the manifest says 11"),
            "{err}"
        );
        std::fs::write(&path, b"0123456780").unwrap();
        assert!(
            Shard::open(&path, &entry, false).is_ok(),
            "the checksum only with verify"
        );
        let err = Shard::open(&path, &entry, true).err().unwrap();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        assert!(err.to_string().contains("shard-00000.bin"), "{err}");
        let missing = dir.path().join("shard-00001.bin");
        let err = Shard::open(&missing, &entry, false).err().unwrap();
        assert!(
            err.to_string()
                .contains("cannot open shard listed in the manifest"),
            "{err}"
        );
    }
}
