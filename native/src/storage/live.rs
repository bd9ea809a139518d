//! `LiveCaches`: a served set of caches that notices its files changing.
//!
//! A cache's files never change once published, but a disk or an operator can
//! still cut, replace or delete one under a server. Mapped reads survive a cut
//! (`mapped`), and a replaced or deleted file stays readable through its old
//! mapping; either way the set in use no longer matches the directory. So every
//! request asks `LiveCaches::current`, which at most once a second (and at once
//! after a read met a cut file) compares each shard on disk with what was
//! opened (the file's identity and its length against the manifest). On a
//! difference it opens the caches again: a restored cache is served from its
//! new files, a damaged one is refused with the error that says which shard of
//! which cache is wrong, until it is repaired (checked again at most once a
//! second). Streams already open keep the set they started with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::CacheSet;
use crate::error::{Error, Result};
use crate::os::mapped;

/// How often the files are compared with the open set (one `stat` per shard).
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub struct LiveCaches {
    paths: Vec<PathBuf>,
    verify: bool,
    /// Where caches on object storage are read through (`CacheSet::open_mirrored`).
    mirror: Option<PathBuf>,
    state: Mutex<State>,
}

struct State {
    caches: Arc<CacheSet>,
    /// Why the set cannot be served, when its last check found it damaged.
    damage: Option<Error>,
    checked: Instant,
    /// Cuts met by any read since the last check.
    cuts: mapped::CutWatch,
}

impl LiveCaches {
    pub fn open(paths: &[PathBuf], verify: bool, mirror: Option<&Path>) -> Result<Self> {
        let caches = Arc::new(CacheSet::open_mirrored(paths, verify, mirror)?);
        Ok(LiveCaches {
            paths: paths.to_vec(),
            verify,
            mirror: mirror.map(Path::to_path_buf),
            state: Mutex::new(State {
                caches,
                damage: None,
                checked: Instant::now(),
                cuts: mapped::CutWatch::new(),
            }),
        })
    }

    /// The set as opened or last reopened, whatever its state (for what does
    /// not read records: schemas, identities, validating a population).
    pub fn opened(&self) -> Arc<CacheSet> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .caches
            .clone()
    }

    /// The set to serve a request from: checked against the files on disk
    /// (see the module comment), reopened when they changed, or the error that
    /// says what is damaged.
    pub fn current(&self) -> Result<Arc<CacheSet>> {
        let mut state = self.lock()?;
        if state.cuts.saw_new() || state.checked.elapsed() >= CHECK_INTERVAL {
            state.checked = Instant::now();
            if state.damage.is_some() || changed(&state.caches) {
                self.reopen(&mut state);
            }
        }
        match &state.damage {
            Some(error) => Err(error.duplicate()),
            None => Ok(state.caches.clone()),
        }
    }

    /// Why the set cannot be served now, if it cannot (for readiness).
    pub fn problem(&self) -> Option<String> {
        self.current().err().map(|e| e.to_string())
    }

    fn reopen(&self, state: &mut State) {
        let damage = match CacheSet::open_mirrored(&self.paths, self.verify, self.mirror.as_deref())
        {
            Ok(fresh) if fresh.cache_ids() != state.caches.cache_ids() => Some(Error::corrupt(
                &self.paths[0],
                "the caches were replaced by other caches while the server ran; restart \
                 the server to serve them",
            )),
            Ok(fresh) => {
                state.caches = Arc::new(fresh);
                None
            }
            Err(error) => Some(error),
        };
        state.damage = damage;
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| Error::internal("the cache state lock is poisoned"))
    }
}

/// Whether a file of `caches` on disk differs from the one opened, or a read
/// found one cut short.
fn changed(caches: &CacheSet) -> bool {
    caches
        .caches()
        .iter()
        .any(|cache| cache.truncation().is_some() || cache.files_changed())
}
