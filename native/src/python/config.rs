//! The engine side of `dataset_rt`'s configuration classes: each Python config
//! builds its options object here when it is constructed, so a bad value fails
//! where it is written, and every rule lives in Rust (`args.rs`).

use pyo3::prelude::*;

use super::args::{boolean, positive_usize, seed};

/// The validated values of a `ReaderConfig`.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct ReaderOptions {
    /// The stream's seed as the unsigned 64-bit value the sampler uses.
    pub seed: u64,
    pub prefetch_size: usize,
    pub shuffle: bool,
    pub validate_cache: bool,
}

#[pymethods]
impl ReaderOptions {
    #[new]
    #[pyo3(signature = (*, seed, prefetch_size, shuffle, validate_cache))]
    fn new(
        seed: &Bound<'_, PyAny>,
        prefetch_size: &Bound<'_, PyAny>,
        shuffle: &Bound<'_, PyAny>,
        validate_cache: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(ReaderOptions {
            seed: self::seed("ReaderConfig.seed", seed)?,
            prefetch_size: positive_usize("ReaderConfig.prefetch_size", prefetch_size)?.get(),
            shuffle: boolean("ReaderConfig.shuffle", shuffle)?,
            validate_cache: boolean("ReaderConfig.validate_cache", validate_cache)?,
        })
    }
}
