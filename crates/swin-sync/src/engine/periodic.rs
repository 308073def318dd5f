//! One periodic sync: drain every diff (they move into `synced`, so the node's view does
//! not dip), push them in chunks of at most 500 windows, each with the next sequence
//! number, apply the totals each push returns, then read the current and previous totals
//! of every other window this node holds and apply them, so hits other nodes pushed reach
//! this node even for keys it has not seen lately. Its cost grows with the keys this node
//! holds — keys used here within the last two windows (older entries are dropped at the
//! drain), at most `max_counters` — not with every key in the cluster (Kong reads the
//! whole namespace on every node). GCRA buckets go the same way (TAT advances instead of
//! diffs). On Redis the windows a push's keys need read go in the push itself (see
//! `rows.rs`, `reads_beside`): a synced key costs the store one call's share, not two.
//!
//! A failed push keeps its chunks and their sequence numbers; the next attempt sends
//! exactly the same chunks, which the store applies at most once each (see
//! `store::Push`). New hits wait in the counter table meanwhile and go in the batch after.

use std::sync::Arc;
use std::time::Instant;

use swin_core::{Advance, CompactString, Diff, Tat, UnixMs};
use tracing::error;

use super::pace::Pace;
use super::rows::{enqueue, PushState, Rows};
use super::{nanos, off_runtime, Create, NamespaceSync, SyncReport};
use crate::store::{Pushed, Store, WindowKey};
use crate::StoreError;

/// Windows read per store call when refreshing held keys, and pushed per store call.
/// A request's own store call (a synchronous increment, a reservation, a first touch)
/// shares the store's connection with these and is answered after them, so a chunk is
/// how long a sync can hold requests back: 500 windows are about half a millisecond of
/// Redis's time, where 5,000 held every request of a node 5-20 ms once a second (p99
/// at 25 % of the synchronous peak: 6 ms; BENCHMARKS.md). More calls cost little: each
/// is one round trip, and a node holding 100,000 keys makes 400 a second.
pub(super) const READ_CHUNK: usize = 500;

impl NamespaceSync {
    /// One sync now: push pending and fresh diffs, then refresh active keys.
    pub async fn sync_once(&self, now: UnixMs) -> Result<SyncReport, StoreError> {
        self.sync_paced(now, Pace::none()).await
    }

    /// One sync, its store calls spaced by `pace` (a tick of the sync loop).
    pub(super) async fn sync_paced(
        &self,
        now: UnixMs,
        mut pace: Pace,
    ) -> Result<SyncReport, StoreError> {
        let Some(store) = &self.session.store else {
            // local only: draining drops expired entries; there is nowhere to push. Off
            // the runtime as a sync's drain is: a walk of every key held
            let counters = self.counters.clone();
            off_runtime(move || {
                for t in counters.tables() {
                    t.drain(now);
                }
                counters.buckets().drain(nanos(now));
            })
            .await?;
            return Ok(SyncReport::default());
        };
        let started = Instant::now();
        if self.owes() {
            // synchronous round trips owed: sent again (confirmed, they are done)
            self.pay_owed(store).await;
        }
        let mut st = self.rounds.state.lock().await;
        let mut result = self.sync_locked(store, &mut st, now, &mut pace).await;
        let never_reached = self.status().last_success_ms.is_none();
        if result.is_ok() && (self.skipping_store() || never_reached) {
            // a sync with nothing to push or read may not have asked the store at all:
            // it must answer before requests go to it again, and before the namespace
            // counts as having reached it (readiness: an idle namespace whose store was
            // down since the start was ready at its first empty sync)
            if let Err(e) = self.call(store.ping()).await {
                result = Err(e);
            }
        }
        self.set_pending(
            st.pending.iter().map(|(_, d)| d.len()).sum(),
            st.pending_tats.iter().map(|(_, a)| a.len()).sum(),
        );
        let result = result.map(|(pushed, fetched)| SyncReport {
            pushed,
            fetched,
            duration_ms: started.elapsed().as_secs_f64() * 1e3,
        });
        self.record(result.as_ref());
        result
    }

    /// Reads one key's current and previous windows from the store into the tables
    /// (a key this node may never have held): what a refund gives back is then the
    /// cluster's count, not only what this node saw. No store: nothing to read.
    pub async fn load_key(&self, key: &str, now: UnixMs) -> Result<(), StoreError> {
        let Some(store) = &self.session.store else {
            return Ok(());
        };
        let wanted = self.windows_of(&[key.into()], now);
        let read = async {
            // under the push lock, as a sync reads: a push in flight is in what is read
            let st = self.rounds.state.lock().await;
            let since = self.fresh.since();
            let totals = self.call(store.read(self.name(), &wanted)).await?;
            let mut totals = with_absent_as_zero(&wanted, totals);
            // what this node drained but the store has not confirmed (a push that failed,
            // a synchronous round trip owed) is in the node's view, not yet in the store's
            // count: the view keeps it
            let owed = self.owed_diffs();
            let unconfirmed = st.pending.iter().flat_map(|(_, d)| d).chain(&owed);
            with_unconfirmed(&mut totals, unconfirmed);
            (self.fresh).apply_unless_newer(&self.counters, totals, now, since, Create::Yes);
            Ok(())
        };
        // a request waits for it (the lock too, held by a sync on a hung store) at most
        // its answer time
        let within = self.session.answer_within;
        match tokio::time::timeout(within, read).await {
            Ok(r) => r,
            Err(_) => {
                let e = StoreError::Timeout(within);
                self.trip(&e);
                Err(e)
            }
        }
    }

    pub(super) async fn sync_locked(
        &self,
        store: &Store,
        st: &mut PushState,
        now: UnixMs,
        pace: &mut Pace,
    ) -> Result<(usize, usize), StoreError> {
        // no sync call is out (the caller holds the push lock): stamps before now are moot
        self.fresh.clear();
        // windows whose totals a push of this sync returned: no need to read them again
        let mut fresh = Fresh::default();
        let mut fetched = 0;
        let mut pushed = self
            .push_rounds(store, st, now, pace, |diffs: Vec<Diff>, read: Vec<Diff>| {
                fetched += read.len();
                fresh.extend(diffs.into_iter().chain(read).map(|d| {
                    let w = WindowKey::of(&d);
                    (w.key, w.window_size, w.window_start)
                }));
            })
            .await?;
        pushed += self
            .push_rounds::<Advance>(store, st, now, pace, |_, _| ())
            .await?;
        let wanted = held_windows_but(&self.counters, Arc::new(fresh), now).await?;
        // In chunks: a node holding 100,000 keys should not decode 200,000 rows on a
        // runtime worker in one go, nor send one statement of that size.
        // A held window the store does not hold counts 0 in the cluster: never pushed, or
        // reset (DELETE on some node) — its synced total drops to 0, local hits stay.
        for chunk in wanted.chunks(READ_CHUNK) {
            let read = async {
                let since = self.fresh.since();
                let totals = self.call(store.read(self.name(), chunk)).await?;
                fetched += totals.len();
                let totals = with_absent_as_zero(chunk, totals);
                self.apply_off_runtime(totals, now, since).await
            };
            pace.call(read).await?;
        }
        let held = self.counters.buckets().keys();
        for chunk in held.chunks(READ_CHUNK) {
            let tats = pace
                .call(self.call(store.read_tats(self.name(), chunk)))
                .await?;
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
            .await?;
        }
        Ok((pushed, fetched))
    }

    /// The push-pending loop, for diffs and TAT advances alike. Two rounds: what a
    /// failed sync left queued, then what a drain yields now (the first round drains
    /// when nothing was left). A drained batch goes out in chunks of PUSH_CHUNK, each its
    /// own call with its own sequence number, so that no single reply holds a runtime
    /// worker decoding 100,000 rows while requests wait behind it. A chunk leaves the
    /// queue only once its push succeeded (then `done` takes it); after a failure it
    /// stays, to go again unchanged. `done` takes each pushed chunk with the rows read
    /// beside it. Returns the rows pushed.
    async fn push_rounds<R: Rows>(
        &self,
        store: &Store,
        st: &mut PushState,
        now: UnixMs,
        pace: &mut Pace,
        mut done: impl FnMut(Vec<R>, Vec<R>),
    ) -> Result<usize, StoreError> {
        let mut pushed = 0;
        for _ in 0..2 {
            if R::queue(st).is_empty() {
                let drained = R::drain(self, now).await?;
                if drained.is_empty() {
                    break;
                }
                let mut seq = st.seq;
                enqueue(&mut seq, R::queue(st), drained);
                st.seq = seq;
            }
            loop {
                let queue = R::queue(st);
                let Some((seq, rows)) = queue.front() else {
                    break;
                };
                let next = queue.get(1).map_or(&[][..], |(_, r)| r.as_slice());
                let read = pace
                    .call(R::push(self, store, *seq, rows, next, now))
                    .await?;
                if let Some((_, rows)) = R::queue(st).pop_front() {
                    pushed += rows.len();
                    done(rows, read);
                }
            }
        }
        Ok(pushed)
    }

    /// The totals a push returned, with every pushed window the store did not return
    /// at 0 (a negative diff on a window it does not hold leaves none). Windows the
    /// store refused are logged with their key and counted, never retried: they would
    /// fail every time and hold back every diff behind them.
    pub(super) fn settle(&self, diffs: &[Diff], reply: Pushed) -> Vec<swin_core::Total> {
        // a window read beside a push (a diff of 0) drops no hits: not logged as one
        let dropped = reply.rejected.iter().filter(|r| r.diff.value != 0.0);
        for r in dropped.clone() {
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
        let dropped = dropped.count() as u64;
        if dropped > 0 {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            s.rejected_windows += dropped;
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

    pub(super) async fn apply_tats_off_runtime(&self, tats: Vec<Tat>) -> Result<(), StoreError> {
        let counters = self.counters.clone();
        off_runtime(move || counters.buckets().apply(&tats, false)).await
    }

    /// Applies a sync call's store totals (the call sent at `since`, see `fresh`) on a
    /// blocking thread: with 100,000 keys this is tens of milliseconds of CPU that must
    /// not hold up a runtime worker serving requests.
    pub(super) async fn apply_off_runtime(
        &self,
        totals: Vec<swin_core::Total>,
        now: UnixMs,
        since: super::fresh::Since,
    ) -> Result<(), StoreError> {
        let (counters, fresh) = (self.counters.clone(), self.fresh.clone());
        off_runtime(move || fresh.apply_unless_newer(&counters, totals, now, since, Create::No))
            .await
    }

    /// Writes the store's totals for keys a request just read or held into the
    /// tables (adding keys they do not hold), for reads of their rates.
    /// `sent`: the call's number ([`Self::fresh_number`], taken as it was sent).
    pub(crate) fn apply_totals(&self, totals: &[swin_core::Total], now: UnixMs, sent: u64) {
        self.apply_answered(totals, now, Create::Yes, sent);
    }
}

/// The totals read for `wanted`, with a zero total for every window the store lacks.
/// Adds to each of `totals` the diffs of its window in `unconfirmed`.
fn with_unconfirmed<'a>(
    totals: &mut [swin_core::Total],
    unconfirmed: impl Iterator<Item = &'a Diff>,
) {
    let mut by_window: std::collections::HashMap<(&str, u32, i64), f64> =
        std::collections::HashMap::new();
    for d in unconfirmed {
        *by_window
            .entry((d.key.as_str(), d.window_size, d.window_start))
            .or_default() += d.value;
    }
    if by_window.is_empty() {
        return;
    }
    for t in totals.iter_mut() {
        let w = (t.key.as_str(), t.window_size, t.window_start);
        if let Some(v) = by_window.get(&w) {
            t.count = (t.count + v).max(0.0);
        }
    }
}

pub(super) fn with_absent_as_zero(
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

/// Windows a sync pushed or read beside a push: (key, size, start).
type Fresh = std::collections::HashSet<(CompactString, u32, i64), foldhash::fast::RandomState>;

/// Keys of a table a call off the runtime looks at for the windows a sync reads (see
/// `DRAIN_SLICE` in `taken.rs`: a node's keys in slices, not in one walk).
const WALK_SLICE: usize = 2_000;

/// The current and previous windows of every key `counters` hold, but those in `fresh`
/// (pushed or read beside a push in this sync): one list of each table's keys, then
/// slices of it, each a call off the runtime.
async fn held_windows_but(
    counters: &Arc<swin_core::NamespaceCounters>,
    fresh: Arc<Fresh>,
    now: UnixMs,
) -> Result<Vec<WindowKey>, StoreError> {
    let mut wanted = Vec::new();
    for table in 0..counters.tables().len() {
        let c = counters.clone();
        let keys = Arc::new(off_runtime(move || c.tables()[table].keys()).await?);
        for from in (0..keys.len()).step_by(WALK_SLICE) {
            let (c, keys, fresh) = (counters.clone(), keys.clone(), fresh.clone());
            let slice = off_runtime(move || {
                let size = c.tables()[table].size();
                let mut out = Vec::new();
                for key in &keys[from..keys.len().min(from + WALK_SLICE)] {
                    for start in [size.start_of(now), size.previous_start_of(now)] {
                        if !fresh.contains(&(key.clone(), size.secs(), start)) {
                            out.push(WindowKey {
                                key: key.clone(),
                                window_size: size.secs(),
                                window_start: start,
                            });
                        }
                    }
                }
                out
            });
            wanted.extend(slice.await?);
        }
    }
    Ok(wanted)
}
