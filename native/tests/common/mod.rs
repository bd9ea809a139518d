//! The caches that the engine's tests (`tests/engine.rs`) and its benchmarks
//! (`benches/hot_paths.rs`) are written over, in one place. Both include this
//! file as a module (`#[path = "common/mod.rs"]`, `#[path =
//! "../tests/common/mod.rs"]`): a benchmark cannot link a test target, and a
//! crate feature for test support would be one more build for two files.
//! Cargo builds no test of its own from `tests/common/`.

// A fixture has no caller to report to: a failed write stops the test or the
// benchmark run with its message.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use dataset_rt_native::storage::{
    CacheWriter, ColumnSpec, EncodedRecord, MetaType, MetaValue, WriterOptions,
};

/// The stored columns of a labelled cache (`write_cache`): an integer
/// `label` and a string `split`.
pub fn label_split_columns() -> Vec<ColumnSpec> {
    vec![
        ColumnSpec {
            name: "label".into(),
            dtype: MetaType::Int64,
        },
        ColumnSpec {
            name: "split".into(),
            dtype: MetaType::String,
        },
    ]
}

/// Write cache `name` of `records` records under `base` with `options`;
/// record `i`'s payload is `payload(i)`. A `labelled` cache stores
/// `label_split_columns`: record `i`'s `label` is `i % 3` and its `split`
/// "train" when `i` is even, "val" when odd. Returns the cache's directory.
pub fn write_cache(
    base: &Path,
    name: &str,
    records: u64,
    options: WriterOptions,
    labelled: bool,
    payload: impl Fn(u64) -> Vec<u8>,
) -> PathBuf {
    let columns = if labelled {
        label_split_columns()
    } else {
        Vec::new()
    };
    let mut writer = CacheWriter::create(base, name, columns, options).expect("create the cache");
    for i in 0..records {
        let record = EncodedRecord::encode(payload(i), options.compression).expect("encode");
        let metadata = if labelled {
            vec![
                MetaValue::Int((i % 3) as i64),
                MetaValue::Str(if i % 2 == 0 { "train" } else { "val" }.into()),
            ]
        } else {
            Vec::new()
        };
        writer.append(&record, &metadata).expect("append");
    }
    writer.finish().expect("publish the cache").0
}
