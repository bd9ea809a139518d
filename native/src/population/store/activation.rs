//! The active pointer and the runs of a `PopulationStore`: the activation
//! lock, the activation log (`population::remote`), the pointer a store
//! written before the log starts from, and the runs' generations
//! (`run::fence`).

use std::fs::{File, OpenOptions};

use super::PopulationStore;
use crate::error::{IoContext, Result};
use crate::ids::RunId;
use crate::population::remote::ActivePopulation;
use crate::remote::Bucket;
use crate::run::fence::{Claim, Runs};

pub(super) const ACTIVE: &str = "active.json";
pub(super) const ACTIVATION_LOCK: &str = "active.lock";

/// The right to change the active pointer: an exclusive lock on
/// `active.lock`, held until this value is dropped.
#[derive(Debug)]
pub struct ActivationLock {
    _file: File,
}

impl PopulationStore {
    /// Wait for the activation lock (held by other threads or processes only
    /// for the few writes of an activation).
    pub fn lock_activation(&self) -> Result<ActivationLock> {
        let path = self.dir.join(ACTIVATION_LOCK);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .at("cannot open", &path)?;
        file.lock().at("cannot lock", &path)?;
        Ok(ActivationLock { _file: file })
    }

    /// The active population: the newest valid entry of the activation log
    /// (`remote.rs`), at most `Bucket::freshness` old.
    pub fn active(&self) -> Result<Option<ActivePopulation>> {
        self.log.active()
    }

    /// Replace the active pointer, durably (it has been renamed into place and
    /// the directory fsynced when this returns).
    pub fn set_active(&self, lock: &ActivationLock, active: &ActivePopulation) -> Result<()> {
        self.update_active(lock, |_| Ok(Some(active.clone())))
            .map(|_| ())
    }

    /// Change the active pointer by `change` of the current one (None: leave
    /// it), durably, as the next entry of the activation log (retried on the
    /// newest entry when another process or replica appended first).
    /// Returns the active one afterwards.
    pub fn update_active(
        &self,
        _lock: &ActivationLock,
        mut change: impl FnMut(Option<&ActivePopulation>) -> Result<Option<ActivePopulation>>,
    ) -> Result<Option<ActivePopulation>> {
        self.log.update(&mut change)
    }

    /// Entries of the activation log skipped as damaged or hostile.
    pub fn skipped_log_entries(&self) -> u64 {
        self.log.skipped()
    }

    /// The runs resumed against this store (`run::fence`).
    pub fn runs(&self) -> Runs {
        Runs::new(self.shared.child("runs"))
    }

    /// The generation a resume of `run` gets (see `run::fence`), recorded
    /// durably before it is returned.
    pub fn claim_run(&self, run: &RunId, claim: Claim) -> Result<u64> {
        self.runs().claim(run, claim)
    }
}

/// The active pointer of a directory store written before the activation
/// log (`active.json`): where the log starts when it has no entry yet. A
/// damaged one is reported and ignored, like a damaged log entry.
pub(super) fn legacy_pointer(shared: &Bucket) -> Result<Option<ActivePopulation>> {
    let Some(bytes) = shared.get(ACTIVE)? else {
        return Ok(None);
    };
    match serde_json::from_slice::<ActivePopulation>(&bytes) {
        Ok(active) => Ok(Some(active)),
        _ => {
            eprintln!(
                "warning: ignored {}/{ACTIVE}, which is not a valid active pointer",
                shared.url()
            );
            Ok(None)
        }
    }
}
