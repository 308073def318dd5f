//! Limits set per key at run time (`PUT …/keys/{key}/limits`): kept in the namespace's
//! store, held by a node only for the keys it serves.
//!
//! A node reads a key's runtime limits the first time it is asked about the key (with
//! the first touch of its counts, in one store call for all the keys of a request) and
//! remembers the answer, "none" included, while it serves the key: a node serving ten
//! thousand keys holds ten thousand entries whatever the store holds. A watcher per
//! namespace asks the store which keys changed since it last asked — every sync period,
//! or every [`QUICK_WATCH`] for namespaces whose hits wait on the store — and reads
//! those it holds again; when that read fails they keep what was last read and the
//! same changes are asked for again next round, so a store outage never leaves a key
//! under the config's limits that had runtime ones. It also forgets the keys the node no
//! longer serves. A namespace without a store keeps its runtime limits on this node only.
//!
//! A read that started before a change and lands after the watcher saw it is not kept
//! (the entries' generation moved) but made again: a node never keeps limits older than a
//! change it saw, and the request that read them decides under the fresh read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::StoredLimit;
use swin_sync::NamespaceSync;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::policy::algorithm::Algorithm;
use crate::policy::limits::{KeyLimits, RawKeyLimits};

/// How often namespaces whose hits wait on the store (synchronous, strict) ask for
/// changes.
pub const QUICK_WATCH: Duration = Duration::from_millis(50);

/// Reads of a request's keys before it gives up waiting for a read no change overtook.
const READS: usize = 4;

/// How often the watcher forgets the keys the node no longer serves.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// A key's runtime limits, validated for its namespace.
#[derive(Debug)]
pub(crate) struct RuntimeLimit {
    /// The limits, in the namespace's algorithm.
    pub(crate) limits: KeyLimits,
    /// As the store keeps them (who set them, when, until when).
    pub(crate) stored: StoredLimit,
}

#[derive(Debug, Clone)]
enum Cached {
    /// The store holds none for the key.
    Absent,
    Set(Arc<RuntimeLimit>),
}

/// The limits a key is decided against: the config's, or its runtime limits.
#[derive(Debug, Clone)]
pub(crate) enum Effective<'a> {
    /// The config's limits for the key (none set at run time).
    Config(&'a KeyLimits),
    /// Limits set at run time, in force for the key.
    Runtime(Arc<RuntimeLimit>),
}

impl std::ops::Deref for Effective<'_> {
    type Target = KeyLimits;
    fn deref(&self) -> &KeyLimits {
        match self {
            Effective::Config(l) => l,
            Effective::Runtime(r) => &r.limits,
        }
    }
}

/// One namespace's runtime limits on this node (shared by the namespace's versions
/// across reloads that keep its counters).
#[derive(Debug, Default)]
pub struct RuntimeLimits {
    entries: papaya::HashMap<String, Cached>,
    /// Entries that hold limits: while there is none, a lookup costs one atomic load.
    set: AtomicUsize,
    /// Moves whenever the watcher forgets keys: a read that began before it is not kept.
    generation: AtomicU64,
    /// The store's change cursor this node has read up to.
    cursor: Mutex<Option<String>>,
    changes_seen: AtomicU64,
    /// The namespace's algorithm, whose shape stored limits are read in.
    algorithm: Mutex<Algorithm>,
}

impl RuntimeLimits {
    /// The key's runtime limits, if it has live ones this node knows of.
    pub fn get(&self, key: &str, now: UnixMs) -> Option<Arc<RuntimeLimit>> {
        if self.set.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.entries.pin().get(key) {
            Some(Cached::Set(r)) if r.stored.live_at(now) => Some(r.clone()),
            _ => None,
        }
    }

    /// What `key` is decided against: its runtime limits, else `config`. (The clock is
    /// read only for limits that lapse.)
    pub fn effective<'a>(&self, key: &str, config: &'a KeyLimits) -> Effective<'a> {
        if self.set.load(Ordering::Relaxed) == 0 {
            return Effective::Config(config);
        }
        match self.entries.pin().get(key) {
            Some(Cached::Set(r)) if r.stored.expires_at.is_none_or(|t| t > swin_sync::now()) => {
                Effective::Runtime(r.clone())
            }
            _ => Effective::Config(config),
        }
    }

    fn insert(&self, key: String, value: Cached) {
        let is_set = matches!(value, Cached::Set(_));
        let old = self.entries.pin().insert(key, value).cloned();
        let was_set = matches!(old, Some(Cached::Set(_)));
        match (was_set, is_set) {
            (false, true) => {
                self.set.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.set.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn forget(&self, key: &str) {
        if let Some(Cached::Set(_)) = self.entries.pin().remove(key) {
            self.set.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Keeps limits this node just set or removed (the writer applies them at once).
    pub fn remember(&self, key: &str, limit: Option<RuntimeLimit>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let value = limit.map_or(Cached::Absent, |l| Cached::Set(Arc::new(l)));
        self.insert(key.to_owned(), value);
    }

    /// Forgets every entry (the namespace's limits changed shape on a reload, or the
    /// store's log no longer reaches back to this node's cursor).
    pub fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.entries.pin().clear();
        self.set.store(0, Ordering::Relaxed);
    }

    /// This node's live runtime limits in key order after `after`, at most `count` (a
    /// namespace without a store, where this node holds them all).
    pub fn list(&self, after: Option<&str>, count: usize, now: UnixMs) -> Vec<StoredLimit> {
        let mut out: Vec<StoredLimit> = self
            .entries
            .pin()
            .iter()
            .filter_map(|(k, v)| match v {
                Cached::Set(r) if r.stored.live_at(now) && after.is_none_or(|a| k.as_str() > a) => {
                    Some(r.stored.clone())
                }
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.truncate(count);
        out
    }

    /// Whether this node holds what the store says of every one of `keys` (limits, or
    /// none): nothing for a first touch to read.
    pub fn holds_all(&self, keys: &[&str]) -> bool {
        let entries = self.entries.pin();
        keys.iter().all(|k| entries.contains_key(*k))
    }

    /// Before a request decides `keys`: reads the runtime limits of those this node
    /// holds nothing for, in one store call, bounded by the store timeout. When the
    /// store cannot answer (or is known to be failing) the keys go on under the config's
    /// limits and are asked about again by the next request.
    pub async fn first_touch(&self, sync: &NamespaceSync, keys: &[&str]) {
        if !sync.keeps_limits_in_store() {
            return;
        }
        let missing: Vec<&str> = {
            let entries = self.entries.pin();
            keys.iter()
                .copied()
                .filter(|k| !entries.contains_key(*k))
                .collect()
        };
        if missing.is_empty() || sync.store_failing() {
            return;
        }
        if self
            .cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
        {
            // the watcher has not read the store's change cursor yet: a change between
            // this read and that cursor would go unseen, so nothing is kept until then
            return;
        }
        if let Err(e) = self
            .read_and_keep(sync, &missing, || sync.read_limits(&missing))
            .await
        {
            debug!(namespace = sync.name(), cause = %e, "runtime limits not read; the config's apply");
            sync.store_failed(&e);
        }
    }

    /// Reads `keys` with `read` and keeps the answer. When the watcher forgot keys while
    /// a read was out, what it read may predate a change: the keys are forgotten and read
    /// again (at most [`READS`] times, then left for the next request to read), so the
    /// request that reads them decides under what it read, never under the config's
    /// limits for want of a quiet moment.
    async fn read_and_keep<F, R>(
        &self,
        sync: &NamespaceSync,
        keys: &[&str],
        read: F,
    ) -> Result<(), swin_sync::StoreError>
    where
        F: Fn() -> R,
        R: std::future::Future<Output = Result<Vec<StoredLimit>, swin_sync::StoreError>>,
    {
        for _ in 0..READS {
            let generation = self.generation.load(Ordering::SeqCst);
            let answer = read().await?;
            self.keep(sync, &answer, keys);
            // the watcher bumps the generation before it forgets: either it forgets
            // these entries after this keep, or this check sees it
            if self.generation.load(Ordering::SeqCst) == generation {
                return Ok(());
            }
            for &key in keys {
                self.forget(key);
            }
        }
        Ok(())
    }

    /// The runtime limits of a namespace of `algorithm`.
    pub fn for_algorithm(algorithm: Algorithm) -> Self {
        RuntimeLimits {
            algorithm: Mutex::new(algorithm),
            ..RuntimeLimits::default()
        }
    }

    /// The namespace's algorithm changed (a reload): stored limits are read in its shape.
    pub fn set_algorithm(&self, algorithm: Algorithm) {
        *self.algorithm.lock().unwrap_or_else(|p| p.into_inner()) = algorithm;
    }

    /// Keeps what the store answered for `keys` (each key's limits, or none).
    fn keep(&self, sync: &NamespaceSync, read: &[StoredLimit], keys: &[&str]) {
        let algorithm = *self.algorithm.lock().unwrap_or_else(|p| p.into_inner());
        let sizes: Vec<_> = sync.counters().window_sizes().collect();
        for &key in keys {
            let value = match read.iter().find(|l| l.key == key) {
                None => Cached::Absent,
                Some(stored) => match parse(stored, algorithm, &sizes) {
                    Some(limits) => Cached::Set(Arc::new(RuntimeLimit {
                        limits,
                        stored: stored.clone(),
                    })),
                    None => {
                        warn!(
                            namespace = sync.name(),
                            key,
                            "stored runtime limits this namespace cannot hold; the config's apply"
                        );
                        Cached::Absent
                    }
                },
            };
            self.insert(key.to_owned(), value);
        }
    }

    /// Asks the store for changes and reads the changed keys it holds again at once;
    /// forgets everything when the store's log no longer reaches back. Returns the keys
    /// changed.
    pub async fn catch_up(&self, sync: &NamespaceSync) -> Result<usize, swin_sync::StoreError> {
        let since = self
            .cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let changes = sync.limit_changes(since.as_deref()).await?;
        self.apply_changes(sync, changes, |keys| async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            sync.read_limits(&keys).await
        })
        .await
    }

    /// Applies `changes`, reading the changed keys this node holds with `read`. When
    /// that read fails the keys keep the limits last read and the cursor stays, so the
    /// next round reads the same changes again: while the store is away a key is
    /// decided under the last limits this node read for it, not under the config's.
    async fn apply_changes<F, R>(
        &self,
        sync: &NamespaceSync,
        changes: swin_sync::store::LimitChanges,
        read: F,
    ) -> Result<usize, swin_sync::StoreError>
    where
        F: FnOnce(Vec<String>) -> R,
        R: std::future::Future<Output = Result<Vec<StoredLimit>, swin_sync::StoreError>>,
    {
        let changed = if !changes.complete {
            let n = self.entries.len();
            self.forget_all();
            n
        } else if changes.keys.is_empty() {
            0
        } else {
            // the generation moves before the held keys are listed: a request's read
            // kept before the listing is read again here; one kept after it sees the
            // generation moved and reads again itself
            let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
            let held: Vec<String> = {
                let entries = self.entries.pin();
                changes
                    .keys
                    .iter()
                    .filter(|k| entries.contains_key(k.as_str()))
                    .cloned()
                    .collect()
            };
            // read again here, where the store has just answered: a request right after
            // need not (and, while the namespace is still marked failing after an
            // outage, would not) read them, and would decide under the config's limits
            let read = read(held.clone()).await?;
            let keys: Vec<&str> = held.iter().map(String::as_str).collect();
            self.keep(sync, &read, &keys);
            if self.generation.load(Ordering::SeqCst) != generation {
                // another change meanwhile (this node set one): read on next touch
                for k in &keys {
                    self.forget(k);
                }
            }
            self.changes_seen
                .fetch_add(changes.keys.len() as u64, Ordering::Relaxed);
            changes.keys.len()
        };
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = Some(changes.cursor);
        Ok(changed)
    }

    /// Forgets the entries of keys the node no longer serves, and lapsed limits.
    pub fn sweep(&self, sync: &NamespaceSync, now: UnixMs) {
        let stale: Vec<String> = self
            .entries
            .pin()
            .iter()
            .filter(|(k, v)| match v {
                Cached::Set(r) if !r.stored.live_at(now) => true,
                _ => sync.keeps_limits_in_store() && !sync.serves(k),
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.forget(&k);
        }
    }
}

/// Stored limits read back as the namespace's limits; `None` when it cannot hold them
/// (its window sizes or algorithm changed since they were set).
pub fn parse(
    stored: &StoredLimit,
    algorithm: Algorithm,
    sizes: &[swin_core::WindowSize],
) -> Option<KeyLimits> {
    let raw: RawKeyLimits = serde_json::from_str(&stored.limits).ok()?;
    raw.validate(algorithm, sizes).ok()
}

/// Keeps a namespace's runtime limits current until `cancel`: catches up with the
/// store's changes every `period` and sweeps every `SWEEP_EVERY` (10 s).
pub async fn watch(
    limits: Arc<RuntimeLimits>,
    sync: Arc<NamespaceSync>,
    period: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sweep = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if sync.keeps_limits_in_store() {
            match limits.catch_up(&sync).await {
                Ok(n) => {
                    if n > 0 {
                        debug!(namespace = sync.name(), keys = n, "runtime limits changed");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        warn!(namespace = sync.name(), cause = %e, "runtime limit changes not read; retrying");
                    }
                    failing = true;
                }
            }
        }
        if last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = tokio::time::Instant::now();
            limits.sweep(&sync, swin_sync::now());
        }
    }
}

#[cfg(test)]
mod tests;
