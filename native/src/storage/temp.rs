//! Temporary files and directories that their writer holds locked.
//!
//! A writer creates its temporary entry under a unique name and holds an
//! exclusive advisory lock (`flock`) on it until the entry is renamed into
//! place or removed. The kernel releases the lock when the writer's process
//! ends, however it ends (`kill -9` included), so a leftover whose lock can be
//! taken was abandoned. Process ids cannot tell this: inside containers every
//! writer is pid 1. A cleaner that cannot take the lock leaves the entry alone:
//! its writer is alive, in this process or another.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
pub use crate::ids::unique_suffix;

/// How often `create` starts again under a new name when a cleaner removed
/// its fresh entry before the lock was taken (it needs a cleaner at exactly
/// that moment, so once is already rare).
const CREATE_ATTEMPTS: usize = 8;

/// A temporary file or directory, locked for as long as this value lives.
#[derive(Debug)]
pub struct LockedTemp {
    path: PathBuf,
    /// The open entry that holds the lock (for a file, also what is written).
    file: File,
}

impl LockedTemp {
    /// A new, empty file `<dir>/<prefix><unique>`, open for writing and locked.
    pub fn create_file(dir: &Path, prefix: &str) -> Result<Self> {
        Self::create(dir, prefix, |path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
        })
    }

    /// A new, empty directory `<dir>/<prefix><unique>`, locked.
    pub fn create_dir(dir: &Path, prefix: &str) -> Result<Self> {
        Self::create(dir, prefix, |path| {
            fs::create_dir(path)?;
            File::open(path)
        })
    }

    fn create(
        dir: &Path,
        prefix: &str,
        make: impl Fn(&Path) -> std::io::Result<File>,
    ) -> Result<Self> {
        for _ in 0..CREATE_ATTEMPTS {
            let path = dir.join(format!("{prefix}{}", unique_suffix()));
            let file = match make(&path) {
                Ok(file) => file,
                // A cleaner removed the new directory before it was opened.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("cannot create", &path, e)),
            };
            // Blocks only while a cleaner holds the lock, and a cleaner removes
            // the entry before it lets go: then the path is gone and we start
            // again under a new name.
            file.lock().at("cannot lock", &path)?;
            if is_same_entry(&path, &file) {
                return Ok(LockedTemp { path, file });
            }
        }
        Err(Error::internal(format!(
            "cannot create a temporary entry in {}: it was removed {CREATE_ATTEMPTS} times \
             before it could be locked",
            dir.display()
        )))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Whether `path` still names the entry `file` has open.
fn is_same_entry(path: &Path, file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::symlink_metadata(path), file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// Remove the entries of `dir` whose names `is_temp` accepts and whose writer
/// is gone (their lock can be taken). Returns how many were removed. Best
/// effort: an entry that cannot be opened, locked or removed is left alone.
pub fn remove_abandoned(dir: &Path, is_temp: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(&is_temp) {
            continue;
        }
        let path = entry.path();
        let Ok(held) = File::open(&path) else {
            continue;
        };
        if held.try_lock().is_err() {
            continue; // its writer is alive (or the lock cannot be taken here)
        }
        // Removed while the lock is held, so a writer that created this entry
        // and waits for its lock finds it gone (see `LockedTemp::create`).
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
        removed += usize::from(gone.is_ok());
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_temp(name: &str) -> bool {
        name.starts_with(".tmp-")
    }

    #[test]
    fn a_held_entry_is_kept_and_an_abandoned_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = LockedTemp::create_file(dir.path(), ".tmp-").unwrap();
        let folder = LockedTemp::create_dir(dir.path(), ".tmp-").unwrap();
        fs::write(dir.path().join("kept"), b"not a temporary name").unwrap();
        assert_eq!(remove_abandoned(dir.path(), is_temp), 0);
        assert!(file.path().exists() && folder.path().exists());
        let (file_path, folder_path) = (file.path().to_path_buf(), folder.path().to_path_buf());
        // What the kernel does when the writer's process dies: the lock goes.
        drop((file, folder));
        assert_eq!(remove_abandoned(dir.path(), is_temp), 2);
        assert!(!file_path.exists() && !folder_path.exists());
        assert!(dir.path().join("kept").exists());
    }

    #[test]
    fn an_unlocked_leftover_of_any_process_id_is_removed() {
        // A writer in another container had pid 1, like this cleaner may have.
        let dir = tempfile::tempdir().unwrap();
        let leftover = dir.path().join(format!(".tmp-{}-0-0", std::process::id()));
        fs::create_dir(&leftover).unwrap();
        fs::write(leftover.join("part"), b"x").unwrap();
        assert_eq!(remove_abandoned(dir.path(), is_temp), 1);
        assert!(!leftover.exists());
    }

    #[test]
    fn names_are_unique() {
        let a = unique_suffix();
        assert_ne!(a, unique_suffix());
        assert!(a.starts_with(&format!("{}-", std::process::id())));
    }
}
