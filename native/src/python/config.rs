//! The engine side of `dataset_rt`'s configuration classes: each Python config
//! builds its options object here when it is constructed, so a bad value fails
//! where it is written, and every rule lives in Rust (`args.rs`).

use std::num::NonZeroUsize;

use pyo3::prelude::*;

use super::args::{boolean, integer, positive_usize, seed, shuffle_mode, unsigned};
use super::errors::IntoPyResult;
use crate::error::{Error, Result};
use crate::sampling::ShuffleMode;
use crate::storage::{check_ratio, Codec, Compression, WriterOptions};

/// Name the config field an engine rule is about: with the prefix
/// "WriterConfig.", "prefetch_size must be ..." becomes "WriterConfig.prefetch_size
/// must be ...".
fn field_of<T>(prefix: &str, result: Result<T>) -> PyResult<T> {
    result
        .map_err(|error| match error {
            Error::InvalidArgument(message) => Error::invalid(format!("{prefix}{message}")),
            other => other,
        })
        .py()
}

/// The validated values of a `ReaderConfig`.
#[pyclass(frozen, get_all, module = "dataset_rt._native")]
pub struct ReaderOptions {
    /// The stream's seed as the unsigned 64-bit value the sampler uses.
    pub seed: u64,
    pub prefetch_size: NonZeroUsize,
    pub shuffle: ShuffleMode,
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
            prefetch_size: positive_usize("ReaderConfig.prefetch_size", prefetch_size)?,
            shuffle: shuffle_mode("ReaderConfig.shuffle", shuffle)?,
            validate_cache: boolean("ReaderConfig.validate_cache", validate_cache)?,
        })
    }
}

/// The validated values of a `ShardCompression`.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct CompressionOptions {
    pub engine: Compression,
}

#[pymethods]
impl CompressionOptions {
    #[new]
    #[pyo3(signature = (*, algo, level, ratio=1.0))]
    fn new(algo: &Bound<'_, PyAny>, level: &Bound<'_, PyAny>, ratio: f64) -> PyResult<Self> {
        let algo: String = algo.extract().map_err(|_| {
            super::errors::to_pyerr(Error::invalid(format!(
                "ShardCompression.algo must be 'none', 'lz4' or 'zstd', got {}",
                algo.repr().map(|r| r.to_string()).unwrap_or_default()
            )))
        })?;
        let codec = field_of("ShardCompression.algo: ", Codec::parse(&algo))?;
        let level = i32::try_from(integer(
            "ShardCompression.level",
            level,
            "between 1 and 22",
        )?)
        .map_err(|_| Error::invalid("ShardCompression.level must be between 1 and 22"))
        .py()?;
        let engine = field_of("ShardCompression.level: ", Compression::new(codec, level))?;
        field_of("ShardCompression: ", check_ratio(codec, ratio))?;
        Ok(CompressionOptions { engine })
    }
}

/// The validated values of a `WriterConfig`.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct WriteOptions {
    pub engine: WriterOptions,
    #[pyo3(get)]
    pub show_progress: bool,
    #[pyo3(get)]
    pub validate_cache: bool,
    /// dataset-rt 0.4.8's process settings, validated and kept (every source is
    /// written in the calling process; the workers are threads).
    #[pyo3(get)]
    pub num_processes: u64,
    #[pyo3(get)]
    pub process_timeout_seconds: f64,
    /// Where to write the stage profile, when profiling is on.
    #[pyo3(get)]
    pub profile_path: Option<String>,
}

#[pymethods]
impl WriteOptions {
    #[new]
    #[pyo3(signature = (
        *, prefetch_size, max_shard_bytes, compression, show_progress, validate_cache,
        num_processes=None, process_timeout_seconds=3600.0, profile_path=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        prefetch_size: &Bound<'_, PyAny>,
        max_shard_bytes: &Bound<'_, PyAny>,
        compression: &CompressionOptions,
        show_progress: &Bound<'_, PyAny>,
        validate_cache: &Bound<'_, PyAny>,
        num_processes: Option<&Bound<'_, PyAny>>,
        process_timeout_seconds: f64,
        profile_path: Option<String>,
    ) -> PyResult<Self> {
        let num_processes = num_processes
            .map(|n| unsigned("WriterConfig.num_processes", n))
            .transpose()?
            .unwrap_or(0);
        if !(process_timeout_seconds.is_finite() && process_timeout_seconds > 0.0) {
            return Err(Error::invalid(format!(
                "WriterConfig.process_timeout_seconds must be finite and greater than zero, \
                 got {process_timeout_seconds}"
            )))
            .py();
        }
        let prefetch = unsigned("WriterConfig.prefetch_size", prefetch_size)?;
        let shard_bytes = unsigned("WriterConfig.max_shard_bytes", max_shard_bytes)?;
        let prefetch = usize::try_from(prefetch)
            .map_err(|_| Error::invalid("WriterConfig.prefetch_size is too large"))
            .py()?;
        let engine = field_of(
            "WriterConfig.",
            WriterOptions::new(prefetch, shard_bytes, compression.engine),
        )?;
        Ok(WriteOptions {
            engine,
            show_progress: boolean("WriterConfig.show_progress", show_progress)?,
            validate_cache: boolean("WriterConfig.validate_cache", validate_cache)?,
            num_processes,
            process_timeout_seconds,
            profile_path,
        })
    }
}
