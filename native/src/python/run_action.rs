//! The fencing actions' bodies for the Flight server (`run::action`): parsed
//! and checked in Rust, handed to Python as a read-only value.

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use crate::run::action::{CheckAction, ClaimAction};

/// A parsed `claim_run` or `check_run` body. `after`, `epoch`, `position`
/// and `fresh` are a claim's (0 and False for a check); `generation` is a
/// check's (0 for a claim).
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct RunAction {
    dataset: String,
    run: String,
    after: u64,
    epoch: u64,
    position: u64,
    fresh: bool,
    generation: u64,
}

/// Parse the body of `claim_run` (`claim=True`) or `check_run`:
/// `InvalidArgumentError` naming the key at fault otherwise.
#[pyfunction]
#[pyo3(signature = (raw, *, claim))]
pub fn parse_run_action(raw: &[u8], claim: bool) -> PyResult<RunAction> {
    if claim {
        let body = ClaimAction::parse(raw).py()?;
        Ok(RunAction {
            dataset: body.dataset,
            run: body.run.as_str().to_string(),
            after: body.after,
            epoch: body.epoch,
            position: body.position,
            fresh: body.fresh,
            generation: 0,
        })
    } else {
        let body = CheckAction::parse(raw).py()?;
        Ok(RunAction {
            dataset: body.dataset,
            run: body.run.as_str().to_string(),
            after: 0,
            epoch: 0,
            position: 0,
            fresh: false,
            generation: body.generation,
        })
    }
}
