//! Crash-safe publication: a cache is written under a temporary name in the
//! base directory, fsynced, then renamed to its final name. A reader can only
//! ever see a missing cache or a complete one.

use std::fs::{self, File};
use std::path::Path;

use super::manifest::Manifest;
use super::temp::{remove_abandoned, LockedTemp};
use crate::error::{Error, IoContext, Result};

const PARTIAL_MARKER: &str = ".partial-";

/// The one rule for a name that becomes one part of a path (a cache source's
/// directory, a dataset's directory in a state dir): a plain path part, never
/// empty, hidden, `..`, nested or longer than 200 bytes. `kind` says what the
/// name is ("source", "dataset") in the message.
pub fn validate_name(kind: &str, name: &str) -> Result<()> {
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
            "{kind} name {name:?} {p}; a {kind} name must be a plain directory name \
             such as 'train_v1'"
        ))),
        None => Ok(()),
    }
}

/// A source name is used as a directory name: keep it to one plain path part
/// (`validate_name`, with dataset-rt 0.4.8's message for sources).
pub fn validate_source_name(name: &str) -> Result<()> {
    validate_name("source", name)
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

/// Create a fresh temporary directory for `name` under `base`, locked by this
/// writer until it is published or removed (see `temp.rs`). Temporary
/// directories in `base` whose writer is gone, of any name, are removed first.
pub fn create_partial_dir(base: &Path, name: &str) -> Result<LockedTemp> {
    fs::create_dir_all(base).at("cannot create the base directory", base)?;
    remove_abandoned(base, is_partial);
    LockedTemp::create_dir(base, &format!(".{name}{PARTIAL_MARKER}"))
}

/// `.<name>.partial-<unique>`: source names never start with '.', so no
/// published cache has such a name.
fn is_partial(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.contains(PARTIAL_MARKER)
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

/// Atomically move the complete `partial` directory, the cache `cache_id`, to
/// `target`. A cache is never overwritten: when `target` exists (before, or
/// written by a concurrent writer meanwhile) and holds the same records (the
/// same id), it is kept and `partial` left for its owner to remove; when it
/// holds other records, the write is refused naming both ids and what to do.
/// Returns whether the existing cache was kept.
pub fn publish(partial: &Path, target: &Path, cache_id: u64) -> Result<bool> {
    fsync_dir(partial)?;
    if !target.exists() {
        match fs::rename(partial, target) {
            Ok(()) => {
                if let Some(parent) = target.parent() {
                    fsync_dir(parent)?;
                }
                return Ok(false);
            }
            // Published by a concurrent writer since: compared below.
            Err(_) if target.exists() => {}
            Err(e) => return Err(Error::io("cannot publish the cache to", target, e)),
        }
    }
    let existing = Manifest::read(target)?;
    if existing.cache_id == cache_id {
        return Ok(true);
    }
    Err(Error::invalid(format!(
        "{} already exists and holds other records (cache_id {}, {} records; the records \
         given make cache_id {cache_id}). Caches are immutable and a cache is reused only \
         for the same records: give these records another name (e.g. {}_v2) or another \
         base directory, or remove {} to write it again",
        target.display(),
        existing.cache_id,
        existing.record_count,
        target.file_name().unwrap_or_default().to_string_lossy(),
        target.display(),
    )))
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
    fn one_rule_for_every_kind_of_name() {
        for bad in [
            "", ".", "..", "../x", "a/b", "/abs", "a\\b", "x\0y", ".hidden",
        ] {
            for kind in ["source", "dataset"] {
                let message = validate_name(kind, bad).unwrap_err().to_string();
                assert!(
                    message.starts_with(&format!("{kind} name {bad:?} ")),
                    "{message}"
                );
                assert!(
                    message.contains(&format!("a {kind} name must be")),
                    "{message}"
                );
            }
        }
        assert!(validate_name("dataset", &"x".repeat(201)).is_err());
        validate_name("dataset", &"x".repeat(200)).unwrap();
        validate_name("dataset", "mix-2.v1").unwrap();
        // dataset-rt 0.4.8's words for sources, which its users compare.
        assert_eq!(
            validate_source_name("a/b").unwrap_err().to_string(),
            "source name \"a/b\" contains '/', '\\' or a NUL byte; a source name must be a \
             plain directory name such as 'train_v1'"
        );
    }

    #[test]
    fn abandoned_partials_are_removed_and_live_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        // Named with this process's id, as every writer is pid 1 in a container.
        let dead = base
            .path()
            .join(format!(".other.partial-{}-0-0", std::process::id()));
        fs::create_dir(&dead).unwrap();
        let live = create_partial_dir(base.path(), "s").unwrap();
        assert!(!dead.exists());
        let fresh = create_partial_dir(base.path(), "s").unwrap();
        assert!(live.path().exists() && fresh.path().exists());
        assert_ne!(live.path(), fresh.path());
    }
}
