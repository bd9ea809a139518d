//! The bodies of the fencing actions, `claim_run` and `check_run`
//! (docs/flight-protocol.md, docs/training.md "Fencing"): one type each, the
//! whole wire contract of the action, read like `request.rs`. serde rejects
//! unknown keys and wrong types, `RunId` a malformed run id; every face
//! (the Flight server, the loaders) reads a body through these types.

use serde::{Deserialize, Serialize};

use super::fence::Claim;
use crate::error::Result;
use crate::ids::RunId;
use crate::wire::{decode, deserialize};

/// `claim_run`: a resume of `run` loaded the state of generation `after` at
/// `(epoch, position)`; `fresh` (rank 0 of a job whose ranks agree through
/// `torch.distributed`) always gets a new generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimAction {
    pub dataset: String,
    pub run: RunId,
    pub after: u64,
    pub epoch: u64,
    pub position: u64,
    #[serde(default)]
    pub fresh: bool,
}

/// `check_run`: is a newer generation of `run` than `generation` there?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckAction {
    pub dataset: String,
    pub run: RunId,
    pub generation: u64,
}

impl ClaimAction {
    /// Parse an action body (UTF-8 JSON, at most `MAX_MESSAGE_BYTES`).
    pub fn parse(raw: &[u8]) -> Result<Self> {
        deserialize(decode(raw, "action body")?, "action body")
    }

    pub fn claim(&self) -> Claim {
        Claim {
            after: self.after,
            place: (self.epoch, self.position),
            fresh: self.fresh,
        }
    }
}

impl CheckAction {
    /// Parse an action body (UTF-8 JSON, at most `MAX_MESSAGE_BYTES`).
    pub fn parse(raw: &[u8]) -> Result<Self> {
        deserialize(decode(raw, "action body")?, "action body")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_claim_is_read_whole_and_nothing_else_is() {
        let body =
            format!(r#"{{"dataset": "d", "run": "{RUN}", "after": 1, "epoch": 2, "position": 3}}"#);
        let claim = ClaimAction::parse(body.as_bytes()).expect("a claim");
        assert_eq!(
            (claim.after, claim.epoch, claim.position, claim.fresh),
            (1, 2, 3, false)
        );
        for (bad, fragment) in [
            (body.replace("\"after\": 1, ", ""), "missing field 'after'"),
            (
                body.replace("}", ", \"extra\": 1}"),
                "unknown field 'extra'",
            ),
            (body.replace(RUN, "nope"), "run id"),
            (body.replace("\"epoch\": 2", "\"epoch\": -2"), "'epoch'"),
            ("[]".to_string(), "JSON object"),
        ] {
            let message = ClaimAction::parse(bad.as_bytes())
                .expect_err(&bad)
                .to_string();
            assert!(message.contains(fragment), "{bad}: {message}");
        }
        let check = format!(r#"{{"dataset": "d", "run": "{RUN}", "generation": 4}}"#);
        assert_eq!(
            CheckAction::parse(check.as_bytes())
                .expect("a check")
                .generation,
            4
        );
        assert!(
            CheckAction::parse(body.as_bytes()).is_err(),
            "a claim is not a check"
        );
    }
}
