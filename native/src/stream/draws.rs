//! Draws without payloads: the population rows of a window, computed in
//! parallel on the worker pool (each position is independent).

use std::sync::Arc;

use crossbeam_channel::unbounded;

use super::WorkerPool;
use crate::error::{Error, Result};
use crate::population::Population;
use crate::sampling::{StreamOrder, StreamWindow};

/// Positions per job: large enough to amortise the hand-off, small enough to
/// spread over the workers.
const CHUNK: u64 = 1 << 20;

/// The population row of every position of `window`, in window order.
pub fn draw_rows(
    pool: &WorkerPool,
    population: Arc<Population>,
    order: StreamOrder,
    window: StreamWindow,
) -> Result<Vec<u32>> {
    let chunks = window.count.div_ceil(CHUNK);
    let (sender, receiver) = unbounded();
    for c in 0..chunks {
        let first = c * CHUNK;
        let n = CHUNK.min(window.count - first);
        let population = population.clone();
        let sender = sender.clone();
        pool.submit(Box::new(move || {
            let alias = population.alias();
            let rows: Vec<u32> = (first..first + n)
                .map(|i| order.row_at(alias, window.position(i)) as u32)
                .collect();
            let _ = sender.send((c, rows));
        }))?;
    }
    drop(sender);
    let mut parts: Vec<Option<Vec<u32>>> = vec![None; chunks as usize];
    for (c, rows) in receiver.iter() {
        parts[c as usize] = Some(rows);
    }
    let mut out = Vec::with_capacity(window.count as usize);
    for part in parts {
        out.extend(part.ok_or_else(|| Error::invalid("a worker thread failed while drawing"))?);
    }
    Ok(out)
}
