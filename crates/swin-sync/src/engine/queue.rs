//! Strict admission's store calls: holds and grants wait in a queue; the first to queue
//! starts a flush, which sends what waits in batches until nothing does, so requests of
//! many keys share calls. A store known to fail lately is not asked again at once.

use std::sync::{Arc, Mutex};

use super::NamespaceSync;
use crate::store::Store;
use crate::StoreError;

/// Requests per store call at most.
const BATCH: usize = 1_000;

/// Where a request's answer goes.
type Answer<A> = tokio::sync::oneshot::Sender<Result<A, Arc<StoreError>>>;

/// Requests (holds, reservations) waiting for the next store call: the first to queue
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
    request: R,
    send: F,
) -> Result<A, Arc<StoreError>>
where
    R: Send + 'static,
    A: Send + 'static,
    F: Fn(Vec<R>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<A>, Arc<StoreError>>> + Send,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let lead = {
        let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
        q.waiting.push((request, tx));
        !std::mem::replace(&mut q.flushing, true)
    };
    if lead {
        let queue = queue.clone();
        tasks.spawn(async move {
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
        });
    }
    match rx.await {
        Ok(r) => r,
        Err(_) => Err(Arc::new(StoreError::Unavailable(
            "the request was dropped".into(),
        ))),
    }
}

impl NamespaceSync {
    /// Queues a strict-admission request for the store (refused at once while the store
    /// is known to fail); batches go out through `send`.
    pub(super) async fn queue_for_store<R, A, F, Fut>(
        self: &Arc<Self>,
        queue: &Arc<Mutex<Queue<R, A>>>,
        request: R,
        send: F,
    ) -> Result<A, Arc<StoreError>>
    where
        R: Send + 'static,
        A: Send + 'static,
        F: Fn(Arc<Self>, Store, Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Vec<A>, Arc<StoreError>>> + Send,
    {
        if self.skipping_store() {
            return Err(Arc::new(StoreError::Unavailable(
                "the store failed lately".into(),
            )));
        }
        let this = self.clone();
        let send = Arc::new(send);
        queued(queue, &self.flushes, request, move |batch| {
            let (this, send) = (this.clone(), send.clone());
            async move {
                let Some(store) = this.store.clone() else {
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
        })
        .await
    }
}
