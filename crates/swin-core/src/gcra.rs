//! GCRA token buckets with Boulder's semantics: a limit is `burst`, `count` per
//! `period`; only the theoretical arrival time (TAT) is stored, in Unix nanoseconds.
//!
//! Spend `cost` at `now`: `t = max(now, tat)`, `new = t + ei·cost`,
//! `diff = now − (new − bo)` with emission interval `ei = period / count` and burst
//! offset `bo = ei · burst`. Denied when `diff < 0` (the TAT stays); otherwise allowed,
//! `remaining = ⌊diff / ei⌋` and the TAT becomes `new`. A refund moves the TAT back by
//! `ei·cost`, never before `now`. Because a spend only ever moves the TAT forward by
//! `ei·cost` from `max(now, tat)`, nodes can push TAT advances as diffs and a store can
//! apply them as `tat = max(tat, now) + Σ advances`.

use std::time::Duration;

use crate::{CoreError, Decision};

/// A GCRA limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: i64,
    count: i64,
    period: Duration,
    emission_ns: i64,
}

/// What a spend, check or refund decided, and the TAT to store after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcraOutcome {
    pub decision: Decision,
    /// The TAT to store (unchanged when denied or checked), Unix nanoseconds.
    pub new_tat: i64,
}

fn nanos(d: i64) -> Duration {
    Duration::from_nanos(u64::try_from(d.max(0)).unwrap_or(u64::MAX))
}

impl Gcra {
    /// `burst` and `count` at least 1, `period` at least 1 ns and at most ~292 years.
    pub fn new(burst: i64, count: i64, period: Duration) -> Result<Self, CoreError> {
        let period_ns = i64::try_from(period.as_nanos()).unwrap_or(i64::MAX);
        if burst < 1 || count < 1 || period_ns < 1 || period_ns < count {
            return Err(CoreError::InvalidLimit(format!(
                "gcra needs burst >= 1, count >= 1 and a period of at least count nanoseconds \
                 (got burst {burst}, count {count}, period {period:?})"
            )));
        }
        // rounded to the nearest nanosecond, as Boulder does
        let emission_ns = (period_ns as f64 / count as f64).round() as i64;
        Ok(Gcra {
            burst,
            count,
            period,
            emission_ns,
        })
    }

    pub fn burst(&self) -> i64 {
        self.burst
    }

    pub fn count(&self) -> i64 {
        self.count
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn emission_interval(&self) -> Duration {
        nanos(self.emission_ns)
    }

    /// The emission interval in nanoseconds: how far one unit of cost moves the TAT.
    pub fn emission_ns(&self) -> i64 {
        self.emission_ns
    }

    /// A cost in whole units this bucket can spend: 0 to the burst.
    pub fn check_cost(&self, cost: i64) -> Result<(), CoreError> {
        if cost < 0 || cost > self.burst {
            return Err(self.invalid_cost(cost as f64));
        }
        Ok(())
    }

    fn invalid_cost(&self, cost: f64) -> CoreError {
        CoreError::InvalidCost {
            cost,
            max: self.burst as f64,
            what: "a whole number",
        }
    }

    /// A cost in whole units a spend decides: 0 up to 2^53. One past the burst never
    /// passes (denied, as a window's cost past its limit is) but can be forced in: a
    /// commit's overrun charged as debt.
    fn check_spend(&self, cost: i64) -> Result<(), CoreError> {
        if !(0..crate::MAX_COUNT as i64).contains(&cost) {
            return Err(self.invalid_cost(cost as f64));
        }
        Ok(())
    }

    /// A cost as whole units to force into the bucket (overrun as debt): any whole
    /// number from 0 up to 2^53, the burst no bound.
    pub fn forced_units(&self, cost: f64) -> Result<i64, CoreError> {
        if !(cost.is_finite() && cost.fract() == 0.0 && (0.0..crate::MAX_COUNT).contains(&cost)) {
            return Err(CoreError::InvalidCost {
                cost,
                max: crate::MAX_COUNT,
                what: "a whole number",
            });
        }
        Ok(cost as i64)
    }

    /// A request's cost as whole units this bucket can spend: 0 to the burst.
    pub fn units(&self, cost: f64) -> Result<i64, CoreError> {
        if !(cost.is_finite() && cost.fract() == 0.0 && cost >= 0.0 && cost <= self.burst as f64) {
            return Err(self.invalid_cost(cost));
        }
        Ok(cost as i64)
    }

    fn decision(&self, allowed: bool, remaining: i64, retry_ns: i64, reset_ns: i64) -> Decision {
        // the TAT past now + the burst offset: units spent beyond the burst
        let past = reset_ns.saturating_sub(self.emission_ns.saturating_mul(self.burst));
        Decision {
            debt: past.max(0) as f64 / self.emission_ns as f64,
            allowed,
            limit: self.burst as f64,
            remaining: remaining.max(0) as f64,
            reset_after: nanos(reset_ns),
            retry_after: if allowed {
                Duration::ZERO
            } else {
                nanos(retry_ns)
            },
        }
    }

    /// Spends `cost` at `now_ns` from a bucket whose TAT is `tat_ns` (`None`: never used).
    /// Any cost from 0 up to 2^53 is decided; one past the burst is always denied (the
    /// caller checks a hit's cost against the burst first: [`Self::units`]). A bucket
    /// whose TAT is past `now` + the burst offset (a debt) denies every spend until the
    /// time has caught up.
    pub fn spend(
        &self,
        tat_ns: Option<i64>,
        now_ns: i64,
        cost: i64,
    ) -> Result<GcraOutcome, CoreError> {
        self.check_spend(cost)?;
        let tat = tat_ns.unwrap_or(now_ns).max(now_ns);
        let ei = self.emission_ns;
        let burst_offset = ei.saturating_mul(self.burst);
        let new_tat = tat.saturating_add(ei.saturating_mul(cost));
        let diff = now_ns - (new_tat - burst_offset);
        if diff < 0 {
            let remaining = (now_ns - (tat - burst_offset)).div_euclid(ei);
            return Ok(GcraOutcome {
                decision: self.decision(false, remaining, -diff, tat - now_ns),
                new_tat: tat_ns.unwrap_or(now_ns),
            });
        }
        Ok(GcraOutcome {
            decision: self.decision(true, diff.div_euclid(ei), 0, new_tat - now_ns),
            new_tat,
        })
    }

    /// What spending `cost` would answer, without spending (the TAT to keep is the old one).
    pub fn dry_run(
        &self,
        tat_ns: Option<i64>,
        now_ns: i64,
        cost: i64,
    ) -> Result<GcraOutcome, CoreError> {
        let d = self.spend(tat_ns, now_ns, cost)?;
        Ok(GcraOutcome {
            new_tat: tat_ns.unwrap_or(now_ns),
            ..d
        })
    }

    /// Gives `cost` back. Not allowed (and nothing changes) when the bucket is full.
    pub fn refund(
        &self,
        tat_ns: Option<i64>,
        now_ns: i64,
        cost: i64,
    ) -> Result<GcraOutcome, CoreError> {
        self.check_cost(cost)?;
        let ei = self.emission_ns;
        let burst_offset = ei.saturating_mul(self.burst);
        let tat = tat_ns.unwrap_or(now_ns).max(now_ns);
        let allowed = tat > now_ns;
        let new_tat = if allowed {
            (tat - ei.saturating_mul(cost)).max(now_ns)
        } else {
            tat
        };
        let remaining = (now_ns - (new_tat - burst_offset)).div_euclid(ei);
        Ok(GcraOutcome {
            // a refund makes no one wait
            decision: Decision {
                retry_after: Duration::ZERO,
                ..self.decision(allowed, remaining, 0, new_tat - now_ns)
            },
            new_tat,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Boulder's published GCRA vectors (ratelimits/gcra_test.go: TestDecide and
    //! TestMaybeRefund), step by step, with a fake clock. One difference, on purpose:
    //! Boulder's `retryIn` on an allowed decision says when the next identical request
    //! would pass; here `retry_after` is zero whenever a hit is allowed, as for windows
    //! and in the HTTP answer.

    use super::*;

    const S: i64 = 1_000_000_000;
    const MS: i64 = 1_000_000;

    fn limit() -> Gcra {
        Gcra::new(10, 1, Duration::from_secs(1)).expect("valid")
    }

    fn secs(n: i64) -> Duration {
        nanos(n * S)
    }

    struct Clock(i64);

    /// Remaining, retry after and reset after, as Boulder's vectors list them.
    fn v(o: &GcraOutcome) -> (i64, Duration, Duration) {
        let d = o.decision;
        (d.remaining as i64, d.retry_after, d.reset_after)
    }

    #[test]
    fn boulder_decide_vectors() {
        let l = limit();
        let mut clk = Clock(1_700_000_000 * S);
        let d = l.spend(Some(clk.0), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (9, Duration::ZERO, secs(1)));

        let d = l.spend(Some(d.new_tat), clk.0, 9).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));
        assert_eq!(d.new_tat, clk.0 + 10 * S);

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.decision.allowed);
        assert_eq!(v(&d), (0, secs(1), secs(10)));

        clk.0 += d.decision.retry_after.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert_eq!(v(&d).0, 1);

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));

        clk.0 += d.decision.reset_after.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (9, Duration::ZERO, secs(1)));

        clk.0 += d.decision.reset_after.as_nanos() as i64 - MS;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (9, Duration::ZERO, nanos(MS)));

        clk.0 += 20 * 3600 * S;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        let d = l.spend(Some(d.new_tat), clk.0, 10).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));

        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.decision.allowed);
        assert_eq!(v(&d), (0, secs(1), secs(10)));

        clk.0 += d.decision.retry_after.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));

        clk.0 += d.decision.reset_after.as_nanos() as i64 / 2;
        let d = l.spend(Some(d.new_tat), clk.0, 7).expect("cost");
        assert!(!d.decision.allowed);
        assert_eq!(v(&d), (5, secs(2), secs(5)));
    }

    #[test]
    fn boulder_refund_vectors() {
        let l = limit();
        let mut clk = Clock(1_700_000_000 * S);
        let d = l.spend(Some(clk.0), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (9, Duration::ZERO, secs(1)));

        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        let d = l.refund(Some(d.new_tat), clk.0, 0).expect("cost");
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (9, Duration::ZERO, secs(1)));

        clk.0 += d.decision.reset_after.as_nanos() as i64;
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.decision.allowed, "a full bucket takes no refund");
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        let d = l.spend(Some(d.new_tat), clk.0, 10).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (0, Duration::ZERO, secs(10)));

        let d = l.refund(Some(d.new_tat), clk.0, 10).expect("cost");
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        clk.0 += 11 * S;
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.decision.allowed);
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));

        let d = l.spend(Some(d.new_tat), clk.0, 5).expect("cost");
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!((v(&d).0, v(&d).1), (6, Duration::ZERO));

        clk.0 += 2500 * MS;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d), (8, Duration::ZERO, nanos(1500 * MS)));

        let d = l.refund(Some(d.new_tat), clk.0, 2).expect("cost");
        assert_eq!(v(&d), (10, Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn a_dry_run_spends_nothing() {
        let l = limit();
        let now = 1_700_000_000 * S;
        let d = l.dry_run(None, now, 3).expect("cost");
        assert!(d.decision.allowed);
        assert_eq!(v(&d).0, 7);
        assert_eq!(d.new_tat, now);
    }

    #[test]
    fn costs_and_limits_are_validated() {
        let l = limit();
        assert!(matches!(
            l.units(11.0),
            Err(CoreError::InvalidCost {
                cost: 11.0,
                max: 10.0,
                ..
            })
        ));
        // a spend decides a cost past the burst (a forced overrun needs it): denied
        let d = l.spend(None, 0, 11).expect("decided");
        assert!(!d.decision.allowed);
        assert_eq!(d.new_tat, 0);
        assert!(l.spend(None, 0, -1).is_err());
        assert!(l.spend(None, 0, 1 << 53).is_err());
        assert!(l.forced_units(11.0).is_ok());
        assert!(l.forced_units(1.5).is_err());
        assert!(Gcra::new(0, 1, Duration::from_secs(1)).is_err());
        assert!(Gcra::new(1, 0, Duration::from_secs(1)).is_err());
        assert!(Gcra::new(1, 10, Duration::from_nanos(5)).is_err());
    }

    /// A TAT forced past now + the burst offset (a commit's overrun as debt): every
    /// spend is denied until the time has caught up, its wait exact, and the debt is the
    /// units past the burst.
    #[test]
    fn a_bucket_in_debt_denies_until_the_time_has_caught_up() {
        let l = limit(); // 10 at once, 1 a second
        let now = 1_700_000_000 * S;
        // 25 forced in at once: 15 past the burst
        let forced = now + 25 * S;
        let d = l.spend(Some(forced), now, 0).expect("decided");
        assert!(
            !d.decision.allowed,
            "a bucket in debt admits nothing, not even 0"
        );
        assert_eq!(d.decision.debt, 15.0);
        assert_eq!(d.decision.remaining, 0.0);
        let d = l.spend(Some(forced), now, 1).expect("decided");
        assert!(!d.decision.allowed);
        // the TAT must come back to now + 10 - 1: 16 s
        assert_eq!(d.decision.retry_after, secs(16));
        assert_eq!(d.new_tat, forced, "a denied spend leaves the TAT");
        let later = now + 16 * S;
        let d = l.spend(Some(forced), later - 1, 1).expect("decided");
        assert!(!d.decision.allowed, "one nanosecond early");
        let d = l.spend(Some(forced), later, 1).expect("decided");
        assert!(d.decision.allowed);
        assert_eq!(d.decision.debt, 0.0);
        // within the burst: no debt
        let d = l.spend(None, now, 10).expect("decided");
        assert_eq!(d.decision.debt, 0.0);
    }
}
