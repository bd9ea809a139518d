//! `PopulationStore`: content-addressed populations on disk, shared by replicas.
//!
//! ```text
//! <state_dir>/<dataset>/populations/<id>.arrow   Arrow IPC stream of the table as supplied
//! <state_dir>/<dataset>/populations/<id>.rows    its records and alias table (rows.rs)
//! <state_dir>/<dataset>/active.json              {"population": id, "epoch_len": n}
//! <state_dir>/<dataset>/active.lock              locked while active.json changes
//! <state_dir>/<dataset>/runs/<run>.json           a run's newest generation (run/fence.rs)
//! ```
//! The id is the xxh3-128 of the table as one IPC record batch (32 hex
//! digits; `table_id.rs`), so a file is verified by hashing it (`verify`),
//! two writers of the same table write the same file, and every write is a
//! rename of a complete temporary file: concurrent puts of the same or
//! different tables never corrupt the store. Both files are written as the
//! table streams in (`writer.rs`) and mapped when read (`Population::open`); a
//! store written before rows files existed gets each one built the first time
//! its population is opened.
//!
//! Changes of the active pointer (and removals, which must not race with an
//! activation of the same population) happen under an exclusive lock on
//! `active.lock`, taken by every process that shares the store: they are
//! applied one at a time, each durable before the next begins, so the order on
//! disk is the order in which they were acknowledged.
//!
//! On object storage (`open_remote`) the directory is this replica's mirror:
//! populations are uploaded when kept and downloaded when first opened, and
//! the active pointer and the runs live in the bucket, changed by create-only
//! writes instead of under the lock (`remote.rs`).
//!
//! Temporary files (`.tmp-*`) are locked by their writer (`storage::temp`);
//! those left by writers that died are removed when the store is opened (by a
//! restarted replica, another replica or a DataLoader worker). Writes do not
//! scan `populations/`, which may hold thousands of files.

use std::fs::{self, File};

use crate::ids::PopulationId;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::PopulationRows;
use crate::hash::xxh3_128;
use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;

use crate::error::{Error, IoContext, Result};
use crate::progress::{self, Unit};
use crate::storage::publish::fsync_dir;
use crate::storage::temp::{remove_abandoned, LockedTemp};

const POPULATIONS: &str = "populations";
use super::remote::RemoteLog;
use super::scratch::TEMP_PREFIX;
use super::table_id::canonical;
use super::writer::{write_population, WrittenPopulation};
use super::Population;
use crate::remote::Bucket;
use crate::storage::CacheSet;

mod activation;
use activation::legacy_pointer;
pub use activation::ActivationLock;

pub struct PopulationStore {
    /// Where this process maps population files: the store's directory, or
    /// this replica's mirror of a bucket.
    dir: PathBuf,
    /// The store as objects: the same directory (`Bucket::local`), or the
    /// bucket prefix. Populations are published here, and the active
    /// pointer and the runs live here, by one protocol for both.
    shared: Bucket,
    log: RemoteLog,
    /// Whether `lock_activation` excludes every process that writes the
    /// store (its lock file is in the store, not in a mirror): removal needs
    /// it, so that no activation of a population being removed is under way.
    lock_is_shared: bool,
    /// Whether a population's first fetch or rows build draws a progress bar
    /// (`set_show_progress`).
    show_progress: AtomicBool,
}

impl PopulationStore {
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_at(dir, Bucket::local(dir)?, true)
    }

    /// A store on object storage under `bucket`, mirrored into `mirror`.
    pub fn open_remote(mirror: &Path, bucket: Bucket) -> Result<Self> {
        Self::open_at(mirror, bucket, false)
    }

    fn open_at(dir: &Path, shared: Bucket, lock_is_shared: bool) -> Result<Self> {
        let populations = dir.join(POPULATIONS);
        fs::create_dir_all(&populations).at("cannot create the population store", dir)?;
        remove_abandoned(dir, is_temp);
        remove_abandoned(&populations, is_temp);
        Self::assemble(dir, shared, lock_is_shared)
    }

    fn assemble(dir: &Path, shared: Bucket, lock_is_shared: bool) -> Result<Self> {
        Ok(PopulationStore {
            dir: dir.to_path_buf(),
            log: RemoteLog::new(shared.clone(), legacy_pointer(&shared)?),
            shared,
            lock_is_shared,
            show_progress: AtomicBool::new(false),
        })
    }

    /// Draw a progress bar on stderr (a terminal only, `crate::progress`)
    /// while `open_population` fetches a population from object storage or
    /// builds its rows file; off by default.
    pub fn set_show_progress(&self, show: bool) {
        self.show_progress.store(show, Ordering::Relaxed);
    }

    /// Where the store lives, for messages: its directory or its URL.
    pub fn location(&self) -> String {
        self.shared.url().to_string()
    }

    fn refuse_removal(&self) -> Result<()> {
        if self.lock_is_shared {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "populations on object storage ({}) are written once and never removed by \
             the server, which cannot exclude an activation of the same population \
             on another replica; leave keep_populations at 0 and expire old objects \
             under populations/ with a lifecycle rule of the bucket if you must",
            self.location()
        )))
    }

    /// Open a store that must already exist, creating and removing nothing
    /// (for readers such as the audit, which must never start a store where
    /// a wrong path points): `NotFound` unless `dir/populations/` is there.
    pub fn open_existing(dir: &Path) -> Result<Self> {
        let populations = dir.join(POPULATIONS);
        match fs::metadata(&populations) {
            Ok(meta) if meta.is_dir() => Self::assemble(dir, Bucket::local(dir)?, true),
            Ok(_) => Err(Error::corrupt_population(
                &populations,
                "not a directory; a population store keeps its populations in a directory",
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound(format!(
                "there is no population store at {}; a server or a LocalSource over \
                 the same caches creates it on its first start",
                dir.display()
            ))),
            Err(e) => Err(Error::io("cannot open the population store", dir, e)),
        }
    }

    fn shows_progress(&self) -> bool {
        self.show_progress.load(Ordering::Relaxed)
    }

    fn path_of(&self, id: &PopulationId) -> PathBuf {
        self.dir.join(POPULATIONS).join(format!("{id}.arrow"))
    }

    fn rows_path_of(&self, id: &PopulationId) -> PathBuf {
        self.dir.join(POPULATIONS).join(format!("{id}.rows"))
    }

    /// Where a population being written keeps its scratch files (keeping
    /// them is then a rename).
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.join(POPULATIONS)
    }

    /// Store a written population (if it is not stored yet) and return its id.
    pub fn keep(&self, written: WrittenPopulation) -> Result<PopulationId> {
        let id = written.id.clone();
        let table = self.path_of(&id);
        if table.exists() {
            // Stored again: as recent as a new one for `retain` (best effort).
            let _ = File::options()
                .write(true)
                .open(&table)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        written.keep_as(&table, &self.rows_path_of(&id))?;
        // Published where replicas share it: the rows first, as the table's
        // presence publishes both. A store in this directory has them now.
        if !self.shared.exists(&remote_table(&id))? {
            self.shared
                .upload(&self.rows_path_of(&id), &remote_rows(&id))?;
            self.shared.upload(&table, &remote_table(&id))?;
        }
        Ok(id)
    }

    /// Bring the population `id` from where replicas share it into this
    /// directory (rows, then the table), checked against its id before it
    /// is used. `NotFound` when the store does not hold it. Each object is
    /// looked up once: the table's `HEAD` (its presence publishes both) is
    /// asked first, the rows' by their download, whose size it reports.
    fn fetch(&self, id: &PopulationId, caches: &CacheSet) -> Result<()> {
        let Some(table_bytes) = self.shared.size(&remote_table(id))? else {
            return Err(self.not_found(id));
        };
        let label = format!("fetching population {}", short(id));
        let bar = progress::bar(self.shows_progress(), label, Some(table_bytes), Unit::Bytes);
        let (sized, count) = (|n| bar.inc_length(n), |n| bar.inc(n));
        let (rows, table) = (self.rows_path_of(id), self.path_of(id));
        self.shared
            .download_counted(&remote_rows(id), &rows, &sized, &count)?;
        self.shared
            .download_known(&remote_table(id), table_bytes, &table, &count)?;
        bar.finish_and_clear();
        if let Err(error) = self.check_table_hash(id, caches) {
            let _ = fs::remove_file(&table);
            let _ = fs::remove_file(&rows);
            return Err(error);
        }
        Ok(())
    }

    /// Map the population `id`. On object storage, a population this replica
    /// has not opened yet is fetched first. A store written before rows files
    /// existed has none: it is built once from the table (a full read,
    /// checked against the id), then kept. Both waits draw a progress bar
    /// after `set_show_progress(true)`.
    pub fn open_population(&self, id: &PopulationId, caches: &Arc<CacheSet>) -> Result<Population> {
        let table = self.path_of(id);
        if !table.exists() {
            self.fetch(id, caches)?;
        }
        let rows = self.rows_path_of(id);
        if !rows.exists() {
            // Each slice is checked as it is read: no separate pass over the table.
            let mapped = super::MappedTable::open(&table)?.unchecked();
            let label = format!("building the rows file of population {}", short(id));
            let total = Some(mapped.num_rows() as u64);
            let bar = progress::bar(self.shows_progress(), label, total, Unit::Rows);
            let slices = mapped.checked_slices().map(|slice| {
                let slice = slice.map_err(Error::from)?;
                bar.inc(slice.num_rows() as u64);
                Ok(slice)
            });
            let written = write_population(caches.clone(), &self.scratch_dir(), slices)?;
            bar.finish_and_clear();
            if written.id != *id {
                return Err(Error::corrupt_population(
                    &table,
                    format!("the content hashes to {}, not to its name", written.id),
                ));
            }
            written.keep_as(&table, &rows)?;
        }
        Population::open(&table, &rows, caches)
    }

    /// Check the population `id` in full: its table hashes to its id and its
    /// rows file matches its checksum.
    pub fn verify(&self, id: &PopulationId, caches: &CacheSet) -> Result<()> {
        self.check_table_hash(id, caches)?;
        let rows = self.rows_path_of(id);
        if rows.exists() {
            PopulationRows::verify(&rows)?;
        }
        Ok(())
    }

    /// Store `table` whole, without a rows file, as stores were written
    /// before populations streamed (tests of old stores; the id is the same).
    pub fn put_table(&self, table: &RecordBatch) -> Result<PopulationId> {
        let table = &canonical(table)?;
        let mut bytes = Vec::new();
        {
            let mut writer = StreamWriter::try_new(&mut bytes, &table.schema())?;
            writer.write(table)?;
            writer.finish()?;
        }
        let id = PopulationId::of_hash(xxh3_128(&bytes));
        let path = self.path_of(&id);
        if !path.exists() {
            self.write_atomically(&path, &bytes)?;
        } else {
            // Stored again: as recent as a new one for `retain` (best effort).
            let _ = File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        Ok(id)
    }

    /// Remove stored populations beyond the `keep` most recently stored (a
    /// population stored again counts from then), never `active`. Returns the
    /// ids removed, oldest first. The caller holds the activation lock, so no
    /// activation of a population being removed is under way.
    pub fn retain(
        &self,
        lock: &ActivationLock,
        keep: usize,
        active: &PopulationId,
    ) -> Result<Vec<PopulationId>> {
        self.refuse_removal()?;
        let mut stored: Vec<(std::time::SystemTime, PopulationId)> = self
            .list()?
            .into_iter()
            .filter(|id| id != active)
            .filter_map(|id| {
                let modified = fs::metadata(self.path_of(&id)).and_then(|m| m.modified());
                modified.ok().map(|time| (time, id))
            })
            .collect();
        // Newest first; the active one is kept on top of `keep` - 1 others.
        stored.sort_by(|a, b| b.cmp(a));
        let others = keep.saturating_sub(1);
        let mut removed: Vec<PopulationId> =
            stored.into_iter().skip(others).map(|(_, id)| id).collect();
        removed.reverse();
        for id in &removed {
            match self.remove(lock, id) {
                Ok(()) | Err(Error::NotFound(_)) => {} // another replica removed it first
                Err(error) => return Err(error),
            }
        }
        Ok(removed)
    }

    pub fn contains(&self, id: &PopulationId) -> bool {
        self.path_of(id).exists() || self.shared.exists(&remote_table(id)).unwrap_or(false)
    }

    /// The table stored under `id`, verified against its id, whole in memory
    /// (for tests and small tables: a population is read by mapping it).
    pub fn load(&self, id: &PopulationId, caches: &CacheSet) -> Result<RecordBatch> {
        let mut table = self.check_table_hash(id, caches)?;
        if !table.left_out().is_empty() {
            let rows = PopulationRows::open(&self.rows_path_of(id), caches)?;
            table.set_keys(rows.keys(caches.cache_ids().into()))?;
        }
        table.checked()?.concat()
    }

    /// The table file of `id` (with its rows file's keys, if it leaves its
    /// identities out), hashed (read in order, not into memory) and found
    /// equal to its name.
    fn check_table_hash(&self, id: &PopulationId, caches: &CacheSet) -> Result<super::MappedTable> {
        let path = self.path_of(id);
        if !path.exists() {
            return Err(self.not_found(id));
        }
        let table = super::MappedTable::open(&path)?;
        let keys = match table.left_out() {
            [] => None,
            _ => Some(PopulationRows::keys_file(&self.rows_path_of(id), caches)?),
        };
        let computed = super::table_id(&table, keys.as_ref())?;
        if computed != *id {
            return Err(Error::corrupt_population(
                &path,
                format!("the content hashes to {computed}, not to its name"),
            ));
        }
        Ok(table)
    }

    /// Delete the population `id`. The caller checked that it is not active
    /// and holds the activation lock, so that no activation of it is under way.
    pub fn remove(&self, _lock: &ActivationLock, id: &PopulationId) -> Result<()> {
        self.refuse_removal()?;
        let path = self.path_of(id);
        match fs::remove_file(&path) {
            Ok(()) => {
                let _ = fs::remove_file(self.rows_path_of(id));
                fsync_dir(&self.dir.join(POPULATIONS))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(self.not_found(id)),
            Err(e) => Err(Error::io("cannot remove", &path, e)),
        }
    }

    fn not_found(&self, id: &PopulationId) -> Error {
        Error::NotFound(format!(
            "population {id} is not in the store {}; list the stored populations \
             with the 'list_populations' action",
            self.location()
        ))
    }

    /// Stored population ids, sorted.
    pub fn list(&self) -> Result<Vec<PopulationId>> {
        let mut ids: Vec<PopulationId> = self
            .shared
            .list(POPULATIONS, None)?
            .iter()
            .filter_map(|name| {
                let id = name.strip_prefix("populations/")?.strip_suffix(".arrow")?;
                PopulationId::parse(id).ok()
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let parent = path.parent().unwrap_or(&self.dir);
        let temp = LockedTemp::create_file(parent, TEMP_PREFIX)?;
        let mut file = temp.file();
        let written = file
            .write_all(bytes)
            .at("cannot write", temp.path())
            .and_then(|()| file.sync_all().at("cannot fsync", temp.path()))
            .and_then(|()| fs::rename(temp.path(), path).at("cannot rename into place", path));
        if written.is_err() {
            // At once, while it is still locked: a full volume must get back
            // the space a failed write took, not wait for the next start.
            let _ = fs::remove_file(temp.path());
        }
        written.map_err(|e| e.naming_target(temp.path(), path))?;
        fsync_dir(parent)
    }
}

/// A population's id as a progress bar names it: its first 12 hex digits.
fn short(id: &PopulationId) -> &str {
    id.as_str().get(..12).unwrap_or(id.as_str())
}

fn remote_table(id: &PopulationId) -> String {
    format!("{POPULATIONS}/{id}.arrow")
}

fn remote_rows(id: &PopulationId) -> String {
    format!("{POPULATIONS}/{id}.rows")
}

fn is_temp(file_name: &str) -> bool {
    file_name.starts_with(TEMP_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::activation::{ACTIVATION_LOCK, ACTIVE};
    use super::*;
    use crate::population::ActivePopulation;
    use arrow_array::{Float64Array, UInt64Array};
    use arrow_schema::{DataType, Field, Schema};

    /// A cache of one record, for reading tables that need none of it.
    fn caches(dir: &tempfile::TempDir) -> CacheSet {
        let base = dir.path().join("caches");
        if let Ok(set) = CacheSet::open(&[base.join("c")], false) {
            return set;
        }
        let mut writer =
            crate::storage::CacheWriter::create(&base, "c", vec![], Default::default()).unwrap();
        let record = crate::storage::EncodedRecord::encode(vec![1], Default::default()).unwrap();
        writer.append(&record, &[]).unwrap();
        CacheSet::open(&[writer.finish().unwrap().0], false).unwrap()
    }

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
        let a = store.put_table(&table(1.0)).unwrap();
        assert_eq!(a, store.put_table(&table(1.0)).unwrap());
        let b = store.put_table(&table(2.0)).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            store.load(&a, &caches(&dir)).unwrap(),
            canonical(&table(1.0)).unwrap()
        );
        assert_eq!(store.list().unwrap().len(), 2);
        assert!(matches!(
            store.load(&PopulationId::of_hash(0), &caches(&dir)),
            Err(Error::NotFound(_))
        ));
        let path = store.path_of(&a);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(matches!(
            store.load(&a, &caches(&dir)),
            Err(Error::CorruptCache { .. })
        ));
    }

    #[test]
    fn active_pointer_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        assert_eq!(store.active().unwrap(), None);
        let lock = store.lock_activation().unwrap();
        let missing = ActivePopulation {
            population: PopulationId::of_hash(0xa),
            epoch_len: 7,
        };
        assert!(matches!(
            store.set_active(&lock, &missing),
            Err(Error::NotFound(_))
        ));
        let active = ActivePopulation {
            population: store.put_table(&table(1.0)).unwrap(),
            epoch_len: 7,
        };
        store.set_active(&lock, &active).unwrap();
        assert_eq!(store.active().unwrap(), Some(active.clone()));
        let again = PopulationStore::open(dir.path()).unwrap();
        assert_eq!(again.active().unwrap(), Some(active));
    }

    #[test]
    fn a_damaged_population_file_says_how_to_mend_a_population_not_a_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let id = store.put_table(&table(1.0)).unwrap();
        let path = store.path_of(&id);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 20;
        bytes[last] ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let message = store
            .verify(&id, &caches(&dir))
            .expect_err("damaged")
            .to_string();
        assert!(message.starts_with("corrupt population file"), "{message}");
        assert!(message.contains("put its table again"), "{message}");
        assert!(!message.contains("delete the cache directory"), "{message}");
    }

    #[test]
    fn a_pointer_from_before_the_log_is_read_and_the_log_continues_it() {
        let dir = tempfile::tempdir().unwrap();
        let id = PopulationStore::open(dir.path())
            .unwrap()
            .put_table(&table(1.0))
            .unwrap();
        let old = format!(r#"{{"population": "{id}", "epoch_len": 5}}"#);
        fs::write(dir.path().join(ACTIVE), old).unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let active = store.active().unwrap().unwrap();
        assert_eq!(
            (active.population.as_str(), active.epoch_len),
            (id.as_str(), 5)
        );
        let lock = store.lock_activation().unwrap();
        store
            .update_active(&lock, |current| {
                let mut next = current.cloned().unwrap();
                next.epoch_len = 6;
                Ok(Some(next))
            })
            .unwrap();
        let reopened = PopulationStore::open(dir.path()).unwrap();
        assert_eq!(reopened.active().unwrap().unwrap().epoch_len, 6);
        assert!(dir.path().join("active/00000000000000000001.json").exists());
        // A damaged old pointer is ignored (with a warning), not fatal.
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(ACTIVE), b"{garbage").unwrap();
        assert_eq!(
            PopulationStore::open(other.path())
                .unwrap()
                .active()
                .unwrap(),
            None
        );
    }

    #[test]
    fn removal_deletes_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let id = store.put_table(&table(1.0)).unwrap();
        let lock = store.lock_activation().unwrap();
        store.remove(&lock, &id).unwrap();
        assert!(!store.contains(&id) && store.list().unwrap().is_empty());
        assert!(matches!(store.remove(&lock, &id), Err(Error::NotFound(_))));
        assert!(matches!(
            store.load(&id, &caches(&dir)),
            Err(Error::NotFound(_))
        ));
    }

    #[test]
    fn abandoned_temporary_files_are_removed_and_held_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let populations = dir.path().join(POPULATIONS);
        fs::create_dir_all(&populations).unwrap();
        // Left by writers killed mid-write (their locks went with them).
        for leftover in [dir.path(), populations.as_path()] {
            fs::write(leftover.join(".tmp-1-0-0"), b"half a table").unwrap();
        }
        // A live writer's temporary file, locked as `write_atomically` does.
        let live = LockedTemp::create_file(&populations, TEMP_PREFIX).unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let temps = |d: &Path| {
            fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|e| is_temp(&e.file_name().to_string_lossy()))
                .count()
        };
        assert_eq!((temps(dir.path()), temps(&populations)), (0, 1));
        assert!(live.path().exists());
        drop(live);
        store.put_table(&table(3.0)).unwrap();
        assert_eq!(temps(&populations), 1, "writes do not scan the store");
        PopulationStore::open(dir.path()).unwrap();
        assert_eq!(temps(&populations), 0);
    }

    #[test]
    fn open_existing_creates_and_removes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere");
        assert!(matches!(
            PopulationStore::open_existing(&missing),
            Err(Error::NotFound(_))
        ));
        assert!(!missing.exists());
        let id = PopulationStore::open(dir.path())
            .unwrap()
            .put_table(&table(1.0))
            .unwrap();
        let leftover = dir.path().join(".tmp-1-0-0");
        fs::write(&leftover, b"half a table").unwrap();
        let store = PopulationStore::open_existing(dir.path()).unwrap();
        assert!(leftover.exists(), "a read-only opening removes nothing");
        assert_eq!(
            store.load(&id, &caches(&dir)).unwrap(),
            canonical(&table(1.0)).unwrap()
        );
        assert_eq!(store.active().unwrap(), None);
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        fs::create_dir(dir.path().join("plain")).unwrap();
        assert!(matches!(
            PopulationStore::open_existing(&dir.path().join("plain")),
            Err(Error::NotFound(_))
        ));
        assert!(PopulationStore::open_existing(&file).is_err());
        assert!(!dir.path().join("plain").join(POPULATIONS).exists());
    }

    #[test]
    fn retain_keeps_the_newest_and_never_the_active_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let ids: Vec<PopulationId> = (1..=5)
            .map(|w| {
                let id = store.put_table(&table(w as f64)).unwrap();
                // Distinct times even on a file system with coarse ones.
                let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(w);
                File::options()
                    .write(true)
                    .open(store.path_of(&id))
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
                id
            })
            .collect();
        let lock = store.lock_activation().unwrap();
        // The oldest is active: kept, with the newest other one (keep = 2).
        let removed = store.retain(&lock, 2, &ids[0]).unwrap();
        assert_eq!(removed, ids[1..4].to_vec());
        let mut left = vec![ids[0].clone(), ids[4].clone()];
        left.sort();
        assert_eq!(store.list().unwrap(), left);
        // keep = 1: only the active one.
        assert_eq!(
            store.retain(&lock, 1, &ids[0]).unwrap(),
            vec![ids[4].clone()]
        );
        assert_eq!(store.list().unwrap(), vec![ids[0].clone()]);
        // Storing a table again makes it recent.
        assert_eq!(
            store.retain(&lock, 5, &ids[0]).unwrap(),
            Vec::<PopulationId>::new()
        );
    }

    /// A population kept by one replica in a bucket held in memory, whose
    /// reads are counted; returns its id.
    fn kept_in_memory(dir: &tempfile::TempDir, bucket: &Bucket) -> PopulationId {
        let caches = Arc::new(caches(dir));
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::UInt64, false),
            Field::new("sample_id", DataType::UInt64, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt64Array::from(vec![caches.get(0).cache_id(); 2])),
                Arc::new(UInt64Array::from(vec![0, 0])),
                Arc::new(Float64Array::from(vec![2.0, 1.0])),
            ],
        )
        .unwrap();
        let writer = PopulationStore::open_remote(&dir.path().join("a"), bucket.clone()).unwrap();
        let written = write_population(caches, &writer.scratch_dir(), [Ok(batch)]).unwrap();
        writer.keep(written).unwrap()
    }

    #[test]
    fn a_replica_fetches_a_population_with_one_head_per_object() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::remote::counting::Counting::new(Arc::new(object_store::memory::InMemory::new()));
        let bucket = Bucket::from_store(store.clone(), "memory://test");
        let id = kept_in_memory(&dir, &bucket);
        let caches = Arc::new(caches(&dir));
        let mirror = dir.path().join("b");
        let reader = PopulationStore::open_remote(&mirror, bucket.clone()).unwrap();
        store.reset();
        let population = reader.open_population(&id, &caches).unwrap();
        assert_eq!(population.num_rows(), 2);
        // Rows and table: a `HEAD` each (the size, to ask for its ranges),
        // then one ranged `GET` each (both are smaller than a range); before,
        // the sizes were asked for twice.
        assert_eq!(store.reads(), (2, 2));

        // A population the store does not hold: the same `NotFound` as
        // before, with no `GET`, and nothing left in the mirror.
        store.reset();
        let missing = PopulationId::of_hash(7);
        let message = match reader.open_population(&missing, &caches) {
            Err(Error::NotFound(message)) => message,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(
            message.contains("is not in the store memory://test"),
            "{message}"
        );
        assert_eq!(store.reads(), (1, 0), "the table's HEAD");
        // Rows uploaded by a put that has not published its table yet.
        bucket
            .put(&remote_rows(&missing), b"rows, no table".to_vec())
            .unwrap();
        let message = reader.open_population(&missing, &caches).err().unwrap();
        assert!(
            message.to_string().contains("is not in the store"),
            "{message}"
        );
        assert!(!reader.rows_path_of(&missing).exists());
        // A table whose rows are gone: the rows are named.
        bucket.delete(&remote_rows(&id)).unwrap();
        let other = PopulationStore::open_remote(&dir.path().join("c"), bucket).unwrap();
        match other.open_population(&id, &caches) {
            Err(Error::NotFound(message)) => {
                assert!(
                    message.ends_with(&format!("{}.rows does not exist", id)),
                    "{message}"
                )
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn the_activation_lock_is_exclusive_across_handles() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopulationStore::open(dir.path()).unwrap();
        let held = store.lock_activation().unwrap();
        let other = File::open(dir.path().join(ACTIVATION_LOCK)).unwrap();
        assert!(other.try_lock().is_err());
        drop(held);
        assert!(other.try_lock().is_ok());
    }
}
