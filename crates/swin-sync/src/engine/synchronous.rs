//! Synchronous increments (`sync_rate = 0`): every increment goes to the store and is
//! answered with the store's total. Increments that arrive while a round trip is in
//! flight wait and go together in the next one (one push and one read for all of them),
//! each answered as if the batch's increments had come one after another in queue order.

use std::sync::Arc;

use swin_core::{
    CompactString, CoreError, Diff, Total, UnixMs, WindowRate, WindowSize, WindowTable,
};
use tracing::warn;

use super::{owed, Create, NamespaceSync, SyncMode};
use crate::store::{Push, Store, WindowKey};

/// What became of a synchronous increment a request sent.
#[derive(Debug)]
pub(super) enum Sent {
    /// The store's total, with the increment in it.
    Answered(WindowRate),
    /// The store failed: the caller counts the increment locally.
    Failed,
    /// No answer within `answer_within`: the round trip goes on and owns the increment.
    Late,
    /// The store may have taken it and did not say: its round trip is owed, sent again
    /// until the store confirms it (applied once), and owns the increment.
    Owed,
    /// The store refused the window for good (it would pass its range): not counted.
    Refused,
}

/// What a round trip tells a synchronous increment's caller.
#[derive(Debug)]
pub(super) enum Told {
    /// The store's total, with the increment in it.
    Counted(WindowRate),
    /// The store failed.
    Failed,
    /// The store may have taken it: the round trip is owed (see [`Sent::Owed`]).
    Owed,
    /// The store refused the window for good.
    Refused,
}

/// A synchronous increment waiting for its round trip.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) key: CompactString,
    pub(super) size: WindowSize,
    pub(super) value: f64,
    pub(super) now: UnixMs,
    /// What became of it.
    pub(super) tx: tokio::sync::oneshot::Sender<Told>,
}

#[derive(Debug, Default)]
pub(super) struct SyncQueue {
    pub(super) waiting: Vec<Waiting>,
    /// A task is sending batches; new arrivals only queue.
    pub(super) flushing: bool,
}

/// A window: key, size, start.
type LateWindow = (CompactString, u32, i64);

/// Synchronous increments answered before their round trip ended ([`Sent::Late`]), per
/// window, until the round trip settles them (in the store, or counted here when it
/// failed): an undo of one of them waits for that, so that it lands where the increment
/// did (see [`NamespaceSync::undo_increment`]).
#[derive(Debug, Default)]
pub(super) struct LateTrips {
    windows: std::sync::Mutex<std::collections::HashMap<LateWindow, usize>>,
    settled: tokio::sync::Notify,
}

impl LateTrips {
    fn add(&self, w: LateWindow) {
        *self.lock().entry(w).or_insert(0) += 1;
    }

    /// One of the window's late increments settled.
    fn settle(&self, w: &LateWindow) {
        {
            let mut m = self.lock();
            if let Some(n) = m.get_mut(w) {
                *n -= 1;
                if *n == 0 {
                    m.remove(w);
                }
            }
        }
        self.settled.notify_waiters();
    }

    fn in_flight(&self, w: &LateWindow) -> bool {
        self.lock().contains_key(w)
    }

    /// Until no late increment of `w` is in flight.
    async fn settled(&self, w: &LateWindow) {
        loop {
            let mut notified = std::pin::pin!(self.settled.notified());
            notified.as_mut().enable();
            if !self.in_flight(w) {
                return;
            }
            notified.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<LateWindow, usize>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Waiting {
    fn window(&self) -> LateWindow {
        (
            self.key.clone(),
            self.size.secs(),
            self.size.start_of(self.now),
        )
    }
}

/// The pause before a round trip whose reply was lost is sent again.
const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// Synchronous increments per round trip at most.
pub(super) const SYNC_BATCH: usize = 2_000;

impl NamespaceSync {
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
        if self.store_for_requests().is_none() {
            return table.increment(key, value, now);
        }
        self.increment_through_store(table, key, value, now).await
    }

    /// Gives back a refund's `value` of hits in the key's window, right after
    /// [`Self::load_key`] read the window (`value` is at most the count it showed, with
    /// this node's hits not pushed yet). In synchronous mode the give-back goes to the
    /// store even while requests skip it (the breaker is open): the refund's read has just
    /// reached the store, and a refund answered in a synchronous namespace is in the store
    /// when answered, as a hit is; counted here instead, it would wait for the sync that
    /// closes the breaker (seconds, in backoff) while the refund told the client it was
    /// done. It goes there only as far as the store's count goes: the rest comes out of
    /// this node's hits not pushed yet (the store stops a count at zero, and those hits,
    /// pushed later, would add back what the refund took there).
    pub async fn refund_hits(
        self: &Arc<Self>,
        key: &str,
        window_size: u32,
        value: f64,
        now: UnixMs,
    ) -> Result<(), CoreError> {
        let table = self.counters.table(window_size)?;
        if self.mode != SyncMode::Synchronous || self.session.store.is_none() {
            return table.increment(key, -value, now).map(drop);
        }
        // the store's count as just read, without this node's hits not pushed yet
        let stored = table.rate(key, now, Some(0.0)).current.max(0.0);
        let in_store = value.min(stored);
        if value > in_store {
            table.increment(key, -(value - in_store), now)?;
        }
        if in_store > 0.0 {
            self.increment_through_store(table, key, -in_store, now)
                .await?;
        }
        Ok(())
    }

    /// A synchronous increment through the store (see [`Self::increment`]).
    async fn increment_through_store(
        self: &Arc<Self>,
        table: &WindowTable,
        key: &str,
        value: f64,
        now: UnixMs,
    ) -> Result<WindowRate, CoreError> {
        // the store's total is only known after the round trip: refuse on the local view
        // a value that would take the window out of range
        swin_core::check_value(value)?;
        let before = table.rate(key, now, None);
        let seen = before.current;
        if (seen + value).abs() > swin_core::MAX_COUNT {
            return Err(CoreError::CountOutOfRange {
                value,
                max: swin_core::MAX_COUNT,
            });
        }
        match self.increment_in_store(key, table.size(), value, now).await {
            Sent::Answered(rate) => Ok(rate),
            // the store failed (logged and recorded once for the batch): counted here,
            // pushed by a later sync
            Sent::Failed => table.increment(key, value, now),
            // the store is slow: answered from what the node knew when the hit was sent,
            // with the hit (the table may hold it by now: the round trip owns the hit
            // from here, in the store when it lands, counted here by the flush when it
            // fails)
            // or owed: the round trip is sent again until the store confirms it
            Sent::Late | Sent::Owed => Ok(WindowRate::at(
                table.size(),
                now,
                before.current + value,
                before.previous,
            )),
            // the store's count would pass its range with it (the count seen here was
            // lower: other nodes' hits): nothing was counted
            Sent::Refused => Err(CoreError::CountOutOfRange {
                value,
                max: swin_core::MAX_COUNT,
            }),
        }
    }

    /// Takes back `value` just counted by [`Self::increment`] in the key's window (an
    /// undo: its request was refused or failed as a whole). In synchronous mode an
    /// increment whose caller was answered before its round trip ended (late)
    /// is owned by that round trip: it lands in the store, or is counted here when it
    /// fails. Its undo must land in the same place, after it: it waits (in the
    /// background, the caller does not) for the window's late round trips to settle, then
    /// takes the value out of this node's count (which holds the store's total with the
    /// increment, or the increment as counted here), pushed by the next sync.
    pub async fn undo_increment(
        self: &Arc<Self>,
        key: &str,
        window_size: u32,
        value: f64,
        now: UnixMs,
    ) -> Result<(), CoreError> {
        let table = self.counters.table(window_size)?;
        let window: LateWindow = (key.into(), window_size, table.size().start_of(now));
        if !self.late.in_flight(&window) {
            return self
                .increment(key, window_size, -value, now)
                .await
                .map(drop);
        }
        let this = self.clone();
        // bounded: a round trip lasts at most the store timeout, and one may queue
        // behind another
        let most = self.session.timeout * 3 + self.session.answer_within;
        self.flushes.spawn(async move {
            if tokio::time::timeout(most, this.late.settled(&window))
                .await
                .is_err()
            {
                warn!(namespace = this.name(), key = %window.0, "a late synchronous hit did not settle; taken back here");
            }
            let undone = this
                .counters
                .table(window.1)
                .and_then(|t| t.increment(&window.0, -value, now));
            if let Err(e) = undone {
                warn!(namespace = this.name(), cause = %e, "a late synchronous hit could not be taken back");
            }
        });
        Ok(())
    }

    /// Queues a synchronous increment for the store and waits for its answer, at most
    /// `answer_within` ([`Sent::Late`] past it). Increments
    /// that arrive while a round trip is in flight wait and go together in the next one
    /// (one push statement and one read for all of them), so throughput grows with the
    /// callers while each still waits about one round trip (PostgreSQL, SQLite: one
    /// transaction instead of one per hit). The flushing runs in a task of its own: a
    /// caller that gives up does not stall the others.
    pub(super) async fn increment_in_store(
        self: &Arc<Self>,
        key: &str,
        size: WindowSize,
        value: f64,
        now: UnixMs,
    ) -> Sent {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
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
            // under the leading request's span: the batch's store calls are its children
            self.flushes
                .spawn(tracing::Instrument::in_current_span(async move {
                    this.flush_synchronous().await
                }));
        }
        match tokio::time::timeout(self.session.answer_within, &mut rx).await {
            Ok(Ok(told)) => told.into(),
            Ok(Err(_)) => Sent::Failed,
            Err(_) => {
                // the store is slow: later requests answer from memory at once until a
                // background sync reaches it again (one wait, not one per request)
                self.trip(&crate::StoreError::Timeout(self.session.answer_within));
                // late until the flush settles it (counted before the close: the flush
                // settles only what it could not answer, which is after the close)
                let window = (key.into(), size.secs(), size.start_of(now));
                self.late.add(window.clone());
                // no answer sent after this: the flush sees the caller gone
                rx.close();
                let sent = match rx.try_recv() {
                    Ok(told) => told.into(),
                    Err(_) => return Sent::Late,
                };
                self.late.settle(&window);
                sent
            }
        }
    }

    /// Sends what waits, in batches of at most SYNC_BATCH, until nothing does.
    pub(super) async fn flush_synchronous(self: Arc<Self>) {
        let Some(store) = self.session.store.clone() else {
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
    pub(super) async fn push_synchronous(&self, store: &Store, batch: Vec<Waiting>) {
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
        if !self.pay_owed(store).await {
            // an earlier round trip is still owed: nothing later goes before it
            let e = crate::StoreError::Unavailable("an earlier round trip is owed".into());
            return self.failed_synchronous(&e, batch);
        }
        let seq = self.next_sync_seq();
        let (answer, may_have_run) = self.send_until_known(store, &diffs, &prev_keys, seq).await;
        let (pushed, previous, refused) = match answer {
            Ok((p, r)) => {
                let refused: std::collections::HashSet<WindowKey> =
                    p.rejected.iter().map(|r| WindowKey::of(&r.diff)).collect();
                (self.settle(&diffs, p), r, refused)
            }
            Err(e) if may_have_run => {
                self.owe(seq, &diffs);
                return self.owed_synchronous(&e, batch);
            }
            Err(e) => return self.failed_synchronous(&e, batch),
        };
        let now = batch.iter().map(|w| w.now).max().unwrap_or(UnixMs(0));
        self.apply(&pushed, now, Create::Yes);
        self.apply(&previous, now, Create::Yes);
        type Window = (CompactString, u32, i64);
        let prev: std::collections::HashMap<Window, f64> = previous
            .iter()
            .map(|t| ((t.key.clone(), t.window_size, t.window_start), t.count))
            .collect();
        let currents = queue_order_totals(&diffs, &pushed);
        for ((w, d), current) in batch.into_iter().zip(&diffs).zip(currents) {
            let previous = prev
                .get(&(
                    d.key.clone(),
                    d.window_size,
                    w.size.previous_start_of(w.now),
                ))
                .copied()
                .unwrap_or(0.0);
            let window = w.window();
            let told = match refused.contains(&WindowKey::of(d)) {
                true => Told::Refused,
                false => Told::Counted(WindowRate::at(w.size, w.now, current, previous)),
            };
            if w.tx.send(told).is_err() {
                // answered late: it is in the store (and in the tables' totals) now
                self.late.settle(&window);
            }
        }
    }

    /// A batch's round trip under its number `seq`, sent again while the store does not
    /// say whether it took it (within the time its callers wait): the answer, and whether
    /// an attempt may have been applied.
    async fn send_until_known(
        &self,
        store: &Store,
        diffs: &[Diff],
        prev_keys: &[WindowKey],
        seq: u64,
    ) -> (
        Result<(crate::store::Pushed, Vec<Total>), crate::StoreError>,
        bool,
    ) {
        let until = tokio::time::Instant::now() + self.session.answer_within;
        let mut may_have_run = false;
        loop {
            let answer = if store.capabilities().pipelines {
                // Redis: one script call per slot does both — the previous windows ride
                // along as diffs of 0, which add nothing and bring their counts back
                self.push_with_previous(store, diffs, prev_keys, seq).await
            } else {
                self.push_beside_read(store, diffs, prev_keys, seq).await
            };
            let e = match answer {
                Ok(a) => return (Ok(a), may_have_run),
                Err(e) => e,
            };
            may_have_run |= owed::unknown(&e);
            if !may_have_run || tokio::time::Instant::now() + AGAIN_AFTER >= until {
                return (Err(e), may_have_run);
            }
            tokio::time::sleep(AGAIN_AFTER).await;
        }
    }

    /// SQL: the push and a read of the previous windows side by side (a 0 added to the
    /// previous windows would take their row locks on every hit).
    async fn push_beside_read(
        &self,
        store: &Store,
        diffs: &[Diff],
        prev_keys: &[WindowKey],
        seq: u64,
    ) -> Result<(crate::store::Pushed, Vec<Total>), crate::StoreError> {
        let push_id = self.sync_push_id();
        let push = Push {
            node_id: &push_id,
            seq: Some(seq),
            diffs,
        };
        let (pushed, previous) = tokio::join!(
            self.call(store.push(self.name(), push)),
            self.call(store.read(self.name(), prev_keys)),
        );
        pushed.and_then(|p| previous.map(|r| (p, r)))
    }

    /// A batch the store did not take: its callers answer from local counts (a caller
    /// already answered without waiting has its hit counted here, for a later sync).
    fn failed_synchronous(&self, e: &crate::StoreError, batch: Vec<Waiting>) {
        warn!(namespace = self.name(), cause = %e, hits = batch.len(), "synchronous increments failed; counted locally");
        self.record(Err(e));
        self.trip(e);
        for w in batch {
            let window = w.window();
            if w.tx.send(Told::Failed).is_err() {
                let counted = self
                    .counters
                    .table(w.size.secs())
                    .and_then(|t| t.increment(&w.key, w.value, w.now));
                if let Err(e) = counted {
                    warn!(namespace = self.name(), cause = %e, "a late synchronous hit could not be counted locally");
                }
                self.late.settle(&window);
            }
        }
    }
}

impl NamespaceSync {
    /// A batch the store may have taken without saying so: owed (see `owed.rs`), and its
    /// callers answer from what the node knew with their increment, counting nothing
    /// here (the owed round trip counts it, once).
    fn owed_synchronous(&self, e: &crate::StoreError, batch: Vec<Waiting>) {
        warn!(namespace = self.name(), cause = %e, hits = batch.len(), "synchronous increments not confirmed; sent again until the store confirms them");
        self.record(Err(e));
        self.trip(e);
        for w in batch {
            let window = w.window();
            if w.tx.send(Told::Owed).is_err() {
                // answered late: the owed round trip owns it
                self.late.settle(&window);
            }
        }
    }
}

impl From<Told> for Sent {
    fn from(told: Told) -> Sent {
        match told {
            Told::Counted(rate) => Sent::Answered(rate),
            Told::Failed => Sent::Failed,
            Told::Owed => Sent::Owed,
            Told::Refused => Sent::Refused,
        }
    }
}

impl NamespaceSync {
    /// The synchronous push and the previous windows' counts in the same call: the
    /// previous windows go as diffs of 0. Returns the push's answer for the current
    /// windows and the previous windows' totals (a window may be both).
    async fn push_with_previous(
        &self,
        store: &Store,
        diffs: &[Diff],
        previous: &[WindowKey],
        seq: u64,
    ) -> Result<(crate::store::Pushed, Vec<Total>), crate::StoreError> {
        let mut all = diffs.to_vec();
        all.extend(previous.iter().map(|w| Diff {
            key: w.key.clone(),
            window_size: w.window_size,
            window_start: w.window_start,
            value: 0.0,
        }));
        let push_id = self.sync_push_id();
        let push = Push {
            node_id: &push_id,
            seq: Some(seq),
            diffs: &all,
        };
        let mut reply = self.call(store.push(self.name(), push)).await?;
        type Window<'a> = (&'a str, u32, i64);
        let of = |w: &WindowKey| (w.key.clone(), w.window_size, w.window_start);
        let wanted: std::collections::HashSet<_> = previous.iter().map(of).collect();
        let counted: std::collections::HashSet<Window<'_>> = diffs
            .iter()
            .map(|d| (d.key.as_str(), d.window_size, d.window_start))
            .collect();
        let prev: Vec<Total> = reply
            .totals
            .iter()
            .filter(|t| wanted.contains(&(t.key.clone(), t.window_size, t.window_start)))
            .cloned()
            .collect();
        reply
            .totals
            .retain(|t| counted.contains(&(t.key.as_str(), t.window_size, t.window_start)));
        Ok((reply, prev))
    }
}

/// Each increment's current-window total as if the batch's increments had come one
/// after another in queue order: the store's total after the whole batch, less the
/// batch's own increments, plus this one's and those before it. A window whose total the
/// store did not return counts from the increment alone.
pub(super) fn queue_order_totals<'a>(diffs: &'a [Diff], after: &'a [Total]) -> Vec<f64> {
    type Window<'a> = (&'a str, u32, i64);
    let mut running: std::collections::HashMap<Window<'a>, f64> = after
        .iter()
        .map(|t| ((t.key.as_str(), t.window_size, t.window_start), t.count))
        .collect();
    for d in diffs {
        if let Some(t) = running.get_mut(&(d.key.as_str(), d.window_size, d.window_start)) {
            *t -= d.value;
        }
    }
    diffs
        .iter()
        .map(
            |d| match running.get_mut(&(d.key.as_str(), d.window_size, d.window_start)) {
                Some(t) => {
                    *t += d.value;
                    *t
                }
                None => d.value,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(key: &str, value: f64) -> Diff {
        Diff {
            key: key.into(),
            window_size: 60,
            window_start: 0,
            value,
        }
    }

    fn total(key: &str, count: f64) -> Total {
        Total {
            key: key.into(),
            window_size: 60,
            window_start: 0,
            count,
        }
    }

    #[test]
    fn each_caller_sees_the_batch_in_queue_order() {
        // the store held a = 6 and b = 3 before; the batch adds a 1, b 2, a 3
        let diffs = [diff("a", 1.0), diff("b", 2.0), diff("a", 3.0)];
        let after = [total("a", 10.0), total("b", 5.0)];
        assert_eq!(queue_order_totals(&diffs, &after), vec![7.0, 5.0, 10.0]);
        // a window the store did not return (refused) counts from the increment alone
        assert_eq!(queue_order_totals(&diffs[1..2], &after[..1]), vec![2.0]);
    }
}
