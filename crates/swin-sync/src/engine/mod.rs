//! The sync engine of one namespace: the three sync modes, the periodic timer, retries
//! with backoff, exactly-once pushes and the final push on shutdown. [`NamespaceSync`]
//! composes three parts, each one type: its store session (`session`: the store, the
//! bounds on every call, the breaker, the warm-up flag), its loop (`sync_loop`: the timer
//! that pushes and fetches, the syncs asked for, what rounds queue) and strict admission's
//! quota (`quota`: the loop has it return what is unused). By concern besides:
//! `periodic` (one sync round), `synchronous` (increments through the store), `gcra`
//! (buckets), `status` (health and the duration histogram), `first_touch` (a key this
//! node holds nothing for is read from the store before an answer), `stopping` (the last
//! push and what a stopped engine hands back); this file holds the handle and reset.

mod blocking;
mod demands;
mod first_touch;
mod fresh;
mod gcra;
mod idempotency;
mod leases;
mod limits;
mod owed;
mod pace;
mod periodic;
mod quota;
mod reach;
mod reservations;
mod round_trips;
mod rows;
mod session;
mod status;
mod stopping;
mod sync_loop;
mod synchronous;
mod taken;

use self::blocking::off_runtime;
pub use self::quota::QuotaKeeper;
use self::quota::StrictQuota;
use self::session::Session;
pub use self::status::{SyncStatus, SYNC_BUCKETS_SECS};
use self::sync_loop::SyncLoop;
use self::synchronous::SyncQueue;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use swin_core::{NamespaceCounters, UnixMs};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::Store;
use crate::StoreError;

/// Whether applying totals may add keys the table does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Create {
    Yes,
    No,
    /// Only keys the table does not hold: a first touch's read, which may land after
    /// the key was counted (its caller stopped waiting) and a sync brought newer totals.
    Absent,
}

/// How a namespace meets the store (Kong's `sync_rate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyncMode {
    /// `sync_rate > 0`: push and fetch every period.
    Periodic(Duration),
    /// `sync_rate == 0`: every increment goes to the store and reads its totals back.
    Synchronous,
    /// `sync_rate < 0`: no store at all.
    LocalOnly,
}

impl SyncMode {
    /// From a `sync_rate` in seconds. `None` for a non-finite rate.
    pub fn from_rate(secs: f64) -> Option<Self> {
        if !secs.is_finite() {
            None
        } else if secs > 0.0 {
            Some(SyncMode::Periodic(Duration::from_secs_f64(secs.max(0.001))))
        } else if secs == 0.0 {
            Some(SyncMode::Synchronous)
        } else {
            Some(SyncMode::LocalOnly)
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            SyncMode::Periodic(_) => "periodic",
            SyncMode::Synchronous => "synchronous",
            SyncMode::LocalOnly => "local",
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SyncReport {
    /// Windows pushed (key × window).
    pub pushed: usize,
    /// Totals read back and applied.
    pub fetched: usize,
    pub duration_ms: f64,
}

#[derive(Debug)]
pub struct NamespaceSync {
    counters: Arc<NamespaceCounters>,
    mode: SyncMode,
    /// Its store, and the bounds and breaker on every call to it.
    session: Session,
    node_id: crate::PushId,
    /// The namespace keeps GCRA buckets (warm-up loads them too).
    buckets: bool,
    /// Synchronous increments waiting for the next round trip.
    sync_queue: Mutex<SyncQueue>,
    /// Synchronous increments answered before their round trip ended.
    late: synchronous::LateTrips,
    /// Synchronous round trips' numbers, and those whose outcome the store did not tell.
    owed: Mutex<owed::Owed>,
    /// The tasks that send them: the engine's last push waits for them.
    flushes: tokio_util::task::TaskTracker,
    /// The timer that pushes and fetches, and what its rounds queue.
    rounds: SyncLoop,
    status: Mutex<SyncStatus>,
    /// Strict admission's quota (none unless the namespace admits strictly): the loop
    /// has it return what is unused.
    strict: StrictQuota,
    /// Keys this node holds nothing for, read from the store before an answer.
    first: first_touch::FirstTouch,
    /// Keys applied from counting and holding calls' answers since the last tick began:
    /// a sync's totals read before them leave them.
    fresh: Arc<fresh::Fresh>,
}

pub use self::session::DEFAULT_ANSWER_WITHIN;

pub(crate) fn nanos(now: UnixMs) -> i64 {
    now.0.saturating_mul(1_000_000)
}

/// The cluster's time: the one place the node and the engine read it (swin-core takes
/// time as an argument). The node's wall clock, corrected to the store's (see
/// [`crate::clock`]).
pub fn now() -> UnixMs {
    crate::clock::clock().now()
}

impl NamespaceSync {
    /// `store` must be `Some` unless `mode` is [`SyncMode::LocalOnly`]; `timeout` bounds
    /// every store call.
    pub fn new(
        counters: Arc<NamespaceCounters>,
        mode: SyncMode,
        store: Option<Store>,
        node_id: crate::PushId,
        timeout: Duration,
    ) -> Self {
        let store = if mode == SyncMode::LocalOnly {
            None
        } else {
            store
        };
        NamespaceSync {
            counters,
            mode,
            session: Session::new(store, timeout),
            buckets: false,
            sync_queue: Mutex::new(SyncQueue::default()),
            late: synchronous::LateTrips::default(),
            owed: Mutex::default(),
            flushes: tokio_util::task::TaskTracker::new(),
            rounds: SyncLoop::default(),
            status: Mutex::new(SyncStatus::default()),
            strict: StrictQuota::default(),
            node_id,
            first: first_touch::FirstTouch::default(),
            fresh: Arc::default(),
        }
    }

    /// A namespace of GCRA buckets: warm-up loads its buckets from the store.
    pub fn with_buckets(mut self) -> Self {
        self.buckets = true;
        self
    }

    /// The tasks that send store calls for requests: the last push waits for them.
    pub(crate) fn flushes(&self) -> &tokio_util::task::TaskTracker {
        &self.flushes
    }

    pub fn name(&self) -> &str {
        self.counters.name()
    }

    pub fn counters(&self) -> &Arc<NamespaceCounters> {
        &self.counters
    }

    pub fn mode(&self) -> SyncMode {
        self.mode
    }

    pub fn store(&self) -> Option<&Store> {
        self.session.store.as_ref()
    }

    /// Where the namespace's leases, reservations and idempotency records are kept: its
    /// store, or the node's memory ([`Store::Memory`]) for a local-only namespace.
    pub(crate) fn records(&self) -> &Store {
        self.session.records.get_or_init(|| {
            let max = self.counters.max_counters();
            Store::Memory(Arc::new(crate::store::MemoryStore::new(max)))
        })
    }

    /// The node's memory that keeps the namespace's leases, reservations and idempotency
    /// records (a local-only namespace); `None` for a namespace with a store.
    pub fn memory(&self) -> Option<&crate::store::MemoryStore> {
        match self.records() {
            Store::Memory(m) => Some(m),
            _ => None,
        }
    }

    /// Whether every node sees the namespace's leases, reservations and idempotency
    /// records (they are its store's, not this node's memory).
    pub fn records_shared(&self) -> bool {
        self.session.store.is_some()
    }

    /// Keeps the leases, reservations and idempotency records of `old`, the namespace this
    /// one replaces, where both keep them in the node's memory (a rebuilt local-only
    /// namespace: a new table would let a limit's worth more in, and run retries again);
    /// a store keeps its own. Before the namespace serves.
    pub fn keep_records_of(&self, old: &NamespaceSync) {
        if self.session.store.is_none() && old.session.store.is_none() {
            // the old one's table made now if it has none yet: it serves until it is
            // retired, and what it takes meanwhile must be in the table this one keeps
            let kept = old.records().clone();
            let set = self.session.records.set(kept);
            debug_assert!(set.is_ok(), "records kept before the namespace served");
        }
    }

    /// The identity this engine pushes under: unique to the engine, so a namespace
    /// rebuilt by a reload never reuses a `(push_id, namespace, seq)` the store has seen.
    pub fn push_id(&self) -> &crate::PushId {
        &self.node_id
    }

    /// Whether the namespace answers with the cluster's counts: it has reached its
    /// store once, and not longer ago than `max(3 × sync period, store_timeout + 1 s)`
    /// (synchronous and local-only engines tick every second). `Err` says why not.
    pub fn readiness(&self, now: UnixMs) -> Result<(), String> {
        if self.session.store.is_none() {
            return Ok(());
        }
        let period = match self.mode {
            SyncMode::Periodic(p) => p,
            SyncMode::Synchronous | SyncMode::LocalOnly => Duration::from_secs(1),
        };
        let limit = (3 * period).max(self.session.timeout + Duration::from_secs(1));
        let st = self.status();
        let Some(last) = st.last_success_ms else {
            return Err(match st.degraded {
                Some(why) => format!("has not reached its store yet: {why}"),
                None => "has not reached its store yet".into(),
            });
        };
        let ago = Duration::from_millis(u64::try_from(now.0 - last).unwrap_or(0));
        if ago > limit {
            return Err(match st.degraded {
                Some(why) => format!(
                    "last reached its store {:.1} s ago: {why}",
                    ago.as_secs_f64()
                ),
                None => format!("last reached its store {:.1} s ago", ago.as_secs_f64()),
            });
        }
        Ok(())
    }

    pub fn status(&self) -> SyncStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Bounds every store call of this engine by `deadline` as well as by its timeout,
    /// and makes the last push try until then: a stopping node gives each namespace
    /// the same time, all at once, and whatever is still unconfirmed at the deadline is
    /// taken (see [`NamespaceSync::take_unconfirmed`]) while there is time to spool it.
    /// Only a store call is cut short, never a drain: the diffs of a call cut short stay
    /// queued under their sequence numbers.
    pub fn stop_by(&self, deadline: tokio::time::Instant) {
        self.session.stop_by(deadline);
    }

    /// A request waits for its store at most `d` (and never past the store timeout):
    /// then it is answered as the namespace says for a failed store, while the store
    /// call goes on in the background and lands as a late answer would.
    pub fn answering_within(mut self, d: Duration) -> Self {
        self.session.answer_within = d.min(self.session.timeout);
        self
    }

    /// How long a request waits for the store (see [`Self::answering_within`]).
    pub fn answer_within(&self) -> Duration {
        self.session.answer_within
    }

    /// The longest one store call waits (`store_timeout`).
    pub fn store_timeout(&self) -> Duration {
        self.session.timeout
    }

    /// A store call a request waits for: [`Self::call`], bounded by
    /// [`Self::answer_within`]. Dropped past it (a timeout, as a store that answers
    /// late is to every caller).
    pub(crate) async fn call_for_request<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let r = self.session.call_for_request(f).await;
        if let Err(e @ StoreError::Timeout(_)) = &r {
            self.trip(e);
        }
        r
    }

    /// A store call its caller waits for at most `within` (and the store timeout).
    pub(crate) async fn call_within<T>(
        &self,
        within: Duration,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(within, self.call(f)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    pub(crate) async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.session.call(f).await
    }

    /// A sync asked for over the API. Requests that arrive while one runs wait for it
    /// and share its outcome: a burst of them costs the store one scan, not one each.
    pub async fn sync_requested(&self, now: UnixMs) -> Result<SyncReport, Arc<StoreError>> {
        self.rounds.requested(self, now).await
    }

    /// The store a request goes to: in synchronous mode, while the store has not failed
    /// lately (the session's breaker); `None` means "decide and count locally".
    pub(super) fn store_for_requests(&self) -> Option<&Store> {
        match (&self.mode, &self.session.store) {
            (SyncMode::Synchronous, Some(store)) if !self.skipping_store() => Some(store),
            _ => None,
        }
    }

    /// Whether requests skip the store for now (the session's breaker is open).
    pub(crate) fn skipping_store(&self) -> bool {
        self.session.is_open()
    }

    /// After a synchronous call failed: answer from local memory until a sync succeeds.
    pub(crate) fn trip(&self, e: &StoreError) {
        // a namespace without a store has no store to fail (its records are the node's
        // memory: a call cut off by the stop is not a store failing)
        if self.session.store.is_none() {
            return;
        }
        if self.session.trip(e) {
            // degraded until a sync reaches the store again (a slow answer trips before
            // the call itself fails and is recorded)
            self.status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .degraded
                .get_or_insert(e.reason());
            warn!(
                namespace = self.name(),
                "store failing: synchronous calls answer from local memory until a background sync reaches it"
            );
        }
    }

    /// Resets a key across the cluster: the store's rows first (an error leaves
    /// everything as it was), then this node's counts and pending hits. Other nodes drop
    /// their totals at their next sync.
    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        if let Some(store) = &self.session.store {
            let sizes: Vec<u32> = self.counters.window_sizes().map(|s| s.secs()).collect();
            self.call(store.reset(self.name(), key, &sizes)).await?;
        }
        for t in self.counters.tables() {
            t.reset(key);
        }
        self.counters.buckets().reset(key);
        Ok(())
    }

    /// Runs until `cancel`: periodic syncs (synchronous and local-only namespaces tick
    /// every second to push fallback hits and drop expired entries), retries with capped
    /// exponential backoff, and one last push before returning (see `SyncLoop`).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        self.rounds.run(&self, cancel).await
    }
}

/// Writes store totals into the namespace's tables (the window-size split is per table).
fn apply_to(
    counters: &NamespaceCounters,
    totals: &[swin_core::Total],
    now: UnixMs,
    create: Create,
) {
    for t in counters.tables() {
        let size = t.size().secs();
        let mine: Vec<_> = totals
            .iter()
            .filter(|x| x.window_size == size)
            .cloned()
            .collect();
        match create {
            _ if mine.is_empty() => {}
            Create::Absent => t.fill(&mine, now),
            _ => t.apply(&mine, now, create == Create::Yes),
        }
    }
}
