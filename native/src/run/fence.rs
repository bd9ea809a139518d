//! Fencing: every resume of a run is a new generation, and a loader of an
//! older generation is told that its run was resumed elsewhere and stops
//! (docs/training.md, "Fencing").
//!
//! ```text
//! <store>/runs/<run id>/<generation>.json   {"generation": n, "from": [g, epoch, position]}
//! ```
//! Each generation is its own object beside the populations of the
//! dataset's store (a directory or a bucket prefix: `Bucket`, one protocol
//! for both), created with `If-None-Match: *` (`link(2)` on a directory): of
//! two claims of one generation exactly one creates it and the other claims
//! again after it. A stream's fence lists the run at most once per
//! `Bucket::freshness` (every batch on a directory, a second on object
//! storage), so a loader of an older generation stops within that time of a
//! resume elsewhere. A store written before generations were objects has
//! `runs/<run id>.json`, read when a run has no generation object yet.
//!
//! The ranks of one resumed job must share their generation. With
//! `torch.distributed`, rank 0 claims a fresh one and tells the others;
//! without it, every rank claims from the same checkpoint (`from`: the
//! generation and place of the state it loaded), and a claim from the
//! checkpoint the newest generation came from gets that generation again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Place, RunId};
use crate::error::{Error, Result};
use crate::remote::Bucket;

/// Rounds a claim retries when others keep winning.
const MAX_ROUNDS: usize = 200;
/// A generation record is about 60 bytes; anything much larger is not one.
const MAX_RECORD_BYTES: u64 = 4096;

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

/// Newest generations read, by run, with when.
type Seen = Arc<Mutex<HashMap<String, (Instant, Option<Generation>)>>>;

/// The runs of one dataset's store (`<store>/runs`).
#[derive(Debug, Clone)]
pub struct Runs {
    bucket: Bucket,
    seen: Seen,
}

impl Runs {
    pub fn new(bucket: Bucket) -> Self {
        Runs {
            bucket,
            seen: Seen::default(),
        }
    }

    /// The run's newest generation, if it was ever resumed against this
    /// store: its newest record that is one (a damaged or foreign object is
    /// passed over), else the record of a store from before generations were
    /// objects.
    pub fn newest(&self, run: &RunId) -> Result<Option<Generation>> {
        let listed = self.bucket.list_sized(run.as_str(), None)?;
        for (name, size) in listed.iter().rev() {
            if let Some(generation) = self.record(name, *size)? {
                return Ok(Some(generation));
            }
        }
        let legacy = format!("{}.json", run.as_str());
        Ok(self
            .bucket
            .get(&legacy)?
            .and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    fn record(&self, name: &str, size: u64) -> Result<Option<Generation>> {
        if size > MAX_RECORD_BYTES || !is_record_name(name) {
            return Ok(None);
        }
        Ok(self
            .bucket
            .get(name)?
            .and_then(|bytes| serde_json::from_slice::<Generation>(&bytes).ok())
            .filter(|g| name.ends_with(&format!("/{:020}.json", g.generation))))
    }

    /// The generation a resume gets, and whether it must be written.
    fn decide(&self, run: &RunId, claim: Claim) -> Result<(Generation, bool)> {
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

    /// Claim a generation: decided from the newest one and created only if
    /// no other claim created it first (else decided again), durably.
    pub fn claim(&self, run: &RunId, claim: Claim) -> Result<u64> {
        for _ in 0..MAX_ROUNDS {
            let (generation, write) = self.decide(run, claim)?;
            if !write {
                return Ok(generation.generation);
            }
            let bytes = serde_json::to_vec(&generation)
                .map_err(|e| Error::internal(format!("cannot encode a run record: {e}")))?;
            let name = format!("{}/{:020}.json", run.as_str(), generation.generation);
            if self.bucket.create(&name, bytes)? {
                return Ok(generation.generation);
            }
        }
        Err(Error::Unavailable(format!(
            "the claim of run {} lost the race to other claims {MAX_ROUNDS} times in a row; \
             retry it",
            run.as_str()
        )))
    }

    /// `FencedError` when a newer generation of `run` than `generation` exists.
    pub fn check(&self, run: &RunId, generation: u64) -> Result<()> {
        let poisoned = || Error::internal("a fence's state was poisoned");
        let known = self
            .seen
            .lock()
            .map_err(|_| poisoned())?
            .get(run.as_str())
            .copied();
        let newest = match known {
            Some((at, newest)) if at.elapsed() < self.bucket.freshness() => newest,
            _ => {
                let newest = self.newest(run)?;
                self.seen
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert(run.as_str().to_string(), (Instant::now(), newest));
                newest
            }
        };
        match newest {
            Some(newest) if newest.generation > generation => Err(fenced(run, generation, newest)),
            _ => Ok(()),
        }
    }
}

/// `<run>/<20 digits>.json`.
fn is_record_name(name: &str) -> bool {
    name.rsplit('/')
        .next()
        .and_then(|file| file.strip_suffix(".json"))
        .is_some_and(|digits| digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
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
