//! Worker threads and the ordering of their results, shared by the write
//! pipeline (`storage::WritePipeline`) and the epoch streams (`stream`).
//!
//! This module depends on nothing else in the crate, so `storage` and `stream`
//! can both use it without depending on each other.

mod pool;
mod reorder;

pub use pool::{Job, WorkerPool};
pub use reorder::{ReorderBuffer, Ticket};
