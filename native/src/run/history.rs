//! What a run consumed, exactly, for any chain of resumes: each span of the run
//! cut by its own world size and batch size (`seen`), or what a run would read
//! from the state on (`ahead`). The audit streams a manifest from these spans;
//! `taken` lists the positions themselves (tests, small runs).

use std::num::NonZeroU64;

use super::plan::Part;
use super::{PopulationId, RunState};
use crate::error::{Error, Result};
use crate::request::StreamRequest;

/// Most epochs one history covers without being told which (a state's epoch
/// comes from a file).
pub const MAX_EPOCHS: u64 = 1 << 20;

/// A stretch of a run: the epoch-relative `part` of `epoch`, read by
/// `world_size` ranks in batches of `batch_size` (the partition rule with
/// `block = batch_size` from the part's start), each rank's first batch in it
/// being its step `first_step` of the epoch. `span` is the index of the run's
/// span (`resumes`) it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub epoch: u64,
    pub part: Part,
    pub world_size: NonZeroU64,
    pub batch_size: NonZeroU64,
    pub first_step: u64,
    pub span: usize,
    pub generation: u64,
}

impl Span {
    /// Batches each rank takes.
    pub fn steps(&self) -> u64 {
        (self.part.stop - self.part.start) / self.batch_size.get() / self.world_size.get()
    }

    /// Samples all ranks take together.
    pub fn rows(&self) -> u64 {
        self.steps() * self.world_size.get() * self.batch_size.get()
    }
}

/// One consumed position: which rank took it at which step of its epoch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taken {
    pub epoch: u64,
    pub position: u64,
    pub rank: u64,
    pub step: u64,
    pub population: PopulationId,
}

impl RunState {
    /// What the run had consumed when this state was saved: every span of the
    /// chain, from where it began to where the next began (the last to the
    /// state's place), cut at population switches, in the order read. Only
    /// `epochs` if given; without it at most `MAX_EPOCHS` epochs.
    pub fn seen(&self, epochs: Option<&[u64]>) -> Result<Vec<Span>> {
        let mut spans = Vec::new();
        let mut counted = 0u64;
        for (index, resume) in self.resumes.iter().enumerate() {
            let (from, until) = (
                resume.start,
                resume.until.unwrap_or((self.epoch, self.position)),
            );
            if self.absolute(from) >= self.absolute(until) {
                continue;
            }
            let last = if until.1 == 0 { until.0 - 1 } else { until.0 };
            let chosen: Vec<u64> = match epochs {
                Some(list) => list
                    .iter()
                    .copied()
                    .filter(|e| (from.0..=last).contains(e))
                    .collect(),
                None => {
                    counted += last - from.0 + 1;
                    if counted > MAX_EPOCHS {
                        return Err(Error::invalid(format!(
                            "a run covers at most {MAX_EPOCHS} epochs and this one spans more; \
                             choose the epochs to cover ('epochs', --epochs)"
                        )));
                    }
                    (from.0..=last).collect()
                }
            };
            for epoch in chosen {
                let lo = if epoch == from.0 { from.1 } else { 0 };
                let hi = if epoch == until.0 {
                    until.1
                } else {
                    self.epoch_len.get()
                };
                let first = if epoch == from.0 { resume.steps } else { 0 };
                self.cut(
                    &mut spans,
                    epoch,
                    lo,
                    hi,
                    first,
                    index,
                    resume.world_size,
                    resume.batch_size,
                );
            }
        }
        Ok(spans)
    }

    /// What a run resumed from this state at `world_size` x `batch_size` reads
    /// of `epochs` (each >= the state's): its epoch from its position, later
    /// ones whole.
    pub fn ahead(
        &self,
        epochs: &[u64],
        world_size: NonZeroU64,
        batch_size: NonZeroU64,
    ) -> Result<Vec<Span>> {
        let mut spans = Vec::new();
        let index = self.resumes.len();
        let generation = self.current()?.generation;
        for &epoch in epochs {
            if epoch < self.epoch {
                return Err(Error::invalid(format!(
                    "'epochs' must be >= the state's epoch {}, got {epoch}",
                    self.epoch
                )));
            }
            let (lo, first) = if epoch == self.epoch {
                (self.position, self.steps)
            } else {
                (0, 0)
            };
            self.cut(
                &mut spans,
                epoch,
                lo,
                self.epoch_len.get(),
                first,
                index,
                world_size,
                batch_size,
            );
        }
        for span in &mut spans {
            span.generation = generation;
        }
        Ok(spans)
    }

    /// Append epoch `epoch`'s `[lo, hi)` cut at switches, numbering steps on
    /// from `first`.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        &self,
        spans: &mut Vec<Span>,
        epoch: u64,
        lo: u64,
        hi: u64,
        mut first: u64,
        index: usize,
        world_size: NonZeroU64,
        batch_size: NonZeroU64,
    ) {
        let generation = self.resumes.get(index).map_or(0, |r| r.generation);
        for part in self.parts_between(epoch, lo, hi) {
            let span = Span {
                epoch,
                part,
                world_size,
                batch_size,
                first_step: first,
                span: index,
                generation,
            };
            first += span.steps();
            spans.push(span);
        }
    }

    /// Rank `rank`'s ticket for `span` (ids and columns only unless `payload`).
    /// It reads as any client may: an audit is not the run, so it is not fenced.
    pub fn span_ticket(&self, span: &Span, rank: u64, payload: bool) -> Result<StreamRequest> {
        let ticket = self.ticket(
            span.epoch,
            &span.part,
            rank,
            span.world_size.get(),
            span.batch_size,
            payload,
        )?;
        Ok(StreamRequest {
            run: None,
            generation: None,
            ..ticket
        })
    }

    /// Every position of `spans`, with the rank and step that took it, by the
    /// partition rule's arithmetic.
    pub fn taken(&self, spans: &[Span]) -> Vec<Taken> {
        let mut taken = Vec::new();
        for span in spans {
            let (w, b) = (span.world_size.get(), span.batch_size.get());
            let origin = self.absolute((span.epoch, span.part.start));
            for block in 0..span.steps() * w {
                for t in 0..b {
                    taken.push(Taken {
                        epoch: span.epoch,
                        position: origin + block * b + t,
                        rank: block % w,
                        step: span.first_step + block / w,
                        population: span.part.population.clone(),
                    });
                }
            }
        }
        taken
    }
}
