//! Synchronous round trips (see `synchronous`): a batch of waiting increments pushed
//! with the previous windows' read in one call, sent again under its number while its
//! reply is lost, each caller answered as if the batch had come in queue order.

use std::sync::Arc;

use swin_core::{CompactString, Diff, Total, UnixMs, WindowRate};
use tracing::warn;

use super::synchronous::{Sent, Told, Waiting, AGAIN_AFTER, SYNC_BATCH};
use super::{owed, Create, NamespaceSync};
use crate::store::{Push, Store, WindowKey};

impl NamespaceSync {
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
        let sent = self.fresh.next();
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
        self.apply_answered(&pushed, now, Create::Yes, sent);
        self.apply_answered(&previous, now, Create::Yes, sent);
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
                // Redis (a script call per slot) and PostgreSQL (one statement) do both:
                // the previous windows ride along as diffs of 0, read, not written
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

    /// SQLite: the push and a read of the previous windows side by side.
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
