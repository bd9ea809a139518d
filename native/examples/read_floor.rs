//! The floor of a sampled, verified read, beside the engine's own read, on one
//! thread: how much of a stream's per-record CPU is work no reader can skip.
//!
//! ```sh
//! cargo run --release -p dataset_rt_native --example read_floor -- CACHE_DIR [REPEATS]
//! ```
//!
//! Over the same random record ids (about 1 GiB of payload, from a stream key
//! as the engine draws), each pass is timed in this thread's CPU time:
//!
//! - `hash`: each record's stored bytes hashed with xxh3 where they are mapped,
//!   asked for ahead as the batch builder asks (`Cache::prefetch`): the least
//!   a reader that verifies what it sends does (no index lookup counted, no
//!   checksum compared, nothing copied);
//! - `hash + copy`: the same, and the bytes appended to a reused 4 MiB batch
//!   buffer (a batch must own its bytes unless they are lent);
//! - `read_into`: the engine's read (`Cache::read_into`: index entry, checks,
//!   hash, copy: records of 4 KiB and more with non-temporal stores), with the
//!   same prefetch, into a reused 4 MiB buffer.
//!
//! Records of `LARGE_RECORD` (256 KiB) or more are read by `pread` in
//! `read_into`, and the Flight server lends them instead of copying them: for
//! them, `hash` is the floor that counts. `benchmarks/README.md` ("The floor
//! of a verified read") has figures; `benchmarks/bench_flight.py --floor` runs
//! this program on each of its caches and sets the result beside the raw
//! server's CPU (it reads the last line, `floor`: `hash` for records the server
//! lends, else the lesser of `hash + copy` and `read_into`).

// A record read once already cannot fail but by a bug: a panic is the report.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use dataset_rt_native::hash::xxh3_64;
use dataset_rt_native::sampling::word_at;
use dataset_rt_native::storage::{Cache, IndexEntry, LARGE_RECORD};

const GIB: f64 = (1u64 << 30) as f64;
/// A batch's payload buffer at most (the stream's default batch bytes).
const BATCH_BYTES: usize = 4 << 20;
/// Records asked for ahead of their read, as the batch builder does.
const AHEAD: usize = 8;

fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Run `pass` over every id (with the entry `AHEAD` records on asked for
/// first); its CPU seconds.
fn timed(cache: &Cache, ids: &[u64], entries: &[IndexEntry], mut pass: impl FnMut(u64)) -> f64 {
    let started = thread_cpu();
    for (i, &id) in ids.iter().enumerate() {
        if let Some(ahead) = entries.get(i + AHEAD) {
            cache.prefetch(ahead);
        }
        pass(id);
    }
    (thread_cpu() - started).as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: read_floor CACHE_DIR [REPEATS]")?);
    let repeats: usize = match args.next() {
        Some(text) => text
            .parse()
            .map_err(|_| format!("REPEATS must be a whole number >= 1, got {text:?}"))?,
        None => 5,
    };
    if repeats == 0 {
        return Err("REPEATS must be at least 1".into());
    }
    let cache = Cache::open(&dir, false)?;
    let count = cache.manifest().record_count;
    if count == 0 {
        return Err(format!("{} holds no records", dir.display()).into());
    }
    let first = cache.entry(0).ok_or("record 0 has no index entry")?;
    let draws = ((GIB / first.raw_len.max(1) as f64) as u64).clamp(1, 1 << 21);
    let ids: Vec<u64> = (0..draws).map(|i| word_at(7, i) % count).collect();
    let entries: Vec<IndexEntry> = ids
        .iter()
        .map(|&id| {
            cache
                .entry(id)
                .ok_or(format!("record {id} has no index entry"))
        })
        .collect::<Result<_, _>>()?;
    let bytes: u64 = entries.iter().map(|e| e.raw_len).sum();
    let mut batch: Vec<u8> = Vec::with_capacity(BATCH_BYTES);
    let append = |out: &mut Vec<u8>, bytes: &[u8]| {
        if out.len() + bytes.len() > BATCH_BYTES {
            out.clear();
        }
        out.extend_from_slice(bytes);
    };
    // One engine read per record first: it opens every shard (mapped bytes
    // are reachable once a shard is open) and checks the cache is whole.
    let mut out = Vec::new();
    for &id in &ids {
        out.clear();
        cache.read_into(id, &mut out)?;
        if cache.stored_as_is(id).is_none() {
            return Err(format!(
                "record {id} is stored encoded: the floor is measured on records \
                 stored as they are (a cache written without a codec)"
            )
            .into());
        }
    }
    let stored = |id: u64| cache.stored_as_is(id).unwrap_or_default();
    let mut figures: [Vec<f64>; 3] = Default::default();
    let mut reused: Vec<u8> = Vec::with_capacity(BATCH_BYTES);
    for _ in 0..repeats {
        figures[0].push(timed(&cache, &ids, &entries, |id| {
            black_box(xxh3_64(stored(id)));
        }));
        figures[1].push(timed(&cache, &ids, &entries, |id| {
            let bytes = stored(id);
            black_box(xxh3_64(bytes));
            append(&mut batch, bytes);
        }));
        figures[2].push(timed(&cache, &ids, &entries, |id| {
            if reused.len() + first.raw_len as usize > BATCH_BYTES {
                reused.clear();
            }
            cache
                .read_into(id, &mut reused)
                .expect("a record read before");
        }));
    }
    println!(
        "{} records of {} bytes ({} draws, {:.2} GiB), median of {repeats} passes, one thread:",
        count,
        first.raw_len,
        draws,
        bytes as f64 / GIB
    );
    let medians = figures.map(|mut seconds| {
        seconds.sort_by(f64::total_cmp);
        seconds[seconds.len() / 2]
    });
    let [hash, hash_copy, read_into] = medians;
    // What a verified stream cannot skip: the hash of a record the Flight
    // server lends, else the cheaper of a hash and copy and the engine's read.
    let floor = if first.raw_len >= LARGE_RECORD {
        hash
    } else {
        hash_copy.min(read_into)
    };
    for (name, median) in [
        ("hash", hash),
        ("hash + copy", hash_copy),
        ("read_into", read_into),
        ("floor", floor),
    ] {
        println!(
            "  {name:<12} {:>8.0} ns/record  {:.3} CPU s/GiB",
            median / draws as f64 * 1e9,
            median / (bytes as f64 / GIB)
        );
    }
    Ok(())
}
