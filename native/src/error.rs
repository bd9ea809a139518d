//! The engine's one error type. `python/errors.rs` maps each variant to one
//! Python exception class; the Flight server maps those to Flight statuses.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a damaged file belongs to, which says how to mend it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// A cache's file: caches are written once and never repaired in place.
    Cache,
    /// A population store's file (a population's table or rows file).
    Population,
    /// A dataset of many caches: its descriptor, or a cache it names that is
    /// not the cache it was committed with.
    Dataset,
}

impl Repair {
    fn what(self) -> &'static str {
        match self {
            Repair::Cache => "cache file",
            Repair::Population => "population file",
            Repair::Dataset => "dataset",
        }
    }

    fn how(self) -> &'static str {
        match self {
            Repair::Cache => {
                "caches are immutable, so delete the cache directory and write it again (a \
                 mirror of a cache on object storage: stop the server, delete the mirrored \
                 directory, and it is fetched again; if the damage returns, it is in the \
                 bucket's copy: upload the cache again)"
            }
            Repair::Population => {
                "populations are written once, so remove this population's two files (its \
                 .arrow and .rows; on object storage, this replica's mirrored copies, which \
                 are fetched again) and put its table again if the store has no good copy; \
                 other populations and the active pointer are not affected"
            }
            Repair::Dataset => {
                "a dataset is committed once and never changed in place, so write it again \
                 at a new location (docs/distributed.md); the parts of the damaged one are \
                 removed with `python -m dataset_rt remove-uncommitted` once its descriptor \
                 is deleted"
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of a cache or of a population store is missing, truncated,
    /// malformed, of an unknown version or fails a checksum; `repair` says
    /// how to mend which.
    #[error("corrupt {} {path}: {detail}; {}", repair.what(), repair.how())]
    CorruptCache {
        path: PathBuf,
        detail: String,
        repair: Repair,
    },

    /// The operating system refused an operation on `path`.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The volume holding `path` is full (`ENOSPC`, or a quota: `EDQUOT`).
    /// Not damage and not the caller's mistake: over Flight it is UNAVAILABLE,
    /// which a client may retry on another replica.
    #[error(
        "{action} {path}: the volume is full (no space left on the device); free space on \
         it, then retry"
    )]
    StorageFull { action: &'static str, path: PathBuf },

    /// Records or caches disagree about the metadata schema.
    #[error("{0}")]
    Schema(String),

    /// A metadata table was rejected; nothing changed.
    #[error("{message}")]
    InvalidPopulation {
        column: Option<String>,
        first_row: Option<u64>,
        count: Option<u64>,
        message: String,
    },

    /// An argument is out of range or of the wrong kind.
    #[error("{0}")]
    InvalidArgument(String),

    /// A named thing (dataset, population, cache) does not exist.
    #[error("{0}")]
    NotFound(String),

    /// A source yielded a bad record or failed while it was read.
    #[error("{0}")]
    Source(String),

    /// Something broke inside the engine (a worker thread panicked, a lock was
    /// poisoned, the pool stopped). Not the caller's fault: over Flight it is
    /// INTERNAL, which a client may retry on another replica.
    #[error("internal error: {0}")]
    Internal(String),

    /// Object storage could not be reached or refused a request (network,
    /// credentials, a store that is down). Nothing changed; over Flight it is
    /// UNAVAILABLE, which a client may retry (on another replica, or later).
    #[error("{0}")]
    Unavailable(String),

    /// A loader of an older generation of a run: the run was resumed elsewhere
    /// (`run::fence`). It must stop; over Flight it is CANCELLED, never retried.
    #[error("{0}")]
    Fenced(String),

    /// An Arrow kernel failed (a bug or an unsupported input type).
    #[error("arrow: {0}")]
    Arrow(arrow_schema::ArrowError),
}

impl From<arrow_schema::ArrowError> for Error {
    /// An error of ours that passed through an Arrow interface (a record
    /// batch iterator) comes back as itself.
    fn from(error: arrow_schema::ArrowError) -> Self {
        match error {
            arrow_schema::ArrowError::ExternalError(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::Arrow(arrow_schema::ArrowError::ExternalError(other)),
            },
            other => Error::Arrow(other),
        }
    }
}

impl Error {
    pub fn corrupt(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::CorruptCache {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
            repair: Repair::Cache,
        }
    }

    /// A damaged dataset of many caches (`storage::descriptor`).
    pub fn corrupt_dataset(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::CorruptCache {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
            repair: Repair::Dataset,
        }
    }

    /// A damaged file of a population store (`corrupt` is a cache's).
    pub fn corrupt_population(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::CorruptCache {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
            repair: Repair::Population,
        }
    }

    /// An I/O error at `path`; a full volume is its own kind (`StorageFull`).
    pub fn io(action: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Self {
        if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            || source.kind() == std::io::ErrorKind::StorageFull
        {
            return Error::StorageFull {
                action,
                path: path.as_ref().to_path_buf(),
            };
        }
        Error::Io {
            action,
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// This error, when it is a full volume at the temporary entry `temp` or
    /// below it, naming `target` (and the same path below it) instead: a
    /// failed write removes its temporary entry, so the path to report is
    /// the one the write was for, on the volume that needs space. Every
    /// other error is returned as it is.
    pub fn naming_target(self, temp: &Path, target: &Path) -> Self {
        match self {
            Error::StorageFull { action, path } => {
                let path = match path.strip_prefix(temp) {
                    Ok(below) if below.as_os_str().is_empty() => target.to_path_buf(),
                    Ok(below) => target.join(below),
                    Err(_) => path,
                };
                Error::StorageFull { action, path }
            }
            other => other,
        }
    }

    /// A rejection that is about the whole table rather than rows of a column.
    pub fn population(message: impl Into<String>) -> Self {
        Error::InvalidPopulation {
            column: None,
            first_row: None,
            count: None,
            message: message.into(),
        }
    }

    /// A rejection of `count` rows of `column`, the first of them `first_row`.
    /// `problem` is a whole sentence (it names the column); the rows are added.
    pub fn population_rows(column: &str, first_row: u64, count: u64, problem: &str) -> Self {
        Error::InvalidPopulation {
            column: Some(column.to_string()),
            first_row: Some(first_row),
            count: Some(count),
            message: format!(
                "{problem} (first offending row {first_row}, {count} {} fail{})",
                if count == 1 { "row" } else { "rows" },
                if count == 1 { "s" } else { "" }
            ),
        }
    }

    /// The parts of a `population_rows` rejection: (column, first row, count,
    /// the problem without the rows), to merge rejections of several batches.
    pub fn row_failure(&self) -> Option<(&str, u64, u64, &str)> {
        match self {
            Error::InvalidPopulation {
                column: Some(column),
                first_row: Some(row),
                count: Some(count),
                message,
            } => {
                let problem = message
                    .rfind(" (first offending row ")
                    .map_or(message.as_str(), |at| &message[..at]);
                Some((column, *row, *count, problem))
            }
            _ => None,
        }
    }

    /// A rejection of a whole column (its type, its presence).
    pub fn population_column(column: &str, message: impl Into<String>) -> Self {
        Error::InvalidPopulation {
            column: Some(column.to_string()),
            first_row: None,
            count: None,
            message: message.into(),
        }
    }

    /// The same error again (for one kept and returned to many callers); an
    /// I/O error keeps its kind and message, an Arrow error its message.
    pub fn duplicate(&self) -> Self {
        match self {
            Error::CorruptCache {
                path,
                detail,
                repair,
            } => Error::CorruptCache {
                path: path.clone(),
                detail: detail.clone(),
                repair: *repair,
            },
            Error::Io {
                action,
                path,
                source,
            } => Error::io(
                action,
                path,
                std::io::Error::new(source.kind(), source.to_string()),
            ),
            Error::StorageFull { action, path } => Error::StorageFull {
                action,
                path: path.clone(),
            },
            Error::Schema(m) => Error::Schema(m.clone()),
            Error::InvalidPopulation {
                column,
                first_row,
                count,
                message,
            } => Error::InvalidPopulation {
                column: column.clone(),
                first_row: *first_row,
                count: *count,
                message: message.clone(),
            },
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::Source(m) => Error::Source(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::Fenced(m) => Error::Fenced(m.clone()),
            Error::Unavailable(m) => Error::Unavailable(m.clone()),
            Error::Arrow(e) => Error::Internal(format!("arrow: {e}")),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }
}

/// Attach the path to an I/O result.
pub trait IoContext<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T> {
        self.map_err(|source| Error::io(action, path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(path: &str) -> Error {
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        Error::io("cannot write", Path::new(path), enospc)
    }

    #[test]
    fn a_full_volume_is_named_at_the_target_not_at_the_temporary_entry() {
        let (temp, target) = (Path::new("/base/.c.partial-1"), Path::new("/base/c"));
        let named = |e: Error| e.naming_target(temp, target).to_string();
        assert_eq!(
            named(full("/base/.c.partial-1/metadata.arrow")),
            full("/base/c/metadata.arrow").to_string()
        );
        assert_eq!(
            named(full("/base/.c.partial-1")),
            full("/base/c").to_string()
        );
        // Elsewhere, or not a full volume: as it was.
        assert_eq!(named(full("/base/d/x")), full("/base/d/x").to_string());
        let other = Error::io(
            "cannot write",
            Path::new("/base/.c.partial-1/x"),
            std::io::Error::other("refused"),
        );
        assert!(
            matches!(other.naming_target(temp, target), Error::Io { path, .. }
            if path == Path::new("/base/.c.partial-1/x"))
        );
    }
}
