//! Strict admission's arithmetic: how much of a window's room one holder's hold
//! may take. Every store applies [`settle_hold`] atomically, on the window's stored count
//! and the holder's stored total, so the cluster's holds never add up past the
//! limit:
//!
//! - a window's stored count includes every hold at once, so every node sees
//!   held quota as used;
//! - a sliding window's room `limit − current − previous × weight(t)` only grows as `t`
//!   goes through the window (the weight falls), so a hold that fit when it was
//!   made fits until the window ends; a fixed window has weight 0;
//! - a holder asks for its *total* to be somewhere in `[need, want]`, never for an
//!   increment: a retried request whose first attempt was applied (its reply lost) finds
//!   its total already there and changes nothing, so a lost reply neither makes nor
//!   loses quota. Lowering the total (`want` below it) gives quota back the same way.

/// What a holder asks of one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoldRequest {
    /// The window's limit.
    pub limit: f64,
    /// The previous window's weight at the holder's clock (0 for a fixed window).
    pub weight: f64,
    /// The least total the holder can use (what it has admitted plus what waits);
    /// raised to this whole or not at all.
    pub need: f64,
    /// The total it would like (`need` plus a block for the hits to come). A total above
    /// `want` is lowered to `want`: the difference goes back to the window.
    pub want: f64,
}

/// A window as the store holds it, and the holder's total in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoldState {
    pub current: f64,
    pub previous: f64,
    pub held: f64,
}

/// Of the room left beyond what is needed, one hold takes at most this share
/// (rounded down to whole units), so holders near the limit leave room for each other
/// and blocks shrink to single hits.
pub const HOLD_SHARE: f64 = 0.25;

/// The window and the holder's total after the request: what every store computes.
pub fn settle_hold(s: HoldState, r: HoldRequest) -> HoldState {
    let held = s.held.max(0.0);
    if r.want < held {
        // give back down to `want` (never below zero, never more than the window holds)
        let back = (held - r.want.max(0.0)).min(s.current.max(0.0));
        return HoldState {
            current: s.current - back,
            previous: s.previous,
            held: held - back,
        };
    }
    if r.need <= held {
        return HoldState { held, ..s };
    }
    let room = r.limit - s.current - s.previous * r.weight;
    let need = r.need - held;
    // a NaN anywhere is no room
    if need.partial_cmp(&room).is_none_or(|o| o.is_gt()) {
        return HoldState { held, ..s };
    }
    let extra = (r.want - held - need).max(0.0);
    // whole units beyond the need: hits of cost 1 leave no fraction of room unusable
    let grant = need + extra.min(((room - need) * HOLD_SHARE).max(0.0)).floor();
    HoldState {
        current: s.current + grant,
        previous: s.previous,
        held: held + grant,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(current: f64, previous: f64, held: f64) -> HoldState {
        HoldState {
            current,
            previous,
            held,
        }
    }

    fn req(limit: f64, weight: f64, need: f64, want: f64) -> HoldRequest {
        HoldRequest {
            limit,
            weight,
            need,
            want,
        }
    }

    #[test]
    fn a_need_is_met_whole_or_not_at_all() {
        // room 10 − 4 − 8 × 0.5 = 2
        assert_eq!(
            settle_hold(state(4.0, 8.0, 0.0), req(10.0, 0.5, 3.0, 3.0)).held,
            0.0
        );
        let s = settle_hold(state(4.0, 8.0, 0.0), req(10.0, 0.5, 2.0, 2.0));
        assert_eq!((s.held, s.current), (2.0, 6.0));
    }

    #[test]
    fn beyond_the_need_a_share_of_the_room() {
        // room 100, need 1, want 1,000: 1 + ⌊99 / 4⌋
        let s = settle_hold(state(0.0, 0.0, 0.0), req(100.0, 0.0, 1.0, 1000.0));
        assert_eq!(s.held, 1.0 + 24.0);
        assert_eq!(s.current, s.held);
    }

    #[test]
    fn a_retry_changes_nothing() {
        let r = req(100.0, 0.3, 5.0, 20.0);
        let once = settle_hold(state(10.0, 50.0, 0.0), r);
        assert_eq!(settle_hold(once, r), once);
        let back = req(100.0, 0.3, 0.0, 2.0);
        let returned = settle_hold(once, back);
        assert_eq!(returned.held, 2.0);
        assert_eq!(settle_hold(returned, back), returned);
    }

    proptest! {
        /// Whatever holders ask, in any order, retried or not: the window's count stays
        /// within the limit whenever it grows, and it is the other counts plus the totals held.
        #[test]
        fn holders_never_hold_past_the_limit(
            limit in 1.0f64..1000.0,
            previous in 0.0f64..2000.0,
            others in 0.0f64..500.0,
            asks in prop::collection::vec((0usize..3, 0.0f64..1.0, 0.0f64..300.0, 0.0f64..600.0, any::<bool>()), 1..60),
        ) {
            let mut current = others;
            let mut held = [0.0f64; 3];
            let mut weight: f64 = 1.0;
            for (h, dw, need, want, retry) in asks {
                weight = (weight - dw * 0.1).max(0.0); // time goes on: the weight falls
                let r = req(limit, weight, need, want);
                let before = current;
                let times = if retry { 2 } else { 1 };
                for _ in 0..times {
                    let s = settle_hold(state(current, previous, held[h]), r);
                    current = s.current;
                    held[h] = s.held;
                }
                if current > before {
                    prop_assert!(current + previous * weight <= limit + 1e-9);
                }
                prop_assert!((current - others - held.iter().sum::<f64>()).abs() < 1e-6);
            }
        }
    }
}
