//! Objects on S3-compatible storage, through Apache Arrow's `object_store`.
//!
//! The engine is synchronous (worker threads, PyO3 calls without the GIL), so
//! every call here blocks on one small Tokio runtime shared by the process.
//! Only what the stores need is exposed: whole-object gets and puts,
//! create-only puts (`If-None-Match: *`, the one conditional write that S3,
//! Ceph's radosgw and the other S3-compatible stores agree on; see
//! docs/storage-format.md, "On object storage"), listings after a key, and
//! file uploads and downloads that stream (a population file may be GBs).
//!
//! Credentials and the endpoint come from the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_ALLOW_HTTP`, ...), never from a URL, a ticket or a log line.

use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientConfigKey, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};

use crate::error::{Error, IoContext, Result};
use crate::storage::temp::LockedTemp;

pub mod counters;
#[cfg(test)]
pub(crate) mod counting;
mod health;
mod limits;
mod slow_downs;
use health::{Health, Probe};
use limits::{downloads, in_flight};
pub use limits::{parts_in_flight, requests_in_flight};

/// Files up to this size are uploaded in one request, larger ones in parts.
const SINGLE_PUT_BYTES: u64 = 16 << 20;
/// The part size of multipart uploads (S3's minimum is 5 MiB).
const PART_BYTES: usize = 16 << 20;
/// Parts of one file's upload, or ranges of one download, in flight at once
/// (a 64 MiB shard is four parts of 16 MiB).
const PARTS_IN_FLIGHT: usize = 4;
/// Downloads are ranged requests of this size: each is short enough for the
/// per-request timeout, and a failed one is retried alone.
const RANGE_BYTES: u64 = 32 << 20;

fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("drt-object-store")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::internal(format!("cannot start the object-store runtime: {e}")))
}

fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    Ok(runtime()?.block_on(future))
}

/// A prefix of an object store: `s3://bucket/prefix`, or a local directory
/// seen as one (`Bucket::local`), so that what is shared between replicas is
/// written and read by one code path whichever backend holds it.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    root: Key,
    /// The URL it was opened from (no credentials), or the directory, for messages.
    url: String,
    /// How long a reader may trust what it listed (`freshness`).
    freshness: Duration,
    /// Whether the store answers (`health`), shared by its prefixes.
    health: Arc<Health>,
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Relative to the bucket's prefix.
    pub name: String,
    pub size: u64,
    pub modified: std::time::SystemTime,
}

/// How stale a replica's view of a bucket's small mutable state (the active
/// pointer, a run's generations) may be: one listing per second at most.
pub const POLL: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({})", self.url)
    }
}

/// Whether `location` names object storage rather than a local directory.
pub fn is_url(location: &str) -> bool {
    location.starts_with("s3://")
}

impl Bucket {
    /// Open `s3://bucket/prefix` with the credentials and endpoint of the
    /// environment. Nothing is requested until the first operation.
    pub fn open(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            Error::invalid(format!(
                "{url:?} is not an object-storage URL; give s3://BUCKET/PREFIX"
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || url.contains('@') || url.contains('?') {
            return Err(Error::invalid(format!(
                "{url:?} is not an object-storage URL; give s3://BUCKET/PREFIX (credentials \
                 come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, never from the URL)"
            )));
        }
        // Unless the environment says otherwise: a store that is down fails
        // within about half a minute (not object_store's three), and each
        // request (a part, a range) has a minute.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_http_connector(slow_downs::Counting)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: Duration::from_secs(30),
            });
        for (key, default) in [("connect_timeout", "5s"), ("timeout", "60s")] {
            let set = std::env::var(format!("AWS_{}", key.to_ascii_uppercase())).ok();
            let value = match set.as_deref().map(str::trim) {
                None => default.to_string(),
                // A bare number is seconds (object_store wants a unit).
                Some(n) if n.parse::<f64>().is_ok_and(|n| n.is_finite() && n >= 0.0) => {
                    format!("{n}s")
                }
                Some(other) => other.to_string(),
            };
            if let Ok(key) = key.parse::<ClientConfigKey>() {
                builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
            }
        }
        let store = builder.build().map_err(|e| {
            Error::invalid(format!(
                "cannot use object storage at {url}: {e}; set AWS_ENDPOINT_URL (and \
                     AWS_ALLOW_HTTP=true for a plain-HTTP endpoint), AWS_REGION and the \
                     credentials in the environment"
            ))
        })?;
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        Ok(Bucket {
            health: Health::new(probe(&store)),
            store,
            root: Key::parse(prefix.trim_end_matches('/'))
                .map_err(|e| Error::invalid(format!("{url:?}: the prefix is not valid: {e}")))?,
            url: url.trim_end_matches('/').to_string(),
            freshness: POLL,
        })
    }

    /// The directory `dir` (created if needed) as a bucket: objects are its
    /// files, a create-only put is a hard link of a complete, fsynced file
    /// (`link(2)` fails if the name exists, atomically, on every POSIX file
    /// system, NFS included), and every write is fsynced with its directory.
    /// Listing a directory is cheap and coherent, so readers trust nothing
    /// they listed before (a freshness of 0).
    pub fn local(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).at("cannot create", dir)?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| Error::io("cannot open", dir, std::io::Error::other(e)))?
            .with_fsync(true);
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        Ok(Bucket {
            health: Health::new(probe(&store)),
            store,
            root: Key::default(),
            url: dir.display().to_string(),
            freshness: Duration::ZERO,
        })
    }

    /// A bucket over any `ObjectStore` (tests).
    pub fn from_store(store: Arc<dyn ObjectStore>, url: &str) -> Self {
        Bucket {
            health: Health::new(probe(&store)),
            store,
            root: Key::default(),
            url: url.to_string(),
            freshness: POLL,
        }
    }

    /// How long what was listed here may be trusted before it is listed again.
    pub fn freshness(&self) -> Duration {
        self.freshness
    }

    /// The prefix `name` below this one (`name` may hold `/`).
    pub fn child(&self, name: &str) -> Bucket {
        let mut root = self.root.clone();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            root = root.join(part);
        }
        Bucket {
            store: self.store.clone(),
            root,
            url: format!("{}/{name}", self.url),
            freshness: self.freshness,
            health: self.health.clone(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, name: &str) -> Key {
        let mut key = self.root.clone();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            key = key.join(part);
        }
        key
    }

    fn error(&self, action: &str, name: &str, error: object_store::Error) -> Error {
        match error {
            object_store::Error::NotFound { .. } => {
                Error::NotFound(format!("{}/{name} does not exist", self.url))
            }
            other => {
                // The details (the endpoint's URL, the object's key) are the
                // operator's: in the server's log, not in what a client reads.
                // One line: a store's error body is often XML over several.
                let detail: String = other
                    .to_string()
                    .chars()
                    .take(2000)
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                eprintln!(
                    "warning: object storage at {} could not {action} {name}: {detail}",
                    self.url
                );
                Error::Unavailable(format!(
                    "object storage could not {action} an object: the store did not answer, \
                     refused the request or kept asking to slow down (the server's log has the \
                     details); check that the store is reachable and that the credentials in \
                     the environment may read and write the bucket"
                ))
            }
        }
    }

    /// `request`'s output, waited for here; fails at once, or as soon as a
    /// probe finds the store not answering (`health`), with `Unavailable`.
    fn run<F: std::future::Future>(&self, request: F) -> Result<F::Output> {
        block_on(self.health.guard(request))?.map_err(|down| self.down(down))
    }

    fn down(&self, since: Duration) -> Error {
        Error::Unavailable(format!(
            "object storage has not answered for {:.0} s: requests fail at once until it \
             answers again (it is probed every second; the server's log has the details); \
             check that the store is reachable",
            since.as_secs_f64().max(1.0)
        ))
    }

    /// The object `name`, or None when there is none.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let key = self.key(name);
        let got = self.run(async {
            let result = self.store.get(&key).await?;
            result.bytes().await
        })?;
        match got {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("read", name, e)),
        }
    }

    /// Whether the object `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.size(name)?.is_some())
    }

    /// The size of the object `name` in bytes, or None when there is none.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        match self.run(self.store.head(&self.key(name)))? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("look up", name, e)),
        }
    }

    /// Write `name` holding `bytes`, replacing what it held.
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.run(self.store.put(&self.key(name), PutPayload::from(bytes)))?
            .map(|_| ())
            .map_err(|e| self.error("write", name, e))
    }

    /// Create `name` holding `bytes` unless it exists (`If-None-Match: *`):
    /// true when this call created it. Of concurrent creates exactly one
    /// returns true. A create whose answer was lost and that the client
    /// retried returns false although it won: callers that must know put a
    /// nonce in `bytes` and read it back.
    pub fn create(&self, name: &str, bytes: Vec<u8>) -> Result<bool> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let put = self.run(self.store.put_opts(
            &self.key(name),
            PutPayload::from(bytes),
            options,
        ))?;
        match put {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.error("create", name, e)),
        }
    }

    /// The names below `prefix` (relative to this bucket's prefix) that sort
    /// after `after`, in order.
    pub fn list(&self, prefix: &str, after: Option<&str>) -> Result<Vec<String>> {
        Ok(self
            .list_sized(prefix, after)?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// `list` with each object's size in bytes.
    pub fn list_sized(&self, prefix: &str, after: Option<&str>) -> Result<Vec<(String, u64)>> {
        Ok(self
            .listed(prefix, after)?
            .into_iter()
            .map(|object| (object.name, object.size))
            .collect())
    }

    /// The objects below `prefix` with their sizes and modification times.
    pub fn list_modified(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.listed(prefix, None)
    }

    fn listed(&self, prefix: &str, after: Option<&str>) -> Result<Vec<Listed>> {
        let prefix_key = self.key(prefix);
        let listed = self.run(async {
            let stream = match after {
                Some(after) => self
                    .store
                    .list_with_offset(Some(&prefix_key), &self.key(after)),
                None => self.store.list(Some(&prefix_key)),
            };
            stream.collect::<Vec<_>>().await
        })?;
        let root = self.root.as_ref();
        let mut objects = Vec::with_capacity(listed.len());
        for meta in listed {
            let meta = meta.map_err(|e| self.error("list", prefix, e))?;
            let full = meta.location.as_ref();
            let name = if root.is_empty() {
                full
            } else {
                full.strip_prefix(root)
                    .and_then(|n| n.strip_prefix('/'))
                    .unwrap_or(full)
            };
            objects.push(Listed {
                name: name.to_string(),
                size: meta.size,
                modified: meta.last_modified.into(),
            });
        }
        objects.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(objects)
    }

    /// Upload the file at `path` as `name`, streamed in parts when large; the
    /// object appears whole or not at all (S3 publishes a put, or the
    /// completion of a multipart upload, atomically).
    pub fn upload(&self, path: &Path, name: &str) -> Result<()> {
        self.upload_counted(path, name, &|_| {})
    }

    /// `upload`, telling `sent` of each piece of the file as it goes out.
    pub fn upload_counted(&self, path: &Path, name: &str, sent: &dyn Fn(u64)) -> Result<()> {
        self.run(self.upload_one(path, name, sent))?
    }

    /// Upload each `(file, name)` of `files` as `upload` does, several at once
    /// (`parts_in_flight`), telling `sent` of every piece as it goes out.
    /// Returns at the first failure; what was uploaded stays (a publication
    /// record written after them makes them visible, see `storage::upload`).
    pub fn upload_files(&self, files: &[(PathBuf, String)], sent: &dyn Fn(u64)) -> Result<()> {
        let at_once = parts_in_flight().div_ceil(PARTS_IN_FLIGHT).max(1);
        let uploads = futures::stream::iter(files)
            .map(|(path, name)| self.upload_one(path, name, sent))
            .buffer_unordered(at_once);
        self.run(async {
            futures::pin_mut!(uploads);
            while let Some(done) = uploads.next().await {
                done?;
            }
            Ok(())
        })?
    }

    async fn upload_one(&self, path: &Path, name: &str, sent: &dyn Fn(u64)) -> Result<()> {
        let key = self.key(name);
        let mut file = fs::File::open(path).at("cannot open", path)?;
        let size = file.metadata().at("cannot stat", path)?.len();
        if size <= SINGLE_PUT_BYTES {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).at("cannot read", path)?;
            self.store
                .put(&key, PutPayload::from(bytes))
                .await
                .map_err(|e| self.error("write", name, e))?;
            sent(size);
            return Ok(());
        }
        let upload = self
            .store
            .put_multipart(&key)
            .await
            .map_err(|e| self.error("start an upload of", name, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buffer = vec![0u8; PART_BYTES];
        loop {
            let read = file.read(&mut buffer).at("cannot read", path)?;
            if read == 0 {
                break;
            }
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| self.error("upload", name, e))?;
            writer.write(&buffer[..read]);
            sent(read as u64);
        }
        writer
            .finish()
            .await
            .map(|_| ())
            .map_err(|e| self.error("complete the upload of", name, e))
    }

    /// Download `name` to `dest`: written to a temporary file beside it and
    /// renamed into place, so `dest` is whole or absent. `NotFound` when the
    /// object does not exist.
    pub fn download(&self, name: &str, dest: &Path) -> Result<()> {
        self.download_counted(name, dest, &|_| {}, &|_| {})
    }

    /// `download`, telling `sized` the object's size once its one `HEAD`
    /// has answered (before any byte arrives; a caller need not ask for the
    /// size itself) and `received` of each piece of the object as it is
    /// written.
    pub fn download_counted(
        &self,
        name: &str,
        dest: &Path,
        sized: &dyn Fn(u64),
        received: &dyn Fn(u64),
    ) -> Result<()> {
        self.download_sized(name, None, dest, sized, received)
    }

    /// `download` of an object whose size the caller knows (a shard, from
    /// its manifest; an object it has looked up): its ranges are asked for
    /// at once, with no `HEAD` first. `received` is told of each piece.
    pub fn download_known(
        &self,
        name: &str,
        size: u64,
        dest: &Path,
        received: &dyn Fn(u64),
    ) -> Result<()> {
        self.download_sized(name, Some(size), dest, &|_| {}, received)
    }

    fn download_sized(
        &self,
        name: &str,
        known: Option<u64>,
        dest: &Path,
        sized: &dyn Fn(u64),
        received: &dyn Fn(u64),
    ) -> Result<()> {
        let dir = dest.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).at("cannot create", dir)?;
        let temp = LockedTemp::create_file(dir, ".tmp-")?;
        let file = temp.file();
        let key = self.key(name);
        let fetched: Result<()> = self.run(async {
            let size = match known {
                Some(size) => size,
                None => {
                    counters::request(0);
                    self.store
                        .head(&key)
                        .await
                        .map_err(|e| self.error("look up", name, e))?
                        .size
                }
            };
            sized(size);
            let ranges = (0..size.div_ceil(RANGE_BYTES))
                .map(|i| i * RANGE_BYTES..((i + 1) * RANGE_BYTES).min(size));
            let mut parts = futures::stream::iter(ranges)
                .map(|range| async {
                    // Whole objects take few of the store's requests at once
                    // (`DOWNLOADS_IN_FLIGHT` ranges of 32 MiB in the process),
                    // so the records a stream waits for are not queued behind
                    // a mirror filling up.
                    let _permit = downloads().acquire().await;
                    self.write_range(&key, name, range, file, temp.path(), received)
                        .await
                })
                .buffer_unordered(PARTS_IN_FLIGHT);
            while let Some(part) = parts.next().await {
                part?;
            }
            Ok(())
        })?;
        let kept = fetched
            .and_then(|()| file.sync_all().at("cannot fsync", temp.path()))
            .and_then(|()| fs::rename(temp.path(), dest).at("cannot rename into place", dest));
        if kept.is_err() {
            let _ = fs::remove_file(temp.path());
        }
        // A full volume is named at `dest`, not at the file just removed.
        kept.map_err(|e| e.naming_target(temp.path(), dest))
    }

    /// Bytes `range` of the object `key` (`name`) written to `file` (at
    /// `path`) at the same offsets, piece by piece as they arrive: a range
    /// is never gathered in memory first (a 32 MiB buffer per range, four per
    /// shard in flight, each a fresh mapping faulted in and copied once more).
    async fn write_range(
        &self,
        key: &Key,
        name: &str,
        range: std::ops::Range<u64>,
        file: &fs::File,
        path: &Path,
        received: &dyn Fn(u64),
    ) -> Result<()> {
        let options = GetOptions::default().with_range(Some(range.clone()));
        let got = self.store.get_opts(key, options).await;
        let mut pieces = got.map_err(|e| self.error("read", name, e))?.into_stream();
        let mut at = range.start;
        while let Some(piece) = pieces.next().await {
            let piece = piece.map_err(|e| self.error("read", name, e))?;
            if at + piece.len() as u64 > range.end {
                break;
            }
            file.write_all_at(&piece, at).at("cannot write", path)?;
            at += piece.len() as u64;
            received(piece.len() as u64);
        }
        if at != range.end {
            // The details are the operator's (`error`).
            eprintln!(
                "warning: object storage at {} answered bytes {}..{at}+ of {name} for {range:?}",
                self.url, range.start
            );
            return Err(Error::Unavailable(
                "object storage answered a ranged read with another length than asked for \
                 (the server's log has the details); retry"
                    .to_string(),
            ));
        }
        counters::request(range.end - range.start);
        Ok(())
    }

    /// Start fetching bytes `range` of `name` now, in the background, among
    /// at most `requests_in_flight()` ranged requests of the process; the
    /// caller waits for them when it needs them (`Fetch::wait`).
    pub fn fetch_range(&self, name: &str, range: std::ops::Range<u64>) -> Result<Fetch> {
        let (store, key) = (self.store.clone(), self.key(name));
        let len = range.end - range.start;
        let health = self.health.clone();
        let task = runtime()?.spawn(async move {
            let _permit = in_flight().acquire().await;
            let got = match health.guard(store.get_range(&key, range)).await {
                Ok(got) => got,
                Err(_down) => Err(object_store::Error::Generic {
                    store: "object storage",
                    source: "the store does not answer".into(),
                }),
            };
            if let Ok(bytes) = &got {
                counters::request(bytes.len() as u64);
            }
            got.map_err(Arc::new)
        });
        Ok(Fetch {
            bucket: self.clone(),
            name: name.to_string(),
            len,
            task: task
                .map(|joined| {
                    joined.unwrap_or_else(|e| {
                        Err(Arc::new(object_store::Error::JoinError { source: e }))
                    })
                })
                .boxed()
                .shared(),
        })
    }

    /// Remove `name` (no error when it is already gone).
    pub fn delete(&self, name: &str) -> Result<()> {
        match self.run(self.store.delete(&self.key(name)))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("delete", name, e)),
        }
    }
}

/// A request any live store answers at once: a `HEAD` of a key that is never
/// written (its "not found" proves the store alive as well as an object).
fn probe(store: &Arc<dyn ObjectStore>) -> Probe {
    let store = store.clone();
    Arc::new(move || {
        let store = store.clone();
        async move {
            let _ = store.head(&Key::from(".dataset-rt-probe")).await;
        }
        .boxed()
    })
}

type Fetched = std::result::Result<bytes::Bytes, Arc<object_store::Error>>;

/// A ranged read started by `Bucket::fetch_range`: any number of readers may
/// wait for it (`Clone`), the bytes are fetched once.
#[derive(Clone)]
pub struct Fetch {
    bucket: Bucket,
    name: String,
    len: u64,
    task: futures::future::Shared<futures::future::BoxFuture<'static, Fetched>>,
}

impl Fetch {
    /// The bytes, once they have arrived (the store's error otherwise).
    pub fn wait(&self) -> Result<bytes::Bytes> {
        match block_on(self.task.clone())? {
            Ok(bytes) if bytes.len() as u64 == self.len => Ok(bytes),
            Ok(bytes) => Err(Error::Unavailable(format!(
                "object storage answered a read of {} bytes with {}",
                self.len,
                bytes.len()
            ))),
            Err(e) => {
                if let Some(down) = self.bucket.health.down_for() {
                    return Err(self.bucket.down(down));
                }
                let error =
                    Arc::try_unwrap(e).unwrap_or_else(|shared| object_store::Error::Generic {
                        store: "object storage",
                        source: shared.to_string().into(),
                    });
                Err(self.bucket.error("read", &self.name, error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;

    fn local_bucket(dir: &Path) -> Bucket {
        let store = LocalFileSystem::new_with_prefix(dir).expect("a local store");
        Bucket::from_store(Arc::new(store), "file://test")
    }

    #[test]
    fn create_is_exclusive_and_listing_is_ordered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bucket = local_bucket(dir.path()).child("a/b");
        assert!(bucket.create("log/001", b"one".to_vec()).expect("create"));
        assert!(!bucket.create("log/001", b"two".to_vec()).expect("create"));
        assert_eq!(bucket.get("log/001").expect("get"), Some(b"one".to_vec()));
        assert_eq!(bucket.get("log/002").expect("get"), None);
        assert!(bucket.create("log/003", b"3".to_vec()).expect("create"));
        assert!(bucket.create("log/002", b"2".to_vec()).expect("create"));
        assert_eq!(
            bucket.list("log", None).expect("list"),
            vec!["log/001", "log/002", "log/003"]
        );
        assert_eq!(
            bucket.list("log", Some("log/001")).expect("list"),
            vec!["log/002", "log/003"]
        );
    }

    #[test]
    fn files_round_trip_whole_and_in_parts() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("store")).expect("mkdir");
        let bucket = local_bucket(&dir.path().join("store"));
        for size in [0usize, 1000, (SINGLE_PUT_BYTES as usize) + 12345] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let source = dir.path().join("source");
            fs::write(&source, &bytes).expect("write");
            bucket.upload(&source, "f/object").expect("upload");
            let dest = dir.path().join("copy/dest");
            bucket.download("f/object", &dest).expect("download");
            assert_eq!(fs::read(&dest).expect("read"), bytes);
        }
        assert!(matches!(
            bucket.download("f/missing", &dir.path().join("copy/none")),
            Err(Error::NotFound(_))
        ));
        assert!(!dir.path().join("copy/none").exists());
    }

    #[test]
    fn urls_are_checked() {
        for bad in ["s3://", "file:///x", "s3://key:secret@bucket/p", "bucket/p"] {
            assert!(
                matches!(Bucket::open(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        assert!(is_url("s3://b/p") && !is_url("/tmp/s3"));
    }
}
