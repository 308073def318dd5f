//! A store wrapper that fails on demand (the `faults` feature, which only tests enable),
//! to test that the engine keeps and retries what it could not push. Every call of the
//! boundary honours the faults (through [`FaultyStore::faulted`], which every call made
//! by `store_calls!` runs): fail before the inner store sees the call, or after it ran
//! (the reply lost: for a push, the hard case for exactly-once).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::Store;
use crate::StoreError;

/// What the next call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without calling the inner store.
    FailBefore,
    /// Call the inner store, then report a failure as if the reply was lost.
    FailAfter,
    /// Call the inner store and answer after this long (a slow store or link).
    Slow(std::time::Duration),
    /// Call the inner store only after this long (a call slow on its way there: calls
    /// sent after it reach the store first).
    Late(std::time::Duration),
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Store,
    plan: Mutex<VecDeque<Fault>>,
    down: AtomicBool,
    /// While set, every call waits for ever (a store that accepts and never answers).
    hanging: AtomicBool,
}

impl FaultyStore {
    /// Wraps `inner` (a store already wrapped: its backend).
    pub fn new(inner: Store) -> Self {
        let inner = match inner {
            Store::Faulty(f) => f.inner.clone(),
            backend => backend,
        };
        FaultyStore {
            inner,
            plan: Mutex::new(VecDeque::new()),
            down: AtomicBool::new(false),
            hanging: AtomicBool::new(false),
        }
    }

    pub fn inner(&self) -> &Store {
        &self.inner
    }

    /// Queues faults for the next calls, one per call, whatever the call.
    pub fn plan(&self, faults: impl IntoIterator<Item = Fault>) {
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(faults);
    }

    /// Drops the faults still queued.
    pub fn clear_plan(&self) {
        self.plan.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// While down, every call fails before reaching the inner store.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// While hanging, every call waits for ever (the caller's timeout ends it).
    pub fn set_hanging(&self, hanging: bool) {
        self.hanging.store(hanging, Ordering::SeqCst);
    }

    fn next_fault(&self) -> Option<Fault> {
        if self.down.load(Ordering::SeqCst) {
            return Some(Fault::FailBefore);
        }
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Runs `call` on the inner store as the next fault says.
    pub(crate) async fn faulted<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if self.hanging.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        match self.next_fault() {
            Some(Fault::FailBefore) => Err(StoreError::Injected),
            Some(Fault::FailAfter) => {
                call.await?;
                Err(StoreError::Injected)
            }
            Some(Fault::Slow(d)) => {
                let answer = call.await;
                tokio::time::sleep(d).await;
                answer
            }
            Some(Fault::Late(d)) => {
                tokio::time::sleep(d).await;
                call.await
            }
            None => call.await,
        }
    }
}
