//! DatasetRT's engine: immutable caches (`storage`), validated populations
//! (`population`), counter-based draws (`sampling`) and epoch streams (`stream`),
//! with the work of writing and reading spread over a fixed pool of worker
//! threads (`workers`). `python` holds the PyO3 bindings and is the only module
//! that knows about Python.

pub mod dataset;
pub mod error;
pub mod hash;
mod os;
pub mod population;
mod prefetch;
pub mod remote;
pub mod request;
pub mod run;
pub mod sampling;
pub mod service;
pub mod storage;
pub mod stream;
mod uncached;
mod warmup;
pub mod workers;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
