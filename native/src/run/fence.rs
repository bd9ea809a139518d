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
//! The ranks of one resumed job must share their generation. With
//! `torch.distributed`, rank 0 claims a fresh one and tells the others;
//! without it, every rank claims from the same checkpoint (`from`: the
//! generation and place of the state it loaded), and a claim from the
//! checkpoint the newest generation came from gets that generation again.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Place, RunId};
use crate::error::{Error, IoContext, Result};

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

/// The runs directory of one dataset's store.
#[derive(Debug, Clone)]
pub struct Runs {
    dir: PathBuf,
}

impl Runs {
    pub fn new(store_dir: &Path) -> Self {
        Runs {
            dir: store_dir.join("runs"),
        }
    }

    fn path(&self, run: &RunId) -> PathBuf {
        self.dir.join(format!("{}.json", run.as_str()))
    }

    /// The run's newest generation, if it was ever resumed against this store.
    pub fn newest(&self, run: &RunId) -> Result<Option<Generation>> {
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
        match self.newest(run)? {
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
