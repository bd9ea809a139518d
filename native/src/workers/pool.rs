//! `WorkerPool`: a fixed set of threads shared by every stream and writer of a
//! runtime. Jobs are closures; results travel back on the caller's own channels
//! (a `ReorderBuffer` when they must come back in order).
//!
//! Threads do not survive `fork` (PyTorch DataLoader workers fork). The pool
//! records the process id that started its threads and, when used from another
//! process, starts fresh threads there before accepting work.

use std::num::NonZeroUsize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::thread;

use crossbeam_channel::{unbounded, Sender};

use crate::error::{Error, Result};

pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct Threads {
    pid: u32,
    sender: Sender<Job>,
}

pub struct WorkerPool {
    size: usize,
    threads: Mutex<Threads>,
}

impl WorkerPool {
    pub fn new(size: NonZeroUsize) -> Result<Self> {
        let size = size.get();
        Ok(WorkerPool {
            size,
            threads: Mutex::new(spawn_threads(size)?),
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Run `job` on a worker thread. A panic inside `job` is contained; the job's
    /// result channel is dropped, which its receiver reports as an error.
    pub fn submit(&self, job: Job) -> Result<()> {
        let mut threads = self
            .threads
            .lock()
            .map_err(|_| Error::internal("the worker pool's lock is poisoned"))?;
        if threads.pid != std::process::id() {
            *threads = spawn_threads(self.size)?;
        }
        threads
            .sender
            .send(job)
            .map_err(|_| Error::internal("the worker pool has stopped"))
    }
}

fn spawn_threads(size: usize) -> Result<Threads> {
    let (sender, receiver) = unbounded::<Job>();
    for i in 0..size {
        let receiver = receiver.clone();
        thread::Builder::new()
            .name(format!("dataset-rt-worker-{i}"))
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    let _ = catch_unwind(AssertUnwindSafe(job));
                }
            })
            .map_err(|e| Error::internal(format!("cannot start worker thread: {e}")))?;
    }
    Ok(Threads {
        pid: std::process::id(),
        sender,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_jobs_and_survives_panics() {
        let pool = WorkerPool::new(NonZeroUsize::new(2).unwrap()).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        pool.submit(Box::new(|| panic!("boom"))).unwrap();
        for i in 0..10 {
            let tx = tx.clone();
            pool.submit(Box::new(move || tx.send(i).unwrap())).unwrap();
        }
        let mut got: Vec<i32> = (0..10).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }
}
