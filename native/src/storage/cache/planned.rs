//! Planned reads of a cache on object storage: records fetched by range
//! before a stream needs them, shards fetched whole when that is cheaper.
//!
//! A stream is a pure function of its ticket, so its planner knows which
//! records it will read next (`CacheSet::plan`, called a prefetch budget
//! ahead of the batch builders). For a shard that is not in the mirror, those
//! records are fetched now by ranged requests, neighbours coalesced into one,
//! many in flight (`remote::requests_in_flight`), and held here until a
//! builder takes them; a record nobody planned is fetched alone when read.
//! So the first record of a cold stream waits for its own bytes, not for its
//! shard. Every record is still verified by its checksum when read.
//!
//! Each ranged request costs the store about as much as `REQUEST_COST` more
//! bytes; once the records a shard was asked for by range cost as much as the
//! whole shard, the shard is fetched whole into the mirror in the background,
//! if the mirror's budget admits it (`mirror::admit`), and read from there:
//! while it is on its way, its records are no longer fetched by range (reads
//! wait for it), so its bytes are fetched about once.
//! A mirror smaller than the dataset keeps the shards it admitted and serves
//! the rest by range: it is a cache, never a copy that must hold everything.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::error::Result;
use crate::remote::Fetch;
use crate::storage::index::IndexEntry;
use crate::storage::manifest::FileEntry;
use crate::storage::mirror;
use crate::storage::upload::PublishedFiles;

/// What one more ranged request costs, counted in bytes (a request's latency
/// times a store's bandwidth: about 1-2 ms × 500 MiB/s on a loopback radosgw,
/// where a request also costs the store about 1 ms of CPU; tens of ms × 100
/// MiB/s per flow on S3). At 1 MiB a shard of 64 KiB records is fetched whole
/// once about 6 % of its records were asked for by range.
const REQUEST_COST: u64 = 1 << 20;
/// Records closer than this are fetched in one request, the gap with them.
const COALESCE_GAP: u64 = 64 << 10;
/// The longest coalesced request: a failed one is retried alone, in time.
const MAX_RANGE: u64 = 8 << 20;
/// Bytes of planned records held for their readers, per cache: beyond it the
/// oldest plans are forgotten (their records are fetched when read).
const HELD_BYTES: u64 = 256 << 20;
/// Whole-shard fetches of one cache running at once (each a thread; their
/// requests queue among the process's `requests_in_flight`). A shard turned
/// away waits for its records to cost a shard's worth again.
const WHOLE_IN_FLIGHT: usize = 16;
/// How long a read waits for its shard's whole fetch before it fetches its
/// record alone (a fetch that slow is failing).
const WHOLE_WAIT: Duration = Duration::from_secs(60);

/// The planned reads of one cache on object storage.
pub(super) struct Planned {
    /// The published cache's files, by their names in the manifest.
    files: PublishedFiles,
    /// The cache's directory in the mirror, and the mirror's root.
    dir: PathBuf,
    mirror: PathBuf,
    state: Mutex<State>,
    /// Signalled when a whole-shard fetch ends.
    landed: Condvar,
}

#[derive(Default)]
struct State {
    /// Records fetched or being fetched by range, by (shard, offset).
    records: HashMap<(u32, u64), Held>,
    /// Planning order, for forgetting the oldest when over `HELD_BYTES`.
    order: VecDeque<(u32, u64)>,
    held: u64,
    /// Per shard: what its records fetched by range cost (`REQUEST_COST`).
    spent: HashMap<u32, u64>,
    /// Shards fetched whole, or being fetched, into the mirror.
    whole: HashSet<u32>,
    /// Shards being fetched whole now: their records are read from the
    /// mirror once they land (`landed`), not fetched twice.
    fetching: HashSet<u32>,
    /// Shards whose last whole fetch failed: warned about once, not again
    /// until one succeeds (a volume that stays full would repeat it per epoch).
    failed: HashSet<u32>,
}

/// A record a plan asks for: its stored length, how many reads it was planned
/// for, and where the stream first needs it (its index in the plan).
struct Wanted {
    len: u64,
    readers: u32,
    need: usize,
}

/// A planned record: the request that brings it, where it starts in that
/// request's bytes, and how many reads it was planned for.
struct Held {
    fetch: Fetch,
    start: u64,
    len: u64,
    readers: u32,
}

impl Planned {
    pub(super) fn new(files: PublishedFiles, dir: &Path, mirror: &Path) -> Arc<Self> {
        Arc::new(Planned {
            files,
            dir: dir.to_path_buf(),
            mirror: mirror.to_path_buf(),
            state: Mutex::new(State::default()),
            landed: Condvar::new(),
        })
    }

    /// Whether shard `file` is whole in the mirror (read it from there).
    fn mirrored(&self, file: &FileEntry) -> bool {
        std::fs::metadata(self.dir.join(&file.file)).is_ok_and(|m| m.len() == file.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a cache of fetches: a panic that left it half updated
        // costs at most a fetch again.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start fetching `records` (of shards `shards`), which a stream reads
    /// next in this order. Records of shards in the mirror are left alone.
    /// Requests are sent in the order the stream needs their first record
    /// (the store's queue of `requests_in_flight` serves them in that order).
    pub(super) fn plan(self: &Arc<Self>, shards: &[FileEntry], records: &[IndexEntry]) {
        // Per shard, per offset: the record's length, reads planned, first need.
        let mut wanted: BTreeMap<u32, BTreeMap<u64, Wanted>> = BTreeMap::new();
        let mut state = self.lock();
        for (need, record) in records.iter().enumerate().filter(|(_, r)| r.stored_len > 0) {
            if let Some(held) = state.records.get_mut(&(record.shard, record.offset)) {
                held.readers += 1;
                continue;
            }
            let slot = wanted
                .entry(record.shard)
                .or_default()
                .entry(record.offset)
                .or_insert(Wanted {
                    len: record.stored_len,
                    readers: 0,
                    need,
                });
            slot.readers += 1;
        }
        let mut requests = Vec::new();
        for (shard, offsets) in &wanted {
            let Some(file) = shards.get(*shard as usize) else {
                continue;
            };
            if state.fetching.contains(shard) || self.mirrored(file) {
                continue; // read there (a warm mirror, or a whole fetch)
            }
            for range in coalesce(offsets) {
                let need = offsets.range(range.clone()).map(|(_, w)| w.need).min();
                requests.push((need.unwrap_or(0), *shard, range));
            }
        }
        requests.sort_by_key(|(need, _, _)| *need);
        for (_, shard, range) in requests {
            let file = &shards[shard as usize];
            let Ok(fetch) = self.files.fetch_range(&file.file, range.clone()) else {
                return; // no runtime: every read fetches for itself
            };
            *state.spent.entry(shard).or_default() += range.end - range.start + REQUEST_COST;
            for (&offset, wanted) in wanted[&shard].range(range.clone()) {
                state.records.insert(
                    (shard, offset),
                    Held {
                        fetch: fetch.clone(),
                        start: range.start,
                        len: wanted.len,
                        readers: wanted.readers,
                    },
                );
                state.order.push_back((shard, offset));
                state.held += wanted.len;
            }
        }
        for shard in wanted.keys() {
            if let Some(file) = shards.get(*shard as usize) {
                self.consider_whole(&mut state, *shard, file);
            }
        }
        forget_oldest(&mut state);
    }

    /// The stored bytes of `record` of shard `file`, fetched by range (planned
    /// or now); None when the shard is whole in the mirror, to be read there.
    pub(super) fn record(
        self: &Arc<Self>,
        file: &FileEntry,
        record: &IndexEntry,
    ) -> Result<Option<Bytes>> {
        let key = (record.shard, record.offset);
        let planned = {
            let mut state = self.lock();
            if let Some(held) = state.records.get_mut(&key) {
                held.readers = held.readers.saturating_sub(1);
                let taken = (held.fetch.clone(), held.start, held.len, held.readers);
                if taken.3 == 0 {
                    state.records.remove(&key);
                    state.held = state.held.saturating_sub(taken.2);
                }
                Some((taken.0, taken.1, taken.2))
            } else if state.fetching.contains(&record.shard) {
                // The shard is on its way whole: read it there when it lands.
                let shard = record.shard;
                let (_state, waited) = self
                    .landed
                    .wait_timeout_while(state, WHOLE_WAIT, |s| s.fetching.contains(&shard))
                    .unwrap_or_else(|p| p.into_inner());
                if !waited.timed_out() && self.mirrored(file) {
                    return Ok(None);
                }
                None
            } else if self.mirrored(file) {
                return Ok(None);
            } else {
                *state.spent.entry(record.shard).or_default() += record.stored_len + REQUEST_COST;
                self.consider_whole(&mut state, record.shard, file);
                None
            }
        };
        if let Some((fetch, start, len)) = planned {
            let at = (record.offset - start) as usize;
            // A planned request that failed is asked again, alone, once.
            if let Ok(bytes) = fetch.wait() {
                return Ok(Some(bytes.slice(at..at + len as usize)));
            }
        }
        let range = record.offset..record.offset + record.stored_len;
        self.files.fetch_range(&file.file, range)?.wait().map(Some)
    }

    /// Fetch shard `file` whole into the mirror, in the background, once its
    /// records fetched by range cost as much as it does and the mirror has
    /// room for it.
    fn consider_whole(self: &Arc<Self>, state: &mut State, shard: u32, file: &FileEntry) {
        let spent = state.spent.get(&shard).copied().unwrap_or(0);
        if spent < file.bytes || state.whole.contains(&shard) {
            return;
        }
        if state.fetching.len() >= WHOLE_IN_FLIGHT || !mirror::admit(&self.mirror, file.bytes) {
            // Asked again once its records have cost as much once more.
            state.spent.insert(shard, 0);
            return;
        }
        state.whole.insert(shard);
        state.fetching.insert(shard);
        let (this, file) = (self.clone(), file.clone());
        let started = std::thread::Builder::new()
            .name("drt-mirror-fetch".into())
            .spawn(move || {
                let fetched = this.files.download_known(
                    &file.file,
                    file.bytes,
                    &this.dir.join(&file.file),
                    &|_| {},
                );
                mirror::settle(file.bytes);
                let mut state = this.lock();
                state.fetching.remove(&shard);
                match fetched {
                    Ok(()) => {
                        state.failed.remove(&shard);
                    }
                    Err(error) => {
                        // Read by range until a later plan tries again.
                        if state.failed.insert(shard) {
                            eprintln!(
                                "warning: {error}; its records are read by range meanwhile, \
                                 and it is fetched whole again once they have cost its size \
                                 (not warned again until a fetch of it succeeds)"
                            );
                        }
                        state.whole.remove(&shard);
                        state.spent.insert(shard, 0);
                    }
                }
                this.landed.notify_all();
            });
        if started.is_err() {
            mirror::settle(file.bytes);
            state.whole.remove(&shard);
            state.fetching.remove(&shard);
        }
    }
}

/// The requests that fetch `offsets`, in order: neighbours closer than
/// `COALESCE_GAP` share one, up to `MAX_RANGE` bytes.
fn coalesce(offsets: &BTreeMap<u64, Wanted>) -> Vec<std::ops::Range<u64>> {
    let mut ranges: Vec<std::ops::Range<u64>> = Vec::new();
    for (&offset, wanted) in offsets {
        let end = offset + wanted.len;
        match ranges.last_mut() {
            Some(last) if offset <= last.end + COALESCE_GAP && end - last.start <= MAX_RANGE => {
                last.end = last.end.max(end);
            }
            _ => ranges.push(offset..end),
        }
    }
    ranges
}

/// Forget the oldest plans while more than `HELD_BYTES` are held: their
/// records are fetched again when read (never wrong, only slower).
fn forget_oldest(state: &mut State) {
    while state.held > HELD_BYTES {
        let Some(key) = state.order.pop_front() else {
            break;
        };
        if let Some(held) = state.records.remove(&key) {
            state.held = state.held.saturating_sub(held.len);
        }
    }
    if state.order.len() > 4 * state.records.len() + 1024 {
        let records = &state.records;
        state.order.retain(|key| records.contains_key(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_share_a_request_and_far_records_do_not() {
        let mut offsets = BTreeMap::new();
        let wanted = |len| Wanted {
            len,
            readers: 1,
            need: 0,
        };
        for (offset, len) in [(0, 100), (100, 100), (60_000, 10), (1 << 20, 5)] {
            offsets.insert(offset, wanted(len));
        }
        assert_eq!(
            coalesce(&offsets),
            vec![0..60_010, (1 << 20)..(1 << 20) + 5]
        );
        let mut long = BTreeMap::new();
        for i in 0..20u64 {
            long.insert(i << 20, wanted(1 << 20));
        }
        let ranges = coalesce(&long);
        assert!(
            ranges.iter().all(|r| r.end - r.start <= MAX_RANGE),
            "{ranges:?}"
        );
        assert_eq!(ranges.first().map(|r| r.start), Some(0));
        assert_eq!(ranges.last().map(|r| r.end), Some(20 << 20));
    }
}
