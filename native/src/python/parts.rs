//! Datasets of many caches for Python (`dataset_rt.parts`): a part's stage,
//! the commit of a descriptor, the removal of uncommitted parts. Locations
//! are parsed here, never in Python.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use crate::error::Error;
use crate::storage::descriptor::{self, Descriptor, Part, PartStage};
use crate::storage::location::Location;

/// Where one part is written (`staging_dir`) and published from (`publish`).
#[pyclass(module = "dataset_rt._native")]
pub struct PartTarget {
    stage: PartStage,
}

#[pymethods]
impl PartTarget {
    #[new]
    fn new(location: &str, write_id: &str, scratch_dir: PathBuf) -> PyResult<Self> {
        let at = Location::parse(location).py()?;
        Ok(PartTarget {
            stage: PartStage::new(&at, write_id, &scratch_dir).py()?,
        })
    }

    #[getter]
    fn staging_dir(&self) -> PathBuf {
        self.stage.staging_dir().to_path_buf()
    }

    /// Publish `staging_dir/<part>`: `(cache_id, records)`.
    fn publish(&self, py: Python<'_>, part: &str) -> PyResult<(u64, u64)> {
        let part = py.detach(|| self.stage.publish(part)).py()?;
        Ok((part.cache_id, part.records))
    }
}

/// `location` as every task of a write must name it (a directory made absolute).
#[pyfunction]
pub fn absolute_location(location: &str) -> PyResult<String> {
    Ok(Location::parse(location).py()?.absolute().py()?.to_string())
}

/// Publish the descriptor of `name` over `parts` (`(name, cache_id, records)`)
/// of the write `write_id` at `location`: `(descriptor JSON, created)`.
#[pyfunction]
pub fn commit_dataset(
    py: Python<'_>,
    location: &str,
    name: &str,
    write_id: &str,
    parts: Vec<(String, u64, u64)>,
    input_json: &str,
) -> PyResult<(String, bool)> {
    let at = Location::parse(location).py()?;
    let input: serde_json::Value = serde_json::from_str(input_json)
        .map_err(|e| Error::invalid(format!("the input record is not JSON: {e}")))
        .py()?;
    let parts: Vec<Part> = parts
        .into_iter()
        .map(|(name, cache_id, records)| Part {
            name,
            cache_id,
            records,
        })
        .collect();
    let committed = py
        .detach(|| descriptor::commit(&at, name, write_id, &parts, input))
        .py()?;
    Ok((to_json(&committed.descriptor)?, committed.created))
}

/// The descriptor at `location` as JSON, or None when it holds none.
#[pyfunction]
pub fn read_descriptor(py: Python<'_>, location: &str) -> PyResult<Option<String>> {
    let at = Location::parse(location).py()?;
    match py.detach(|| Descriptor::read(&at)).py()? {
        Some(descriptor) => Ok(Some(to_json(&descriptor)?)),
        None => Ok(None),
    }
}

/// Remove the parts at `location` that no descriptor names and that are older
/// than `min_age_seconds`: `(removed, left as recent, bytes)`.
#[pyfunction]
pub fn remove_uncommitted(
    py: Python<'_>,
    location: &str,
    min_age_seconds: f64,
    dry_run: bool,
) -> PyResult<(Vec<String>, Vec<String>, u64)> {
    if !(min_age_seconds.is_finite() && min_age_seconds >= 0.0) {
        return Err(Error::invalid(format!(
            "min_age_seconds must be a number >= 0, got {min_age_seconds}"
        )))
        .py();
    }
    let at = Location::parse(location).py()?;
    let age = Duration::from_secs_f64(min_age_seconds);
    let removal = py
        .detach(|| descriptor::remove_uncommitted(&at, age, dry_run))
        .py()?;
    Ok((removal.parts, removal.recent, removal.bytes))
}

fn to_json(descriptor: &Descriptor) -> PyResult<String> {
    serde_json::to_string(descriptor)
        .map_err(|e| Error::internal(format!("cannot encode a dataset descriptor: {e}")))
        .py()
}
