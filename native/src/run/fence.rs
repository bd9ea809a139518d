//! Fencing: every resume of a run is a new generation, and a loader of an
//! older generation is told that its run was resumed elsewhere and stops
//! (docs/training.md, "Fencing").
//!
//! ```text
//! <state_dir>/<dataset>/runs/<run id>.json   {"generation": n, "from": [g, epoch, position]}
//! ```
//! One small file per run, beside the populations of the dataset's store, so
//! every process and every replica sharing the store shares it. A claim
//! happens under the store's lock and replaces the file whole (write, fsync,
//! rename), so two resumes of one run never get one generation by accident.
//!
//! On object storage each generation is its own object,
//! `runs/<run id>/<generation>.json` (20 digits), created with
//! `If-None-Match: *`: of two claims of one generation exactly one creates it
//! and the other claims again after it. A stream's fence there lists the run
//! at most once per `POLL`, so a loader of an older generation stops within
//! that time of a resume on another replica.
//!
//! The ranks of one resumed job must share their generation. With
//! `torch.distributed`, rank 0 claims a fresh one and tells the others;
//! without it, every rank claims from the same checkpoint (`from`: the
//! generation and place of the state it loaded), and a claim from the
//! checkpoint the newest generation came from gets that generation again.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Place, RunId};
use crate::error::{Error, IoContext, Result};
use crate::remote::Bucket;

/// How long a fence on object storage trusts what it last read.
pub const POLL: Duration = Duration::from_secs(1);
/// Rounds a claim on object storage retries when others keep winning.
const MAX_ROUNDS: usize = 200;

/// The newest generation of a run and the checkpoint it resumed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    pub generation: u64,
    /// `[generation, epoch, position]` of the state that generation resumed from.
    pub from: (u64, u64, u64),
}

/// A resume asks for a generation: from the state of generation `after` at
/// `place`; `fresh` (a job whose ranks agree through `torch.distributed`)
/// always gets a new one.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub after: u64,
    pub place: Place,
    pub fresh: bool,
}

/// Newest generations read from object storage, by run, with when.
type Seen = Arc<Mutex<HashMap<String, (Instant, Option<Generation>)>>>;

/// The runs of one dataset's store: a directory, or a bucket prefix.
#[derive(Debug, Clone)]
pub struct Runs {
    dir: PathBuf,
    remote: Option<(Bucket, Seen)>,
}

impl Runs {
    pub fn new(store_dir: &Path) -> Self {
        Runs {
            dir: store_dir.join("runs"),
            remote: None,
        }
    }

    /// The runs of a store on object storage under `store`.
    pub fn remote(store: &Bucket) -> Self {
        Runs {
            dir: PathBuf::new(),
            remote: Some((store.child("runs"), Seen::default())),
        }
    }

    fn path(&self, run: &RunId) -> PathBuf {
        self.dir.join(format!("{}.json", run.as_str()))
    }

    /// The newest generation on object storage (one listing, one read).
    fn newest_remote(bucket: &Bucket, run: &RunId) -> Result<Option<Generation>> {
        let names = bucket.list(run.as_str(), None)?;
        let Some(newest) = names.last() else {
            return Ok(None);
        };
        let corrupt = |detail: String| Error::corrupt(format!("{}/{newest}", bucket.url()), detail);
        let bytes = bucket
            .get(newest)?
            .ok_or_else(|| corrupt("listed but cannot be read".into()))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| corrupt(format!("not a run record: {e}")))
    }

    /// Claim a generation on object storage: decided from the newest one and
    /// created only if no other claim created it first (else decided again).
    pub fn claim_remote(&self, run: &RunId, claim: Claim) -> Result<u64> {
        let Some((bucket, _)) = &self.remote else {
            return Err(Error::internal("claim_remote on a local store"));
        };
        for _ in 0..MAX_ROUNDS {
            let (generation, write) = self.decide(run, claim)?;
            if !write {
                return Ok(generation.generation);
            }
            let bytes = serde_json::to_vec(&generation)
                .map_err(|e| Error::internal(format!("cannot encode a run record: {e}")))?;
            let name = format!("{}/{:020}.json", run.as_str(), generation.generation);
            if bucket.create(&name, bytes)? {
                return Ok(generation.generation);
            }
        }
        Err(Error::Unavailable(format!(
            "the claim of run {} lost the race to other claims {MAX_ROUNDS} times in a row; \
             retry it",
            run.as_str()
        )))
    }

    /// The run's newest generation, if it was ever resumed against this store.
    pub fn newest(&self, run: &RunId) -> Result<Option<Generation>> {
        if let Some((bucket, _)) = &self.remote {
            return Self::newest_remote(bucket, run);
        }
        let path = self.path(run);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::corrupt(&path, format!("not a run record: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("cannot read", &path, e)),
        }
    }

    /// The generation a resume gets (the caller holds the store's lock), and
    /// whether it must be written.
    pub fn decide(&self, run: &RunId, claim: Claim) -> Result<(Generation, bool)> {
        let from = (claim.after, claim.place.0, claim.place.1);
        let newest = self.newest(run)?;
        if let Some(known) = newest {
            if !claim.fresh && known.from == from {
                return Ok((known, false));
            }
        }
        let base = newest.map_or(claim.after, |n| n.generation.max(claim.after));
        let generation = base.checked_add(1).ok_or_else(|| {
            Error::invalid(format!("run {} has no generation left", run.as_str()))
        })?;
        Ok((Generation { generation, from }, true))
    }

    /// Where a claimed generation is written (the caller writes it atomically).
    pub fn record_path(&self, run: &RunId) -> Result<PathBuf> {
        fs::create_dir_all(&self.dir).at("cannot create the runs directory", &self.dir)?;
        Ok(self.path(run))
    }

    /// `FencedError` when a newer generation of `run` than `generation` exists.
    pub fn check(&self, run: &RunId, generation: u64) -> Result<()> {
        let newest = match &self.remote {
            None => self.newest(run)?,
            Some((bucket, seen)) => {
                let poisoned = || Error::internal("a fence's state was poisoned");
                let known = seen
                    .lock()
                    .map_err(|_| poisoned())?
                    .get(run.as_str())
                    .copied();
                match known {
                    Some((at, newest)) if at.elapsed() < POLL => newest,
                    _ => {
                        let newest = Self::newest_remote(bucket, run)?;
                        seen.lock()
                            .map_err(|_| poisoned())?
                            .insert(run.as_str().to_string(), (Instant::now(), newest));
                        newest
                    }
                }
            }
        };
        match newest {
            Some(newest) if newest.generation > generation => Err(fenced(run, generation, newest)),
            _ => Ok(()),
        }
    }
}

fn fenced(run: &RunId, generation: u64, newest: Generation) -> Error {
    let (g, epoch, position) = newest.from;
    Error::Fenced(format!(
        "run {} was resumed elsewhere: generation {} resumed it from the checkpoint of \
         generation {g} (epoch {epoch}, position {position}), and this loader is generation \
         {generation}. It stops here and cannot save its state, so it cannot overwrite the \
         newer run's checkpoint; stop this process (an orphaned rank of an earlier job)",
        run.as_str(),
        newest.generation,
    ))
}

/// A stream's fence: checked before each batch it hands out.
#[derive(Debug, Clone)]
pub struct Fence {
    runs: Runs,
    run: RunId,
    generation: u64,
}

impl Fence {
    pub fn new(runs: Runs, run: RunId, generation: u64) -> Self {
        Fence {
            runs,
            run,
            generation,
        }
    }

    pub fn check(&self) -> Result<()> {
        self.runs.check(&self.run, self.generation)
    }
}
