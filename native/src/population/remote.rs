//! A population store's shared state on object storage
//! (docs/storage-format.md, "On object storage").
//!
//! ```text
//! <url>/<dataset>/caches-<key>/populations/<id>.rows    uploaded first
//! <url>/<dataset>/caches-<key>/populations/<id>.arrow   then the table: its presence publishes both
//! <url>/<dataset>/caches-<key>/active/<seq>.json        the activation log (20-digit seq)
//! <url>/<dataset>/caches-<key>/runs/<run>/<gen>.json    the generations of a run (run/fence.rs)
//! ```
//! Populations are content-addressed and written once, so any replica may
//! upload one and any replica may download it into its local mirror and map
//! it there. The active pointer is the newest entry of an append-only log:
//! an activation reads the newest entry (seq n), decides, and creates entry
//! n + 1 with `If-None-Match: *`. Of replicas racing for n + 1 exactly one
//! creates it; the others read again and append after it, so every
//! acknowledged activation has its own place in the log and the last one
//! acknowledged is the active one, as with the file store's lock. Readers
//! ask for the entry after the newest one they know (one small request) at
//! most once per `Bucket::freshness` (a second on object storage; every read on a
//! directory, where a listing is cheap and coherent), so a replica sees
//! another's activation within that time.
//!
//! The same log runs on a local directory (`Bucket::local`), where a
//! create-only put is `link(2)` of a complete, fsynced file: atomic and
//! exclusive on any POSIX file system, so replicas sharing a volume (NFS
//! included) append to it as they would to a bucket.
//!
//! A bucket is shared, so the log must survive what anyone with write access
//! leaves in it (issue 46, finding 2). The log is the chain of entries with
//! consecutive sequence numbers from the first one a replica reads; each
//! entry takes its place in the chain whether or not it is valid, and an
//! entry that is larger than `MAX_ENTRY_BYTES`, does not parse, or names an
//! invalid population or one that is not in the store is skipped: the entry
//! before it stays active, and the next activation appends after it. A name
//! that is not a 20-digit sequence number, or an entry past a gap in the
//! chain (far in the future), is not part of the log. Each skip is reported
//! once per process (stderr) and counted (`skipped`).
//!
//! A replica lists the log at most once, at its start, and not even then
//! when it can help it: after every append, the writer records the entry's
//! sequence number in `CHECKPOINT` (a plain overwrite; a hint like Delta's
//! `_last_checkpoint`), and a starting replica reads the entry it names. A
//! missing, damaged or stale checkpoint only costs one listing. From there a
//! read asks for the next entry by name (`HEAD`), so a read that finds
//! nothing new costs one small request (or a `stat`) however long the log.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::PopulationId;
use crate::remote::Bucket;

/// Rounds an activation retries when others keep winning before it gives up.
const MAX_ROUNDS: usize = 200;
const LOG: &str = "active";
/// Where the newest appended sequence number is recorded (outside `LOG`).
const CHECKPOINT: &str = "active-checkpoint.json";
/// An entry is about 80 bytes; anything much larger is not one.
pub const MAX_ENTRY_BYTES: u64 = 4096;
/// Skipped names remembered for warning once (bounded; past it, no warnings).
const WARNED: usize = 1024;
/// Entries one read follows at most (the next read goes on from there).
const MAX_STEPS: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogEntry {
    population: String,
    epoch_len: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Checkpoint {
    seq: u64,
}

/// What the newest valid entry of the log says: the active population.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivePopulation {
    pub population: PopulationId,
    pub epoch_len: u64,
}

/// The newest log entry this process has seen.
#[derive(Debug, Default)]
struct Head {
    /// The sequence number of the newest entry in the chain (0: none yet).
    seq: u64,
    active: Option<ActivePopulation>,
    read_at: Option<Instant>,
    /// Names already reported as skipped.
    warned: HashSet<String>,
}

#[derive(Debug)]
pub struct RemoteLog {
    bucket: Bucket,
    head: Mutex<Head>,
    skipped: AtomicU64,
}

fn entry_name(seq: u64) -> String {
    format!("{LOG}/{seq:020}.json")
}

impl RemoteLog {
    /// The log under `bucket`. `legacy` is the active pointer from before
    /// the log's first entry (a directory store's `active.json`): active
    /// while the log has no valid entry.
    pub fn new(bucket: Bucket, legacy: Option<ActivePopulation>) -> Self {
        RemoteLog {
            bucket,
            head: Mutex::new(Head {
                active: legacy,
                ..Head::default()
            }),
            skipped: AtomicU64::new(0),
        }
    }

    /// Entries this process skipped as damaged, hostile or out of place.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Head>> {
        self.head
            .lock()
            .map_err(|_| Error::internal("the activation log's state was poisoned"))
    }

    /// The active population, at most the bucket's `freshness` old.
    pub fn active(&self) -> Result<Option<ActivePopulation>> {
        {
            let head = self.lock()?;
            let fresh = self.bucket.freshness();
            if head.read_at.is_some_and(|at| at.elapsed() < fresh) {
                return Ok(head.active.clone());
            }
        }
        Ok(self.refresh()?.1)
    }

    /// Read the entries after the newest one known; returns the newest.
    fn refresh(&self) -> Result<(u64, Option<ActivePopulation>)> {
        let mut head = self.lock()?;
        if head.read_at.is_none() && head.seq == 0 {
            self.find_start(&mut head)?;
        }
        // Along the chain: entry seq + 1 while there is one. A read that
        // finds nothing new costs one `HEAD` (a `stat` on a directory),
        // however long the log.
        for _ in 0..MAX_STEPS {
            // From an empty log (0) the first entry is 1: writers append
            // after the newest entry they know.
            let Some(next) = head.seq.checked_add(1) else {
                break;
            };
            let name = entry_name(next);
            let Some(size) = self.bucket.size(&name)? else {
                break;
            };
            head.seq = next;
            match self.read_entry(&name, size)? {
                Ok(active) => head.active = Some(active),
                Err(reason) => self.skip(&mut head, &name, &reason),
            }
        }
        head.read_at = Some(Instant::now());
        Ok((head.seq, head.active.clone()))
    }

    /// Where a process that has read nothing yet stands: at the entry the
    /// checkpoint names, if it is a valid one; else at the end of the chain
    /// that the whole log, listed once, holds, with the newest valid entry
    /// in it active.
    fn find_start(&self, head: &mut Head) -> Result<()> {
        if let Some(seq) = self.checkpoint()? {
            let name = entry_name(seq);
            if let Some(size) = self.bucket.size(&name)? {
                if let Ok(active) = self.read_entry(&name, size)? {
                    head.seq = seq;
                    head.active = Some(active);
                    return Ok(());
                }
            }
        }
        let mut chain: Vec<(u64, String, u64)> = Vec::new();
        for (name, size) in self.bucket.list_sized(LOG, None)? {
            let Some(seq) = parse_seq(&name) else {
                self.skip(head, &name, "its name is not a 20-digit sequence number");
                continue;
            };
            if let Some(&(last, _, _)) = chain.last() {
                if seq != last + 1 {
                    // Past a gap: not (yet) part of the log, nor what follows.
                    let reason = format!(
                        "it lies past a gap in the log (entry {} is missing)",
                        last + 1
                    );
                    self.skip(head, &name, &reason);
                    break;
                }
            }
            chain.push((seq, name, size));
        }
        let Some(&(end, _, _)) = chain.last() else {
            return Ok(());
        };
        head.seq = end;
        for (_, name, size) in chain.iter().rev() {
            match self.read_entry(name, *size)? {
                Ok(active) => {
                    head.active = Some(active);
                    break;
                }
                Err(reason) => self.skip(head, name, &reason),
            }
        }
        Ok(())
    }

    /// The sequence number the checkpoint records, if it holds one.
    fn checkpoint(&self) -> Result<Option<u64>> {
        Ok(self
            .bucket
            .get(CHECKPOINT)?
            .filter(|bytes| bytes.len() as u64 <= MAX_ENTRY_BYTES)
            .and_then(|bytes| serde_json::from_slice::<Checkpoint>(&bytes).ok())
            .map(|c| c.seq)
            .filter(|&seq| seq > 0))
    }

    /// The activation an entry holds, or why it is skipped. The store being
    /// unreachable is an error (not a reason to skip).
    fn read_entry(
        &self,
        name: &str,
        size: u64,
    ) -> Result<std::result::Result<ActivePopulation, String>> {
        if size > MAX_ENTRY_BYTES {
            return Ok(Err(format!(
                "it holds {size} bytes; an entry is at most {MAX_ENTRY_BYTES}"
            )));
        }
        let Some(bytes) = self.bucket.get(name)? else {
            return Ok(Err("it was listed but cannot be read".into()));
        };
        if bytes.len() as u64 > MAX_ENTRY_BYTES {
            return Ok(Err(format!("it holds more than {MAX_ENTRY_BYTES} bytes")));
        }
        let entry: LogEntry = match serde_json::from_slice(&bytes) {
            Ok(entry) => entry,
            Err(e) => return Ok(Err(format!("it is not an activation ({e})"))),
        };
        let Ok(population) = PopulationId::parse(&entry.population) else {
            return Ok(Err("it names no valid population id".into()));
        };
        if entry.epoch_len == 0 {
            return Ok(Err("its epoch length is 0".into()));
        }
        if !self.bucket.exists(&population_key(&population))? {
            return Ok(Err(format!(
                "it names population {population}, which is not in the store"
            )));
        }
        Ok(Ok(ActivePopulation {
            population,
            epoch_len: entry.epoch_len,
        }))
    }

    /// Count a skipped entry and report it once.
    fn skip(&self, head: &mut Head, name: &str, reason: &str) {
        if head.warned.len() >= WARNED || !head.warned.insert(name.to_string()) {
            return;
        }
        self.skipped.fetch_add(1, Ordering::Relaxed);
        let shown: String = name.chars().take(120).collect();
        eprintln!(
            "warning: skipped {shown} in the activation log of {}: {reason}; the entry \
             before it stays active (remove the object to silence this)",
            self.bucket.url()
        );
    }

    /// Change the active pointer by `change` (given the newest entry; None
    /// leaves it as it is), appended as the next entry of the log: retried on
    /// the newest entry while other replicas win the race. Returns the active
    /// population afterwards.
    pub fn update(
        &self,
        mut change: impl FnMut(Option<&ActivePopulation>) -> Result<Option<ActivePopulation>>,
    ) -> Result<Option<ActivePopulation>> {
        for _ in 0..MAX_ROUNDS {
            let (seq, current) = self.refresh()?;
            let Some(next) = change(current.as_ref())? else {
                return Ok(current);
            };
            // Never an entry that readers would skip (`read_entry`).
            if !self.bucket.exists(&population_key(&next.population))? {
                return Err(Error::NotFound(format!(
                    "population {} is not in the store {}; store it before activating it",
                    next.population,
                    self.bucket.url()
                )));
            }
            let entry = LogEntry {
                population: next.population.to_string(),
                epoch_len: next.epoch_len,
            };
            let bytes = serde_json::to_vec(&entry)
                .map_err(|e| Error::internal(format!("cannot encode an activation: {e}")))?;
            if self.bucket.create(&entry_name(seq + 1), bytes)? {
                self.record_checkpoint(seq + 1);
                let mut head = self.lock()?;
                if head.seq <= seq + 1 {
                    head.seq = seq + 1;
                    head.active = Some(next.clone());
                    head.read_at = Some(Instant::now());
                }
                return Ok(Some(next));
            }
        }
        Err(Error::Unavailable(format!(
            "the activation at {} lost the race to other replicas {MAX_ROUNDS} times in a \
             row; retry it",
            self.bucket.url()
        )))
    }
}

impl RemoteLog {
    /// Best effort: a lost or older checkpoint only makes a start list more.
    fn record_checkpoint(&self, seq: u64) {
        if let Ok(bytes) = serde_json::to_vec(&Checkpoint { seq }) {
            let _ = self.bucket.put(CHECKPOINT, bytes);
        }
    }
}

/// The object whose presence says a population is stored (`store.rs`).
fn population_key(id: &PopulationId) -> String {
    format!("populations/{id}.arrow")
}

fn parse_seq(name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(LOG)?
        .strip_prefix('/')?
        .strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;
    use std::sync::Arc;

    fn bucket(dir: &std::path::Path) -> Bucket {
        let store = LocalFileSystem::new_with_prefix(dir).expect("store");
        Bucket::from_store(Arc::new(store), "file://test")
    }

    fn log(dir: &std::path::Path) -> RemoteLog {
        RemoteLog::new(bucket(dir), None)
    }

    /// The activation of population `id` (32 times the character), which is
    /// stored in the bucket at `dir`.
    fn active(dir: &std::path::Path, id: char, epoch_len: u64) -> ActivePopulation {
        let population = id.to_string().repeat(32);
        bucket(dir)
            .put(
                &format!("populations/{population}.arrow"),
                b"table".to_vec(),
            )
            .expect("store a population");
        ActivePopulation {
            population: PopulationId::parse(&population).expect("an id"),
            epoch_len,
        }
    }

    fn entry(dir: &std::path::Path, name: &str, bytes: &[u8]) {
        bucket(dir)
            .put(name, bytes.to_vec())
            .expect("write an entry");
    }

    #[test]
    fn every_update_is_the_next_entry_and_readers_see_the_newest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (log(dir.path()), log(dir.path()));
        assert_eq!(a.active().expect("read"), None);
        let first = active(dir.path(), 'a', 1);
        a.update(|_| Ok(Some(first.clone()))).expect("update");
        // `b` has never read: it lists at once.
        assert_eq!(b.active().expect("read"), Some(first));
        // A change computed from the newest entry, through the other handle.
        b.update(|current| {
            let mut next = current.cloned().expect("an active one");
            next.epoch_len = 9;
            Ok(Some(next))
        })
        .expect("update");
        let (seq, newest) = a.refresh().expect("refresh");
        assert_eq!((seq, newest), (2, Some(active(dir.path(), 'a', 9))));
        // No change: nothing appended.
        a.update(|_| Ok(None)).expect("update");
        assert_eq!(a.refresh().expect("refresh").0, 2);
        assert_eq!(a.skipped() + b.skipped(), 0);
    }

    #[test]
    fn racing_writers_each_get_their_own_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let writers: Vec<_> = ['a', 'b', 'c', 'd']
            .into_iter()
            .map(|id| {
                let path = path.clone();
                let next = active(&path, id, 1);
                std::thread::spawn(move || {
                    let log = log(&path);
                    for n in 1..=5 {
                        let mut next = next.clone();
                        next.epoch_len = n;
                        log.update(|_| Ok(Some(next.clone()))).expect("update");
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("writer");
        }
        let reader = log(dir.path());
        assert_eq!(reader.refresh().expect("refresh").0, 20);
    }

    #[test]
    fn damaged_and_hostile_entries_are_skipped_and_puts_append_after_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = active(dir.path(), 'a', 5);
        log(dir.path())
            .update(|_| Ok(Some(first.clone())))
            .expect("update");
        let big = vec![b' '; 64 << 10];
        let hostile: [(&str, &[u8]); 6] = [
            (&entry_name(2), b"{not json"),
            (&entry_name(3), &big),
            (
                &entry_name(4),
                br#"{"population": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "epoch_len": 3}"#,
            ),
            (
                &entry_name(5),
                br#"{"population": "../../etc", "epoch_len": 3}"#,
            ),
            ("active/99999999999999999999.json", br#"{}"#),
            (&entry_name(1000), br#"{"population": "x", "epoch_len": 3}"#),
        ];
        for (name, bytes) in hostile {
            entry(dir.path(), name, bytes);
        }
        let reader = log(dir.path());
        assert_eq!(reader.active().expect("read"), Some(first.clone()));
        assert_eq!(reader.skipped(), 4, "each skipped entry counted once");
        assert_eq!(reader.refresh().expect("again").1, Some(first));
        assert_eq!(reader.skipped(), 4, "and reported once");
        // A put appends after the damaged entries and becomes active.
        let next = active(dir.path(), 'c', 7);
        reader.update(|_| Ok(Some(next.clone()))).expect("update");
        assert_eq!(reader.refresh().expect("refresh").0, 6);
        assert_eq!(log(dir.path()).active().expect("fresh"), Some(next));
    }

    #[test]
    fn a_pointer_from_before_the_log_is_active_until_the_first_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = active(dir.path(), 'a', 3);
        let log = RemoteLog::new(bucket(dir.path()), Some(old.clone()));
        assert_eq!(log.active().expect("read"), Some(old.clone()));
        log.update(|current| {
            assert_eq!(current, Some(&old));
            Ok(Some(ActivePopulation {
                epoch_len: 4,
                ..old.clone()
            }))
        })
        .expect("update");
        assert_eq!(log.refresh().expect("refresh").0, 1, "the first entry");
    }

    #[test]
    fn a_start_begins_at_the_checkpoint_and_survives_a_bad_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writer = log(dir.path());
        for n in 1..=4 {
            let next = active(dir.path(), 'a', n);
            writer.update(|_| Ok(Some(next.clone()))).expect("update");
        }
        // Entry 2 gone: a reader listing from the start would stop at 1; the
        // checkpoint (4) takes a new reader past the gap.
        std::fs::remove_file(dir.path().join(entry_name(2))).expect("remove");
        assert_eq!(
            log(dir.path()).refresh().expect("refresh"),
            (4, Some(active(dir.path(), 'a', 4)))
        );
        // A checkpoint that names no entry, or is not one: the whole log.
        for bad in [&br#"{"seq": 999}"#[..], b"garbage"] {
            entry(dir.path(), CHECKPOINT, bad);
            assert_eq!(
                log(dir.path()).refresh().expect("refresh"),
                (1, Some(active(dir.path(), 'a', 1)))
            );
        }
    }
}
