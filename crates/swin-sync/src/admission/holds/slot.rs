//! One key's window quota on this node (a slot): what it holds and has used, and how
//! a hit is decided from it or asks the store for more.

use std::sync::Arc;

use swin_core::{HoldRequest, HoldState, UnixMs, WindowLimit};

use super::StrictView;
use crate::sync::{Mutex, MutexGuard};
use crate::StoreError;

#[derive(Debug, Default)]
pub(super) struct SlotState {
    pub(super) start: i64,
    pub(super) held: f64,
    pub(super) used: f64,
    pub(super) current: f64,
    pub(super) previous: f64,
    pub(super) block: f64,
    /// A request for this slot is at the store; hits wait for its answer.
    pub(super) inflight: bool,
    /// A request failed, or a return is out: the store may hold more for this node
    /// than `held` says (a reply lost, or not come yet), so what is unused goes back
    /// even when `held` shows none.
    pub(super) unsure: bool,
    pub(super) last_hit_ms: i64,
    /// Earlier windows and what was used in each: their quota goes back.
    pub(super) ended: Vec<(i64, f64)>,
    /// Ended windows whose quota went back, and what was used in each, while they are
    /// still the previous window: a give-back into one goes back to the store again.
    pub(super) returned: Vec<(i64, f64)>,
    /// Pruned from the map (its window over, nothing left to give back): a hit that
    /// still holds it takes the key's new slot instead.
    pub(super) dead: bool,
}

#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) state: Mutex<SlotState>,
    pub(super) changed: tokio::sync::Notify,
}

pub(super) fn lock(slot: &Slot) -> MutexGuard<'_, SlotState> {
    slot.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a hit of `cost` from the quota held fits under `limit` — the limit in force
/// now, which a runtime limit may have lowered since the quota was held — as the store
/// last showed the window: every other holder's quota counted as used, this node's as
/// what it has used. Quota held under the limit in force always fits (the store granted
/// it with the window under the limit, and a sliding window's previous weight only
/// falls), so this refuses only quota held under a higher limit.
pub(super) fn fits(s: &SlotState, weight: f64, limit: f64, cost: f64) -> bool {
    let unused = (s.held - s.used).max(0.0);
    (s.current - unused) + s.previous * weight + cost <= limit
}

pub(super) fn view(s: &SlotState, allowed: bool) -> StrictView {
    StrictView {
        allowed,
        current: s.current,
        previous: s.previous,
        unused: (s.held - s.used).max(0.0),
    }
}

/// The first block a key asks for beyond its first hit: a thousandth of the limit, between
/// 1 and 1,024 — a key far from a large limit starts with a few round trips instead of ten,
/// while under a small limit blocks stay single hits.
pub(super) fn first_block(limit: f64, cost: f64) -> f64 {
    (limit / 1000.0).floor().clamp(1.0, 1024.0).max(cost)
}

/// A hold that lowers the holder's total in a window to what it used.
/// What a slot can do for a hit without the store.
pub(super) enum Local {
    /// Decided from what it holds.
    Answered(StrictView),
    /// Ask the store for more (this hit's request is the one out).
    Ask(HoldRequest),
    /// Another hit's request is out: wait for its answer.
    Wait,
    /// The slot was pruned from the map: the hit takes the key's new one.
    Pruned,
}

/// Starts the slot afresh in the window starting at `start` (for a hit of `cost`),
/// keeping what ended for the return.
pub(super) fn roll(s: &mut SlotState, l: &WindowLimit, start: i64, cost: f64) {
    if s.start != 0 && (s.held > 0.0 || s.unsure) {
        let ended = (s.start, s.used);
        s.ended.push(ended);
    }
    // the window that ended, as this node last saw it, its own unused quota gone
    // back: the previous window of the key's answers until the store shows it
    let previous = match s.start == start - i64::from(l.window.secs()) {
        true => (s.current - (s.held - s.used).max(0.0)).max(0.0),
        false => 0.0,
    };
    let ended = std::mem::take(&mut s.ended);
    let returned = std::mem::take(&mut s.returned);
    *s = SlotState {
        start,
        previous,
        block: first_block(l.limit, cost),
        inflight: s.inflight,
        ended,
        returned,
        ..SlotState::default()
    };
}

/// Decides a hit of `cost` from the slot's quota when it can (a new window starts
/// the slot afresh, keeping what ended for the return), unless the slot was pruned.
pub(super) fn from_slot(
    s: &mut SlotState,
    l: &WindowLimit,
    start: i64,
    weight: f64,
    cost: f64,
    now: UnixMs,
) -> Local {
    if s.dead {
        return Local::Pruned;
    }
    if s.start != start {
        roll(s, l, start, cost);
    }
    s.last_hit_ms = now.0;
    if s.held - s.used >= cost {
        if !fits(s, weight, l.limit, cost) {
            // held under a higher limit than the one in force (a runtime limit
            // lowered it): the window is already past it
            return Local::Answered(view(s, false));
        }
        s.used += cost;
        return Local::Answered(view(s, true));
    }
    if s.inflight {
        return Local::Wait;
    }
    s.inflight = true;
    let need = s.used + cost;
    Local::Ask(HoldRequest {
        limit: l.limit,
        weight,
        need,
        want: need + s.block,
    })
}

/// Takes the store's answer to `request` into the slot and decides the hit by it;
/// `None` when the window ended while the request was out.
pub(super) fn settle(
    slot: &Slot,
    start: i64,
    request: &HoldRequest,
    answer: Result<HoldState, Arc<StoreError>>,
    l: &WindowLimit,
    weight: f64,
    cost: f64,
) -> Result<Option<StrictView>, Arc<StoreError>> {
    let mut s = lock(slot);
    s.inflight = false;
    slot.changed.notify_waiters();
    let held = match answer {
        Ok(h) => h,
        Err(e) => {
            if s.start == start {
                s.unsure = true;
            }
            return Err(e);
        }
    };
    if s.start != start {
        return Ok(None);
    }
    s.unsure = false;
    let whole = held.held >= request.want;
    s.held = held.held;
    s.current = held.current;
    s.previous = held.previous;
    s.block = if whole {
        s.block * 2.0
    } else {
        (s.block / 2.0).max(1.0)
    };
    let allowed = s.held - s.used >= cost && fits(&s, weight, l.limit, cost);
    if allowed {
        s.used += cost;
    }
    Ok(Some(view(&s, allowed)))
}
