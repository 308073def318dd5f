//! Strict admission of GCRA buckets: how much of a bucket one holder's grant may
//! take. Every store applies [`settle_grant`] atomically on the bucket's TAT and the
//! holder's last grant.
//!
//! A grant request asks at the holder's clock `now` for units it may spend until
//! `now + horizon` (then the rest is dropped, never given back: a TAT cannot be lowered
//! safely once others were granted after it). The store checks it as if every unit were
//! spent at the earliest instant (`now`: Boulder's check, `max(tat, now) + k·ei − now ≤
//! burst·ei`) and moves the TAT as if every unit were spent at the latest
//! (`tat = max(tat, now + horizon) + k·ei`). Both are the strict side of Boulder's rule
//! (`max(tat, t) − t` only shrinks as `t` grows, and a later arrival only moves a TAT
//! further), so however the units are really spent inside the horizon, and whatever
//! order grant requests of several holders reach the store in, the spends the cluster
//! admits pass Boulder's rule taken in time order. The price: a bucket that drains to
//! full loses up to `horizon / ei` units each time it is granted from again.
//!
//! A holder numbers its grant requests; the store keeps the last number and grant per
//! holder and answers a repeated number with the same grant, changing nothing, so a
//! lost reply neither makes nor loses quota when the holder asks again.

/// What a holder asks of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRequest {
    /// The holder's number for this request; a repeat is answered as the first.
    pub seq: i64,
    /// The holder's clock, Unix nanoseconds.
    pub now_ns: i64,
    /// How long after `now_ns` the holder may spend the units.
    pub horizon_ns: i64,
    /// The bucket's emission interval and burst.
    pub emission_ns: i64,
    pub burst: i64,
    /// Units granted whole or not at all.
    pub need: i64,
    /// Units the holder would like (at least `need`).
    pub want: i64,
}

/// A bucket as the store holds it: its TAT (`None`: no bucket, it is full) and the
/// holder's last grant (request number, units granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantState {
    pub tat_ns: Option<i64>,
    pub last: Option<(i64, i64)>,
}

/// The bucket after a grant and the units granted (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantSettled {
    pub state: GrantState,
    pub granted: i64,
}

/// The bucket and the grant after the request: what every store computes. Beyond
/// `need`, one grant takes at most [`crate::HOLD_SHARE`] of the room left.
pub fn settle_grant(s: GrantState, r: GrantRequest) -> GrantSettled {
    if let Some((seq, granted)) = s.last {
        if seq == r.seq {
            return GrantSettled { state: s, granted };
        }
    }
    let ei = r.emission_ns.max(1);
    let horizon = r.horizon_ns.max(0);
    let need = r.need.max(0);
    let earliest = s.tat_ns.unwrap_or(r.now_ns).max(r.now_ns);
    // units that pass Boulder's check at `now`
    let room = (r.now_ns.saturating_add(ei.saturating_mul(r.burst)) - earliest).div_euclid(ei);
    let granted = if need == 0 || need > room {
        0
    } else {
        let extra = (r.want - need).max(0);
        let share = ((room - need) as f64 * crate::HOLD_SHARE).floor() as i64;
        need + extra.min(share.max(0))
    };
    let tat_ns = if granted > 0 {
        let latest = s
            .tat_ns
            .unwrap_or(i64::MIN)
            .max(r.now_ns.saturating_add(horizon));
        Some(latest.saturating_add(ei.saturating_mul(granted)))
    } else {
        s.tat_ns
    };
    GrantSettled {
        state: GrantState {
            tat_ns,
            last: Some((r.seq, granted)),
        },
        granted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: i64 = 1_000_000;

    fn req(seq: i64, now_ns: i64, need: i64, want: i64) -> GrantRequest {
        GrantRequest {
            seq,
            now_ns,
            horizon_ns: 10 * MS,
            emission_ns: 100 * MS,
            burst: 10,
            need,
            want,
        }
    }

    const FRESH: GrantState = GrantState {
        tat_ns: None,
        last: None,
    };

    #[test]
    fn a_fresh_bucket_grants_its_burst_checked_at_now_placed_at_the_horizon() {
        let r = settle_grant(FRESH, req(1, 0, 10, 10));
        assert_eq!(r.granted, 10);
        assert_eq!(r.state.tat_ns, Some(10 * MS + 1000 * MS));
        // nothing more until the TAT comes back within the burst
        assert_eq!(settle_grant(r.state, req(2, 0, 1, 1)).granted, 0);
        assert_eq!(settle_grant(r.state, req(2, 100 * MS, 1, 1)).granted, 0);
        assert_eq!(settle_grant(r.state, req(2, 110 * MS, 1, 1)).granted, 1);
    }

    #[test]
    fn beyond_the_need_a_share_of_the_room() {
        // room 10, need 2: 2 + ⌊8 / 4⌋
        assert_eq!(settle_grant(FRESH, req(1, 0, 2, 100)).granted, 4);
        assert_eq!(settle_grant(FRESH, req(1, 0, 11, 11)).granted, 0);
    }

    #[test]
    fn a_repeat_is_answered_as_the_first_and_changes_nothing() {
        let once = settle_grant(FRESH, req(7, 0, 3, 3));
        let again = settle_grant(once.state, req(7, 50 * MS, 3, 3));
        assert_eq!(again, once);
        // a denial is remembered as a grant of 0
        let full = GrantState {
            tat_ns: Some(5_000 * MS),
            last: None,
        };
        let denied = settle_grant(full, req(8, 0, 1, 1));
        assert_eq!(denied.granted, 0);
        assert_eq!(denied.state.tat_ns, full.tat_ns);
        assert_eq!(settle_grant(denied.state, req(8, 0, 1, 1)), denied);
    }

    /// Boulder's rule over spends in time order: each spend of one unit at `t` passes
    /// when `max(tat, t) + ei − t ≤ burst·ei`.
    fn conforms(mut spends: Vec<i64>, ei: i64, burst: i64) -> bool {
        spends.sort_unstable();
        let mut tat = i64::MIN;
        for t in spends {
            let next = tat.max(t) + ei;
            if next - t > burst * ei {
                return false;
            }
            tat = next;
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        /// Holders ask at their own instants (not in order), spend what they were
        /// granted anywhere inside their horizons, retry some requests: the spends the
        /// cluster makes pass Boulder's rule in time order.
        #[test]
        fn spends_inside_the_horizons_pass_boulders_rule(
            burst in 1i64..20,
            horizon in 0i64..300,
            asks in prop::collection::vec(
                (0usize..3, 0i64..2_000, 1i64..4, 0i64..8, 0.0f64..1.0, any::<bool>()), 1..60),
        ) {
            let ei = 100;
            let mut s = FRESH;
            let mut last = [None::<(i64, i64)>; 3];
            let mut seq = [0i64; 3];
            let mut clock = 0i64;
            let mut spends = Vec::new();
            for (h, dt, need, extra, at, retry) in asks {
                // arrivals at the store may be out of the holders' clock order
                clock += dt - 500;
                let now = clock.max(0);
                seq[h] += 1;
                let r = GrantRequest {
                    seq: seq[h], now_ns: now, horizon_ns: horizon, emission_ns: ei,
                    burst, need, want: need + extra,
                };
                let mut out = settle_grant(GrantState { last: last[h], ..s }, r);
                if retry {
                    let again = settle_grant(out.state, r);
                    prop_assert_eq!(again, out);
                    out = again;
                }
                s = out.state;
                last[h] = s.last;
                // at the horizon's ends (where the danger is) or inside it
                for u in 0..out.granted {
                    let frac = match (at * 3.0) as u32 {
                        0 => 0.0,
                        1 => 1.0,
                        _ => (at + u as f64 * 0.37).fract(),
                    };
                    spends.push(now + (horizon as f64 * frac) as i64);
                }
            }
            prop_assert!(conforms(spends, ei, burst));
        }
    }
}
