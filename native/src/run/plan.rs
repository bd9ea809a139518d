//! What a run reads next: the parts of the epoch left, each rank's and worker's
//! tickets for them, and how the state moves as batches are taken, the epoch
//! changes, the population switches or the run resumes.

use std::num::NonZeroU64;

use super::{Place, PopulationId, Resume, RunState, Segment};
use crate::error::{Error, Result};
use crate::request::StreamRequest;

/// An epoch-relative range `[start, stop)` drawn from one population.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub stop: u64,
    pub population: PopulationId,
}

impl RunState {
    /// The population drawing the absolute `position`.
    pub fn population_at(&self, position: u64) -> &PopulationId {
        let index = self.segments.partition_point(|s| s.0 <= position);
        // `check` holds segments[0].0 == 0, so index >= 1.
        &self.segments[index.saturating_sub(1)].1
    }

    /// Epoch `epoch`'s range `[from, to)` cut at population switches.
    pub(crate) fn parts_between(&self, epoch: u64, from: u64, to: u64) -> Vec<Part> {
        let origin = self.absolute((epoch, 0));
        let (begin, end) = (origin + from, origin + to);
        let mut cuts = vec![begin];
        cuts.extend(
            self.segments
                .iter()
                .map(|s| s.0)
                .filter(|&s| begin < s && s < end),
        );
        cuts.push(end);
        cuts.windows(2)
            .filter(|w| w[0] < w[1])
            .map(|w| Part {
                start: w[0] - origin,
                stop: w[1] - origin,
                population: self.population_at(w[0]).clone(),
            })
            .collect()
    }

    /// The rest of the current epoch, one part per population segment.
    pub fn parts(&self) -> Vec<Part> {
        self.parts_between(self.epoch, self.position, self.epoch_len.get())
    }

    /// Positions one step of the current span takes: world_size x batch_size.
    fn step(&self) -> Result<u64> {
        let span = self.current()?;
        Ok(span.world_size.get() * span.batch_size.get())
    }

    /// Batches each rank takes of `parts` at the current span's world size and
    /// batch size (each part's tail that fills no step goes to no rank).
    fn steps_of(&self, parts: &[Part]) -> Result<u64> {
        let step = self.step()?;
        Ok(parts.iter().map(|p| (p.stop - p.start) / step).sum())
    }

    /// Batches each rank still takes in the current epoch.
    pub fn batches_left(&self) -> Result<u64> {
        self.steps_of(&self.parts())
    }

    /// The batches each rank has taken in the current epoch, counted from
    /// `span`'s start (the steps it began with when that is in this epoch).
    pub(crate) fn steps_since(&self, span: &Resume) -> Result<u64> {
        let (epoch, from) = span.start;
        let (first, from) = if epoch == self.epoch {
            (span.steps, from)
        } else {
            (0, 0)
        };
        let to = self.position.max(from);
        Ok(first + self.steps_of(&self.parts_between(self.epoch, from, to))?)
    }

    /// An epoch must hold at least one batch for every rank.
    pub fn check_share(&self) -> Result<()> {
        let span = self.current()?;
        let step = self.step()?;
        if self.epoch_len.get() < step {
            return Err(Error::invalid(format!(
                "an epoch of {} positions gives every rank 0 batches: a step takes world_size x \
                 batch_size = {} x {} = {step} positions; lower batch_size to at most {} or use \
                 a longer epoch_len",
                self.epoch_len,
                span.world_size,
                span.batch_size,
                self.epoch_len.get() / span.world_size.get()
            )));
        }
        Ok(())
    }

    /// The run's epoch over `population` as a command (no rank): what a source
    /// checks before the run uses the population.
    pub fn command(&self, population: &PopulationId) -> StreamRequest {
        StreamRequest {
            dataset: self.dataset.clone(),
            seed: self.seed,
            epoch: self.epoch,
            epoch_len: Some(self.epoch_len),
            shuffle: self.shuffle,
            world_size: 1,
            start: 0,
            stop: None,
            block: NonZeroU64::MIN,
            population: Some(population.clone()),
            columns: self.columns.clone(),
            payload: true,
            rank: None,
            offset: None,
            run: Some(self.run.clone()),
            generation: self.resumes.last().map(|span| span.generation),
        }
    }

    /// The ticket of rank `rank` of `world_size`'s share of `part` of `epoch`,
    /// in blocks of `block`.
    pub(crate) fn ticket(
        &self,
        epoch: u64,
        part: &Part,
        rank: u64,
        world_size: u64,
        block: NonZeroU64,
        payload: bool,
    ) -> Result<StreamRequest> {
        StreamRequest {
            epoch,
            start: part.start,
            stop: Some(part.stop),
            block,
            world_size,
            payload,
            ..self.command(&part.population)
        }
        .for_rank(rank)
    }

    /// The tickets of DataLoader worker `worker` of `workers` of rank `rank`
    /// for the rest of the epoch, in order.
    ///
    /// The rank takes `Q = floor(blocks / world_size)` blocks of each part; its
    /// `g`-th batch over all parts is block `rank + q * world_size` of its part
    /// and is read by worker `g mod workers`, the worker a DataLoader asks for
    /// it (round-robin, in order). Within a part that is the lane
    /// `k * world_size + rank` of `workers * world_size` lanes (`k` the
    /// worker's turn in this part) for the first `floor(Q / workers)` rounds,
    /// and one lane of the last, shorter round when `k < Q mod workers`.
    pub fn requests(
        &self,
        rank: u64,
        worker: u64,
        workers: u64,
        payload: bool,
    ) -> Result<Vec<StreamRequest>> {
        let span = self.current()?;
        let (w, size) = (span.world_size.get(), span.batch_size);
        if rank >= w || workers == 0 || worker >= workers {
            return Err(Error::invalid(format!(
                "rank {rank} of world_size {w}, worker {worker} of {workers}: need \
                 rank < world_size and worker < workers"
            )));
        }
        let mut tickets = Vec::new();
        let mut taken = 0u64; // the rank's batches in the parts before this one
        for part in self.parts() {
            let per_rank = (part.stop - part.start) / size.get() / w;
            let turn = (worker + workers - taken % workers) % workers;
            let (rounds, last) = (per_rank / workers, per_rank % workers);
            let middle = part.start + rounds * workers * w * size.get();
            let lane = turn * w + rank;
            if rounds > 0 {
                let head = Part {
                    stop: middle,
                    ..part.clone()
                };
                tickets.push(self.ticket(self.epoch, &head, lane, workers * w, size, payload)?);
            }
            if turn < last {
                let tail = Part {
                    start: middle,
                    stop: middle + last * w * size.get(),
                    ..part.clone()
                };
                tickets.push(self.ticket(self.epoch, &tail, lane, last * w, size, payload)?);
            }
            taken += per_rank;
        }
        Ok(tickets)
    }

    /// Move past the batch whose first sample is the absolute `first_position`
    /// (a batch of the current epoch this rank was given).
    pub fn advance(&mut self, first_position: u64) -> Result<()> {
        let step = self.step()?;
        let relative = first_position
            .checked_sub(self.epoch_start())
            .filter(|&r| r < self.epoch_len.get());
        let part = relative.and_then(|r| self.parts().into_iter().rev().find(|p| p.start <= r));
        let (Some(relative), Some(part)) = (relative, part) else {
            return Err(Error::internal(format!(
                "a batch from position {first_position} is not in the rest of epoch {} \
                 (from {})",
                self.epoch,
                self.consumed()
            )));
        };
        let batch = self.current()?.batch_size.get();
        let block = (relative - part.start) / batch;
        let span = self.current()?.world_size.get();
        self.position = (part.start + (block / span + 1) * step).min(self.epoch_len.get());
        self.steps += 1;
        Ok(())
    }

    /// Every rank has read its share of the epoch: the rest is the dropped tail.
    pub fn finish_epoch(&mut self) {
        self.position = self.epoch_len.get();
        // The tail's parts hold no step, so the count is already final.
    }

    /// Read epoch `epoch` next, from its start; the current epoch keeps its
    /// place. Going on to the next epoch after this one is done continues the
    /// span; any other move (an epoch left unfinished, skipped or read again)
    /// ends the span there and begins another.
    pub fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        if epoch == self.epoch {
            return Ok(());
        }
        let last_epoch = self.last_epoch();
        if epoch > last_epoch {
            return Err(Error::invalid(format!(
                "'epoch' must be <= {last_epoch} (epochs of {} positions end at 2**64), got \
                 {epoch}",
                self.epoch_len
            )));
        }
        let continues = epoch == self.epoch + 1 && self.position == self.epoch_len.get();
        if !continues {
            let here = (self.epoch, self.position);
            let next = Resume {
                start: (epoch, 0),
                until: None,
                steps: 0,
                ..self.current()?.clone()
            };
            self.begin_span(here, next);
        }
        (self.epoch, self.position, self.steps) = (epoch, 0, 0);
        Ok(())
    }

    /// Resume the run here as a new generation, cut into `world_size` ranks of
    /// `batch_size`, `workers` workers each. `generation` must be newer than
    /// every earlier one of the run.
    pub fn resume(
        &mut self,
        world_size: u64,
        batch_size: u64,
        workers: u64,
        generation: u64,
    ) -> Result<()> {
        let positive = |name: &str, value: u64| {
            NonZeroU64::new(value)
                .ok_or_else(|| Error::invalid(format!("'{name}' must be >= 1, got {value}")))
        };
        let (world, batch) = (
            positive("world_size", world_size)?,
            positive("batch_size", batch_size)?,
        );
        let newest = self.current()?.generation;
        if generation <= newest {
            return Err(Error::invalid(format!(
                "a resume is a new generation of the run: it must be > {newest}, got {generation}"
            )));
        }
        let mut resumed = self.clone();
        let here = (self.epoch, self.position);
        resumed.begin_span(
            here,
            Resume {
                start: here,
                until: None,
                steps: self.steps,
                world_size: world,
                batch_size: batch,
                workers,
                generation,
            },
        );
        resumed.check_resumes()?;
        resumed.check_share()?;
        *self = resumed;
        Ok(())
    }

    /// End the current span at `here` and begin `next` (an empty span of the
    /// same generation is replaced instead: it consumed nothing).
    fn begin_span(&mut self, here: Place, next: Resume) {
        let here_at = self.absolute(here);
        let starts = self.resumes.last().map(|last| self.absolute(last.start));
        if let Some(last) = self.resumes.last_mut() {
            let empty = starts == Some(here_at);
            if empty && last.generation == next.generation {
                *last = next;
                return;
            }
            last.until = Some(here);
        }
        self.resumes.push(next);
    }

    /// Draw from `population` from the absolute position `at` on (a later
    /// pending switch is replaced). `at` must not be behind the state and must
    /// be a batch boundary of the run: `position + k * world_size x batch_size`
    /// in the current epoch, any multiple of that from a later epoch's start.
    pub fn switch(&mut self, at: u64, population: PopulationId) -> Result<()> {
        let consumed = self.consumed();
        if at < consumed {
            return Err(Error::invalid(format!(
                "'at' must be an absolute position >= {consumed} (what this rank has \
                 consumed), got {at}"
            )));
        }
        let step = self.step()?;
        let (epoch, offset) = (at / self.epoch_len.get(), at % self.epoch_len.get());
        // In the current epoch the grid starts at the place reached; a later
        // epoch's grid starts at that epoch's first position.
        let origin = if epoch == self.epoch {
            self.position
        } else {
            0
        };
        if (offset - origin) % step != 0 {
            return Err(Error::invalid(format!(
                "'at' = {at} is not a batch boundary of this run: boundaries of epoch {epoch} \
                 are {} + k * {step} (world_size x batch_size)",
                self.absolute((epoch, origin))
            )));
        }
        self.segments.retain(|s| s.0 < at);
        self.segments.push(Segment(at, population));
        Ok(())
    }
}
