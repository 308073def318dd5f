//! A bucket's grant under every interleaving loom can make of what runs on it at once
//! (`scripts/loom`: built with `--cfg swin_loom`, where `crate::sync` is loom's):
//! spends on the request threads (`spend_held`, the step `admit` takes under the slot's
//! lock), a refund (`give_back`), the store's answer (`answered`) and the engine's
//! prune of lapsed keys (`return_unused`). Each model checks that no unit is made or
//! lost: what was granted is what was spent (less what came back) plus what is still
//! held, no spend passes what was held, and a key has one request at the store at a
//! time.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use swin_core::{Gcra, GrantRequest, UnixMs};

use super::{answered, horizon, lock, BucketSlot, BucketState, Grants, Local};
use crate::store::Granted;
use crate::PushId;

const KEY: &str = "k";

/// 10 units a second, a burst of 10 (a horizon of 125 ms).
fn gcra() -> Gcra {
    Gcra::new(10, 10, Duration::from_secs(1)).expect("a bucket")
}

/// What one spend's step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spent {
    /// Spent from the units held.
    Admitted,
    /// Asks the store (its request is the key's one out).
    Asked(GrantRequest),
    /// Waits for the request out.
    Waits,
}

/// A spend of `cost` at time 0, as `admit` takes it: the key's slot (the new one when
/// this one was pruned under it), its lock, `spend_held`.
fn spend(g: &Grants, cost: i64) -> (Spent, std::sync::Arc<BucketSlot>) {
    loop {
        let slot = g.slot(KEY);
        let mut s = lock(&slot);
        let spent = match g.spend_held(&mut s, &gcra(), cost, 0) {
            Local::Answered(v) => {
                assert!(v.allowed, "spent but refused");
                Spent::Admitted
            }
            Local::Ask(r) => Spent::Asked(r),
            Local::Wait => Spent::Waits,
            Local::Pruned => continue,
        };
        drop(s);
        return (spent, slot);
    }
}

/// Units spent by spends that were admitted.
fn admitted(spends: &[(Spent, i64)]) -> i64 {
    spends
        .iter()
        .filter(|(s, _)| *s == Spent::Admitted)
        .map(|(_, c)| c)
        .sum()
}

/// The store's answer to `request`, granting `units`, taken into `slot`.
fn answer(slot: &BucketSlot, request: &GrantRequest, units: i64) {
    let answer = Ok(Granted {
        granted: units,
        tat_ns: Some(0),
    });
    let (_, _, took) = answered(slot, request, answer, &gcra()).expect("an answer");
    assert!(took, "a grant");
}

/// Grants with `units` granted to the key at time 0 (the first spend's request, the
/// store's answer), `spent` of them spent.
fn granted(units: i64, spent: i64) -> Arc<Grants> {
    let g = Arc::new(Grants::new(&PushId::new("node")));
    match spend(&g, 1) {
        (Spent::Asked(request), slot) => answer(&slot, &request, units),
        _ => panic!("a fresh key asks"),
    }
    for _ in 0..spent {
        assert_eq!(spend(&g, 1).0, Spent::Admitted);
    }
    g
}

/// The grant's units add up: what is spent is what the spends took less what came
/// back, never more than the grant, and the rest is held.
fn balanced(s: &BucketState, spent: i64, back: i64) {
    assert_eq!(s.spent, spent - back, "spent {spent}, {back} back");
    assert!(s.spent <= s.granted, "spent past the grant");
    assert_eq!(s.granted, s.spent + s.unused(0), "granted = spent + held");
}

/// A spend racing a refund of a unit spent before: the spend takes the refunded unit
/// when the refund came first, else asks the store; the refund gives back no more than
/// was spent.
#[test]
fn a_spend_racing_a_refund_makes_and_loses_no_unit() {
    loom::model(|| {
        let g = granted(2, 2);
        let spender = {
            let g = g.clone();
            thread::spawn(move || spend(&g, 1).0)
        };
        let back = g.give_back(KEY, 1, UnixMs(0));
        let spent = spender.join().expect("spender");
        assert_eq!(back, 1, "a spent unit goes back");
        let taken = 2 + admitted(&[(spent, 1)]);
        balanced(&lock(&g.slot(KEY)), taken, back);
    });
}

/// Two spends racing a refund of two units: only the units held or given back are
/// spent, and at most one spend asks the store (the other waits for its answer).
#[test]
fn two_spends_racing_a_refund_spend_only_what_is_held() {
    loom::model(|| {
        let g = granted(3, 2);
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                thread::spawn(move || spend(&g, 1).0)
            })
            .collect();
        let back = g.give_back(KEY, 2, UnixMs(0));
        let spends: Vec<_> = spenders
            .into_iter()
            .map(|t| (t.join().expect("spender"), 1))
            .collect();
        let asked = spends
            .iter()
            .filter(|(s, _)| matches!(s, Spent::Asked(_)))
            .count();
        assert!(asked <= 1, "one request out per key");
        assert!(
            back <= 2 + admitted(&spends),
            "gave back more than was spent"
        );
        balanced(&lock(&g.slot(KEY)), 2 + admitted(&spends), back);
    });
}

/// The store's answer to a spend's request racing a refund of a unit of the grant
/// before: the refunded unit is spent again or held; or, once the answer replaced that
/// grant, comes back into the new one when it has spent a unit, else goes nowhere (it
/// lapsed with its grant). The spend is admitted, from one grant or the other, and no
/// spend passes what the grants held.
#[test]
fn a_grant_answered_racing_a_refund_spends_only_what_was_granted() {
    loom::model(|| {
        let g = granted(1, 1);
        let spender = {
            let g = g.clone();
            thread::spawn(move || match spend(&g, 1) {
                (Spent::Asked(request), slot) => {
                    answer(&slot, &request, 2);
                    // the hit is admitted at the top of `admit`'s loop
                    (spend(&g, 1).0, 2)
                }
                (spent, _) => (spent, 0),
            })
        };
        let back = g.give_back(KEY, 1, UnixMs(0));
        let (spent, new) = spender.join().expect("spender");
        assert_eq!(spent, Spent::Admitted);
        assert!(back <= 1, "gave back more than was spent");
        let slot = g.slot(KEY);
        let s = lock(&slot);
        assert!(!s.inflight, "the answer was taken");
        // the first unit and this spend's, less the refund, from the grants' units
        assert!(2 - back <= 1 + new, "spent past what was granted");
        assert!(s.spent >= 0 && s.spent <= s.granted, "spent past the grant");
        assert_eq!(s.granted, s.spent + s.unused(0), "granted = spent + held");
    });
}

/// The engine's prune of lapsed keys (`return_unused`) racing two spends of a key whose
/// grant is spent: a spend holding a slot pruned under it takes the key's new slot, so
/// that exactly one request goes to the store for the key, from the slot the map holds
/// (where its answer is found).
#[test]
fn a_prune_racing_two_spends_leaves_one_request_in_the_map() {
    loom::model(|| {
        let g = granted(1, 1);
        let lapsed = horizon(&gcra()).as_nanos() as i64 + 1;
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                thread::spawn(move || spend(&g, 1))
            })
            .collect();
        g.prune(lapsed);
        let spends: Vec<_> = spenders
            .into_iter()
            .map(|t| t.join().expect("spender"))
            .collect();
        let asked: Vec<_> = spends
            .iter()
            .filter(|(s, _)| matches!(s, Spent::Asked(_)))
            .collect();
        assert_eq!(asked.len(), 1, "one request out per key");
        let slot = g.slot(KEY);
        let pruned = !std::sync::Arc::ptr_eq(&asked[0].1, &slot);
        assert!(!pruned, "asked from a pruned slot");
        assert!(lock(&slot).inflight);
    });
}
