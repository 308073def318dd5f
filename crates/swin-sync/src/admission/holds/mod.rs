//! Strict admission of window limits (`admission = "strict"`): a node admits a hit only
//! from quota it holds, taken from the store with [`crate::Store::hold`] (see
//! `swin_core::settle_hold`). [`Holds`] owns that quota; the engine's loop asks it to
//! return what is unused to the store ([`QuotaKeeper`]).
//!
//! Per key and window size a slot keeps what this node holds in the current window and
//! how much of it it has used. A hit that fits in the unused part is admitted from
//! memory; otherwise one request for the slot goes to the store (`need` = used + the
//! hit, `want` = need + a block that doubles while holds are taken whole and
//! halves when not) and the hits behind it wait for its answer (batched with other keys'
//! by `queue.rs`). A slot has at most one request in flight, and every request states
//! the holder's total, so a retry or a lost reply can neither make nor lose quota.
//!
//! Quota goes back (the holder's total lowered to what it used; `returns.rs`): for a
//! window at the engine's first tick after it ends, for a key idle for [`IDLE_MS`], and
//! at shutdown. A node that
//! dies holding quota leaves it counted until its window ends: the cluster then admits
//! less, never more.
//!
//! `grants.rs` is the bucket side.

#[cfg(all(test, swin_loom))]
mod loom_models;
mod returns;
mod slot;

use std::collections::HashMap;
use std::sync::Arc;

use swin_core::{
    CompactString, HoldRequest, HoldState, Total, UnixMs, WindowAlgorithm, WindowLimit,
};

use self::slot::{from_slot, lock, settle, view, Local, Slot};
use super::queue::{queue_for_store, Queue, StoreCalls};
use crate::store::Hold;
use crate::sync::Mutex;
use crate::{NamespaceSync, StoreError};

/// A key with quota it has not used for this long gives the rest back.
pub const IDLE_MS: i64 = 5_000;

/// The answer for one limit: admitted or not, and the window as this node knows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StrictView {
    pub allowed: bool,
    /// The window's count at the store's last answer, with every holder's quota in it.
    pub current: f64,
    pub previous: f64,
    /// Quota this node holds in the window and has not used.
    pub unused: f64,
}

type SlotKey = (CompactString, u32);

/// The window quota a strict namespace holds, per key and window size, and its store
/// calls.
#[derive(Debug)]
pub struct Holds {
    calls: Arc<StoreCalls>,
    slots: Mutex<HashMap<SlotKey, Arc<Slot>>>,
    queue: Arc<std::sync::Mutex<Queue<Hold, HoldState>>>,
}

impl Holds {
    pub fn new(push: &crate::PushId) -> Self {
        Holds {
            calls: Arc::new(StoreCalls::new(push)),
            slots: Mutex::default(),
            queue: Arc::default(),
        }
    }

    fn slot(&self, key: &str, size: u32) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .entry((key.into(), size))
            .or_insert_with(|| Arc::new(Slot::default()))
            .clone()
    }

    /// Forgets the slots whose window has ended with nothing held unused and nothing to
    /// give back or ask again (the holder's total in the store is final), and those never
    /// used. Without it a strict namespace would keep a slot for every key it ever saw.
    fn prune(&self, now: UnixMs) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|(_, size), slot| {
            let mut s = lock(slot);
            // kept while its window is the previous one: a commit may still give back
            // into it (see `returned`)
            let size = i64::from(*size);
            let previous = size.saturating_mul(1000).saturating_mul(2);
            s.returned
                .retain(|(start, _)| now.0 < start.saturating_mul(1000).saturating_add(previous));
            let over = s.start == 0 || now.0 >= s.start * 1000 + previous;
            let done = over
                && !s.inflight
                && !s.unsure
                && s.ended.is_empty()
                && s.returned.is_empty()
                && s.held <= s.used;
            s.dead = done;
            !done
        });
    }

    /// The window of `key` and `size` starting at `start` as this node last saw it from
    /// the store (count with every holder's quota, previous count, quota this node holds
    /// unused); `None` when it holds nothing for that window.
    pub fn seen(&self, key: &str, size: u32, start: i64) -> Option<StrictView> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.get(&(CompactString::from(key), size))?;
        let s = lock(slot);
        (s.start == start).then(|| view(&s, false))
    }

    /// Keys (per window size) with strict-admission state on this node.
    fn tracked(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn all(&self) -> Vec<(SlotKey, Arc<Slot>)> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Holds {
    /// The holder name of this run (its totals in the store).
    pub fn holder(&self) -> &crate::Holder {
        &self.calls.holder
    }

    /// Strict admission of a hit of `cost` on `key` under every limit in `limits`: each
    /// admits from quota this node holds (holding more when it must); a hit denied by
    /// one limit gives back what the others took. An error means the store could not
    /// be asked: nothing was admitted, and the caller decides on its own.
    pub async fn admit(
        &self,
        sync: &Arc<NamespaceSync>,
        key: &str,
        limits: &[WindowLimit],
        cost: f64,
        now: UnixMs,
    ) -> Result<Vec<StrictView>, Arc<StoreError>> {
        let mut views = Vec::with_capacity(limits.len());
        let mut taken: Vec<(Arc<Slot>, i64)> = Vec::new();
        let mut outcome = Ok(());
        for l in limits {
            match self.admit_one(sync, key, l, cost, now).await {
                Ok((v, slot, start)) => {
                    if v.allowed {
                        taken.push((slot, start));
                    }
                    views.push(v);
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if outcome.is_err() || views.iter().any(|v| !v.allowed) {
            for (slot, start) in taken {
                let mut s = lock(&slot);
                if s.start == start {
                    s.used = (s.used - cost).max(0.0);
                }
            }
            outcome?;
            for v in &mut views {
                v.allowed = false;
            }
        }
        Ok(views)
    }

    /// Gives back `cost` of admitted hits on `key` counted in the window of `at` (a
    /// refund, an undo): the quota is this node's to admit again, or, for a window that
    /// has ended, goes back to the store with the ended window's. `previous_too` (a
    /// reservation's settlement): what that window cannot take back comes out of the one
    /// before it. Returns how much went back (at most what this node admitted in the
    /// windows, in the limit that gave back most).
    pub fn give_back(
        &self,
        key: &str,
        limits: &[WindowLimit],
        cost: f64,
        at: UnixMs,
        previous_too: bool,
    ) -> f64 {
        let mut back = 0.0f64;
        for l in limits {
            // a key this node holds nothing of gives nothing back (and gets no slot)
            let slot = {
                let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
                match slots.get(&(CompactString::from(key), l.window.secs())) {
                    Some(slot) => slot.clone(),
                    None => continue,
                }
            };
            let mut s = lock(&slot);
            let start = l.window.start_of(at);
            let size = i64::from(l.window.secs());
            let mut b = give_back_in(&mut s, start, size, cost);
            if previous_too {
                b += give_back_in(&mut s, start - size, size, cost - b);
            }
            back = back.max(b);
        }
        back
    }

    /// Spends up to `cost` of `key` from the quota this node holds unused in each
    /// limit's current window (a commit's overrun forced in as debt, past what any hold
    /// could take): answers, per limit, how much came from it; the rest is the caller's
    /// to count. The slot is left with nothing unused, so the key's next hit asks the
    /// store, which by then counts the rest; its view of the window counts the rest
    /// already, so that what it answers meanwhile (a dry run, the commit's own answer)
    /// shows the debt.
    pub fn use_up(&self, key: &str, limits: &[WindowLimit], cost: f64, now: UnixMs) -> Vec<f64> {
        limits
            .iter()
            .map(|l| {
                let slot = self.slot(key, l.window.secs());
                let mut s = lock(&slot);
                let start = l.window.start_of(now);
                if s.start != start {
                    if s.inflight {
                        return 0.0;
                    }
                    slot::roll(&mut s, l, start, cost);
                }
                let from_held = match s.inflight {
                    true => 0.0,
                    false => cost.min((s.held - s.used).max(0.0)),
                };
                s.used += from_held;
                s.current += cost - from_held;
                s.last_hit_ms = now.0;
                from_held
            })
            .collect()
    }

    async fn admit_one(
        &self,
        sync: &Arc<NamespaceSync>,
        key: &str,
        l: &WindowLimit,
        cost: f64,
        now: UnixMs,
    ) -> Result<(StrictView, Arc<Slot>, i64), Arc<StoreError>> {
        let size = l.window;
        let start = size.start_of(now);
        let weight = match l.algorithm {
            WindowAlgorithm::Sliding => size.previous_weight(now),
            WindowAlgorithm::Fixed => 0.0,
        };
        let mut slot = self.slot(key, size.secs());
        let mut refetch = false;
        let request = loop {
            if std::mem::take(&mut refetch) {
                slot = self.slot(key, size.secs());
            }
            let notified = slot.changed.notified();
            tokio::pin!(notified);
            {
                let mut s = lock(&slot);
                match from_slot(&mut s, l, start, weight, cost, now) {
                    Local::Answered(v) => return Ok((v, slot.clone(), start)),
                    Local::Ask(request) => break request,
                    Local::Wait => {
                        notified.as_mut().enable();
                    }
                    Local::Pruned => {
                        refetch = true;
                        continue;
                    }
                }
            }
            notified.await;
        };
        let sent = sync.fresh_number();
        let answer = self
            .hold_batched(sync, key, size.secs(), start, request)
            .await;
        match settle(&slot, start, &request, answer, l, weight, cost)? {
            Some(v) => {
                // the key's counts as the store just showed them, for reads of its rate
                let totals = [
                    Total {
                        key: key.into(),
                        window_size: size.secs(),
                        window_start: start,
                        count: v.current,
                    },
                    Total {
                        key: key.into(),
                        window_size: size.secs(),
                        window_start: start - i64::from(size.secs()),
                        count: v.previous,
                    },
                ];
                sync.apply_totals(&totals, now, sent);
                Ok((v, slot, start))
            }
            // the window ended while the request was out: its quota goes back with the
            // ended window's; this hit counts in the new window
            None => {
                let later = UnixMs(now.0.max((start + i64::from(size.secs())) * 1000));
                Box::pin(self.admit_one(sync, key, l, cost, later)).await
            }
        }
    }

    /// Queues a hold for the next store call and waits for its answer.
    async fn hold_batched(
        &self,
        sync: &Arc<NamespaceSync>,
        key: &str,
        size: u32,
        start: i64,
        request: HoldRequest,
    ) -> Result<HoldState, Arc<StoreError>> {
        let hold = Hold {
            key: key.into(),
            window_size: size,
            window_start: start,
            request,
        };
        let calls = self.calls.clone();
        queue_for_store(sync, &self.queue, hold, move |sync, store, holds| {
            let calls = calls.clone();
            async move { calls.holds(&sync, &store, &holds).await }
        })
        .await
    }
}

/// Gives back up to `cost` of what the slot used in the window starting at `start`:
/// its current window, one that ended and has not gone back to the store yet, or one
/// whose quota went back already (then it goes back again, at what is left used: the
/// store lowers this node's hold in it, and the window's count with it).
/// A window that is the slot's previous one (`size` seconds before its current one)
/// counts what went back in the slot's view of it too, for the key's answers meanwhile.
fn give_back_in(s: &mut slot::SlotState, start: i64, size: i64, cost: f64) -> f64 {
    let b = if let Some(i) = s.returned.iter().position(|(e, _)| *e == start) {
        let (_, used) = s.returned.remove(i);
        let b = cost.min(used.max(0.0));
        s.ended.push((start, used - b));
        b
    } else {
        let used = match s.start == start {
            true => &mut s.used,
            false => match s.ended.iter_mut().find(|(e, _)| *e == start) {
                Some((_, used)) => used,
                None => return 0.0,
            },
        };
        let b = cost.min(used.max(0.0));
        *used -= b;
        b
    };
    if s.start == start + size {
        s.previous = (s.previous - b).max(0.0);
    }
    b
}
