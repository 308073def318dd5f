//! Synchronous increments (`sync_rate = 0`): every increment goes to the store and is
//! answered with the store's total. Increments that arrive while a round trip is in
//! flight wait and go together in the next one (one push and one read for all of them),
//! each answered as if the batch's increments had come one after another in queue order.

use std::sync::Arc;

use swin_core::{CompactString, CoreError, UnixMs, WindowRate, WindowSize, WindowTable};
use tracing::warn;

use super::{NamespaceSync, SyncMode};

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
    pub(super) fn settle(&self, w: &LateWindow) {
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
    pub(super) fn window(&self) -> LateWindow {
        (
            self.key.clone(),
            self.size.secs(),
            self.size.start_of(self.now),
        )
    }
}

/// The pause before a round trip whose reply was lost is sent again.
pub(super) const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

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
}
