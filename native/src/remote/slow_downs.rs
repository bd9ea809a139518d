//! Counting the store's slow-down answers.
//!
//! S3 answers `503 SlowDown` when one key prefix gets more requests than it
//! serves (about 5,500 reads a second; other stores answer 429 or 503 for the
//! same). `object_store` retries such answers with exponential backoff and
//! jitter (`RetryConfig` in `Bucket::open`), which is what S3 asks of its
//! clients, so a throttled request is slower, never damage. But the retries
//! are silent: every answer of an S3 store passes through `Counting` first,
//! and the count (`/metrics`: `datasetrt_object_store_slow_downs`) tells an
//! operator that replicas wait on the store's request rate, not on its
//! bandwidth. A request still throttled after its retries fails as any
//! unanswered request does: `Unavailable`, which clients retry.

use async_trait::async_trait;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// `object_store`'s own HTTP client, each of its answers looked at once.
#[derive(Debug, Default)]
pub(super) struct Counting;

impl HttpConnector for Counting {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counted(client)))
    }
}

#[derive(Debug)]
struct Counted(HttpClient);

#[async_trait]
impl HttpService for Counted {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = self.0.execute(request).await?;
        let status = response.status().as_u16();
        if status == 503 || status == 429 {
            super::counters::slow_down();
        }
        Ok(response)
    }
}
