//! Quota going back to the store: what ended windows did not use, what idle keys hold,
//! everything at shutdown (the engine's loop, [`QuotaKeeper`]), and a commit's give-back
//! into an ended window at once.

use std::sync::Arc;

use swin_core::{CompactString, HoldRequest, UnixMs, WindowLimit};

use super::slot::{lock, Slot};
use super::{Holds, SlotKey, IDLE_MS};
use crate::engine::QuotaKeeper;
use crate::store::Hold;
use crate::NamespaceSync;

/// A current window's quota going back: its slot, its start, what the slot asks the
/// store to hold for it there, what it held before.
type GoingBack = (Arc<Slot>, i64, f64, f64);

impl QuotaKeeper for Holds {
    fn return_unused<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        now: UnixMs,
        all: bool,
    ) -> futures_util::future::BoxFuture<'a, bool> {
        Box::pin(self.return_held(sync, now, all))
    }

    fn tracked(&self) -> usize {
        self.tracked()
    }

    fn round_trips(&self) -> u64 {
        self.calls.round_trips()
    }
}

impl Holds {
    /// Returns quota to the store: what ended windows did not use (whether or not a hit
    /// has rolled the key to a new window since), what idle keys hold unused, or (`all`,
    /// at shutdown) everything unused. Run by the engine's loop every tick; a
    /// return that fails is tried again at the next.
    /// True when nothing is left to return.
    async fn return_held(&self, sync: &Arc<NamespaceSync>, now: UnixMs, all: bool) -> bool {
        self.prune(now);
        let Some(store) = sync.store().cloned() else {
            return true;
        };
        let (holds, current) = self.going_back(now, all);
        if holds.is_empty() {
            return true;
        }
        let answer = self.calls.holds(sync, &store, &holds).await;
        let ok = answer.is_ok();
        self.gone_back(&holds, current, ok);
        ok
    }

    /// What a return asks the store (under each slot's lock): a hold at what was used
    /// for each ended window, and for each current window that gives back (ended with
    /// no hit since to roll the slot, idle, or `all`), its slot, window and what it asks
    /// the store to hold for it there.
    pub(super) fn going_back(&self, now: UnixMs, all: bool) -> (Vec<Hold>, Vec<GoingBack>) {
        let mut holds = Vec::new();
        let mut current = Vec::new();
        for ((key, size), slot) in self.all() {
            let mut s = lock(&slot);
            if !s.inflight {
                // (a request still out for an ended window could land after its give-back)
                for &(start, used) in &s.ended {
                    holds.push(returned(&key, size, start, used));
                }
            }
            let idle = now.0 - s.last_hit_ms >= IDLE_MS;
            // a window that ended with no hit since to roll the slot
            let over = now.0 >= (s.start + i64::from(size)).saturating_mul(1000);
            if (all || idle || over) && !s.inflight && (s.held > s.used || s.unsure) && s.start != 0
            {
                // no hit uses the quota while it goes back: the slot holds what it used
                // (hits beyond it wait for the answer), and the store may hold more for
                // it until the answer comes (a lost one leaves it unsure: it goes back
                // again at the next return)
                s.inflight = true;
                holds.push(returned(&key, size, s.start, s.used));
                current.push((slot.clone(), s.start, s.used, s.held));
                s.held = s.used;
                s.unsure = true;
            }
        }
        (holds, current)
    }

    /// The store's answer to a return (`ok`: it took `holds`) taken into the slots.
    pub(super) fn gone_back(&self, holds: &[Hold], current: Vec<GoingBack>, ok: bool) {
        for (slot, start, want, held) in current {
            let mut s = lock(&slot);
            s.inflight = false;
            if ok && s.start == start {
                // the store holds `want` now (the slot's `held` since the return went
                // out), and counts it in the window; a give-back while it was out leaves
                // `used` below it, to go back at the next return
                s.current = (s.current - (held - want).max(0.0)).max(0.0);
                s.unsure = false;
                s.block = 1.0;
            }
            slot.changed.notify_waiters();
        }
        if ok {
            returned_all(holds, self.all());
        }
    }

    /// Returns now what the ended windows of `key` hold (a commit gave back into one):
    /// the give-back is in the store when the commit answers, not at the engine's next
    /// tick. A return of the key already out (the tick's, or a hit's ask) is waited for
    /// first: it may carry the window as it was before the give-back, and this call's
    /// return then carries the rest. A return that fails is left for the tick to try
    /// again.
    pub async fn return_ended(&self, sync: &Arc<NamespaceSync>, key: &str, limits: &[WindowLimit]) {
        let Some(store) = sync.store().cloned() else {
            return;
        };
        let key = CompactString::from(key);
        let (holds, slots) = loop {
            match self.ended_of(&key, limits) {
                Ended::Ready(holds, slots) => break (holds, slots),
                Ended::Out(slot) => {
                    // a return or ask ends within the store's timeout (its answer or
                    // its failure); past it the tick returns what is left
                    let notified = slot.changed.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if !lock(&slot).inflight {
                        continue;
                    }
                    let wait = sync.store_timeout();
                    if tokio::time::timeout(wait, notified).await.is_err() {
                        return;
                    }
                }
            }
        };
        if holds.is_empty() {
            return;
        }
        let Ok(states) = self.calls.holds(sync, &store, &holds).await else {
            return;
        };
        // the store's count of an ended window that is the slot's previous one, every
        // node's hits and give-backs in it: the key's answers count it from now
        for (h, st) in holds.iter().zip(&states) {
            if let Some((_, slot)) = slots.iter().find(|((_, size), _)| *size == h.window_size) {
                let mut s = lock(slot);
                if s.start == h.window_start + i64::from(h.window_size) {
                    s.previous = st.current;
                }
            }
        }
        returned_all(&holds, slots);
    }

    /// What the ended windows of `key` hold, with their slots; or, when one of the
    /// key's slots has a request out, what to wait on before asking again.
    fn ended_of(&self, key: &CompactString, limits: &[WindowLimit]) -> Ended {
        let mut holds = Vec::new();
        let mut slots = Vec::new();
        for l in limits {
            let size = l.window.secs();
            let slot = self.slot(key, size);
            let s = lock(&slot);
            if s.inflight {
                drop(s);
                return Ended::Out(slot);
            }
            if s.ended.is_empty() {
                continue;
            }
            for &(start, used) in &s.ended {
                holds.push(returned(key, size, start, used));
            }
            drop(s);
            slots.push(((key.clone(), size), slot));
        }
        Ended::Ready(holds, slots)
    }
}

/// The ended windows of a key, ready to go back, or a request of the key still out.
enum Ended {
    Ready(Vec<Hold>, Vec<(SlotKey, Arc<Slot>)>),
    Out(Arc<Slot>),
}

/// After `holds` went back to the store: each slot's ended windows that went back at
/// what they still use are kept as returned; one given back into while its return was
/// out goes again.
fn returned_all(holds: &[Hold], slots: impl IntoIterator<Item = (SlotKey, Arc<Slot>)>) {
    let given: std::collections::HashMap<(&str, u32, i64), f64> = holds
        .iter()
        .map(|h| {
            (
                (h.key.as_str(), h.window_size, h.window_start),
                h.request.want,
            )
        })
        .collect();
    for ((key, size), slot) in slots {
        let mut s = lock(&slot);
        let (back, kept) = std::mem::take(&mut s.ended)
            .into_iter()
            .partition(|(start, used)| given.get(&(key.as_str(), size, *start)) == Some(used));
        s.ended = kept;
        s.returned.extend::<Vec<_>>(back);
    }
}

fn returned(key: &CompactString, size: u32, start: i64, used: f64) -> Hold {
    Hold {
        key: key.clone(),
        window_size: size,
        window_start: start,
        request: HoldRequest {
            limit: 0.0,
            weight: 0.0,
            need: 0.0,
            want: used,
        },
    }
}
