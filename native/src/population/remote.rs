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
//! list the log after the newest key they know (one small request) at most
//! once per `POLL`, so a replica sees another's activation within `POLL`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::store::ActivePopulation;
use crate::error::{Error, Result};
use crate::remote::Bucket;

/// How stale a replica's view of the active pointer may be.
pub const POLL: Duration = Duration::from_secs(1);
/// Rounds an activation retries when others keep winning before it gives up.
const MAX_ROUNDS: usize = 200;
const LOG: &str = "active";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogEntry {
    population: String,
    epoch_len: u64,
}

/// The newest log entry this process has seen.
#[derive(Debug, Default)]
struct Head {
    seq: u64,
    active: Option<ActivePopulation>,
    read_at: Option<Instant>,
}

#[derive(Debug)]
pub struct RemoteLog {
    bucket: Bucket,
    head: Mutex<Head>,
}

fn entry_name(seq: u64) -> String {
    format!("{LOG}/{seq:020}.json")
}

impl RemoteLog {
    pub fn new(bucket: Bucket) -> Self {
        RemoteLog {
            bucket,
            head: Mutex::new(Head::default()),
        }
    }

    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Head>> {
        self.head
            .lock()
            .map_err(|_| Error::internal("the activation log's state was poisoned"))
    }

    /// The active population, at most `POLL` old.
    pub fn active(&self) -> Result<Option<ActivePopulation>> {
        {
            let head = self.lock()?;
            if head.read_at.is_some_and(|at| at.elapsed() < POLL) {
                return Ok(head.active.clone());
            }
        }
        Ok(self.refresh()?.1)
    }

    /// Read the entries after the newest one known; returns the newest.
    fn refresh(&self) -> Result<(u64, Option<ActivePopulation>)> {
        let mut head = self.lock()?;
        let after = (head.seq > 0).then(|| entry_name(head.seq));
        let names = self.bucket.list(LOG, after.as_deref())?;
        if let Some(newest) = names.last() {
            let seq = parse_seq(newest).ok_or_else(|| {
                self.corrupt(newest, "its name is not a 20-digit sequence number")
            })?;
            let bytes = self
                .bucket
                .get(newest)?
                .ok_or_else(|| self.corrupt(newest, "it was listed but cannot be read"))?;
            let entry: LogEntry = serde_json::from_slice(&bytes)
                .map_err(|e| self.corrupt(newest, &format!("not an activation: {e}")))?;
            head.seq = seq;
            head.active = Some(ActivePopulation {
                population: entry.population,
                epoch_len: entry.epoch_len,
            });
        }
        head.read_at = Some(Instant::now());
        Ok((head.seq, head.active.clone()))
    }

    fn corrupt(&self, name: &str, detail: &str) -> Error {
        Error::corrupt(
            format!("{}/{name}", self.bucket.url()),
            format!("{detail}; the activation log holds only entries written by DatasetRT"),
        )
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
            let entry = LogEntry {
                population: next.population.clone(),
                epoch_len: next.epoch_len,
            };
            let bytes = serde_json::to_vec(&entry)
                .map_err(|e| Error::internal(format!("cannot encode an activation: {e}")))?;
            if self.bucket.create(&entry_name(seq + 1), bytes)? {
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

    fn log(dir: &std::path::Path) -> RemoteLog {
        let store = LocalFileSystem::new_with_prefix(dir).expect("store");
        RemoteLog::new(Bucket::from_store(Arc::new(store), "file://test"))
    }

    fn active(id: char, epoch_len: u64) -> ActivePopulation {
        ActivePopulation {
            population: id.to_string().repeat(32),
            epoch_len,
        }
    }

    #[test]
    fn every_update_is_the_next_entry_and_readers_see_the_newest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (log(dir.path()), log(dir.path()));
        assert_eq!(a.active().expect("read"), None);
        a.update(|_| Ok(Some(active('a', 1)))).expect("update");
        // `b` has never read: it lists at once.
        assert_eq!(b.active().expect("read"), Some(active('a', 1)));
        // A change computed from the newest entry, through the other handle.
        b.update(|current| {
            let mut next = current.cloned().expect("an active one");
            next.epoch_len = 9;
            Ok(Some(next))
        })
        .expect("update");
        let (seq, newest) = a.refresh().expect("refresh");
        assert_eq!((seq, newest), (2, Some(active('a', 9))));
        // No change: nothing appended.
        a.update(|_| Ok(None)).expect("update");
        assert_eq!(a.refresh().expect("refresh").0, 2);
    }

    #[test]
    fn racing_writers_each_get_their_own_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let writers: Vec<_> = ['a', 'b', 'c', 'd']
            .into_iter()
            .map(|id| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let log = log(&path);
                    for n in 0..5 {
                        log.update(|_| Ok(Some(active(id, n)))).expect("update");
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
    fn a_damaged_entry_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join(LOG)).expect("mkdir");
        std::fs::write(dir.path().join(entry_name(1)), b"{not json").expect("write");
        let message = log(dir.path()).active().expect_err("damaged").to_string();
        assert!(message.contains("not an activation"), "{message}");
    }
}
