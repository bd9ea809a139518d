//! The size bound of a replica's mirror of caches on object storage.
//!
//! Shards are fetched whole into the mirror when first read
//! (`Cache::open_remote`). When a fetch takes the shards of the mirror past
//! the budget, the least recently fetched or opened others are deleted until
//! it fits again. A deleted shard that an open cache still maps stays
//! readable through its mapping; the server notices the file is gone
//! (`LiveCaches`), reopens the cache, and fetches the shard again when a read
//! needs it. So the budget bounds the disk the mirror keeps, and a budget
//! smaller than what the streams read in turn (the whole cache, for draws
//! over all of it) makes every epoch fetch again: size it to the caches.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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
