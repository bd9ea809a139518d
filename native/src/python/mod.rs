//! PyO3 bindings: the only module that knows about Python. Each function
//! converts arguments, releases the GIL around engine work, and maps errors
//! through `errors::to_pyerr`.

mod args;
mod arrow;
mod batch_stream;
mod cache;
mod config;
mod dataset;
mod errors;
mod ingest;
mod json;
mod partition;
mod parts;
mod request;
mod run_action;
mod run_options;
mod run_state;
mod service;
mod writer;

use std::sync::Arc;

use pyo3::prelude::*;

use crate::storage::FORMAT_VERSION;
use crate::stream::WorkerPool;
use errors::IntoPyResult;

/// A fixed pool of worker threads shared by everything created from it.
#[pyclass(frozen, module = "dataset_rt._native")]
pub struct Runtime {
    pool: Arc<WorkerPool>,
}

#[pymethods]
impl Runtime {
    #[new]
    fn new(num_workers: &Bound<'_, PyAny>) -> PyResult<Self> {
        let size = args::num_workers(num_workers)?;
        Ok(Runtime {
            pool: Arc::new(WorkerPool::new(size).py()?),
        })
    }

    #[getter]
    fn num_workers(&self) -> usize {
        self.pool.size()
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", FORMAT_VERSION)?;
    m.add("BASE_COLUMNS", crate::stream::BASE_COLUMNS.to_vec())?;
    m.add("MAX_MESSAGE_BYTES", crate::request::MAX_MESSAGE_BYTES)?;
    m.add("CachedSample", dataset::sample_type(m.py())?)?;
    m.add_class::<Runtime>()?;
    m.add_class::<run_action::RunAction>()?;
    m.add_class::<dataset::Dataset>()?;
    m.add_class::<batch_stream::BatchStream>()?;
    m.add_class::<batch_stream::StreamProgress>()?;
    m.add_class::<dataset::SampleIterator>()?;
    m.add_class::<arrow::ArrowTable>()?;
    m.add_class::<service::DatasetService>()?;
    m.add_class::<service::ActivePopulation>()?;
    m.add_class::<service::ServiceStats>()?;
    m.add_class::<request::StreamRequest>()?;
    m.add_class::<request::MetadataRequest>()?;
    m.add_class::<partition::Partition>()?;
    m.add_class::<run_options::RunOptions>()?;
    m.add_class::<run_state::RunState>()?;
    m.add_class::<run_state::RunSpan>()?;
    m.add("STATE_VERSION", crate::run::STATE_VERSION)?;
    m.add_class::<config::ReaderOptions>()?;
    m.add_class::<config::WriteOptions>()?;
    m.add_class::<config::CompressionOptions>()?;
    m.add_class::<cache::VerifyReport>()?;
    m.add_class::<cache::UploadReport>()?;
    m.add_class::<cache::CacheInfo>()?;
    m.add_class::<cache::ShardInfo>()?;
    m.add_function(wrap_pyfunction!(request::parse_ticket, m)?)?;
    m.add_function(wrap_pyfunction!(service::check_name, m)?)?;
    m.add_function(wrap_pyfunction!(run_action::parse_run_action, m)?)?;
    m.add_function(wrap_pyfunction!(service::local_path, m)?)?;
    m.add_function(wrap_pyfunction!(service::state_local_dir, m)?)?;
    m.add_function(wrap_pyfunction!(writer::write_cache, m)?)?;
    m.add_function(wrap_pyfunction!(ingest::write_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(writer::validate_source_name_py, m)?)?;
    m.add_function(wrap_pyfunction!(writer::check_source_names_py, m)?)?;
    m.add_class::<writer::WriteProfiler>()?;
    m.add_function(wrap_pyfunction!(cache::check_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cache::verify_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cache::upload_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cache::set_mirror_budget, m)?)?;
    m.add_function(wrap_pyfunction!(cache::object_store_reads, m)?)?;
    m.add_function(wrap_pyfunction!(cache::object_store_slow_downs, m)?)?;
    m.add_function(wrap_pyfunction!(cache::inspect_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cache::describe_manifest, m)?)?;
    m.add_class::<parts::PartTarget>()?;
    m.add_function(wrap_pyfunction!(parts::absolute_location, m)?)?;
    m.add_function(wrap_pyfunction!(parts::commit_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(parts::read_descriptor, m)?)?;
    m.add_function(wrap_pyfunction!(parts::remove_uncommitted, m)?)?;
    errors::register(m)?;
    Ok(())
}
