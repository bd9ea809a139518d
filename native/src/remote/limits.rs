//! How much a process asks of object storage at once: parts of uploads,
//! ranged reads, whole-object downloads (each bounded by a semaphore shared by
//! the process, some tunable from the environment).

use std::sync::OnceLock;

/// Parts of an upload of many files in flight at once, over the files
/// uploaded together (`upload_files`): `DATASET_RT_PARTS_IN_FLIGHT`, 8 unless
/// set (two 64 MiB shards at a time, four parts each).
pub fn parts_in_flight() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| env_count("DATASET_RT_PARTS_IN_FLIGHT", 8, 256))
}

/// Ranged requests of the whole process in flight at once (planned reads,
/// `fetch_range`): `DATASET_RT_REQUESTS_IN_FLIGHT`, 32 unless set. Enough to
/// cover a store's latency at its bandwidth (64 KiB records at 1 ms each, 32
/// at once: 2 GiB/s), few enough for one replica to stay a polite client.
pub fn requests_in_flight() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| env_count("DATASET_RT_REQUESTS_IN_FLIGHT", 32, 4096))
}

/// The count in the environment variable `name` when it is one from 1 to
/// `max`, else `default`.
fn env_count(name: &str, default: usize, max: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| (1..=max).contains(&n))
        .unwrap_or(default)
}

/// Ranges of whole-object downloads in flight in the process (`download`).
const DOWNLOADS_IN_FLIGHT: usize = 2;

pub(super) fn downloads() -> &'static tokio::sync::Semaphore {
    static SEMAPHORE: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    SEMAPHORE.get_or_init(|| tokio::sync::Semaphore::new(DOWNLOADS_IN_FLIGHT))
}

pub(super) fn in_flight() -> &'static tokio::sync::Semaphore {
    static SEMAPHORE: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    SEMAPHORE.get_or_init(|| tokio::sync::Semaphore::new(requests_in_flight()))
}
