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
    population.recheck();
    let chunks = window.count.div_ceil(CHUNK);
    let (sender, receiver) = unbounded();
    for c in 0..chunks {
        let first = c * CHUNK;
        let n = CHUNK.min(window.count - first);
        let population = population.clone();
        let sender = sender.clone();
        pool.submit(Box::new(move || {
            let mut rows = Vec::with_capacity(n as usize);
            let positions = window.positions(first, n);
            order.rows_at(population.alias(), positions, &mut rows);
            let _ = sender.send((c, rows));
        }))?;
    }
    drop(sender);
    let mut out = vec![0u32; window.count as usize];
    let mut received = 0u64;
    for (c, rows) in receiver.iter() {
        let first = (c * CHUNK) as usize;
        out[first..first + rows.len()].copy_from_slice(&rows);
        received += 1;
    }
    if received != chunks {
        return Err(Error::internal("a worker thread failed while drawing"));
    }
    // A page of the rows file the draws read that does not match its sum.
    if let Some(error) = population.damage() {
        return Err(error);
    }
    Ok(out)
}
