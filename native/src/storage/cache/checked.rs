//! A cache file checked against its manifest entry: mapped, its length and
//! xxh3 compared with what the manifest records (`open`, `metadata` and
//! `shard` all check files this way).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::hash::xxh3_64;
use crate::os::mapped::MappedFile;
use crate::storage::manifest::FileEntry;
use crate::storage::{hex64, MANIFEST_FILE};

/// The file `expected_name` listed by `entry`, mapped and checked against
/// the manifest (size and xxh3); None when it is empty.
pub(super) fn map_checked(
    dir: &Path,
    entry: &FileEntry,
    expected_name: &str,
) -> Result<Option<Arc<MappedFile>>> {
    let path = dir.join(expected_name);
    if entry.file != expected_name {
        return Err(Error::corrupt(
            dir.join(MANIFEST_FILE),
            format!("lists '{}' where '{expected_name}' belongs", entry.file),
        ));
    }
    let unreadable = |e: std::io::Error| {
        Error::corrupt(
            &path,
            format!("cannot read a file listed in the manifest: {e}"),
        )
    };
    let file = File::open(&path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    if len != entry.bytes {
        return Err(Error::corrupt(
            &path,
            format!("{len} bytes, the manifest says {}", entry.bytes),
        ));
    }
    let map = if len == 0 {
        None
    } else {
        Some(Arc::new(MappedFile::map(&file).map_err(unreadable)?))
    };
    // Before the first read: the pages this read brings in are the ones the
    // cache is served from, and only pages read in after the hint can be
    // mapped huge (`crate::os::prefetch::huge_pages_hint`).
    if let Some(map) = &map {
        crate::os::prefetch::huge_pages_hint(&map[..]);
    }
    let digest = hex64(xxh3_64(map.as_deref().map_or(&[][..], |m| &m[..])));
    check_digest(&path, &entry.xxh3, &digest)?;
    Ok(map)
}

/// The xxh3 `computed` of the file at `path` against the manifest's `recorded`.
pub(super) fn check_digest(path: &Path, recorded: &str, computed: &str) -> Result<()> {
    if recorded != computed {
        return Err(Error::corrupt(
            path,
            format!(
                "checksum mismatch (manifest {recorded}, file {computed}): the file was \
                 modified or damaged"
            ),
        ));
    }
    Ok(())
}
