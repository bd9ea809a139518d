//! Crash-safe publication: a cache is written under a temporary name in the
//! base directory, fsynced, then renamed to its final name. A reader can only
//! ever see a missing cache or a complete one.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, IoContext, Result};

const PARTIAL_MARKER: &str = ".partial-";

/// A source name is used as a directory name: keep it to one plain path part.
pub fn validate_source_name(name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > 200 {
        Some("is longer than 200 bytes")
    } else if name.starts_with('.') {
        Some("starts with '.'")
    } else if name.contains(['/', '\\', '\0']) {
        Some("contains '/', '\\' or a NUL byte")
    } else {
        None
    };
    match problem {
        Some(p) => Err(Error::invalid(format!(
            "source name {name:?} {p}; a source name must be a plain directory name \
             such as 'train_v1'"
        ))),
        None => Ok(()),
    }
}

/// The message of a source that yielded nothing (dataset-rt 0.4.8's words,
/// which its users compare `CacheWriteError.message` with).
pub const EMPTY_SOURCE: &str = "cache source yielded no samples";

/// Refuse a write of several sources before anything is written when two of
/// them would write the same directory (`base/name`). (A name that is not a
/// plain directory name is refused by `validate_source_name`, per source.)
pub fn check_source_names<S: AsRef<str>>(base: &Path, names: &[S]) -> Result<()> {
    let mut seen = std::collections::HashMap::new();
    for (position, name) in names.iter().enumerate() {
        let name = name.as_ref();
        if let Some(first) = seen.insert(name, position) {
            return Err(Error::invalid(format!(
                "duplicate generated cache path: {}; sources #{first} and #{position} are both \
                 named {name:?}, and a source's cache is written at base_dir/name (give every \
                 source a unique name)",
                base.join(name).display()
            )));
        }
    }
    Ok(())
}

/// Create a fresh temporary directory for `name` under `base`.
pub fn create_partial_dir(base: &Path, name: &str) -> Result<PathBuf> {
    fs::create_dir_all(base).at("cannot create the base directory", base)?;
    remove_abandoned_partials(base, name);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = base.join(format!(
        ".{name}{PARTIAL_MARKER}{}-{nanos}",
        std::process::id()
    ));
    fs::create_dir(&dir).at("cannot create the temporary directory", &dir)?;
    Ok(dir)
}

/// Remove temporary directories of `name` left by writers that died. A
/// directory whose writer process is still alive is left alone.
fn remove_abandoned_partials(base: &Path, name: &str) {
    let prefix = format!(".{name}{PARTIAL_MARKER}");
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|s| s.strip_prefix(&prefix)) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = match pid {
            Some(pid) if pid == std::process::id() => true,
            Some(pid) => Path::new("/proc").exists() && Path::new(&format!("/proc/{pid}")).exists(),
            None => false,
        };
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

pub fn fsync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .at("cannot fsync", path)
}

pub fn fsync_dir(path: &Path) -> Result<()> {
    // Directories can be opened read-only and fsynced on Unix; elsewhere this is a no-op.
    if cfg!(unix) {
        File::open(path)
            .and_then(|f| f.sync_all())
            .at("cannot fsync directory", path)?;
    }
    Ok(())
}

/// Atomically move the complete `partial` directory to `target`.
pub fn publish(partial: &Path, target: &Path) -> Result<()> {
    fsync_dir(partial)?;
    if target.exists() {
        return Err(Error::invalid(format!(
            "{} already exists; caches are immutable: remove it to write it again",
            target.display()
        )));
    }
    fs::rename(partial, target).at("cannot publish the cache to", target)?;
    if let Some(parent) = target.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain() {
        for bad in ["", ".x", "a/b", "..", "a\\b"] {
            assert!(validate_source_name(bad).is_err(), "{bad:?}");
        }
        validate_source_name("train_v1").unwrap();
    }

    #[test]
    fn abandoned_partials_are_removed() {
        let base = tempfile::tempdir().unwrap();
        let dead = base.path().join(".s.partial-999999999-1");
        fs::create_dir(&dead).unwrap();
        let fresh = create_partial_dir(base.path(), "s").unwrap();
        assert!(!dead.exists());
        assert!(fresh.exists());
    }
}
