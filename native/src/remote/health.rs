//! Telling a store that stopped answering from a slow request, in seconds.
//!
//! A network cut does not refuse connections: requests on pooled connections
//! wait for their timeout (a minute) and new ones for their connect timeout,
//! each retried, so every request would wait about half a minute before it
//! failed, and a client failing over across replicas would wait for each.
//! Instead, a request that has not answered within `STALL` starts a probe (a
//! listing of one key, answered by any live store at once) with `PROBE_TIMEOUT`
//! of its own. A probe that does not complete marks the store down: the
//! requests waiting on it fail then (`UNAVAILABLE`), and new ones fail at once,
//! while the probe is repeated every `RECHECK` until the store answers again;
//! nothing needs a restart. A probe that completes, whatever it answered,
//! proves the store alive and merely slow: the request goes on waiting.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{select, BoxFuture, Either};
use tokio::sync::watch;

/// How long a request may go unanswered before the store is probed.
const STALL: Duration = Duration::from_secs(2);
/// How long a probe may take before the store counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a store that is down is probed again.
const RECHECK: Duration = Duration::from_secs(1);

/// A small request that any live store answers at once.
pub(super) type Probe = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Whether one store answers, shared by every prefix opened on it.
pub(super) struct Health {
    /// Since when the store has not answered (None: it answers).
    down: watch::Sender<Option<Instant>>,
    probing: AtomicBool,
    /// What proves the store alive.
    probe: Probe,
}

impl Health {
    pub(super) fn new(probe: Probe) -> Arc<Self> {
        Arc::new(Health {
            down: watch::channel(None).0,
            probing: AtomicBool::new(false),
            probe,
        })
    }

    /// How long the store has not answered, when it is down.
    pub(super) fn down_for(&self) -> Option<Duration> {
        self.down.borrow().map(|since| since.elapsed())
    }

    /// `request`'s output, or how long the store has been down when it is or
    /// goes down before the request is answered.
    pub(super) async fn guard<F: Future>(
        self: &Arc<Self>,
        request: F,
    ) -> Result<F::Output, Duration> {
        if let Some(down) = self.down_for() {
            return Err(down);
        }
        let mut watch = self.down.subscribe();
        let request = Box::pin(request);
        let stalled = Box::pin(tokio::time::sleep(STALL));
        let request = match select(request, stalled).await {
            Either::Left((answered, _)) => return Ok(answered),
            Either::Right(((), request)) => request,
        };
        self.start_probing();
        let down = Box::pin(async move {
            // An error means the health itself is gone: wait for the request.
            if watch.wait_for(Option::is_some).await.is_err() {
                futures::future::pending::<()>().await;
            }
        });
        match select(request, down).await {
            Either::Left((answered, _)) => Ok(answered),
            Either::Right(((), _)) => Err(self.down_for().unwrap_or_default()),
        }
    }

    /// Probe the store in the background (one probe at a time), and while it
    /// does not answer, again every `RECHECK`.
    fn start_probing(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let answered = tokio::time::timeout(PROBE_TIMEOUT, (this.probe)())
                    .await
                    .is_ok();
                if answered {
                    if this.down.send_replace(None).is_some() {
                        eprintln!("note: object storage answers again");
                    }
                    break;
                }
                if this.down.borrow().is_none() {
                    eprintln!(
                        "warning: object storage did not answer a probe within {} s; \
                         requests fail at once until it does (probed every {} s)",
                        PROBE_TIMEOUT.as_secs(),
                        RECHECK.as_secs()
                    );
                    this.down.send_replace(Some(Instant::now()));
                }
                tokio::time::sleep(RECHECK).await;
            }
            this.probing.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_store_whose_probe_hangs_is_down_at_once_for_later_requests_and_up_when_it_answers() {
        let answering = Arc::new(AtomicBool::new(false));
        let flag = answering.clone();
        let probe: Probe = Arc::new(move || {
            let answering = flag.load(Ordering::Acquire);
            async move {
                if !answering {
                    futures::future::pending::<()>().await;
                }
            }
            .boxed()
        });
        let health = Health::new(probe);
        let rt = runtime();
        rt.block_on(async {
            // Answered before the stall: no probe.
            assert_eq!(health.guard(async { 7 }).await, Ok(7));
            // A request that never answers fails once the probe times out.
            let started = Instant::now();
            let hung = health.guard(futures::future::pending::<()>()).await;
            assert!(hung.is_err());
            let waited = started.elapsed();
            assert!(
                waited < STALL + PROBE_TIMEOUT + Duration::from_secs(2),
                "{waited:?}"
            );
            // Down: the next request fails at once, even one that would answer.
            let started = Instant::now();
            assert!(health.guard(async { 1 }).await.is_err());
            assert!(started.elapsed() < Duration::from_millis(100));
            // The store answers again: within a recheck, requests go through.
            answering.store(true, Ordering::Release);
            let deadline = Instant::now() + PROBE_TIMEOUT + RECHECK * 3;
            while health.down_for().is_some() {
                assert!(Instant::now() < deadline, "never came back");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(health.guard(async { 2 }).await, Ok(2));
        });
    }

    #[test]
    fn a_slow_request_on_a_store_that_answers_probes_goes_on() {
        let probe: Probe = Arc::new(|| async {}.boxed());
        let health = Health::new(probe);
        runtime().block_on(async {
            let slow = async {
                tokio::time::sleep(STALL + Duration::from_millis(500)).await;
                3
            };
            assert_eq!(health.guard(slow).await, Ok(3));
            assert!(health.down_for().is_none());
        });
    }
}
