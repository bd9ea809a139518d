//! A training run's state, owned by the core: where a run is, the population of
//! every position, and every resume (docs/training.md, "What the state holds").
//!
//! A loader reads one rank's share of an epoch in batches of `batch_size`
//! consecutive positions: the partition rule with `block = batch_size`. Rank
//! `r` of `w` takes blocks `r, r + w, ...`, so once every rank has taken `m`
//! batches the consumed positions are the prefix `[s, s + m * w * batch_size)`
//! of the part being read; `position` is where that prefix ends. The run's
//! progress is that one number, which resumes at any world size.
//!
//! A run is a chain of *spans* (`resumes`): the first loader, then each resume
//! from a saved state (a new generation of the run, at any world size, batch
//! size and worker count), and each `set_epoch` that leaves an epoch
//! unfinished. A span records where it began and, once another followed, where
//! it ended, so what every rank of every span consumed, at which step, is
//! exact for any chain (`history`). `plan` turns the state into the tickets of
//! each rank's DataLoader workers.

pub mod action;
pub mod fence;
mod history;
mod options;
mod plan;

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use history::{Span, Taken};
pub use options::RunOptions;
pub use plan::Part;

use crate::error::{Error, Result};
use crate::ids::PopulationId;
pub use crate::ids::RunId;
use crate::request::StreamRequest;
use crate::sampling::{ShuffleMode, MAX_WORLD_SIZE};
use crate::storage::publish::validate_name;
use crate::wire::deserialize;

/// The layout version written; version 1 states (no spans) still load.
pub const STATE_VERSION: u64 = 2;

/// From absolute stream position `.0` on, draws use population `.1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment(pub u64, pub PopulationId);

/// `[epoch, position]`: an epoch-relative place in the stream (`position` may
/// be the epoch length: the epoch is done).
pub type Place = (u64, u64);

/// One span of a run: a generation of it reading from `start` on, cut into
/// `world_size` ranks taking batches of `batch_size`. `workers` (per rank) is
/// recorded for people; it never changes what a rank reads. `steps` is the
/// batches each rank had taken in `start`'s epoch when the span began. `until`
/// is where the span ended (a later span began there), absent for the last,
/// which runs to the state's own place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    #[serde(rename = "from")]
    pub start: Place,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Place>,
    pub steps: u64,
    pub world_size: NonZeroU64,
    pub batch_size: NonZeroU64,
    pub workers: u64,
    pub generation: u64,
}

/// Where a training run is. Always valid: built by `new` or `from_json`, and
/// changed only by the methods that keep its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState {
    pub(crate) dataset: String,
    pub(crate) seed: u64,
    pub(crate) shuffle: ShuffleMode,
    pub(crate) columns: Vec<String>,
    pub(crate) epoch_len: NonZeroU64,
    pub(crate) epoch: u64,
    pub(crate) position: u64,
    pub(crate) steps: u64,
    pub(crate) segments: Vec<Segment>,
    pub(crate) run: RunId,
    pub(crate) resumes: Vec<Resume>,
}

/// The saved form, both versions: the keys a JSON state may have.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u64,
    dataset: String,
    seed: u64,
    shuffle: ShuffleMode,
    columns: Vec<String>,
    epoch_len: NonZeroU64,
    batch_size: NonZeroU64,
    world_size: NonZeroU64,
    epoch: u64,
    position: u64,
    steps: u64,
    segments: Vec<Segment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workers: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<RunId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resumes: Option<Vec<Resume>>,
}

/// The keys of a version 1 state, and those version 2 added.
const KEYS_V1: &[&str] = &[
    "version",
    "dataset",
    "seed",
    "shuffle",
    "columns",
    "epoch_len",
    "batch_size",
    "world_size",
    "epoch",
    "position",
    "steps",
    "segments",
];
const KEYS_V2: &[&str] = &["workers", "run", "generation", "resumes"];

impl Saved {
    /// The state these keys describe, with its run id and spans.
    fn into_state(self, run: RunId, resumes: Vec<Resume>) -> RunState {
        RunState {
            dataset: self.dataset,
            seed: self.seed,
            shuffle: self.shuffle,
            columns: self.columns,
            epoch_len: self.epoch_len,
            epoch: self.epoch,
            position: self.position,
            steps: self.steps,
            segments: self.segments,
            run,
            resumes,
        }
    }
}

impl RunState {
    /// A run that has consumed nothing yet, at the start of `options.epoch`,
    /// reading the population and epoch length the source pinned in `pinned`
    /// (`options.request()` as the source resolved it).
    pub fn start(options: &RunOptions, pinned: &StreamRequest) -> Result<Self> {
        let (Some(population), Some(epoch_len)) = (&pinned.population, pinned.epoch_len) else {
            return Err(Error::internal(format!(
                "the source did not pin the request (no population or epoch length): {pinned:?}"
            )));
        };
        let state = RunState {
            dataset: options.dataset.clone(),
            seed: options.seed,
            shuffle: options.shuffle,
            columns: options.columns.clone(),
            epoch_len,
            epoch: options.epoch,
            position: 0,
            steps: 0,
            segments: vec![Segment(0, population.clone())],
            run: RunId::new(),
            resumes: vec![Resume {
                start: (options.epoch, 0),
                until: None,
                steps: 0,
                world_size: options.world_size,
                batch_size: options.batch_size,
                workers: options.workers,
                generation: 0,
            }],
        };
        state.check()?;
        Ok(state)
    }

    /// A saved state (`to_json`), validated: a bad one is refused naming the
    /// key and what would be valid.
    pub fn from_json(raw: &[u8]) -> Result<Self> {
        let value: Value = serde_json::from_slice(raw)
            .map_err(|e| Error::invalid(format!("a loader state is a JSON object: {e}")))?;
        Self::from_value(value)
    }

    /// A saved state already decoded (a Python dict arrives this way).
    pub fn from_value(value: Value) -> Result<Self> {
        let Value::Object(object) = &value else {
            return Err(Error::invalid(
                "a loader state is a dict (from state_dict()), got another value",
            ));
        };
        match object.get("version") {
            Some(Value::Number(n)) if n.as_u64() == Some(1) || n.as_u64() == Some(2) => {}
            other => {
                return Err(Error::invalid(format!(
                    "loader state 'version' must be 1 or {STATE_VERSION}, got {}",
                    other.map_or_else(|| "nothing".to_string(), Value::to_string)
                )))
            }
        }
        let version = object
            .get("version")
            .and_then(Value::as_u64)
            .unwrap_or(STATE_VERSION);
        let expected: Vec<&str> = if version == 1 {
            KEYS_V1.to_vec()
        } else {
            KEYS_V1.iter().chain(KEYS_V2).copied().collect()
        };
        let mut missing: Vec<&str> = expected
            .iter()
            .copied()
            .filter(|k| !object.contains_key(*k))
            .collect();
        let mut unknown: Vec<&str> = object
            .keys()
            .map(String::as_str)
            .filter(|k| !expected.contains(k))
            .collect();
        if !missing.is_empty() || !unknown.is_empty() {
            let mut all = expected.clone();
            all.sort_unstable();
            missing.sort_unstable();
            unknown.sort_unstable();
            let listed = |keys: &[&str]| {
                let quoted: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
                format!("[{}]", quoted.join(", "))
            };
            return Err(Error::invalid(format!(
                "loader state keys: missing {}, unknown {}; a version {version} state has \
                 exactly {}",
                listed(&missing),
                listed(&unknown),
                listed(&all)
            )));
        }
        let saved: Saved = deserialize(value, "loader state")?;
        let state = if saved.version == 1 {
            Self::from_version_1(saved)?
        } else {
            Self::from_version_2(saved)?
        };
        state.check()?;
        Ok(state)
    }

    fn from_version_2(mut saved: Saved) -> Result<Self> {
        let (Some(workers), Some(run), Some(generation), Some(resumes)) = (
            saved.workers,
            saved.run.take(),
            saved.generation,
            saved.resumes.take(),
        ) else {
            return Err(Error::internal("a version 2 state's keys were checked"));
        };
        let (world_size, batch_size) = (saved.world_size, saved.batch_size);
        let state = saved.into_state(run, resumes);
        let last = state.current()?;
        for (key, saved_value, span_value) in [
            ("world_size", world_size.get(), last.world_size.get()),
            ("batch_size", batch_size.get(), last.batch_size.get()),
            ("workers", workers, last.workers),
            ("generation", generation, last.generation),
        ] {
            if saved_value != span_value {
                return Err(Error::invalid(format!(
                    "loader state {key:?} is {saved_value} but the last of 'resumes' has \
                     {span_value}: they are the same run's"
                )));
            }
        }
        Ok(state)
    }

    /// A state of before spans were recorded: one span from the start of the
    /// stream at its world size and batch size (what it described), then one
    /// from its own place, so its step count is kept. The run id is derived
    /// from the state, so every resume of one such state is one run.
    fn from_version_1(saved: Saved) -> Result<Self> {
        let identity = serde_json::to_vec(&saved)
            .map_err(|e| Error::internal(format!("cannot encode a loader state: {e}")))?;
        let span = |start: Place, until: Option<Place>, steps: u64| Resume {
            start,
            until,
            steps,
            world_size: saved.world_size,
            batch_size: saved.batch_size,
            workers: 0,
            generation: 0,
        };
        let here = (saved.epoch, saved.position);
        let resumes = vec![span((0, 0), Some(here), 0), span(here, None, saved.steps)];
        let run = RunId::derived(&identity);
        Ok(saved.into_state(run, resumes))
    }

    /// The saved form: compact JSON, always the current version.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(&self.saved()?)
            .map_err(|e| Error::internal(format!("cannot encode a loader state: {e}")))
    }

    fn saved(&self) -> Result<Saved> {
        let last = self.current()?;
        Ok(Saved {
            version: STATE_VERSION,
            dataset: self.dataset.clone(),
            seed: self.seed,
            shuffle: self.shuffle,
            columns: self.columns.clone(),
            epoch_len: self.epoch_len,
            batch_size: last.batch_size,
            world_size: last.world_size,
            epoch: self.epoch,
            position: self.position,
            steps: self.steps,
            segments: self.segments.clone(),
            workers: Some(last.workers),
            run: Some(self.run.clone()),
            generation: Some(last.generation),
            resumes: Some(self.resumes.clone()),
        })
    }

    /// The rules that relate keys to each other (serde checked each key).
    fn check(&self) -> Result<()> {
        validate_name("dataset", &self.dataset)?;
        if self.position > self.epoch_len.get() {
            return Err(Error::invalid(format!(
                "loader state 'position' must be <= 'epoch_len' ({}), got {}",
                self.epoch_len, self.position
            )));
        }
        let last_epoch = self.last_epoch();
        let valid_segments = "a non-empty list of [from_position, population_id] pairs, \
                              ascending from 0";
        match self.segments.first() {
            None => {
                return Err(Error::invalid(format!(
                    "loader state 'segments' must be {valid_segments}, got []"
                )))
            }
            Some(first) if first.0 != 0 => {
                return Err(Error::invalid(format!(
                    "loader state 'segments' must be {valid_segments}; the first starts at {}",
                    first.0
                )))
            }
            Some(_) => {}
        }
        if let Some(pair) = self.segments.windows(2).find(|w| w[1].0 <= w[0].0) {
            return Err(Error::invalid(format!(
                "loader state 'segments' must be {valid_segments}; {} follows {}",
                pair[1].0, pair[0].0
            )));
        }
        self.check_resumes()?;
        if self.epoch > last_epoch {
            return Err(Error::invalid(format!(
                "loader state 'epoch' must be <= {last_epoch} (epochs of {} positions end \
                 at 2**64), got {}",
                self.epoch_len, self.epoch
            )));
        }
        let expected = self.steps_since(self.current()?)?;
        if self.steps != expected {
            return Err(Error::invalid(format!(
                "loader state 'steps' is {} but its position and last resume give {expected} \
                 batches per rank in epoch {}",
                self.steps, self.epoch
            )));
        }
        Ok(())
    }

    fn check_resumes(&self) -> Result<()> {
        let last_epoch = self.last_epoch();
        let valid = "a non-empty list of spans {from, until, steps, world_size, batch_size, \
                     workers, generation}, 'until' on every span but the last, generations \
                     never decreasing";
        let bad =
            |why: String| Error::invalid(format!("loader state 'resumes' must be {valid}; {why}"));
        if self.resumes.is_empty() {
            return Err(bad("it is empty".into()));
        }
        let place_ok =
            |(epoch, position): Place| epoch <= last_epoch && position <= self.epoch_len.get();
        for (i, span) in self.resumes.iter().enumerate() {
            let is_last = i + 1 == self.resumes.len();
            if span.until.is_some() == is_last {
                return Err(bad(format!(
                    "span {i} {} 'until'",
                    if is_last { "has" } else { "lacks" }
                )));
            }
            if span.world_size.get() > MAX_WORLD_SIZE {
                return Err(bad(format!(
                    "span {i}: 'world_size' must be between 1 and {MAX_WORLD_SIZE}, got {}",
                    span.world_size
                )));
            }
            if span.world_size.checked_mul(span.batch_size).is_none() {
                return Err(bad(format!(
                    "span {i}: 'world_size' x 'batch_size' ({} x {}) must be below 2**64",
                    span.world_size, span.batch_size
                )));
            }
            let until = span.until.unwrap_or((self.epoch, self.position));
            if !place_ok(span.start) || !place_ok(until) {
                return Err(bad(format!(
                    "span {i}: a place is [epoch, position] with position <= epoch_len ({})",
                    self.epoch_len
                )));
            }
            if self.absolute(span.start) > self.absolute(until) {
                return Err(bad(format!(
                    "span {i} ends at {until:?}, before it begins at {:?}",
                    span.start
                )));
            }
            if i > 0 && span.generation < self.resumes[i - 1].generation {
                return Err(bad(format!(
                    "span {i} has an older generation than span {}",
                    i - 1
                )));
            }
        }
        Ok(())
    }

    /// The last epoch whose positions all fit below 2**64.
    pub(crate) fn last_epoch(&self) -> u64 {
        u64::MAX / self.epoch_len.get() - 1
    }

    /// The span being read (there is always one).
    pub(crate) fn current(&self) -> Result<&Resume> {
        self.resumes
            .last()
            .ok_or_else(|| Error::invalid("loader state 'resumes' must not be empty"))
    }

    /// The absolute stream position of `place` (checked to fit when loaded).
    pub(crate) fn absolute(&self, (epoch, position): Place) -> u64 {
        epoch
            .saturating_mul(self.epoch_len.get())
            .saturating_add(position)
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }
    pub fn seed(&self) -> u64 {
        self.seed
    }
    pub fn shuffle(&self) -> ShuffleMode {
        self.shuffle
    }
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
    pub fn epoch_len(&self) -> NonZeroU64 {
        self.epoch_len
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// Epoch-relative: every position of the epoch before it has been consumed.
    pub fn position(&self) -> u64 {
        self.position
    }
    /// Batches each rank has taken in this epoch.
    pub fn steps(&self) -> u64 {
        self.steps
    }
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
    pub fn run(&self) -> &RunId {
        &self.run
    }
    pub fn resumes(&self) -> &[Resume] {
        &self.resumes
    }
    /// The absolute position of this epoch's first sample.
    pub fn epoch_start(&self) -> u64 {
        self.absolute((self.epoch, 0))
    }
    /// The absolute position of the next sample to consume.
    pub fn consumed(&self) -> u64 {
        self.absolute((self.epoch, self.position))
    }
}

#[cfg(test)]
mod tests;
