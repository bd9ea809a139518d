//! `Location`: where a dataset or a cache lives, a local directory or a prefix
//! on object storage, parsed once from the text a user gave (a path, or
//! `s3://bucket/prefix`). Everything that differs between the two backends is a
//! method here, so that no caller asks which one it holds.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::remote::{self, Bucket};
use crate::storage::upload::PUBLISHED;
use crate::storage::MANIFEST_FILE;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A local directory (a cache in place, or a dataset's directory).
    Dir(PathBuf),
    /// `s3://bucket/prefix`, without a trailing `/`.
    Bucket(String),
}

impl Location {
    pub fn parse(text: &str) -> Result<Location> {
        if text.is_empty() {
            return Err(Error::invalid(
                "a location is empty; give a directory or s3://BUCKET/PREFIX",
            ));
        }
        Ok(if remote::is_url(text) {
            Location::Bucket(text.trim_end_matches('/').to_string())
        } else {
            Location::Dir(PathBuf::from(text))
        })
    }

    /// This location as every process of a job names it: a directory made
    /// absolute (tasks of a distributed engine run in other working directories).
    pub fn absolute(&self) -> Result<Location> {
        match self {
            Location::Dir(dir) => std::path::absolute(dir)
                .map(Location::Dir)
                .map_err(|e| Error::io("cannot resolve", dir, e)),
            Location::Bucket(_) => Ok(self.clone()),
        }
    }

    /// `relative` (`/`-separated plain names, checked by the caller) below this one.
    pub fn join(&self, relative: &str) -> Location {
        match self {
            Location::Dir(dir) => Location::Dir(
                relative
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .fold(dir.clone(), |dir, part| dir.join(part)),
            ),
            Location::Bucket(url) => Location::Bucket(format!("{url}/{relative}")),
        }
    }

    /// The objects below this location, through the one object-store layer. A
    /// directory is created when missing only when `create` (a reader of a
    /// mistyped path gets "not found", not a new empty directory).
    pub fn bucket(&self, create: bool) -> Result<Bucket> {
        match self {
            Location::Dir(dir) if !create && !dir.is_dir() => Err(Error::NotFound(format!(
                "{} is not a directory",
                dir.display()
            ))),
            Location::Dir(dir) => Bucket::local(dir),
            Location::Bucket(url) => Bucket::open(url),
        }
    }

    /// A reader of this location maps local files: a directory in place, object
    /// storage through a local `mirror` directory, which it then needs.
    pub fn check_mirror(&self, mirror: Option<&Path>) -> Result<()> {
        match (self, mirror) {
            (Location::Bucket(url), None) => Err(Error::invalid(format!(
                "the cache {url} is on object storage: give a mirror directory to read it \
                 through"
            ))),
            _ => Ok(()),
        }
    }

    /// The object whose presence says that a cache at a location is complete:
    /// a local cache is published by renaming its directory into place (its
    /// manifest comes with it), one on object storage by `published.json`,
    /// created last (docs/storage-format.md).
    pub fn published_marker(&self) -> &'static str {
        match self {
            Location::Dir(_) => MANIFEST_FILE,
            Location::Bucket(_) => PUBLISHED,
        }
    }

    /// Remove everything below `relative` (a part of a dataset that no
    /// descriptor names). Missing is fine: removal is idempotent.
    pub fn remove_tree(&self, relative: &str) -> Result<()> {
        match self.join(relative) {
            Location::Dir(dir) => match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io("cannot remove", &dir, e))
                }
                _ => Ok(()),
            },
            Location::Bucket(_) => {
                let bucket = self.bucket(false)?;
                for object in bucket.list(&format!("{relative}/"), None)? {
                    bucket.delete(&object)?;
                }
                Ok(())
            }
        }
    }

    /// The local directory, for what is only ever local (a mirror, a scratch
    /// copy); None on object storage.
    pub fn local_dir(&self) -> Option<&Path> {
        match self {
            Location::Dir(dir) => Some(dir),
            Location::Bucket(_) => None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Dir(dir) => write!(f, "{}", dir.display()),
            Location::Bucket(url) => f.write_str(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_is_parsed_once_and_joined_per_backend() {
        let dir = Location::parse("/data/set").unwrap();
        assert_eq!(
            dir.join("parts/w/p0"),
            Location::Dir(PathBuf::from("/data/set/parts/w/p0"))
        );
        assert_eq!(dir.published_marker(), MANIFEST_FILE);
        let bucket = Location::parse("s3://b/pre/").unwrap();
        assert_eq!(bucket.join("parts/p0").to_string(), "s3://b/pre/parts/p0");
        assert_eq!(bucket.published_marker(), PUBLISHED);
        assert!(bucket.local_dir().is_none());
        assert!(Location::parse("").is_err());
    }

    #[test]
    fn a_missing_directory_is_not_created_for_a_reader() {
        let base = tempfile::tempdir().unwrap();
        let missing = Location::Dir(base.path().join("typo"));
        assert!(matches!(missing.bucket(false), Err(Error::NotFound(_))));
        assert!(!base.path().join("typo").exists());
        missing.bucket(true).unwrap();
        assert!(base.path().join("typo").is_dir());
    }
}
