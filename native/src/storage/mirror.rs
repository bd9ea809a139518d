//! The size bound of a replica's mirror of caches on object storage.
//!
//! Records of shards that are not in the mirror are fetched by range
//! (`cache::planned`); a shard is fetched whole into the mirror when its
//! records cost as much, if `admit` finds room for it: within the budget,
//! after deleting shards unused for a while. A mirror smaller than the dataset
//! so keeps the shards it admitted and serves the others by range, instead of
//! evicting, least recently used first, the shards a shuffled epoch needs
//! again. A shard read whole for another reason (a verification) is fetched
//! anyway and then `evict`s the least recently used others. A deleted shard
//! that an open cache still maps stays readable through its mapping, and one
//! that is gone is fetched again when a read needs it: eviction is never
//! damage (`ShardSource::refetches`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// Bytes of shards a mirror keeps (0: no bound).
static BUDGET: AtomicU64 = AtomicU64::new(0);

/// Bound every mirror of this process to `bytes` of shards (0: no bound).
pub fn set_budget(bytes: u64) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

pub fn budget() -> u64 {
    BUDGET.load(Ordering::Relaxed)
}

fn is_shard(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("shard-") && n.ends_with(".bin"))
}

/// The shard files under `root` with their size and last use (mtime).
fn shards(root: &Path) -> Vec<(SystemTime, u64, PathBuf)> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                dirs.push(path);
            } else if is_shard(&path) {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.push((used, meta.len(), path));
            }
        }
    }
    found
}

/// Mark `shard` as just used (its mtime), for the eviction order.
pub fn touch(shard: &Path) {
    let _ = std::fs::File::options()
        .write(true)
        .open(shard)
        .and_then(|f| f.set_modified(SystemTime::now()));
}

/// How long a shard must go unused before `admit` may delete it for another:
/// longer than an epoch's pass over a mirror's worth of shards, so that a
/// mirror smaller than the dataset keeps what it holds instead of trading
/// shards the stream needs again (LRU over a shuffled epoch evicts exactly
/// those).
const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Bytes of shards admitted and still being fetched (not yet files to count).
static RESERVED: Mutex<u64> = Mutex::new(0);

/// Whether a shard of `bytes` may be fetched whole into the mirror at `root`:
/// with no budget, always; otherwise when it fits beside the shards there and
/// those being fetched, after deleting the shards unused for `IDLE`, least
/// recently used first. An admitted fetch is `settle`d when it ends.
pub fn admit(root: &Path, bytes: u64) -> bool {
    let mut reserved = RESERVED.lock().unwrap_or_else(|p| p.into_inner());
    let budget = budget();
    if budget != 0 {
        let mut found = shards(root);
        let mut total: u64 = *reserved + found.iter().map(|(_, bytes, _)| bytes).sum::<u64>();
        found.sort();
        let idle_since = SystemTime::now() - IDLE;
        for (used, size, path) in found {
            if total + bytes <= budget || used > idle_since {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= size;
            }
        }
        if total + bytes > budget {
            return false;
        }
    }
    *reserved += bytes;
    true
}

/// An admitted fetch of `bytes` ended (its file is counted now, or it failed).
pub fn settle(bytes: u64) {
    let mut reserved = RESERVED.lock().unwrap_or_else(|p| p.into_inner());
    *reserved = reserved.saturating_sub(bytes);
}

/// Delete the least recently used shards under `root` (never `keep`) while
/// they take more than the budget. Returns the bytes freed. Best effort: a
/// file another process removed first is skipped.
pub fn evict(root: &Path, keep: &Path) -> u64 {
    let budget = budget();
    if budget == 0 {
        return 0;
    }
    let mut found = shards(root);
    let mut total: u64 = found.iter().map(|(_, bytes, _)| bytes).sum();
    found.sort();
    let mut freed = 0;
    for (_, bytes, path) in found {
        if total <= budget {
            break;
        }
        if path == keep {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= bytes;
            freed += bytes;
        }
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_least_recently_used_shards_go_first_and_the_new_one_stays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).expect("mkdir");
        let paths: Vec<PathBuf> = (0..4)
            .map(|i| sub.join(format!("shard-0000{i}.bin")))
            .collect();
        for (i, path) in paths.iter().enumerate() {
            std::fs::write(path, vec![0u8; 100]).expect("write");
            let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(path)
                .and_then(|f| f.set_modified(when))
                .expect("mtime");
        }
        std::fs::write(sub.join("index.bin"), vec![0u8; 1000]).expect("write");
        set_budget(0);
        assert_eq!(evict(dir.path(), &paths[0]), 0, "no budget, no eviction");
        set_budget(250);
        // The oldest is the one just fetched: kept; the next two oldest go.
        assert_eq!(evict(dir.path(), &paths[0]), 200);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, vec![true, false, false, true]);
        assert!(sub.join("index.bin").exists(), "only shards are evicted");
        set_budget(0);
    }
}
