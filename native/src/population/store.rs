//! `PopulationStore`: content-addressed populations on disk, shared by replicas.
//!
//! ```text
//! <state_dir>/<dataset>/populations/<id>.arrow   Arrow IPC stream of the table as supplied
//! <state_dir>/<dataset>/active.json              {"population": id, "epoch_len": n}
//! ```
//! The id is the xxh3-128 of the file's bytes (32 hex digits), so a file is
//! verified by hashing it, two writers of the same table write the same file,
//! and every write is a rename of a complete temporary file: concurrent puts of
//! the same or different tables never corrupt the store.

use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_128;

use crate::error::{Error, IoContext, Result};
use crate::storage::publish::{fsync_dir, fsync_file};

const POPULATIONS: &str = "populations";
const ACTIVE: &str = "active.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivePopulation {
    pub population: String,
    pub epoch_len: u64,
}

/// The representation a population is stored and named in, so that the same
/// logical table gets the same id whichever client encoded it: every string
/// column (view, large or dictionary-encoded) as plain Utf8, every field
/// nullable, no schema metadata.
pub fn canonical(table: &RecordBatch) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(table.num_columns());
    let mut columns = Vec::with_capacity(table.num_columns());
    for (field, column) in table.schema().fields().iter().zip(table.columns()) {
        let is_string =
            |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        let target = match field.data_type() {
            DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
            DataType::Dictionary(_, value) if is_string(value) => DataType::Utf8,
            other => other.clone(),
        };
        let column = if &target == column.data_type() {
            column.clone()
        } else {
            arrow_cast::cast(column, &target)?
        };
        fields.push(Field::new(field.name(), target, true));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

pub struct PopulationStore {
    dir: PathBuf,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A random number fixed for the life of this process (std's hasher keys are
/// drawn from the OS's random source).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(std::process::id() as u64);
        hasher.finish()
    })
}

/// A population id: 32 lowercase hex digits.
pub fn check_population_id(id: &str) -> Result<()> {
    if id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "population id {id:?} is malformed; a population id is 32 lowercase hex digits"
        )))
    }
}

impl PopulationStore {
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir.join(POPULATIONS)).at("cannot create the population store", dir)?;
        Ok(PopulationStore {
            dir: dir.to_path_buf(),
        })
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(POPULATIONS).join(format!("{id}.arrow"))
    }

    /// Store `table` (if it is not stored yet) and return its id. The table
    /// should be `canonical` already (it is made so again here).
    pub fn put(&self, table: &RecordBatch) -> Result<String> {
        let table = &canonical(table)?;
        let mut bytes = Vec::new();
        {
            let mut writer = StreamWriter::try_new(&mut bytes, &table.schema())?;
            writer.write(table)?;
            writer.finish()?;
        }
        let id = format!("{:032x}", xxh3_128(&bytes));
        let path = self.path_of(&id);
        if !path.exists() {
            self.write_atomically(&path, &bytes)?;
        }
        Ok(id)
    }

    /// The table stored under `id`, verified against its id.
    pub fn load(&self, id: &str) -> Result<RecordBatch> {
        check_population_id(id)?;
        let path = self.path_of(id);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!(
                    "population {id} is not in the store {}; list the stored populations \
                     with the 'list_populations' action",
                    self.dir.display()
                )))
            }
            Err(e) => return Err(Error::io("cannot read", &path, e)),
        };
        let computed = format!("{:032x}", xxh3_128(&bytes));
        if computed != id {
            return Err(Error::corrupt(
                &path,
                format!("the content hashes to {computed}, not to its name"),
            ));
        }
        let reader = StreamReader::try_new(Cursor::new(bytes), None)
            .map_err(|e| Error::corrupt(&path, format!("not an Arrow IPC stream: {e}")))?;
        let schema = reader.schema();
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::corrupt(&path, format!("not an Arrow IPC stream: {e}")))?;
        Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
    }

    /// Stored population ids, sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let dir = self.dir.join(POPULATIONS);
        let mut ids: Vec<String> = fs::read_dir(&dir)
            .at("cannot list", &dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".arrow")?.to_string();
                check_population_id(&id).ok().map(|_| id)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    pub fn active(&self) -> Result<Option<ActivePopulation>> {
        let path = self.dir.join(ACTIVE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::corrupt(&path, format!("not a valid active pointer: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("cannot read", &path, e)),
        }
    }

    pub fn set_active(&self, active: &ActivePopulation) -> Result<()> {
        check_population_id(&active.population)?;
        let bytes = serde_json::to_vec_pretty(active)
            .map_err(|e| Error::internal(format!("cannot encode the active pointer: {e}")))?;
        self.write_atomically(&self.dir.join(ACTIVE), &bytes)
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let parent = path.parent().unwrap_or(&self.dir);
        // Replicas in containers all run as pid 1, so the name also carries a
        // per-process random part: writers never share a temporary file.
        let temp = parent.join(format!(
            ".tmp-{}-{:016x}-{}",
            std::process::id(),
            process_nonce(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(&temp, bytes).at("cannot write", &temp)?;
        fsync_file(&temp)?;
        fs::rename(&temp, path).at("cannot rename into place", path)?;
        fsync_dir(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, UInt64Array};

    fn table(weight: f64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("sample_id", DataType::UInt64, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt64Array::from(vec![1, 2])),
                Arc::new(Float64Array::from(vec![weight, 1.0])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn content_addressed_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let a = store.put(&table(1.0)).unwrap();
        assert_eq!(a, store.put(&table(1.0)).unwrap());
        let b = store.put(&table(2.0)).unwrap();
        assert_ne!(a, b);
        assert_eq!(store.load(&a).unwrap(), canonical(&table(1.0)).unwrap());
        assert_eq!(store.list().unwrap().len(), 2);
        assert!(matches!(
            store.load(&"0".repeat(32)),
            Err(Error::NotFound(_))
        ));
        assert!(store.load("../etc").is_err());
        let path = store.path_of(&a);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(matches!(store.load(&a), Err(Error::CorruptCache { .. })));
    }

    #[test]
    fn active_pointer_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        assert_eq!(store.active().unwrap(), None);
        let active = ActivePopulation {
            population: "a".repeat(32),
            epoch_len: 7,
        };
        store.set_active(&active).unwrap();
        assert_eq!(store.active().unwrap(), Some(active));
    }
}
