//! `ReorderBuffer`: results of numbered jobs come back from the workers in any
//! order and are handed out in the order the jobs were numbered.
//!
//! Each job carries a `Ticket` (its sequence number and a way back). A ticket
//! dropped without a result (the job panicked, or the pool dropped it) reports
//! its slot as lost, so the consumer gets an error in that position instead of
//! waiting forever.

use std::collections::BTreeMap;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use crate::error::{Error, Result};

/// A result, or `None` for a job that ended without one.
type Arrival<T> = (u64, Option<T>);

pub struct ReorderBuffer<T> {
    /// The sequence number of the next ticket.
    next_ticket: u64,
    /// The sequence number of the next result to hand out.
    next_out: u64,
    /// Results that arrived ahead of `next_out`.
    early: BTreeMap<u64, Option<T>>,
    sender: Sender<Arrival<T>>,
    receiver: Receiver<Arrival<T>>,
}

/// The way back for one job's result; send it with `Ticket::send`.
pub struct Ticket<T> {
    seq: u64,
    sender: Option<Sender<Arrival<T>>>,
}

impl<T> Ticket<T> {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Deliver the job's result. If the buffer is gone (its consumer stopped),
    /// the result is dropped.
    pub fn send(mut self, value: T) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send((self.seq, Some(value)));
        }
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send((self.seq, None));
        }
    }
}

impl<T> Default for ReorderBuffer<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ReorderBuffer<T> {
    pub fn new() -> Self {
        let (sender, receiver) = unbounded();
        ReorderBuffer {
            next_ticket: 0,
            next_out: 0,
            early: BTreeMap::new(),
            sender,
            receiver,
        }
    }

    /// Number the next job. Its result is handed out after those of every
    /// ticket issued before it.
    pub fn ticket(&mut self) -> Ticket<T> {
        let seq = self.next_ticket;
        self.next_ticket += 1;
        Ticket {
            seq,
            sender: Some(self.sender.clone()),
        }
    }

    /// Tickets issued whose results have not been handed out yet.
    pub fn outstanding(&self) -> u64 {
        self.next_ticket - self.next_out
    }

    /// The next result in sequence order if it has arrived; never blocks.
    pub fn try_next(&mut self) -> Option<Result<T>> {
        while let Ok((seq, value)) = self.receiver.try_recv() {
            self.early.insert(seq, value);
        }
        self.take_next()
    }

    /// The next result in sequence order, waiting for it (at most `timeout`,
    /// if given). `None` when no ticket is outstanding.
    pub fn next_blocking(&mut self, timeout: Option<Duration>) -> Option<Result<T>> {
        if self.outstanding() == 0 {
            return None;
        }
        loop {
            if let Some(result) = self.try_next() {
                return Some(result);
            }
            let arrival = match timeout {
                Some(timeout) => self.receiver.recv_timeout(timeout).map_err(|e| match e {
                    RecvTimeoutError::Timeout => "the worker threads stopped responding",
                    RecvTimeoutError::Disconnected => "the worker threads stopped",
                }),
                None => self
                    .receiver
                    .recv()
                    .map_err(|_| "the worker threads stopped"),
            };
            match arrival {
                Ok((seq, value)) => {
                    self.early.insert(seq, value);
                }
                Err(message) => return Some(Err(Error::internal(message))),
            }
        }
    }

    fn take_next(&mut self) -> Option<Result<T>> {
        let value = self.early.remove(&self.next_out)?;
        self.next_out += 1;
        Some(value.ok_or_else(|| Error::internal("a worker thread panicked")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::workers::WorkerPool;

    proptest! {
        /// Whatever order the results arrive in, and however the consumer
        /// interleaves its reads with the arrivals, it sees them in sequence order.
        #[test]
        fn any_arrival_order_comes_out_in_sequence_order(
            (arrivals, polls) in (1usize..64).prop_flat_map(|n| (
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                proptest::collection::vec(any::<bool>(), n),
            ))
        ) {
            let mut buffer = ReorderBuffer::new();
            let mut tickets: Vec<Option<Ticket<usize>>> =
                (0..arrivals.len()).map(|_| Some(buffer.ticket())).collect();
            let mut out = Vec::new();
            for (&seq, &poll) in arrivals.iter().zip(&polls) {
                let ticket = tickets[seq].take().unwrap();
                prop_assert_eq!(ticket.seq(), seq as u64);
                ticket.send(seq);
                if poll {
                    while let Some(value) = buffer.try_next() {
                        out.push(value.unwrap());
                    }
                }
            }
            while let Some(value) = buffer.next_blocking(None) {
                out.push(value.unwrap());
            }
            prop_assert_eq!(out, (0..arrivals.len()).collect::<Vec<_>>());
            prop_assert_eq!(buffer.outstanding(), 0);
        }
    }

    #[test]
    fn results_from_worker_threads_come_out_in_order() {
        let pool = WorkerPool::new(std::num::NonZeroUsize::new(4).unwrap()).unwrap();
        let mut buffer = ReorderBuffer::new();
        for i in 0..200u64 {
            let ticket = buffer.ticket();
            pool.submit(Box::new(move || {
                // Later jobs finish first more often than not.
                std::thread::sleep(Duration::from_micros((200 - i) % 7 * 50));
                ticket.send(i);
            }))
            .unwrap();
        }
        let out: Vec<u64> = std::iter::from_fn(|| buffer.next_blocking(None))
            .map(Result::unwrap)
            .collect();
        assert_eq!(out, (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn a_job_that_panics_is_an_internal_error_in_its_place() {
        let pool = Arc::new(WorkerPool::new(std::num::NonZeroUsize::new(2).unwrap()).unwrap());
        let mut buffer = ReorderBuffer::new();
        for i in 0..3u32 {
            let ticket = buffer.ticket();
            pool.submit(Box::new(move || {
                if i == 1 {
                    panic!("boom");
                }
                ticket.send(i);
            }))
            .unwrap();
        }
        assert_eq!(buffer.next_blocking(None).unwrap().unwrap(), 0);
        let err = buffer.next_blocking(None).unwrap().unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err}");
        assert_eq!(err.to_string(), "internal error: a worker thread panicked");
        assert_eq!(buffer.next_blocking(None).unwrap().unwrap(), 2);
        assert!(buffer.next_blocking(None).is_none());
    }

    #[test]
    fn waiting_longer_than_the_timeout_is_an_internal_error() {
        let mut buffer = ReorderBuffer::<u8>::new();
        let ticket = buffer.ticket();
        let err = buffer
            .next_blocking(Some(Duration::from_millis(10)))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "internal error: the worker threads stopped responding"
        );
        ticket.send(7);
        assert_eq!(buffer.next_blocking(None).unwrap().unwrap(), 7);
    }
}
