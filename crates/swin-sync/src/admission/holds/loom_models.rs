//! A key's window quota under every interleaving loom can make of what runs on it at
//! once (`scripts/loom`: built with `--cfg swin_loom`, where `crate::sync` is loom's):
//! hits on the request threads (`from_slot`, the step `admit_one` takes under the
//! slot's lock, and `settle` when one asks the store), a refund or a settlement's
//! give-back (`give_back`), and the engine's return of unused quota (`going_back`, the
//! store call, `gone_back`). The store is `settle_hold` on a map of windows, under a
//! lock. Each model checks that no quota is made or lost: what the store holds for the
//! node in a window is what the node counts as held there, what the node used is what
//! its hits took less what came back, never more than it holds, and nothing gives back
//! more than was taken.

use std::collections::HashMap;

use loom::sync::{Arc, Mutex};
use loom::thread;
use swin_core::{settle_hold, HoldState, UnixMs, WindowAlgorithm, WindowLimit, WindowSize};

use super::slot::{from_slot, lock, settle, Local, SlotState};
use super::Holds;
use crate::store::Hold;
use crate::PushId;

const KEY: &str = "k";

/// The window starting at 60 s.
const T0: UnixMs = UnixMs(60_000);

/// 10 hits a minute, a fixed window.
fn limit() -> WindowLimit {
    WindowLimit {
        window: WindowSize::new(60).expect("a size"),
        limit: 10.0,
        algorithm: WindowAlgorithm::Fixed,
        shadow: false,
    }
}

/// The store: each window's count and this node's total in it, moved by `settle_hold`.
#[derive(Default)]
struct Store(Mutex<HashMap<i64, HoldState>>);

impl Store {
    fn hold(&self, holds: &[Hold]) -> Vec<HoldState> {
        let mut windows = self.0.lock().expect("store");
        let empty = HoldState {
            current: 0.0,
            previous: 0.0,
            held: 0.0,
        };
        holds
            .iter()
            .map(|h| {
                let w = windows.entry(h.window_start).or_insert(empty);
                *w = settle_hold(*w, h.request);
                *w
            })
            .collect()
    }

    /// The node's total in the window starting at `start`.
    fn held(&self, start: i64) -> f64 {
        let windows = self.0.lock().expect("store");
        windows.get(&start).map_or(0.0, |w| w.held)
    }
}

/// Quota and a store, shared by a model's threads.
struct Node {
    holds: Holds,
    store: Store,
}

type Shared = Arc<Node>;

fn node() -> Shared {
    Arc::new(Node {
        holds: Holds::new(&PushId::new("node")),
        store: Store::default(),
    })
}

/// A hit of `cost` at `now`, as `admit_one` takes it: decided from the slot (the key's
/// new one when this one was pruned under it) or, when it asks, by the store's answer.
/// The cost it took (0: refused, or waiting for another hit's request).
fn hit(n: &Node, cost: f64, now: UnixMs) -> f64 {
    let l = limit();
    let start = l.window.start_of(now);
    loop {
        let slot = n.holds.slot(KEY, l.window.secs());
        let request = match from_slot(&mut lock(&slot), &l, start, 0.0, cost, now) {
            Local::Answered(v) => return if v.allowed { cost } else { 0.0 },
            Local::Wait => return 0.0,
            Local::Pruned => continue,
            Local::Ask(r) => r,
        };
        let hold = Hold {
            key: KEY.into(),
            window_size: l.window.secs(),
            window_start: start,
            request,
        };
        let answer = Ok(n.store.hold(&[hold])[0]);
        let v = settle(&slot, start, &request, answer, &l, 0.0, cost).expect("an answer");
        return match v {
            Some(v) if v.allowed => cost,
            _ => 0.0,
        };
    }
}

/// The engine's return at `now`: what goes back, the store's answer (which the store
/// applies, but the node does not get when `lost`), taken in.
fn give_back_unused(n: &Node, now: UnixMs, lost: bool) {
    let (holds, current) = n.holds.going_back(now, false);
    if !holds.is_empty() {
        n.store.hold(&holds);
        n.holds.gone_back(&holds, current, !lost);
    }
}

/// A refund of `cost` of the hits in the window of `at`.
fn refund(n: &Node, cost: f64, at: UnixMs) -> f64 {
    n.holds.give_back(KEY, &[limit()], cost, at, false)
}

/// The key's slot, locked for `check`.
fn slot(n: &Node, check: impl FnOnce(&SlotState)) {
    let slot = n.holds.slot(KEY, limit().window.secs());
    check(&lock(&slot));
}

/// The slot's current window adds up: the store holds for the node what the node
/// counts as held, and the node used what its hits took less what came back, within
/// what it holds.
fn balanced(n: &Node, taken: f64, back: f64) {
    let store = n.store.held(limit().window.start_of(T0));
    slot(n, |s| {
        assert!(!s.inflight, "nothing left out");
        assert_eq!(s.held, store, "the node holds what the store holds for it");
        assert_eq!(s.used, taken - back, "used: {taken} taken, {back} back");
        assert!(s.used <= s.held, "used {} past the {} held", s.used, s.held);
    });
}

/// A hit that fits in what the key holds and one that asks the store, racing a refund
/// of two hits taken before: each is admitted from what is held (or refused), and the
/// refund gives back what was taken.
#[test]
fn two_hits_racing_a_refund_take_only_what_is_held() {
    loom::model(|| {
        let n = node();
        let first = hit(&n, 2.0, T0);
        assert_eq!(first, 2.0);
        slot(&n, |s| assert_eq!((s.held, s.used), (4.0, 2.0)));
        let hits: Vec<_> = [1.0, 3.0]
            .into_iter()
            .map(|cost| {
                let n = n.clone();
                thread::spawn(move || hit(&n, cost, T0))
            })
            .collect();
        let back = refund(&n, 2.0, T0);
        let taken: f64 = hits.into_iter().map(|t| t.join().expect("hit")).sum();
        assert_eq!(back, 2.0, "what was taken goes back");
        balanced(&n, first + taken, back);
    });
}

/// A hit that fits in what an idle key holds racing the engine's return of that quota
/// (its answer `lost` or not): the hit takes quota the node still holds (before the
/// return, or asking the store after it), never quota that went back.
fn a_hit_racing_a_return(lost: bool) {
    loom::model(move || {
        let n = node();
        let first = hit(&n, 2.0, T0);
        let idle = UnixMs(T0.0 + super::IDLE_MS);
        let hitter = {
            let n = n.clone();
            thread::spawn(move || hit(&n, 1.0, idle))
        };
        give_back_unused(&n, idle, lost);
        let taken = hitter.join().expect("hit");
        balanced(&n, first + taken, 0.0);
    });
}

#[test]
fn a_hit_racing_the_return_of_idle_quota_takes_none_that_went_back() {
    a_hit_racing_a_return(false);
}

#[test]
fn a_hit_racing_a_return_whose_answer_is_lost_takes_none_that_went_back() {
    a_hit_racing_a_return(true);
}

/// A refund into a window that has ended racing that window's return: what goes back
/// reaches the store exactly once, in this return or the next.
#[test]
fn a_refund_into_an_ended_window_racing_its_return_reaches_the_store() {
    loom::model(|| {
        let n = node();
        assert_eq!(hit(&n, 2.0, T0), 2.0);
        // a hit in the next window rolls the slot: the first window has ended
        let next = UnixMs(T0.0 + 60_000);
        assert_eq!(hit(&n, 1.0, next), 1.0);
        let returner = {
            let n = n.clone();
            thread::spawn(move || give_back_unused(&n, next, false))
        };
        let back = refund(&n, 1.0, T0);
        returner.join().expect("return");
        // the engine's next tick
        give_back_unused(&n, next, false);
        assert_eq!(back, 1.0, "what was taken goes back");
        let start = limit().window.start_of(T0);
        assert_eq!(
            n.store.held(start),
            2.0 - back,
            "the store holds what was used"
        );
        slot(&n, |s| {
            assert!(s.ended.is_empty(), "nothing left to go back");
            assert_eq!(s.returned, vec![(start, 2.0 - back)]);
        });
    });
}
