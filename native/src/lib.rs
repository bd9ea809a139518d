//! DatasetRT's engine: immutable caches (`storage`), validated populations
//! (`population`), counter-based draws (`sampling`), epoch streams (`stream`)
//! and training runs (`run`), with the work of writing and reading spread over
//! a fixed pool of worker threads (`workers`). Everything shared between
//! replicas goes through one object-store abstraction (`remote::Bucket`, a
//! bucket or a local directory); everything OS-specific is in `os`. `python`
//! holds the PyO3 bindings and is the only module that knows about Python.
//! docs/architecture.md has the map.

pub mod dataset;
pub mod error;
pub mod hash;
pub mod ids;
mod os;
pub mod population;
pub mod progress;
pub mod remote;
pub mod request;
pub mod run;
pub mod sampling;
pub mod service;
pub mod storage;
pub mod stream;
mod warmup;
pub mod wire;
pub mod workers;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
