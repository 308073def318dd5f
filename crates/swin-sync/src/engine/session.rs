//! A namespace's way to its store, apart from what it syncs: the store, the bounds on
//! every call (the store timeout, a request's answer time, the stop deadline), the
//! breaker that has requests answer from memory after a failure, and whether the
//! namespace's totals are still loading from it (warm-up). The sync loop and the request
//! paths reach the store only through it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::store::Store;
use crate::StoreError;

/// How long a request waits for its store unless told otherwise: half a second, so a
/// hung store costs no answer more than that.
pub const DEFAULT_ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// One namespace's store session (see the module's note).
#[derive(Debug)]
pub(crate) struct Session {
    /// `None` exactly when the namespace is local only.
    pub(super) store: Option<Store>,
    /// Where its leases, reservations and idempotency records are kept: its store, or
    /// (local only) the node's memory, made at first use unless carried from the
    /// namespace it replaces ([`super::NamespaceSync::keep_records_of`]).
    pub(super) records: OnceLock<Store>,
    /// Bounds every store call.
    pub(super) timeout: Duration,
    /// The longest a request waits for the store (at most `timeout`): past it, the
    /// request is answered as if the store had failed, and the store call goes on in the
    /// background.
    pub(super) answer_within: Duration,
    /// Set when the node stops: no store call outlasts it, not even one begun before.
    pub(super) stop_by: OnceLock<tokio::time::Instant>,
    /// Wakes the calls under way when `stop_by` is set.
    stopping: tokio::sync::Notify,
    /// The breaker: the store failed lately, so requests answer from local memory at
    /// once instead of each waiting; closed again by the next sync that reaches it.
    open: AtomicBool,
    /// The namespace's totals are still loading from the store (see
    /// [`super::NamespaceSync::warm_up`]): it serves meanwhile, each key read at its first
    /// touch.
    warming: AtomicBool,
}

impl Session {
    pub(super) fn new(store: Option<Store>, timeout: Duration) -> Self {
        let records = OnceLock::new();
        if let Some(store) = &store {
            let _ = records.set(store.clone());
        }
        Session {
            store,
            records,
            timeout,
            answer_within: timeout.min(DEFAULT_ANSWER_WITHIN),
            stop_by: OnceLock::new(),
            stopping: tokio::sync::Notify::new(),
            open: AtomicBool::new(false),
            warming: AtomicBool::new(false),
        }
    }

    /// Whether the namespace's totals are still loading from the store.
    pub(super) fn warming(&self) -> bool {
        self.warming.load(Ordering::Relaxed)
    }

    pub(super) fn set_warming(&self, on: bool) {
        self.warming.store(on, Ordering::Relaxed);
    }

    /// `f`, bounded by the store timeout and the stop deadline (also when the stop
    /// comes while it runs: a shutdown grace shorter than the store timeout still
    /// bounds every call).
    pub(super) async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let until = tokio::time::Instant::now() + self.timeout;
        tokio::select! {
            r = tokio::time::timeout_at(until, f) => r.unwrap_or(Err(StoreError::Timeout(self.timeout))),
            () = self.stopped() => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Sets the stop deadline (the first one set holds) and tells the calls under way.
    pub(super) fn stop_by(&self, deadline: tokio::time::Instant) {
        let _ = self.stop_by.set(deadline);
        self.stopping.notify_waiters();
    }

    /// Done at the stop deadline, once one is set.
    async fn stopped(&self) {
        loop {
            let told = self.stopping.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if let Some(d) = self.stop_by.get() {
                tokio::time::sleep_until(*d).await;
                return;
            }
            told.await;
        }
    }

    /// `f` for a request: [`Self::call`], bounded by `answer_within` as well (a
    /// timeout, as a store that answers late is to every caller).
    pub(super) async fn call_for_request<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.answer_within, self.call(f)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.answer_within)),
        }
    }

    /// Whether requests skip the store for now (the breaker is open).
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Opens the breaker after `e`, if it is a failure that may pass; true when it was
    /// closed until now.
    pub(super) fn trip(&self, e: &StoreError) -> bool {
        e.is_transient() && !self.open.swap(true, Ordering::Relaxed)
    }

    /// Closes the breaker (a sync reached the store); true when it was open.
    pub(super) fn close(&self) -> bool {
        self.open.swap(false, Ordering::Relaxed)
    }
}
