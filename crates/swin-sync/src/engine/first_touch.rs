//! First touch: a node asked about a key it holds nothing for (no window of any table,
//! no bucket) reads what the store holds for it before it answers, so that a read, a dry
//! run, a decision or an increment on a node that never saw the key answers with the
//! cluster's count, not with the node's own zero.
//!
//! Loads are coalesced per key (a key already asked for waits for that read) and batched
//! per store call (keys that arrive while a read is in flight go together in the next
//! one). A caller waits `store_timeout` at most, in all (a read in flight before its own
//! included); when the store cannot answer in time it goes on with what the node knows,
//! and the fallback is counted ([`NamespaceSync::first_touches`]). A read that lands
//! later fills only keys still not held: a key counted meanwhile holds newer news (a sync
//! may have pushed it and brought the store's total back), and the next sync brings the
//! rest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use swin_core::{CompactString, UnixMs};
use tokio::sync::oneshot;

use super::periodic::READ_CHUNK;
use super::NamespaceSync;
use crate::store::{Store, WindowKey};
use crate::StoreError;

/// Told whether the key was read.
type Waiters = Vec<oneshot::Sender<bool>>;

#[derive(Debug, Default)]
struct Queue {
    /// Keys asked for and not sent yet.
    waiting: HashMap<CompactString, Waiters>,
    /// Keys of the read in flight: a caller asking for one of them waits for it.
    sending: HashMap<CompactString, Waiters>,
    /// A task is reading; new keys only queue.
    flushing: bool,
}

/// The first-touch loads of one namespace.
#[derive(Debug, Default)]
pub(super) struct FirstTouch {
    queue: Mutex<Queue>,
    /// Keys read from the store before an answer.
    loads: AtomicU64,
    /// Keys answered from local knowledge because the store did not answer in time.
    fallbacks: AtomicU64,
}

/// Keys per load at most; a load reads them in calls of READ_CHUNK windows, all at once.
const LOAD_BATCH: usize = 50_000;

impl NamespaceSync {
    /// Before answering about `keys`: reads those this node holds nothing for from the
    /// store (see the module's documentation). Returns at once when every key is held,
    /// when the namespace has no store, or while the store is known to be failing.
    pub async fn first_touch(self: &Arc<Self>, keys: &[&str]) {
        if self.session.store.is_none() || self.skipping_store() {
            return;
        }
        // the common case, every key held, takes no lock (this runs on every request)
        if keys.iter().all(|k| self.holds(k)) {
            return;
        }
        let mut receivers = Vec::new();
        let lead = {
            let mut q = self.first.queue.lock().unwrap_or_else(|p| p.into_inner());
            for &key in keys {
                if self.holds(key) {
                    continue;
                }
                let (tx, rx) = oneshot::channel();
                match q.sending.get_mut(key) {
                    Some(w) => w.push(tx),
                    None => q.waiting.entry(key.into()).or_default().push(tx),
                }
                receivers.push(rx);
            }
            !receivers.is_empty() && !std::mem::replace(&mut q.flushing, true)
        };
        if lead {
            let this = self.clone();
            // under the leading request's span: the read is its child
            self.flushes
                .spawn(tracing::Instrument::in_current_span(async move {
                    this.load_waiting().await
                }));
        }
        // no caller waits longer than answer_within in all, even behind a read in
        // flight: past it, it answers from what the node knows (the read still lands)
        let until = tokio::time::Instant::now() + self.session.answer_within;
        let (mut late, mut timed_out) = (0, false);
        for rx in receivers {
            match tokio::time::timeout_at(until, rx).await {
                Ok(Ok(true)) => {}
                Ok(_) => late += 1,
                Err(_) => {
                    late += 1;
                    timed_out = true;
                }
            }
        }
        if timed_out {
            // the store is slow: later requests do not wait for it again until a sync
            // reaches it
            self.trip(&crate::StoreError::Timeout(self.session.answer_within));
        }
        if late > 0 {
            self.first.fallbacks.fetch_add(late, Ordering::Relaxed);
        }
    }

    /// First-touch loads: keys read from the store before an answer, and keys answered
    /// from local knowledge because the store did not answer in time.
    pub fn first_touches(&self) -> (u64, u64) {
        (
            self.first.loads.load(Ordering::Relaxed),
            self.first.fallbacks.load(Ordering::Relaxed),
        )
    }

    /// Whether every one of `keys` is held (no first touch to wait for): a check with no
    /// lock and no future, for a request's fast path.
    pub fn holds_all(&self, keys: &[&str]) -> bool {
        keys.iter().all(|k| self.holds(k))
    }

    /// Whether any table or the buckets hold `key`.
    pub(super) fn holds(&self, key: &str) -> bool {
        self.counters.tables().iter().any(|t| t.contains(key))
            || (self.buckets && self.counters.buckets().contains(key))
    }

    /// Reads what waits, a batch at a time, until nothing does.
    async fn load_waiting(self: Arc<Self>) {
        let Some(store) = self.session.store.clone() else {
            return;
        };
        loop {
            let keys: Vec<CompactString> = {
                let mut q = self.first.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.waiting.is_empty() {
                    q.flushing = false;
                    return;
                }
                let keys: Vec<CompactString> = q.waiting.keys().take(LOAD_BATCH).cloned().collect();
                for k in &keys {
                    if let Some(w) = q.waiting.remove(k) {
                        q.sending.insert(k.clone(), w);
                    }
                }
                keys
            };
            let result = self.load(&store, &keys, super::now()).await;
            match &result {
                Ok(()) => {
                    self.first
                        .loads
                        .fetch_add(keys.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(namespace = self.name(), cause = %e, keys = keys.len(), "first touch: the store did not answer; answering from this node");
                }
            }
            let mut q = self.first.queue.lock().unwrap_or_else(|p| p.into_inner());
            for k in &keys {
                for tx in q.sending.remove(k).unwrap_or_default() {
                    let _ = tx.send(result.is_ok());
                }
            }
        }
    }

    /// The store calls for `keys`, all at once: their current and previous windows in
    /// every table, and their buckets. What the store holds becomes the node's synced
    /// count; a key it does not hold stays unheld (the node counts it from zero).
    async fn load(
        &self,
        store: &Store,
        keys: &[CompactString],
        now: UnixMs,
    ) -> Result<(), StoreError> {
        let wanted = self.windows_of(keys, now);
        let sent = self.fresh.next();
        let reads = wanted
            .chunks(READ_CHUNK)
            .map(|chunk| self.call(store.read(self.name(), chunk)));
        // applied as one read: a key's windows may come in different calls
        let (mut read, mut failed) = (Vec::new(), None);
        for totals in futures_util::future::join_all(reads).await {
            match totals {
                Ok(totals) => read.extend(totals),
                Err(e) => failed = Some(e),
            }
        }
        // what a table holds by now was counted or read since this read was sent
        self.apply_first_read(&read, now, sent);
        if let Some(e) = failed {
            return Err(e);
        }
        if self.buckets {
            let reads = keys
                .chunks(READ_CHUNK)
                .map(|chunk| self.call(store.read_tats(self.name(), chunk)));
            for tats in futures_util::future::join_all(reads).await {
                self.counters.buckets().apply(&tats?, true);
            }
        }
        Ok(())
    }

    /// The current and previous windows of `keys` in every table: what a node reads of
    /// a key it did not hold (a first touch, a refund).
    pub(super) fn windows_of(&self, keys: &[CompactString], now: UnixMs) -> Vec<WindowKey> {
        self.counters
            .window_sizes()
            .flat_map(|size| {
                keys.iter().flat_map(move |key| {
                    [size.start_of(now), size.previous_start_of(now)].map(|start| WindowKey {
                        key: key.clone(),
                        window_size: size.secs(),
                        window_start: start,
                    })
                })
            })
            .collect()
    }
}
