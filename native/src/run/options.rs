//! `RunOptions`: what a training run is started with, the one list of start
//! options that every loader (`BatchLoader`, `DatasetLoader`,
//! `HFIterableDataset`) and the audit hand to the core.
//!
//! Read like `crate::request`: the keys and their rules live in the struct
//! below, once. serde rejects unknown keys and wrong types, `NonZeroU64` and
//! the newtypes reject out-of-range values, and `check` holds the rules that
//! relate two keys. docs/training.md lists the keys for users.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::ids::PopulationId;
use crate::request::StreamRequest;
use crate::sampling::{ShuffleMode, MAX_WORLD_SIZE};
use crate::storage::publish::validate_name;
use crate::wire::deserialize;

/// A loader's run-start options. `epoch_len` and `population` default to the
/// dataset's active ones, which the source fixes (pins) when the run starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    /// The dataset's name on the source.
    pub dataset: String,
    pub seed: u64,
    /// The first epoch read.
    #[serde(default)]
    pub epoch: u64,
    /// Positions per epoch (default: the active epoch length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_len: Option<NonZeroU64>,
    /// The population read (default: the active one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<PopulationId>,
    /// Population columns added to every batch.
    #[serde(default)]
    pub columns: Vec<String>,
    /// Weighted draws (`true`), table order (`false`) or `"permutation"`.
    #[serde(default = "weighted")]
    pub shuffle: ShuffleMode,
    /// Consecutive positions per batch of one rank.
    pub batch_size: NonZeroU64,
    /// This process's share, `0 <= rank < world_size`.
    #[serde(default)]
    pub rank: u64,
    /// Ranks the run is split into, `1..=MAX_WORLD_SIZE`.
    #[serde(default = "one")]
    pub world_size: NonZeroU64,
    /// Reader processes per rank: recorded for people, it never changes what a
    /// rank reads.
    #[serde(default)]
    pub workers: u64,
}

fn weighted() -> ShuffleMode {
    ShuffleMode::Weighted
}

fn one() -> NonZeroU64 {
    NonZeroU64::MIN
}

impl RunOptions {
    /// Build from decoded JSON (keyword arguments arrive this way): a bad key is
    /// refused naming it and what would be valid.
    pub fn from_value(value: Value) -> Result<Self> {
        let options: RunOptions = deserialize(value, "loader options")?;
        options.check()?;
        Ok(options)
    }

    /// The rules that relate keys to each other (serde checked each key).
    fn check(&self) -> Result<()> {
        validate_name("dataset", &self.dataset)?;
        if self.world_size.get() > MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "'world_size' must be between 1 and {MAX_WORLD_SIZE}, got {}",
                self.world_size
            )));
        }
        if self.rank >= self.world_size.get() {
            return Err(Error::invalid(format!(
                "'rank' must be in [0, world_size={}), got {}",
                self.world_size, self.rank
            )));
        }
        if self.world_size.checked_mul(self.batch_size).is_none() {
            return Err(Error::invalid(format!(
                "'world_size' x 'batch_size' ({} x {}) must be below 2**64",
                self.world_size, self.batch_size
            )));
        }
        Ok(())
    }

    /// The stream the run reads, as a command for the source to pin (its
    /// population and epoch length filled in with the active ones).
    pub fn request(&self) -> StreamRequest {
        StreamRequest {
            dataset: self.dataset.clone(),
            seed: self.seed,
            epoch: self.epoch,
            epoch_len: self.epoch_len,
            shuffle: self.shuffle,
            world_size: 1,
            start: 0,
            stop: None,
            block: NonZeroU64::MIN,
            population: self.population.clone(),
            columns: self.columns.clone(),
            payload: true,
            rank: None,
            offset: None,
            run: None,
            generation: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> Result<RunOptions> {
        RunOptions::from_value(value)
    }

    fn refused(value: Value) -> String {
        parse(value).expect_err("refused").to_string()
    }

    #[test]
    fn defaults_fill_every_optional_key() {
        let options = parse(json!({"dataset": "toy", "seed": 3, "batch_size": 8})).unwrap();
        assert_eq!(options.epoch, 0);
        assert_eq!(options.epoch_len, None);
        assert_eq!(options.population, None);
        assert!(options.columns.is_empty());
        assert_eq!(options.shuffle, ShuffleMode::Weighted);
        assert_eq!((options.rank, options.world_size.get()), (0, 1));
        assert_eq!(options.workers, 0);
        let request = options.request();
        assert_eq!((request.dataset.as_str(), request.seed), ("toy", 3));
        assert_eq!(request.population, None);
    }

    #[test]
    fn each_bad_key_is_named() {
        let base = json!({"dataset": "toy", "seed": 3, "batch_size": 8});
        let with = |key: &str, value: Value| {
            let mut object = base.clone();
            object[key] = value;
            object
        };
        for (value, expected) in [
            (
                with("batch_size", json!(0)),
                "'batch_size' in the loader options",
            ),
            (with("seed", json!(-1)), "'seed' in the loader options"),
            (
                with("world_size", json!(0)),
                "'world_size' in the loader options",
            ),
            (
                with("shuffle", json!("sometimes")),
                "'shuffle' in the loader options",
            ),
            (
                with("population", json!("nope")),
                "'population' in the loader options",
            ),
            (with("bacth_size", json!(8)), "unknown field 'bacth_size'"),
            (
                with("rank", json!(2)),
                "'rank' must be in [0, world_size=1), got 2",
            ),
            (with("dataset", json!("")), "dataset"),
            (
                with("world_size", json!(MAX_WORLD_SIZE + 1)),
                "'world_size' must be between",
            ),
        ] {
            let message = refused(value.clone());
            assert!(message.contains(expected), "{value}: {message}");
        }
        let mut huge = with("batch_size", json!(u64::MAX));
        huge["world_size"] = json!(2);
        assert!(refused(huge).contains("'world_size' x 'batch_size' (2 x 18446744073709551615)"));
        let mut missing = base.clone();
        missing.as_object_mut().unwrap().remove("seed");
        assert!(refused(missing).contains("missing field 'seed'"));
    }
}
