//! `ScratchFile`: a temporary file of a population being written, locked
//! while it lives (`storage::temp`: a writer killed mid-put leaves a file the
//! next opening of the store removes) and removed when dropped unless it was
//! renamed into place.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::storage::publish::fsync_dir;
use crate::storage::temp::LockedTemp;

/// The prefix of every temporary entry of a population store.
pub const TEMP_PREFIX: &str = ".tmp-";

pub struct ScratchFile {
    temp: Option<LockedTemp>,
}

impl ScratchFile {
    pub fn create(dir: &Path) -> Result<Self> {
        Ok(ScratchFile {
            temp: Some(LockedTemp::create_file(dir, TEMP_PREFIX)?),
        })
    }

    pub fn path(&self) -> &Path {
        self.temp.as_ref().map_or(Path::new(""), |t| t.path())
    }

    /// Another handle to the open file (the lock stays with this value).
    pub fn file(&self) -> Result<File> {
        let temp = self
            .temp
            .as_ref()
            .ok_or_else(|| Error::internal("a scratch file was used after it was kept"))?;
        temp.file().try_clone().at("cannot open", temp.path())
    }

    /// Rename the file to `path` (its directory fsynced), unless `path`
    /// exists already: a content-addressed file is the same whoever wrote it.
    pub fn keep_as(mut self, path: &Path) -> Result<PathBuf> {
        let Some(temp) = self.temp.take() else {
            return Err(Error::internal("a scratch file was kept twice"));
        };
        if !path.exists() {
            std::fs::rename(temp.path(), path).at("cannot rename into place", path)?;
            if let Some(dir) = path.parent() {
                fsync_dir(dir)?;
            }
        } else {
            let _ = std::fs::remove_file(temp.path());
        }
        Ok(path.to_path_buf())
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            // At once, while it is still locked: a failed put gives its space back.
            let _ = std::fs::remove_file(temp.path());
        }
    }
}

/// An error of a write to scratch files in `dir`, a full volume named at
/// `dir`: a scratch file is removed as soon as its write fails (`drop`), so
/// the path to report is the directory the population was written to (the
/// store's, or the library's scratch directory), on the volume that needs
/// space. Every other error is returned as it is.
pub fn naming_dir(error: Error, dir: &Path) -> Error {
    match error {
        Error::StorageFull { path, .. }
            if path.parent() == Some(dir)
                && path
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with(TEMP_PREFIX)) =>
        {
            Error::StorageFull {
                action: "cannot write a population to",
                path: dir.to_path_buf(),
            }
        }
        other => other,
    }
}

/// Where the in-process library writes the populations it opens (and
/// unlinks at once: the mappings keep them): `dataset_rt-populations/` in
/// `DATASET_RT_SCRATCH`, or in the system's temporary directory. Put it on a
/// disk, not a RAM-backed tmpfs, for populations larger than memory
/// (docs/large-datasets.md). Files left by a process that was killed while
/// writing are removed the first time a process uses the directory.
pub fn library_scratch_dir() -> Result<PathBuf> {
    static CLEANED: std::sync::Once = std::sync::Once::new();
    let dir = std::env::var_os("DATASET_RT_SCRATCH")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("dataset_rt-populations");
    std::fs::create_dir_all(&dir).at("cannot create the population scratch directory", &dir)?;
    CLEANED.call_once(|| {
        crate::storage::temp::remove_abandoned(&dir, |name| name.starts_with(TEMP_PREFIX));
    });
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_volume_is_named_at_the_directory_not_at_a_scratch_file() {
        let dir = Path::new("/state/populations");
        let enospc = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        let scratch = Error::io("cannot write", dir.join(".tmp-1-2-3"), enospc());
        assert_eq!(
            naming_dir(scratch, dir).to_string(),
            "cannot write a population to /state/populations: the volume is full (no space \
             left on the device); free space on it, then retry"
        );
        // A file that is not a scratch file of `dir` keeps its name.
        let kept = Error::io("cannot write", dir.join("x.arrow"), enospc());
        assert!(naming_dir(kept, dir)
            .to_string()
            .contains("/state/populations/x.arrow"));
    }
}
