//! What this process asked of object storage: requests and bytes received,
//! for the figures of a replica's load on its store (requests per GiB), and
//! the store's slow-down answers (counted by `slow_downs::Counting`).

use std::sync::atomic::{AtomicU64, Ordering};

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static SLOW_DOWNS: AtomicU64 = AtomicU64::new(0);

/// One read request answered with `bytes` bytes.
pub fn request(bytes: u64) {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// (read requests, bytes received) since the process started.
pub fn read() -> (u64, u64) {
    (
        REQUESTS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

/// One slow-down answer (503 or 429), retried or not.
pub(super) fn slow_down() {
    SLOW_DOWNS.fetch_add(1, Ordering::Relaxed);
}

/// Slow-down answers this process received since it started.
pub fn slow_downs() -> u64 {
    SLOW_DOWNS.load(Ordering::Relaxed)
}
