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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{CacheSet, Stamp};
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
    /// Shards hashed after their file changed, by (cache, shard): the file's
    /// stamp then and what the hash found, so that a damaged file is hashed
    /// once, not at every check, until it changes again.
    hashed: HashMap<(usize, usize), (Option<Stamp>, Option<Error>)>,
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
                hashed: HashMap::new(),
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
        // Which shards changed since the set in use was opened: each is hashed
        // whole before the new set is served (a file replaced by garbage of
        // the same length, or written in place, opens without complaint).
        let changed: Vec<(usize, usize, Option<Stamp>)> = state
            .caches
            .caches()
            .iter()
            .enumerate()
            .flat_map(|(c, cache)| {
                cache
                    .changed_shards()
                    .into_iter()
                    .map(move |(s, stamp)| (c, s, stamp))
            })
            .collect();
        let damage = match CacheSet::open_mirrored(&self.paths, self.verify, self.mirror.as_deref())
        {
            Ok(fresh) if fresh.cache_ids() != state.caches.cache_ids() => Some(Error::corrupt(
                &self.paths[0],
                "the caches were replaced by other caches while the server ran; restart \
                 the server to serve them",
            )),
            Ok(fresh) => match Self::check_changed(state, &fresh, &changed) {
                Some(error) => Some(error),
                None => {
                    state.caches = Arc::new(fresh);
                    state.hashed.clear();
                    None
                }
            },
            Err(error) => Some(error),
        };
        state.damage = damage;
    }

    /// The first changed shard of `fresh` whose bytes are not the manifest's.
    fn check_changed(
        state: &mut State,
        fresh: &CacheSet,
        changed: &[(usize, usize, Option<Stamp>)],
    ) -> Option<Error> {
        for &(c, s, stamp) in changed {
            let Some(cache) = fresh.caches().get(c) else {
                continue;
            };
            let verdict = match state.hashed.get(&(c, s)) {
                Some((seen, verdict)) if *seen == stamp => verdict.as_ref().map(Error::duplicate),
                _ => {
                    let verdict = cache.check_shard(s).err();
                    let kept = verdict.as_ref().map(Error::duplicate);
                    state.hashed.insert((c, s), (stamp, kept));
                    verdict
                }
            };
            if verdict.is_some() {
                return verdict;
            }
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::cache::fixture;
    use crate::storage::Codec;

    /// After `CHECK_INTERVAL`, so that the next request compares the files.
    fn later() {
        std::thread::sleep(CHECK_INTERVAL + Duration::from_millis(50));
    }

    fn shard(dir: &Path) -> PathBuf {
        dir.join(crate::storage::shard_file_name(0))
    }

    #[test]
    fn a_shard_overwritten_in_place_or_replaced_is_damage_until_it_is_restored() {
        let base = tempfile::tempdir().unwrap();
        let dir = fixture::write(base.path(), "c", &[100, 200, 300], Codec::None, 1 << 20);
        let live = LiveCaches::open(std::slice::from_ref(&dir), false, None).unwrap();
        assert!(live.problem().is_none());
        let good = std::fs::read(shard(&dir)).unwrap();
        let mut garbage = good.clone();
        garbage[150] ^= 0xff;

        // Written in place: same file, same length, another modification time.
        std::fs::write(shard(&dir), &garbage).unwrap();
        later();
        let problem = live.problem().expect("an overwritten shard is damage");
        assert!(problem.contains("checksum mismatch"), "{problem}");
        assert!(problem.contains("shard-00000.bin"), "{problem}");
        later();
        assert!(
            live.problem().is_some(),
            "and stays so while the file is damaged"
        );

        // Restored: served again.
        std::fs::write(shard(&dir), &good).unwrap();
        later();
        assert!(live.problem().is_none(), "{:?}", live.problem());

        // Replaced by another file of the same length holding garbage.
        let other = dir.join("replacement");
        std::fs::write(&other, &garbage).unwrap();
        std::fs::rename(&other, shard(&dir)).unwrap();
        later();
        assert!(live.problem().is_some(), "a replaced shard is damage");
    }
}
