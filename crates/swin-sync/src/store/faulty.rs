//! A store wrapper that fails on demand, to test that the engine keeps and retries
//! diffs: fail before the inner store sees a push, or after it applied it (the reply
//! lost, the hard case for exactly-once).

use std::collections::VecDeque;
use std::sync::Mutex;

use swin_core::{Tat, Total};

use super::{Push, Pushed, Store, TatPush, WindowKey};
use crate::StoreError;

/// What the next call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without calling the inner store.
    FailBefore,
    /// Call the inner store, then report a failure as if the reply was lost.
    FailAfter,
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Store,
    plan: Mutex<VecDeque<Fault>>,
    down: std::sync::atomic::AtomicBool,
}

impl FaultyStore {
    pub fn new(inner: Store) -> Self {
        FaultyStore {
            inner,
            plan: Mutex::new(VecDeque::new()),
            down: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn inner(&self) -> &Store {
        &self.inner
    }

    /// Queues faults for the next pushes and reads, one per call.
    pub fn plan(&self, faults: impl IntoIterator<Item = Fault>) {
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(faults);
    }

    /// While down, every call fails before reaching the inner store.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    fn next_fault(&self) -> Option<Fault> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Some(Fault::FailBefore);
        }
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    pub(crate) async fn push(&self, ns: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        match self.next_fault() {
            Some(Fault::FailBefore) => Err(StoreError::Injected),
            Some(Fault::FailAfter) => {
                self.inner.push(ns, push).await?;
                Err(StoreError::Injected)
            }
            None => self.inner.push(ns, push).await,
        }
    }

    pub(crate) async fn push_tats(
        &self,
        ns: &str,
        push: TatPush<'_>,
    ) -> Result<Vec<Tat>, StoreError> {
        match self.next_fault() {
            Some(Fault::FailBefore) => Err(StoreError::Injected),
            Some(Fault::FailAfter) => {
                self.inner.push_tats(ns, push).await?;
                Err(StoreError::Injected)
            }
            None => self.inner.push_tats(ns, push).await,
        }
    }

    pub(crate) async fn read(
        &self,
        ns: &str,
        keys: &[WindowKey],
    ) -> Result<Vec<Total>, StoreError> {
        match self.next_fault() {
            Some(_) => Err(StoreError::Injected),
            None => self.inner.read(ns, keys).await,
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Injected);
        }
        self.inner.ping().await
    }
}
