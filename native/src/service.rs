//! `DatasetService`: one dataset as the Flight server serves it.
//!
//! Everything a ticket names is resolved here: the pinned population (loaded
//! from the content-addressed store and validated against the caches), the
//! epoch window, the rank partition and the resume offset. Replicas share the
//! store directory, so any replica resolves any ticket to the same stream.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::ids::PopulationId;
use crate::population::{
    write_population, ActivationLock, ActivePopulation, Population, PopulationStore,
};
use crate::remote::Bucket;
use crate::request::StreamRequest;
use crate::run::fence::{Claim, Fence};
use crate::run::RunId;
use crate::sampling::StreamOrder;
use crate::storage::publish::validate_name;
use crate::storage::{CacheSet, LiveCaches};
use crate::stream::served::{Grouping, Served, ServedLedger};
use crate::stream::{BatchContext, EpochStream, StreamOptions, WorkerPool, BASE_COLUMNS};

/// Where a dataset's population store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateLocation {
    /// A directory (shared by replicas on one file system); caches on object
    /// storage are read through `mirror` (default `<dir>/cache-mirror`).
    Dir {
        dir: PathBuf,
        mirror: Option<PathBuf>,
    },
    /// Object storage at `url` (`s3://bucket/prefix`), mirrored into `mirror`.
    Bucket { url: String, mirror: PathBuf },
}

/// Populations kept in memory (each also lives in the store).
const LOADED_POPULATIONS: usize = 8;

/// Recently used populations by id, with their use order (oldest first).
type LoadedPopulations = (
    HashMap<PopulationId, Arc<Population>>,
    VecDeque<PopulationId>,
);

pub struct DatasetService {
    name: String,
    /// The caches, checked against their files on every request.
    caches: LiveCaches,
    store: PopulationStore,
    loaded: Mutex<LoadedPopulations>,
    /// What the streams served, per population (`stream::served`).
    served: Arc<ServedLedger>,
    streams: AtomicU64,
    /// Stored populations kept after each put (0: all), see `set_keep_populations`.
    keep_populations: AtomicUsize,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceStats {
    pub streams: u64,
    pub rows: u64,
    pub bytes: u64,
    /// Activation-log entries skipped as damaged or hostile.
    pub skipped_log_entries: u64,
}

impl DatasetService {
    /// Open the caches and the population store; the first start stores the
    /// caches' full table and makes it active. `name` must be a plain
    /// directory name (`validate_name`): it becomes `state_dir/name`.
    pub fn open(name: &str, paths: &[PathBuf], state_dir: &Path, verify: bool) -> Result<Self> {
        Self::open_at(
            name,
            paths,
            &StateLocation::Dir {
                dir: state_dir.to_path_buf(),
                mirror: None,
            },
            verify,
        )
    }

    /// `open` with the population store at `state`: a directory, or object
    /// storage mirrored into a local directory.
    pub fn open_at(
        name: &str,
        paths: &[PathBuf],
        state: &StateLocation,
        verify: bool,
    ) -> Result<Self> {
        validate_name("dataset", name)?;
        // Caches on object storage are read through a directory of this replica's.
        let mirror = match state {
            StateLocation::Dir { dir, mirror } => {
                mirror.clone().unwrap_or_else(|| dir.join("cache-mirror"))
            }
            StateLocation::Bucket { mirror, .. } => mirror.join("caches"),
        };
        let caches = LiveCaches::open(paths, verify, Some(&mirror))?;
        let service = match state {
            StateLocation::Dir { dir, .. } => {
                Self::assemble(name, caches, dir, PopulationStore::open)?
            }
            StateLocation::Bucket { url, mirror } => {
                let bucket = Bucket::open(url)?;
                Self::assemble(name, caches, mirror, |dir| {
                    let relative = dir.strip_prefix(mirror).unwrap_or(dir);
                    let prefix = relative.to_string_lossy().replace('\\', "/");
                    PopulationStore::open_remote(dir, bucket.child(&prefix))
                })?
            }
        };
        if service.store.active()?.is_none() {
            let caches = service.caches();
            let written = Population::write_full(&caches, &service.store.scratch_dir())?;
            let rows = written.rows;
            let lock = service.store.lock_activation()?;
            let id = service.store.keep(written)?;
            // Another process or replica sharing the store may have activated
            // a population since we looked: only a store without one gets this.
            service.store.update_active(&lock, |current| {
                Ok(current.is_none().then(|| ActivePopulation {
                    population: id.clone(),
                    epoch_len: rows,
                }))
            })?;
        }
        Ok(service)
    }

    /// Open a dataset whose population store exists and has an active
    /// population, creating, locking and removing nothing (the audit: a wrong
    /// name or state dir must not start a store, nor touch a live server's).
    /// Anything missing is `NotFound`, naming the dataset, the state dir and
    /// what to give instead.
    pub fn open_existing(
        name: &str,
        paths: &[PathBuf],
        state_dir: &Path,
        verify: bool,
    ) -> Result<Self> {
        validate_name("dataset", name)?;
        if !state_dir.is_dir() {
            return Err(Error::NotFound(format!(
                "the state dir {} does not exist or is not a directory; give the \
                 --state-dir of the server (or LocalSource) that stored the populations \
                 of dataset '{name}'",
                state_dir.display()
            )));
        }
        if !state_dir.join(name).is_dir() {
            let mut known: Vec<String> = std::fs::read_dir(state_dir)
                .map(|entries| {
                    entries
                        .flatten()
                        .filter(|e| e.path().is_dir())
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| validate_name("dataset", n).is_ok())
                        .collect()
                })
                .unwrap_or_default();
            known.sort();
            known.truncate(20);
            return Err(Error::NotFound(format!(
                "dataset '{name}' has no population store in the state dir {} (it holds \
                 {known:?}); name a dataset stored there, or give the state dir that holds \
                 '{name}'",
                state_dir.display()
            )));
        }
        let caches = LiveCaches::open(paths, verify, None)?;
        let service = Self::assemble(name, caches, state_dir, |dir| {
            PopulationStore::open_existing(dir).map_err(|e| match e {
                Error::NotFound(_) => Error::NotFound(format!(
                    "dataset '{name}' in the state dir {} has no population store for these \
                     caches (expected {}): its populations belong to other caches (a store \
                     belongs to one set of caches, in the server's order); give the caches \
                     the server serves, in its order",
                    state_dir.display(),
                    dir.display()
                )),
                other => other,
            })
        })?;
        if service.store.active()?.is_none() {
            return Err(Error::NotFound(format!(
                "dataset '{name}' has no active population in the state dir {}; start a \
                 server (or a LocalSource) over its caches with this state dir once",
                state_dir.display()
            )));
        }
        Ok(service)
    }

    /// The service over `caches` with the store `open_store` opens at its
    /// place: populations name (cache_id, sample_id) pairs, so the store
    /// belongs to one set of caches (rebuilt caches get a fresh store).
    fn assemble(
        name: &str,
        caches: LiveCaches,
        state_dir: &Path,
        open_store: impl FnOnce(&Path) -> Result<PopulationStore>,
    ) -> Result<Self> {
        let mut key = crate::hash::Xxh3::new();
        for cache in caches.opened().caches() {
            key.update(&cache.cache_id().to_le_bytes());
        }
        let store_dir = state_dir
            .join(name)
            .join(format!("caches-{:016x}", key.digest()));
        Ok(DatasetService {
            name: name.to_string(),
            caches,
            store: open_store(&store_dir)?,
            loaded: Mutex::new((HashMap::new(), VecDeque::new())),
            served: Arc::default(),
            streams: AtomicU64::new(0),
            keep_populations: AtomicUsize::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The caches as opened (or last reopened): for identities and validation;
    /// streams read from `LiveCaches::current`.
    pub fn caches(&self) -> Arc<CacheSet> {
        self.caches.opened()
    }

    /// Why this dataset cannot be served now (a cache file cut, replaced by a
    /// damaged one or deleted under the server), or None: for readiness.
    pub fn problem(&self) -> Option<String> {
        if let Some(problem) = self.caches.problem() {
            return Some(problem);
        }
        // The populations in use: a rows file that changed since it was last
        // seen (written over, or put back) is verified again in the
        // background, its old verdict forgotten; a damaged one is named.
        let loaded: Vec<Arc<Population>> = self.lock().ok()?.0.values().cloned().collect();
        for population in loaded {
            population.recheck();
            if let Some(error) = population.damage() {
                return Some(error.to_string());
            }
        }
        None
    }

    /// The active population and epoch length (read from the shared store, so
    /// a change made through another replica is seen here).
    pub fn active(&self) -> Result<ActivePopulation> {
        self.store.active()?.ok_or_else(|| self.no_active())
    }

    fn no_active(&self) -> Error {
        Error::NotFound(format!("dataset '{}' has no active population", self.name))
    }

    pub fn populations(&self) -> Result<Vec<PopulationId>> {
        self.store.list()
    }

    /// The population `id`, loaded from the store and validated on first use.
    pub fn population(&self, id: &PopulationId) -> Result<Arc<Population>> {
        let loaded = self.lock()?.0.get(id).cloned();
        if let Some(found) = loaded {
            // Another replica may have removed it: the store decides (one
            // stat); a file cut under its mapping is opened again (or
            // refused). A page found damaged stays found (each batch that
            // reads it fails) until the file changes again (`recheck`).
            if self.store.contains(id) && !found.cut() {
                return Ok(found);
            }
            self.forget(id)?;
        }
        let population = Arc::new(self.store.open_population(id, &self.caches())?);
        self.remember(id, population.clone())?;
        Ok(population)
    }

    /// Validate, store and (optionally) activate a table, streamed batch by
    /// batch. Returns the id and the row count. An activation is durable when
    /// this returns, and activations take effect in the order they return
    /// (see `PopulationStore`).
    pub fn put(
        &self,
        batches: impl IntoIterator<Item = Result<RecordBatch>>,
        activate: bool,
    ) -> Result<(PopulationId, u64)> {
        let (id, rows, _) = self.put_holding_activation(batches, activate)?;
        Ok((id, rows))
    }

    /// `put`, also returning the activation lock when it activated: until it is
    /// dropped no other activation can take effect, so a caller that reports
    /// the activation before dropping it reports activations in the order they
    /// took effect (the Python binding drops it once it holds the GIL again).
    pub fn put_holding_activation(
        &self,
        batches: impl IntoIterator<Item = Result<RecordBatch>>,
        activate: bool,
    ) -> Result<(PopulationId, u64, Option<ActivationLock>)> {
        // Validated and written without the lock: only the renames and the
        // pointer wait for other activations.
        let written = write_population(self.caches(), &self.store.scratch_dir(), batches)?;
        let rows = written.rows;
        // Stored under the lock when activating, so that a removal of the same
        // population cannot come between storing and activating it.
        let lock = activate.then(|| self.store.lock_activation()).transpose()?;
        let id = self.store.keep(written)?;
        let population = Arc::new(self.store.open_population(&id, &self.caches())?);
        self.remember(&id, population)?;
        if let Some(lock) = &lock {
            self.store.set_active(
                lock,
                &ActivePopulation {
                    population: id.clone(),
                    epoch_len: rows,
                },
            )?;
        }
        self.retain(lock.as_ref())?;
        // A put passes many batches of a few MiB through gRPC, pyarrow and the
        // validation; glibc kept what they freed, and a server's anonymous
        // memory stayed a few hundred MiB above its start after a 10^7-row
        // put (`bench_scale.py`).
        crate::os::files::release_freed_memory();
        Ok((id, rows, lock))
    }

    /// Keep at most `keep` stored populations (the active one and the most
    /// recently stored others), removing older ones after each put; 0 keeps
    /// all (the default). Tickets that pin a removed population get
    /// `NotFound`, as after `remove_population`; streams already open finish.
    pub fn set_keep_populations(&self, keep: usize) {
        self.keep_populations.store(keep, Ordering::Relaxed);
    }

    /// Draw a progress bar on stderr (a terminal only, `crate::progress`)
    /// while a population is fetched from object storage on its first use
    /// here, or its rows file is built for a store written before rows
    /// files existed; off by default.
    pub fn set_show_progress(&self, show: bool) {
        self.store.set_show_progress(show);
    }

    /// Apply `set_keep_populations` under the activation lock (`held`, or
    /// taken here), so that no activation races with a removal.
    fn retain(&self, held: Option<&ActivationLock>) -> Result<()> {
        let keep = self.keep_populations.load(Ordering::Relaxed);
        if keep == 0 {
            return Ok(());
        }
        let taken;
        let lock = match held {
            Some(lock) => lock,
            None => {
                taken = self.store.lock_activation()?;
                &taken
            }
        };
        let active = self.active()?.population;
        for id in self.store.retain(lock, keep, &active)? {
            self.forget(&id)?;
        }
        Ok(())
    }

    pub fn set_epoch_len(&self, epoch_len: NonZeroU64) -> Result<ActivePopulation> {
        // Read and written under the lock, so that an activation in between
        // is not undone by writing back the population read before it.
        let lock = self.store.lock_activation()?;
        let updated = self.store.update_active(&lock, |current| {
            let mut active = current.cloned().ok_or_else(|| self.no_active())?;
            active.epoch_len = epoch_len.get();
            Ok(Some(active))
        })?;
        updated.ok_or_else(|| self.no_active())
    }

    /// Delete a stored population that is not active: tickets that pin it get
    /// `NotFound` from then on (streams already open finish), on every replica.
    pub fn remove_population(&self, id: &PopulationId) -> Result<()> {
        let lock = self.store.lock_activation()?;
        if self.active()?.population == *id {
            return Err(Error::invalid(format!(
                "population {id} is the active population of dataset '{}' and cannot be \
                 removed; activate another population first (put or do_put with activate), \
                 then remove this one",
                self.name
            )));
        }
        self.store.remove(&lock, id)?;
        self.forget(id)
    }

    /// The request with the active population and epoch length filled in where
    /// it names none: a self-contained ticket that any replica serves alike.
    pub fn pin(&self, request: &StreamRequest) -> Result<StreamRequest> {
        if let (Some(_), Some(_)) = (&request.population, request.epoch_len) {
            return Ok(request.clone());
        }
        let active = self.active()?;
        let epoch_len = NonZeroU64::new(active.epoch_len).ok_or_else(|| {
            Error::internal(format!(
                "dataset '{}' has an active epoch length of 0",
                self.name
            ))
        })?;
        Ok(request.pinned(&active.population, epoch_len))
    }

    fn context(&self, request: &StreamRequest) -> Result<BatchContext> {
        let request = self.pin(request)?;
        let Some(population) = &request.population else {
            return Err(Error::internal("a pinned request names no population"));
        };
        let window = request.window()?;
        let population = self.population(population)?;
        BatchContext::new(
            self.caches.current()?,
            population,
            StreamOrder::new(request.shuffle, request.seed),
            window,
            &request.columns,
        )
        .map(|ctx| ctx.with_payload(request.payload))
    }

    /// Check that a request can be served and return its stream's schema,
    /// without opening (or counting) a stream.
    pub fn check(&self, request: &StreamRequest) -> Result<arrow_schema::SchemaRef> {
        Ok(self.context(request)?.schema)
    }

    /// Open the stream a request names. A request of a training run is fenced:
    /// refused now, or ended before its next batch, once a newer generation
    /// of the run exists.
    pub fn stream(
        &self,
        request: &StreamRequest,
        pool: Arc<WorkerPool>,
        options: StreamOptions,
    ) -> Result<EpochStream> {
        let fence = match (&request.run, request.generation) {
            (Some(run), Some(generation)) => {
                let fence = Fence::new(self.store.runs(), run.clone(), generation);
                fence.check()?;
                Some(fence)
            }
            _ => None,
        };
        let request = self.pin(request)?;
        let population = request
            .population
            .clone()
            .ok_or_else(|| Error::internal("a pinned request names no population"))?;
        let (request, added) = self.with_group_column(request)?;
        let stream = EpochStream::new(self.context(&request)?, pool, options)?;
        // Counted once it opened: a refused request is not a stream served.
        let tally = self
            .served
            .open(population.as_str(), &stream.schema(), added.as_deref());
        let mut stream = stream.with_tally(tally);
        if let Some(fence) = fence {
            stream = stream.with_fence(fence);
        }
        self.streams.fetch_add(1, Ordering::Relaxed);
        Ok(stream)
    }

    /// The generation a resume of `run` gets (`run::fence`).
    pub fn claim_run(&self, run: &RunId, claim: Claim) -> Result<u64> {
        self.store.claim_run(run, claim)
    }

    /// `Fenced` when a newer generation of `run` than `generation` exists.
    pub fn check_run(&self, run: &RunId, generation: u64) -> Result<()> {
        self.store.runs().check(run, generation)
    }

    /// The request with the grouping column added when the population has it
    /// and the stream would not carry it anyway, and the name added (the tally
    /// drops it again, so the consumer gets the schema it asked for).
    fn with_group_column(
        &self,
        mut request: StreamRequest,
    ) -> Result<(StreamRequest, Option<String>)> {
        let Some(column) = self.served.grouping().column else {
            return Ok((request, None));
        };
        if BASE_COLUMNS.contains(&column.as_str()) || request.columns.contains(&column) {
            return Ok((request, None));
        }
        let Some(id) = &request.population else {
            return Ok((request, None));
        };
        let schema = self.population(id)?.schema();
        match schema.field_with_name(&column) {
            Ok(field) if crate::stream::served::groupable(field.data_type()) => {
                request.columns.push(column.clone());
                Ok((request, Some(column)))
            }
            _ => Ok((request, None)),
        }
    }

    /// Count the rows of every stream opened from now on per value of `grouping`'s column.
    pub fn set_grouping(&self, grouping: Grouping) {
        self.served.set_grouping(grouping);
    }

    /// What the streams served, per population, most recently streamed first.
    pub fn served(&self) -> Vec<(String, Served)> {
        self.served.served()
    }

    pub fn stats(&self) -> ServiceStats {
        let (rows, bytes) = self.served.totals();
        ServiceStats {
            streams: self.streams.load(Ordering::Relaxed),
            rows,
            bytes,
            skipped_log_entries: self.store.skipped_log_entries(),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, LoadedPopulations>> {
        self.loaded
            .lock()
            .map_err(|_| Error::internal("the population cache's lock is poisoned"))
    }

    fn forget(&self, id: &PopulationId) -> Result<()> {
        let mut guard = self.lock()?;
        let (map, order) = &mut *guard;
        map.remove(id);
        order.retain(|kept| kept != id);
        Ok(())
    }

    fn remember(&self, id: &PopulationId, population: Arc<Population>) -> Result<()> {
        let mut guard = self.lock()?;
        let (map, order) = &mut *guard;
        if map.insert(id.clone(), population).is_none() {
            order.push_back(id.clone());
        }
        while order.len() > LOADED_POPULATIONS {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{
        CacheWriter, ColumnSpec, Compression, EncodedRecord, MetaType, MetaValue,
    };

    fn cache(base: &Path) -> PathBuf {
        let columns = vec![ColumnSpec {
            name: "label".into(),
            dtype: MetaType::Int64,
        }];
        let mut writer = CacheWriter::create(base, "c", columns, Default::default()).unwrap();
        for i in 0..4u8 {
            let record = EncodedRecord::encode(vec![i; 8], Compression::default()).unwrap();
            writer.append(&record, &[MetaValue::Int(i.into())]).unwrap();
        }
        writer.finish().unwrap().0
    }

    /// Every file and directory under `dir`, sorted.
    fn listing(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(next) = pending.pop() {
            for entry in std::fs::read_dir(&next).unwrap().flatten() {
                if entry.path().is_dir() {
                    pending.push(entry.path());
                }
                found.push(entry.path());
            }
        }
        found.sort();
        found
    }

    #[test]
    fn names_that_are_not_one_path_part_are_refused_before_any_path() {
        let dir = tempfile::tempdir().unwrap();
        let caches = [cache(&dir.path().join("caches"))];
        let state = dir.path().join("sub").join("state");
        let before = listing(dir.path());
        for bad in ["../x", "a/b", "..", "", ".hidden", "/abs"] {
            for open in [DatasetService::open, DatasetService::open_existing] {
                let Err(error) = open(bad, &caches, &state, false) else {
                    panic!("{bad:?} was accepted");
                };
                assert!(
                    matches!(&error, Error::InvalidArgument(m) if m.starts_with("dataset name")),
                    "{error}"
                );
            }
        }
        assert_eq!(listing(dir.path()), before);
    }

    #[test]
    fn open_existing_creates_nothing_and_says_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let caches = [cache(&dir.path().join("caches"))];
        let state = dir.path().join("state");
        let refused = |name: &str| match DatasetService::open_existing(name, &caches, &state, false)
        {
            Err(Error::NotFound(message)) => message,
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("{name} opened"),
        };
        let before = listing(dir.path());
        assert!(refused("d").contains("does not exist"));
        assert_eq!(listing(dir.path()), before);

        let served = DatasetService::open("d", &caches, &state, false).unwrap();
        let before = listing(dir.path());
        let unknown = refused("e");
        assert!(
            unknown.contains("'e'") && unknown.contains("[\"d\"]"),
            "{unknown}"
        );
        // A store for other caches: the dataset's directory is there, its store is not.
        std::fs::create_dir(state.join("f")).unwrap();
        assert!(refused("f").contains("other caches"));
        std::fs::remove_dir(state.join("f")).unwrap();
        assert_eq!(listing(dir.path()), before);

        let opened = DatasetService::open_existing("d", &caches, &state, false).unwrap();
        assert_eq!(opened.active().unwrap(), served.active().unwrap());
        assert_eq!(
            listing(dir.path()),
            before,
            "opening read-only wrote nothing"
        );
        // A store without an active pointer is not a store a server left.
        let log: Vec<_> = listing(&state)
            .into_iter()
            .filter(|p| p.parent().is_some_and(|d| d.ends_with("active")))
            .collect();
        assert!(!log.is_empty(), "the activation log's entries");
        for entry in log {
            std::fs::remove_file(entry).unwrap();
        }
        assert!(refused("d").contains("no active population"));
    }
}
