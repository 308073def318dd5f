//! The sync engine of one namespace: the three sync modes, the periodic timer, retries
//! with backoff, exactly-once pushes and the final push on shutdown.
//!
//! One sync: drain every diff (they move into `synced`, so the node's view does not
//! dip), push them in chunks of at most 5,000 windows, each with the next sequence
//! number, apply the totals each push returns, then read the current and previous totals
//! of every other window this node holds and apply them, so hits other nodes pushed reach
//! this node even for keys it has not seen lately. Its cost grows with the keys this node
//! holds — keys used here within the last two windows (older entries are dropped at the
//! drain), at most `max_counters` — not with every key in the cluster (Kong reads the
//! whole namespace on every node). GCRA buckets go the same way (TAT advances instead of
//! diffs).
//!
//! A failed push keeps its chunks and their sequence numbers; the next attempt sends
//! exactly the same chunks, which the store applies at most once each (see
//! `store::Push`). New hits wait in the counter table meanwhile and go in the batch after.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use swin_core::{
    Advance, CompactString, CoreError, Diff, Gcra, GcraDecision, NamespaceCounters, Tat, UnixMs,
    WindowRate, WindowSize,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::store::{normalize, normalize_advances, Push, Pushed, Store, TatPush, WindowKey};
use crate::unconfirmed::{Chunk, Unconfirmed};
use crate::StoreError;

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

/// The engine's health, for readiness and metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SyncStatus {
    /// Unix milliseconds of the last sync that reached the store.
    pub last_success_ms: Option<i64>,
    /// Why the last attempt failed, while the store is unreachable.
    pub degraded: Option<String>,
    pub consecutive_failures: u32,
    /// Windows drained but not yet confirmed by the store.
    pub pending_diffs: usize,
    pub syncs: u64,
    pub failures: u64,
    /// Windows the store refused for good (logged with their key and dropped).
    pub rejected_windows: u64,
    pub last_duration_ms: f64,
    /// Syncs per duration bucket of [`SYNC_BUCKETS_SECS`] (not cumulative).
    pub duration_buckets: [u64; SYNC_BUCKETS_SECS.len()],
    pub duration_sum_secs: f64,
}

/// Upper bounds (seconds) of the sync duration histogram.
pub const SYNC_BUCKETS_SECS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// Windows read per store call when refreshing held keys, and pushed per store call:
/// small enough that decoding one reply holds a runtime worker for a few milliseconds.
const READ_CHUNK: usize = 5_000;
const PUSH_CHUNK: usize = 5_000;

/// Whether applying totals may add keys the table does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Create {
    Yes,
    No,
}

#[derive(Debug, Default)]
struct PushState {
    seq: u64,
    /// Drained batches not yet confirmed, each with its sequence number, in push order.
    pending: std::collections::VecDeque<(u64, Vec<Diff>)>,
    /// GCRA advances drained but not confirmed, with their own sequence number.
    pending_tats: std::collections::VecDeque<(u64, Vec<Advance>)>,
}

/// A synchronous increment waiting for its round trip.
#[derive(Debug)]
struct Waiting {
    key: CompactString,
    size: WindowSize,
    value: f64,
    now: UnixMs,
    /// The rate after it, or `None` when the store failed.
    tx: tokio::sync::oneshot::Sender<Option<WindowRate>>,
}

#[derive(Debug, Default)]
struct SyncQueue {
    waiting: Vec<Waiting>,
    /// A task is sending batches; new arrivals only queue.
    flushing: bool,
}

/// Synchronous increments per round trip at most.
const SYNC_BATCH: usize = 2_000;

#[derive(Debug)]
pub struct NamespaceSync {
    counters: Arc<NamespaceCounters>,
    mode: SyncMode,
    store: Option<Store>,
    node_id: Arc<str>,
    timeout: Duration,
    /// The namespace keeps GCRA buckets (warm-up loads them too).
    buckets: bool,
    /// Synchronous increments waiting for the next round trip.
    sync_queue: Mutex<SyncQueue>,
    /// The tasks that send them: the engine's last push waits for them.
    flushes: tokio_util::task::TaskTracker,
    state: tokio::sync::Mutex<PushState>,
    status: Mutex<SyncStatus>,
}

fn nanos(now: UnixMs) -> i64 {
    now.0.saturating_mul(1_000_000)
}

fn now() -> UnixMs {
    UnixMs::from_system_time(SystemTime::now())
}

impl NamespaceSync {
    /// `store` must be `Some` unless `mode` is [`SyncMode::LocalOnly`]; `timeout` bounds
    /// every store call.
    pub fn new(
        counters: Arc<NamespaceCounters>,
        mode: SyncMode,
        store: Option<Store>,
        node_id: Arc<str>,
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
            store,
            node_id,
            timeout,
            buckets: false,
            sync_queue: Mutex::new(SyncQueue::default()),
            flushes: tokio_util::task::TaskTracker::new(),
            state: tokio::sync::Mutex::new(PushState::default()),
            status: Mutex::new(SyncStatus::default()),
        }
    }

    /// A namespace of GCRA buckets: warm-up loads its buckets from the store.
    pub fn with_buckets(mut self) -> Self {
        self.buckets = true;
        self
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
        self.store.as_ref()
    }

    /// The identity this engine pushes under: unique to the engine, so a namespace
    /// rebuilt by a reload never reuses a `(push_id, namespace, seq)` the store has seen.
    pub fn push_id(&self) -> &str {
        &self.node_id
    }

    /// Whether the namespace answers with the cluster's counts: it has reached its
    /// store once, and not longer ago than `max(3 × sync period, store_timeout + 1 s)`
    /// (synchronous and local-only engines tick every second). `Err` says why not.
    pub fn readiness(&self, now: UnixMs) -> Result<(), String> {
        if self.store.is_none() {
            return Ok(());
        }
        let period = match self.mode {
            SyncMode::Periodic(p) => p,
            SyncMode::Synchronous | SyncMode::LocalOnly => Duration::from_secs(1),
        };
        let limit = (3 * period).max(self.timeout + Duration::from_secs(1));
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

    async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    fn record(&self, outcome: Result<&SyncReport, &StoreError>, pending: usize) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.pending_diffs = pending;
        match outcome {
            Ok(report) => {
                s.last_success_ms = Some(now().0);
                s.degraded = None;
                s.consecutive_failures = 0;
                s.syncs += 1;
                s.last_duration_ms = report.duration_ms;
                let secs = report.duration_ms / 1e3;
                s.duration_sum_secs += secs;
                if let Some(i) = SYNC_BUCKETS_SECS.iter().position(|le| secs <= *le) {
                    s.duration_buckets[i] += 1;
                }
            }
            Err(e) => {
                s.degraded = Some(e.to_string());
                s.consecutive_failures += 1;
                s.failures += 1;
            }
        }
    }

    /// Loads the namespace's current and previous windows from the store (a node that
    /// starts knows the cluster's totals before its first sync).
    pub async fn warm_up(&self, now: UnixMs) -> Result<usize, StoreError> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let windows: Vec<(u32, i64)> = self
            .counters
            .window_sizes()
            .map(|s| (s.secs(), s.previous_start_of(now)))
            .collect();
        let totals = self
            .call(store.load_namespace(self.name(), &windows))
            .await?;
        let (counters, mut loaded) = (self.counters.clone(), totals.len());
        off_runtime(move || apply_to(&counters, &totals, now, Create::Yes)).await;
        if self.buckets {
            let tats = self.call(store.load_tats(self.name(), nanos(now))).await?;
            loaded += tats.len();
            let counters = self.counters.clone();
            off_runtime(move || counters.buckets().apply(&tats, true)).await;
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_success_ms = Some(now.0);
        Ok(loaded)
    }

    /// One sync now: push pending and fresh diffs, then refresh active keys.
    pub async fn sync_once(&self, now: UnixMs) -> Result<SyncReport, StoreError> {
        let Some(store) = &self.store else {
            // local only: draining drops expired entries; there is nowhere to push
            for t in self.counters.tables() {
                t.drain(now);
            }
            self.counters.buckets().drain(nanos(now));
            return Ok(SyncReport::default());
        };
        let started = Instant::now();
        let mut st = self.state.lock().await;
        let result = self.sync_locked(store, &mut st, now).await;
        let pending = st.pending.iter().map(|(_, d)| d.len()).sum::<usize>()
            + st.pending_tats.iter().map(|(_, a)| a.len()).sum::<usize>();
        let result = result.map(|(pushed, fetched)| SyncReport {
            pushed,
            fetched,
            duration_ms: started.elapsed().as_secs_f64() * 1e3,
        });
        self.record(result.as_ref(), pending);
        result
    }

    async fn sync_locked(
        &self,
        store: &Store,
        st: &mut PushState,
        now: UnixMs,
    ) -> Result<(usize, usize), StoreError> {
        let mut pushed = 0;
        // windows whose totals a push of this sync returned: no need to read them again
        let mut fresh: Vec<Diff> = Vec::new();
        // Two rounds: what a failed sync left, then the fresh diffs (the first round drains
        // when nothing was left). A drained batch goes out in chunks of PUSH_CHUNK windows,
        // each its own statement with its own sequence number, so that no single reply
        // holds a runtime worker decoding 100,000 rows while requests wait behind it.
        for _ in 0..2 {
            if st.pending.is_empty() {
                let counters = self.counters.clone();
                let drained = off_runtime(move || {
                    let all: Vec<Diff> = counters
                        .tables()
                        .iter()
                        .flat_map(|t| t.drain(now))
                        .collect();
                    normalize(&all)
                })
                .await;
                if drained.is_empty() {
                    break;
                }
                enqueue(&mut st.seq, &mut st.pending, drained);
            }
            while let Some((seq, diffs)) = st.pending.front() {
                let push = Push {
                    node_id: &self.node_id,
                    seq: Some(*seq),
                    diffs,
                };
                let reply = self.call(store.push(self.name(), push)).await?;
                let totals = self.settle(diffs, reply);
                if let Some((_, diffs)) = st.pending.pop_front() {
                    pushed += diffs.len();
                    fresh.extend(diffs);
                }
                self.apply_off_runtime(totals, now).await;
            }
        }
        pushed += self.sync_buckets(store, st, now).await?;
        let counters = self.counters.clone();
        let wanted = off_runtime(move || {
            let fresh: std::collections::HashSet<(&str, u32, i64), foldhash::fast::RandomState> =
                fresh
                    .iter()
                    .map(|d| (d.key.as_str(), d.window_size, d.window_start))
                    .collect();
            let mut wanted = Vec::new();
            for t in counters.tables() {
                let size = t.size();
                for key in t.keys() {
                    for start in [size.start_of(now), size.previous_start_of(now)] {
                        if fresh.contains(&(key.as_str(), size.secs(), start)) {
                            continue;
                        }
                        wanted.push(WindowKey {
                            key: key.clone(),
                            window_size: size.secs(),
                            window_start: start,
                        });
                    }
                }
            }
            wanted
        })
        .await;
        // In chunks: a node holding 100,000 keys should not decode 200,000 rows on a
        // runtime worker in one go, nor send one statement of that size.
        // A held window the store does not hold counts 0 in the cluster: never pushed, or
        // reset (DELETE on some node) — its synced total drops to 0, local hits stay.
        let mut fetched = 0;
        for chunk in wanted.chunks(READ_CHUNK) {
            let totals = self.call(store.read(self.name(), chunk)).await?;
            fetched += totals.len();
            let totals = with_absent_as_zero(chunk, totals);
            self.apply_off_runtime(totals, now).await;
        }
        let held = self.counters.buckets().keys();
        for chunk in held.chunks(READ_CHUNK) {
            let tats = self.call(store.read_tats(self.name(), chunk)).await?;
            fetched += tats.len();
            let counters = self.counters.clone();
            let chunk = chunk.to_vec();
            off_runtime(move || {
                let b = counters.buckets();
                let found: std::collections::HashSet<&str> =
                    tats.iter().map(|t| t.key.as_str()).collect();
                for k in chunk.iter().filter(|k| !found.contains(k.as_str())) {
                    b.forget_if_idle(k);
                }
                b.apply(&tats, false);
            })
            .await;
        }
        Ok((pushed, fetched))
    }

    /// The GCRA half of a sync: the same drain, keep-on-failure and exactly-once as for
    /// diffs, with advances applied as `tat = max(tat, now) + Σ`.
    async fn sync_buckets(
        &self,
        store: &Store,
        st: &mut PushState,
        now: UnixMs,
    ) -> Result<usize, StoreError> {
        let mut pushed = 0;
        for _ in 0..2 {
            if st.pending_tats.is_empty() {
                let counters = self.counters.clone();
                let drained =
                    off_runtime(move || normalize_advances(&counters.buckets().drain(nanos(now))))
                        .await;
                if drained.is_empty() {
                    break;
                }
                enqueue(&mut st.seq, &mut st.pending_tats, drained);
            }
            while let Some((seq, advances)) = st.pending_tats.front() {
                let push = TatPush {
                    node_id: &self.node_id,
                    seq: Some(*seq),
                    now_ns: nanos(now),
                    advances,
                };
                let tats = self.call(store.push_tats(self.name(), push)).await?;
                pushed += advances.len();
                st.pending_tats.pop_front();
                self.apply_tats_off_runtime(tats).await;
            }
        }
        Ok(pushed)
    }

    /// The totals a push returned, with every pushed window the store did not return
    /// at 0 (a negative diff on a window it does not hold leaves none). Windows the
    /// store refused are logged with their key and counted, never retried: they would
    /// fail every time and hold back every diff behind them.
    fn settle(&self, diffs: &[Diff], reply: Pushed) -> Vec<swin_core::Total> {
        for r in &reply.rejected {
            error!(
                namespace = self.name(),
                key = %r.diff.key,
                window_size = r.diff.window_size,
                window_start = r.diff.window_start,
                value = r.diff.value,
                reason = %r.reason,
                "the store refused a window for good; its hits are dropped"
            );
        }
        if !reply.rejected.is_empty() {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            s.rejected_windows += reply.rejected.len() as u64;
        }
        let refused: std::collections::HashSet<WindowKey> = reply
            .rejected
            .iter()
            .map(|r| WindowKey::of(&r.diff))
            .collect();
        let wanted: Vec<WindowKey> = diffs
            .iter()
            .map(WindowKey::of)
            .filter(|w| !refused.contains(w))
            .collect();
        with_absent_as_zero(&wanted, reply.totals)
    }

    async fn apply_tats_off_runtime(&self, tats: Vec<Tat>) {
        let counters = self.counters.clone();
        off_runtime(move || counters.buckets().apply(&tats, false)).await;
    }

    /// Resets a key across the cluster: the store's rows first (an error leaves
    /// everything as it was), then this node's counts and pending hits. Other nodes drop
    /// their totals at their next sync.
    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        if let Some(store) = &self.store {
            let sizes: Vec<u32> = self.counters.window_sizes().map(|s| s.secs()).collect();
            self.call(store.reset(self.name(), key, &sizes)).await?;
        }
        for t in self.counters.tables() {
            t.reset(key);
        }
        self.counters.buckets().reset(key);
        Ok(())
    }

    /// A GCRA spend of `cost` on `key`, as the namespace's mode says: on local buckets
    /// (periodic, local only) or through the store (synchronous: the advance is applied
    /// there and the decision taken on the TAT it returns, taken back when denied; on a
    /// store failure the spend is decided locally and pushed later). With `force` a
    /// denied spend counts too.
    pub async fn spend(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
        force: bool,
    ) -> Result<GcraDecision, CoreError> {
        let buckets = self.counters.buckets();
        let now_ns = nanos(now);
        let (SyncMode::Synchronous, Some(store)) = (&self.mode, &self.store) else {
            return buckets.spend(gcra, key, now_ns, cost, force);
        };
        // validates the cost before anything reaches the store
        gcra.check(None, now_ns, cost)?;
        match self
            .spend_in_store(store, gcra, key, cost, now_ns, force)
            .await
        {
            Ok(d) => Ok(d),
            Err(e) => {
                warn!(namespace = self.name(), cause = %e, "synchronous spend failed; decided locally");
                self.record(Err(&e), self.status().pending_diffs);
                buckets.spend(gcra, key, now_ns, cost, force)
            }
        }
    }

    /// Applies one TAT advance in the store (no sequence number: a synchronous call).
    async fn push_advance(
        &self,
        store: &Store,
        key: &str,
        ns: i64,
        now_ns: i64,
    ) -> Result<Vec<Tat>, StoreError> {
        let advances = [Advance {
            key: key.into(),
            ns,
        }];
        let push = TatPush {
            node_id: &self.node_id,
            seq: None,
            now_ns,
            advances: &advances,
        };
        self.call(store.push_tats(self.name(), push)).await
    }

    /// The key's TAT in the store (`None`: the store holds no bucket, it is full).
    async fn store_tat(&self, store: &Store, key: &str) -> Result<Option<i64>, StoreError> {
        let keys = [CompactString::from(key)];
        let tats = self.call(store.read_tats(self.name(), &keys)).await?;
        Ok(tats.first().map(|t| t.tat_ns))
    }

    async fn spend_in_store(
        &self,
        store: &Store,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now_ns: i64,
        force: bool,
    ) -> Result<GcraDecision, StoreError> {
        let advance = gcra.emission_ns().saturating_mul(cost);
        let tats = self.push_advance(store, key, advance, now_ns).await?;
        let tat = tats.first().map_or(now_ns + advance, |t| t.tat_ns);
        // the TAT before this spend, as the store's max(tat, now) saw it
        let d = gcra
            .spend(Some(tat - advance), now_ns, cost)
            .map_err(|e| StoreError::Protocol(e.to_string()))?;
        let tats = if d.allowed || force {
            tats
        } else {
            self.push_advance(store, key, -advance, now_ns).await?
        };
        self.counters.buckets().apply(&tats, true);
        Ok(d)
    }

    /// Gives back `cost` of a GCRA bucket (Boulder's refund), locally or, in synchronous
    /// mode, in the store (on a store failure: locally, pushed by a later sync).
    pub async fn refund_tokens(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
    ) -> Result<GcraDecision, CoreError> {
        let now_ns = nanos(now);
        if let (SyncMode::Synchronous, Some(store)) = (&self.mode, &self.store) {
            let in_store = async {
                let tat = self.store_tat(store, key).await?;
                let d = gcra
                    .refund(tat, now_ns, cost)
                    .map_err(|e| StoreError::Protocol(e.to_string()))?;
                if d.allowed {
                    let back = d.new_tat - tat.unwrap_or(now_ns).max(now_ns);
                    self.push_advance(store, key, back, now_ns).await?;
                }
                Ok::<_, StoreError>(d)
            };
            match in_store.await {
                Ok(d) => return Ok(d),
                Err(e) => {
                    warn!(namespace = self.name(), cause = %e, "synchronous refund failed; given back locally");
                    self.record(Err(&e), self.status().pending_diffs);
                }
            }
        }
        self.counters.buckets().refund(gcra, key, now_ns, cost)
    }

    /// The key's bucket as a spend of `cost` would find it, spending nothing (in
    /// synchronous mode, read from the store; locally when it cannot be read).
    pub async fn check(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
    ) -> Result<GcraDecision, CoreError> {
        let now_ns = nanos(now);
        if let (SyncMode::Synchronous, Some(store)) = (&self.mode, &self.store) {
            if let Ok(tat) = self.store_tat(store, key).await {
                return gcra.check(tat, now_ns, cost);
            }
        }
        self.counters.buckets().check(gcra, key, now_ns, cost)
    }

    /// Applies store totals on a blocking thread: with 100,000 keys this is tens of
    /// milliseconds of CPU that must not hold up a runtime worker serving requests.
    async fn apply_off_runtime(&self, totals: Vec<swin_core::Total>, now: UnixMs) {
        let counters = self.counters.clone();
        off_runtime(move || apply_to(&counters, &totals, now, Create::No)).await;
    }

    fn apply(&self, totals: &[swin_core::Total], now: UnixMs, create: Create) {
        apply_to(&self.counters, totals, now, create);
    }

    /// Counts a hit and returns the key's rate, as the namespace's mode says: locally
    /// (periodic, local only) or through the store (synchronous; on a store failure the
    /// hit is counted locally and pushed later, and the answer comes from local memory).
    pub async fn increment(
        self: &Arc<Self>,
        key: &str,
        window_size: u32,
        value: f64,
        now: UnixMs,
    ) -> Result<WindowRate, CoreError> {
        let table = self.counters.table(window_size)?;
        match (&self.mode, &self.store) {
            (SyncMode::Synchronous, Some(_)) => {
                // the store's total is only known after the round trip: refuse on the
                // local view a value that would take the window out of range
                swin_core::check_value(value)?;
                let seen = table.rate(key, now, None).current;
                if (seen + value).abs() > swin_core::MAX_COUNT {
                    return Err(CoreError::CountOutOfRange {
                        value,
                        max: swin_core::MAX_COUNT,
                    });
                }
                match self.increment_in_store(key, table.size(), value, now).await {
                    Some(rate) => Ok(rate),
                    // the store failed (logged and recorded once for the batch): counted
                    // here, pushed by a later sync
                    None => table.increment(key, value, now),
                }
            }
            _ => table.increment(key, value, now),
        }
    }

    /// Queues a synchronous increment for the store and waits for its answer. Increments
    /// that arrive while a round trip is in flight wait and go together in the next one
    /// (one push statement and one read for all of them), so throughput grows with the
    /// callers while each still waits about one round trip (PostgreSQL, SQLite: one
    /// transaction instead of one per hit). The flushing runs in a task of its own: a
    /// caller that gives up does not stall the others.
    async fn increment_in_store(
        self: &Arc<Self>,
        key: &str,
        size: WindowSize,
        value: f64,
        now: UnixMs,
    ) -> Option<WindowRate> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // a store that pipelines shares round trips already; a queue would only make
        // callers wait (measured on Redis: p50 0.82 → 1.2 ms)
        if let Some(store) = self.store.as_ref().filter(|s| s.pipelines()) {
            let one = Waiting {
                key: key.into(),
                size,
                value,
                now,
                tx,
            };
            self.push_synchronous(store, vec![one]).await;
            return rx.await.ok().flatten();
        }
        let lead = {
            let mut q = self.sync_queue.lock().unwrap_or_else(|p| p.into_inner());
            q.waiting.push(Waiting {
                key: key.into(),
                size,
                value,
                now,
                tx,
            });
            !std::mem::replace(&mut q.flushing, true)
        };
        if lead {
            let this = self.clone();
            self.flushes
                .spawn(async move { this.flush_synchronous().await });
        }
        rx.await.ok().flatten()
    }

    /// Sends what waits, in batches of at most SYNC_BATCH, until nothing does.
    async fn flush_synchronous(self: Arc<Self>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        loop {
            let batch: Vec<Waiting> = {
                let mut q = self.sync_queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.waiting.is_empty() {
                    q.flushing = false;
                    return;
                }
                let n = q.waiting.len().min(SYNC_BATCH);
                q.waiting.drain(..n).collect()
            };
            self.push_synchronous(&store, batch).await;
        }
    }

    /// One round trip for a batch of synchronous increments: the push and the read of the
    /// previous windows together. Each caller gets the store's total as if the batch's
    /// increments had come one after another in queue order: the total before the batch
    /// plus its own and the earlier ones'.
    async fn push_synchronous(&self, store: &Store, batch: Vec<Waiting>) {
        let diffs: Vec<Diff> = batch
            .iter()
            .map(|w| Diff {
                key: w.key.clone(),
                window_size: w.size.secs(),
                window_start: w.size.start_of(w.now),
                value: w.value,
            })
            .collect();
        let mut prev_keys: Vec<WindowKey> = batch
            .iter()
            .map(|w| WindowKey {
                key: w.key.clone(),
                window_size: w.size.secs(),
                window_start: w.size.previous_start_of(w.now),
            })
            .collect();
        prev_keys.sort();
        prev_keys.dedup();
        let (pushed, previous) = tokio::join!(
            self.call(store.push(
                self.name(),
                Push {
                    node_id: &self.node_id,
                    seq: None,
                    diffs: &diffs
                }
            )),
            self.call(store.read(self.name(), &prev_keys)),
        );
        let (pushed, previous) = match (pushed, previous) {
            (Ok(p), Ok(r)) => (self.settle(&diffs, p), r),
            (Err(e), _) | (_, Err(e)) => {
                warn!(namespace = self.name(), cause = %e, hits = batch.len(), "synchronous increments failed; counted locally");
                self.record(Err(&e), self.status().pending_diffs);
                for w in batch {
                    let _ = w.tx.send(None);
                }
                return;
            }
        };
        let now = batch.iter().map(|w| w.now).max().unwrap_or(UnixMs(0));
        self.apply(&pushed, now, Create::Yes);
        self.apply(&previous, now, Create::Yes);
        type Window = (CompactString, u32, i64);
        let mut after: std::collections::HashMap<Window, f64> = pushed
            .iter()
            .map(|t| ((t.key.clone(), t.window_size, t.window_start), t.count))
            .collect();
        // the total before the batch: the total after it less the batch's own increments
        for d in &diffs {
            if let Some(t) = after.get_mut(&(d.key.clone(), d.window_size, d.window_start)) {
                *t -= d.value;
            }
        }
        let prev: std::collections::HashMap<Window, f64> = previous
            .iter()
            .map(|t| ((t.key.clone(), t.window_size, t.window_start), t.count))
            .collect();
        for (w, d) in batch.into_iter().zip(&diffs) {
            let window = (d.key.clone(), d.window_size, d.window_start);
            let current = match after.get_mut(&window) {
                Some(t) => {
                    *t += d.value;
                    *t
                }
                None => d.value,
            };
            let previous = prev
                .get(&(
                    d.key.clone(),
                    d.window_size,
                    w.size.previous_start_of(w.now),
                ))
                .copied()
                .unwrap_or(0.0);
            let _ =
                w.tx.send(Some(WindowRate::at(w.size, w.now, current, previous)));
        }
    }

    /// Runs until `cancel`: periodic syncs (synchronous and local-only namespaces tick
    /// every second to push fallback hits and drop expired entries), retries with capped
    /// exponential backoff, and one last push before returning.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let period = match self.mode {
            SyncMode::Periodic(p) => p,
            SyncMode::Synchronous | SyncMode::LocalOnly => Duration::from_secs(1),
        };
        let mut backoff = Backoff::new(
            period.max(Duration::from_millis(100)),
            Duration::from_secs(30),
        );
        let mut next = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            match self.sync_once(now()).await {
                Ok(report) => {
                    if backoff.failures() > 0 {
                        info!(
                            namespace = self.name(),
                            pushed = report.pushed,
                            "store reachable again"
                        );
                    }
                    backoff.reset();
                    debug!(
                        namespace = self.name(),
                        pushed = report.pushed,
                        fetched = report.fetched,
                        "synced"
                    );
                    // missed ticks are skipped, never burst
                    next += period;
                    let t = tokio::time::Instant::now();
                    if next < t {
                        next = t + period;
                    }
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    warn!(namespace = self.name(), cause = %e, transient = e.is_transient(), retry_in_ms = delay.as_millis() as u64, "sync failed");
                    next = tokio::time::Instant::now() + delay;
                }
            }
        }
        // synchronous increments still on their way to the store land (or fall back to
        // the tables) before the last push drains them
        self.flushes.close();
        self.flushes.wait().await;
        self.final_push().await;
    }

    /// Everything this engine counted that its store has not confirmed, as chunks under
    /// this engine's identity: what failed pushes left, then whatever the tables and
    /// buckets still hold (drained now, with the next sequence numbers). Called once the
    /// engine has stopped and no request reaches its tables any more; whoever takes the
    /// chunks sends them (see [`Unconfirmed::push`]).
    pub async fn take_unconfirmed(&self, now: UnixMs) -> Unconfirmed {
        let mut guard = self.state.lock().await;
        let st = &mut *guard;
        if self.store.is_some() {
            let drained: Vec<Diff> = self
                .counters
                .tables()
                .iter()
                .flat_map(|t| t.drain(now))
                .collect();
            let drained = normalize(&drained);
            if !drained.is_empty() {
                enqueue(&mut st.seq, &mut st.pending, drained);
            }
            let advances = normalize_advances(&self.counters.buckets().drain(nanos(now)));
            if !advances.is_empty() {
                enqueue(&mut st.seq, &mut st.pending_tats, advances);
            }
        }
        let mut chunks: Vec<Chunk> = st
            .pending
            .drain(..)
            .map(|(seq, d)| Chunk::diffs(seq, &d))
            .chain(
                st.pending_tats
                    .drain(..)
                    .map(|(seq, a)| Chunk::advances(seq, nanos(now), &a)),
            )
            .collect();
        chunks.sort_by_key(|c| c.seq);
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending_diffs = 0;
        Unconfirmed {
            namespace: self.name().to_owned(),
            push_id: self.node_id.to_string(),
            chunks: chunks.into(),
        }
    }

    /// The push on shutdown: a few quick attempts; what still fails is logged with its size.
    pub async fn final_push(&self) {
        if self.store.is_none() {
            return;
        }
        for attempt in 1..=3 {
            match self.sync_once(now()).await {
                Ok(report) => {
                    info!(
                        namespace = self.name(),
                        pushed = report.pushed,
                        "final push done"
                    );
                    return;
                }
                Err(e) => {
                    warn!(namespace = self.name(), attempt, cause = %e, "final push failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let pending = self.status().pending_diffs;
        warn!(
            namespace = self.name(),
            pending, "shutting down with diffs the store did not confirm"
        );
    }
}

/// The totals read for `wanted`, with a zero total for every window the store lacks.
fn with_absent_as_zero(
    wanted: &[WindowKey],
    mut totals: Vec<swin_core::Total>,
) -> Vec<swin_core::Total> {
    let found: std::collections::HashSet<(&str, u32, i64)> = totals
        .iter()
        .map(|t| (t.key.as_str(), t.window_size, t.window_start))
        .collect();
    let absent: Vec<swin_core::Total> = wanted
        .iter()
        .filter(|w| !found.contains(&(w.key.as_str(), w.window_size, w.window_start)))
        .map(|w| swin_core::Total {
            key: w.key.clone(),
            window_size: w.window_size,
            window_start: w.window_start,
            count: 0.0,
        })
        .collect();
    totals.extend(absent);
    totals
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
        if !mine.is_empty() {
            t.apply(&mine, now, create == Create::Yes);
        }
    }
}

/// Queues a drained batch for pushing: chunks of at most PUSH_CHUNK, each with the next
/// sequence number of the namespace (shared by counters and buckets).
fn enqueue<T: Clone>(
    seq: &mut u64,
    pending: &mut std::collections::VecDeque<(u64, Vec<T>)>,
    drained: Vec<T>,
) {
    for chunk in drained.chunks(PUSH_CHUNK) {
        *seq += 1;
        pending.push_back((*seq, chunk.to_vec()));
    }
}

/// Runs CPU-bound table work (draining, applying totals, listing active keys) on
/// tokio's blocking pool, so the OS, not the cooperative scheduler, shares the core
/// with requests. A panic in it is a bug: it is raised here again.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
