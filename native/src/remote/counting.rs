//! `Counting`: an `ObjectStore` that counts the reads asked of the store it
//! wraps (tests of how many requests a path costs; `object_store` has no
//! such wrapper).
//!
//! `ObjectStore` is declared with `#[async_trait]`; the methods below are
//! what that macro expands to (a boxed future per call), written out so the
//! tests need no macro crate of their own.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path as Key;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// `inner`, with its `HEAD`s and `GET`s (ranged or whole) counted.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn ObjectStore>,
    heads: AtomicU64,
    gets: AtomicU64,
}

impl Counting {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            heads: AtomicU64::new(0),
            gets: AtomicU64::new(0),
        })
    }

    /// (`HEAD`s, `GET`s) asked of the store so far.
    pub fn reads(&self) -> (u64, u64) {
        (
            self.heads.load(Ordering::Relaxed),
            self.gets.load(Ordering::Relaxed),
        )
    }

    /// Start counting again from zero.
    pub fn reset(&self) {
        self.heads.store(0, Ordering::Relaxed);
        self.gets.store(0, Ordering::Relaxed);
    }
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

impl ObjectStore for Counting {
    fn put_opts<'s, 'k, 'f>(
        &'s self,
        location: &'k Key,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFuture<'f, Result<PutResult>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.put_opts(location, payload, opts)
    }

    fn put_multipart_opts<'s, 'k, 'f>(
        &'s self,
        location: &'k Key,
        opts: PutMultipartOptions,
    ) -> BoxFuture<'f, Result<Box<dyn MultipartUpload>>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.put_multipart_opts(location, opts)
    }

    fn get_opts<'s, 'k, 'f>(
        &'s self,
        location: &'k Key,
        options: GetOptions,
    ) -> BoxFuture<'f, Result<GetResult>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        let counter = if options.head {
            &self.heads
        } else {
            &self.gets
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.inner.get_opts(location, options)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Key>>,
    ) -> BoxStream<'static, Result<Key>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Key>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Key>,
        offset: &Key,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    fn list_with_delimiter<'s, 'k, 'f>(
        &'s self,
        prefix: Option<&'k Key>,
    ) -> BoxFuture<'f, Result<ListResult>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.list_with_delimiter(prefix)
    }

    fn copy_opts<'s, 'a, 'b, 'f>(
        &'s self,
        from: &'a Key,
        to: &'b Key,
        options: CopyOptions,
    ) -> BoxFuture<'f, Result<()>>
    where
        's: 'f,
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        self.inner.copy_opts(from, to, options)
    }
}
