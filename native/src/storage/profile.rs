//! `WriteProfile`: how a cache write spent its time, stage by stage.
//!
//! Counters (calls, bytes, nanoseconds) per `Stage`, shared by the binding
//! (pulling records from Python), the workers (compression) and the writer
//! (disk writes, the manifest, publication). Atomic, so any thread records
//! into the same profile; reading it is a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A stage of a cache write, in pipeline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// One `next()` on the source's iterator (the last one ends it).
    PythonNext,
    /// Reading one record's payload bytes and metadata out of Python objects.
    PythonExtract,
    /// Encoding one payload (compression and checksum), on a worker.
    Compression,
    /// Appending one encoded record to its shard.
    DiskWrite,
    /// Closing the last shard and writing the index, metadata and manifest.
    FinishManifest,
    /// The atomic rename that makes the cache visible.
    Publish,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::PythonNext,
        Stage::PythonExtract,
        Stage::Compression,
        Stage::DiskWrite,
        Stage::FinishManifest,
        Stage::Publish,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::PythonNext => "python_next",
            Stage::PythonExtract => "python_extract",
            Stage::Compression => "compression",
            Stage::DiskWrite => "disk_write",
            Stage::FinishManifest => "finish_manifest",
            Stage::Publish => "publish",
        }
    }
}

#[derive(Debug, Default)]
struct Counter {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

/// One stage's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct StageTotals {
    pub stage: Stage,
    pub calls: u64,
    pub bytes: u64,
    pub seconds: f64,
}

#[derive(Debug, Default)]
pub struct WriteProfile {
    counters: [Counter; 6],
}

impl WriteProfile {
    /// Count one call of `stage` that handled `bytes` and took `elapsed`.
    pub fn record(&self, stage: Stage, bytes: u64, elapsed: Duration) {
        let counter = &self.counters[stage as usize];
        counter.calls.fetch_add(1, Ordering::Relaxed);
        counter.bytes.fetch_add(bytes, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        counter.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The totals of every stage, in pipeline order.
    pub fn totals(&self) -> Vec<StageTotals> {
        Stage::ALL
            .iter()
            .map(|&stage| {
                let counter = &self.counters[stage as usize];
                StageTotals {
                    stage,
                    calls: counter.calls.load(Ordering::Relaxed),
                    bytes: counter.bytes.load(Ordering::Relaxed),
                    seconds: counter.nanos.load(Ordering::Relaxed) as f64 / 1e9,
                }
            })
            .collect()
    }
}

/// Run `step`, counting it as one call of `stage` with `bytes` when there is a
/// profile (and only running it when there is none).
pub fn timed<T>(
    profile: Option<&WriteProfile>,
    stage: Stage,
    bytes: u64,
    step: impl FnOnce() -> T,
) -> T {
    match profile {
        None => step(),
        Some(profile) => {
            let start = Instant::now();
            let out = step();
            profile.record(stage, bytes, start.elapsed());
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_bytes_and_time_per_stage() {
        let profile = WriteProfile::default();
        let out = timed(Some(&profile), Stage::DiskWrite, 10, || 7);
        assert_eq!(out, 7);
        timed(Some(&profile), Stage::DiskWrite, 5, || ());
        profile.record(Stage::Publish, 0, Duration::from_millis(2));
        let totals = profile.totals();
        let names: Vec<_> = totals.iter().map(|t| t.stage.name()).collect();
        assert_eq!(
            names,
            [
                "python_next",
                "python_extract",
                "compression",
                "disk_write",
                "finish_manifest",
                "publish"
            ]
        );
        assert_eq!((totals[3].calls, totals[3].bytes), (2, 15));
        assert_eq!(totals[5].calls, 1);
        assert!(totals[5].seconds >= 0.002);
        assert_eq!(totals[0].calls, 0);
        assert_eq!(timed(None, Stage::PythonNext, 1, || 3), 3);
    }
}
