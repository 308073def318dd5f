//! Strict admission's store calls: holds and grants wait in a queue; the first to queue
//! starts a flush, which sends what waits in batches until nothing does, so requests of
//! many keys share calls. A store known to fail lately is not asked again at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use swin_core::HoldState;
use tracing::warn;

use crate::store::{Grant, Granted, Hold, Store};
use crate::{Holder, NamespaceSync, PushId, StoreError};

/// Requests per store call at most.
const BATCH: usize = 1_000;

/// Where a request's answer goes.
type Answer<A> = tokio::sync::oneshot::Sender<Result<A, Arc<StoreError>>>;

/// Requests (holds, grants) waiting for the next store call: the first to queue
/// starts a flush, which sends what waits in batches until nothing does.
#[derive(Debug)]
pub(super) struct Queue<R, A> {
    waiting: Vec<(R, Answer<A>)>,
    flushing: bool,
}

impl<R, A> Default for Queue<R, A> {
    fn default() -> Self {
        Queue {
            waiting: Vec::new(),
            flushing: false,
        }
    }
}

/// Queues `request` and waits for its answer; `flush` (spawned by the first to queue)
/// sends batches with `send` until the queue is empty.
async fn queued<R, A, F, Fut>(
    queue: &Arc<Mutex<Queue<R, A>>>,
    tasks: &tokio_util::task::TaskTracker,
    within: std::time::Duration,
    request: R,
    send: F,
) -> Result<A, Arc<StoreError>>
where
    R: Send + 'static,
    A: Send + 'static,
    F: Fn(Vec<R>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<A>, Arc<StoreError>>> + Send,
{
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let lead = {
        let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
        q.waiting.push((request, tx));
        !std::mem::replace(&mut q.flushing, true)
    };
    if lead {
        use tracing::Instrument;
        let queue = queue.clone();
        // under the leading request's span: the batch's store calls are its children
        let flush = async move {
            loop {
                let batch: Vec<_> = {
                    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                    if q.waiting.is_empty() {
                        q.flushing = false;
                        return;
                    }
                    let n = q.waiting.len().min(BATCH);
                    q.waiting.drain(..n).collect()
                };
                let (requests, txs): (Vec<R>, Vec<_>) = batch.into_iter().unzip();
                let n = requests.len();
                match send(requests).await {
                    Ok(answers) if answers.len() == n => {
                        for (tx, a) in txs.into_iter().zip(answers) {
                            let _ = tx.send(Ok(a));
                        }
                    }
                    Ok(answers) => {
                        let e = Arc::new(StoreError::Protocol(format!(
                            "{} answers for {n} requests",
                            answers.len()
                        )));
                        for tx in txs {
                            let _ = tx.send(Err(e.clone()));
                        }
                    }
                    Err(e) => {
                        for tx in txs {
                            let _ = tx.send(Err(e.clone()));
                        }
                    }
                }
            }
        };
        tasks.spawn(flush.in_current_span());
    }
    // no request waits past `within`: it is answered as a lost answer is (the store
    // may still do what was asked; the callers' state machines ask again or settle)
    match tokio::time::timeout(within, &mut rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(Arc::new(StoreError::Unavailable(
            "the request was dropped".into(),
        ))),
        Err(_) => {
            rx.close();
            match rx.try_recv() {
                Ok(r) => r,
                Err(_) => Err(Arc::new(StoreError::Timeout(within))),
            }
        }
    }
}

/// Queues a strict-admission request for `sync`'s store (refused at once while the
/// store is known to fail); batches go out through `send`. The engine's last push waits
/// for the flushes.
pub(super) async fn queue_for_store<R, A, F, Fut>(
    sync: &Arc<NamespaceSync>,
    queue: &Arc<Mutex<Queue<R, A>>>,
    request: R,
    send: F,
) -> Result<A, Arc<StoreError>>
where
    R: Send + 'static,
    A: Send + 'static,
    F: Fn(Arc<NamespaceSync>, Store, Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<A>, Arc<StoreError>>> + Send,
{
    if sync.skipping_store() {
        return Err(Arc::new(StoreError::Unavailable(
            "the store failed lately".into(),
        )));
    }
    let this = sync.clone();
    let send = Arc::new(send);
    let answered = queued(
        queue,
        sync.flushes(),
        sync.answer_within(),
        request,
        move |batch| {
            let (this, send) = (this.clone(), send.clone());
            async move {
                let Some(store) = this.store().cloned() else {
                    return Err(Arc::new(StoreError::Unavailable("no store".into())));
                };
                // requests that queued while the call before them failed: answered at
                // once, not after another store_timeout
                if this.skipping_store() {
                    return Err(Arc::new(StoreError::Unavailable(
                        "the store failed lately".into(),
                    )));
                }
                send(this, store, batch).await
            }
        },
    )
    .await;
    if let Err(e) = &answered {
        // no answer within answer_within (or the store's own timeout): the requests
        // after it are answered at once until a sync reaches the store again
        if matches!(**e, StoreError::Timeout(_)) {
            sync.trip(e);
        }
    }
    answered
}

/// Who asks the store for quota (this run of the node: a restarted node never takes
/// another run's totals for its own) and how many calls it made
/// (`swin_reservations_total`).
#[derive(Debug)]
pub(super) struct StoreCalls {
    pub(super) holder: Holder,
    round_trips: AtomicU64,
}

impl StoreCalls {
    pub(super) fn new(push: &PushId) -> Self {
        StoreCalls {
            holder: Holder::of_run(push),
            round_trips: AtomicU64::new(0),
        }
    }

    pub(super) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Holds of window quota, in one store call.
    pub(super) async fn holds(
        &self,
        sync: &NamespaceSync,
        store: &Store,
        holds: &[Hold],
    ) -> Result<Vec<HoldState>, Arc<StoreError>> {
        let call = store.hold(sync.name(), &self.holder, holds);
        let held = self.call(sync, "holds", holds.len(), call).await?;
        Ok(held.into_iter().map(|h| h.state).collect())
    }

    /// Grants of bucket quota, in one store call.
    pub(super) async fn grants(
        &self,
        sync: &NamespaceSync,
        store: &Store,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, Arc<StoreError>> {
        let call = store.grant(sync.name(), &self.holder, grants);
        self.call(sync, "grants", grants.len(), call).await
    }

    /// One store call: counted, bounded by the store timeout; a failure trips the store.
    async fn call<T>(
        &self,
        sync: &NamespaceSync,
        what: &'static str,
        requests: usize,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Arc<StoreError>> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        match sync.call(call).await {
            Ok(v) => Ok(v),
            Err(e) => {
                warn!(namespace = sync.name(), cause = %e, requests, "{what} failed");
                sync.trip(&e);
                Err(Arc::new(e))
            }
        }
    }
}
