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

use crate::CoreError;

/// A GCRA limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: i64,
    count: i64,
    period: Duration,
    emission_ns: i64,
}

/// The answer to a spend, check or refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraDecision {
    pub allowed: bool,
    /// Whole requests of cost 1 left after this one.
    pub remaining: i64,
    /// How long until the same request would be allowed (zero when it would be now).
    pub retry_in: Duration,
    /// How long until the bucket is full again.
    pub reset_in: Duration,
    /// The TAT to store (unchanged when denied), Unix nanoseconds.
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

    fn check_cost(&self, cost: i64) -> Result<(), CoreError> {
        if cost < 0 || cost > self.burst {
            return Err(CoreError::InvalidCost {
                cost,
                burst: self.burst,
            });
        }
        Ok(())
    }

    /// Spends `cost` at `now_ns` from a bucket whose TAT is `tat_ns` (`None`: never used).
    pub fn spend(
        &self,
        tat_ns: Option<i64>,
        now_ns: i64,
        cost: i64,
    ) -> Result<GcraDecision, CoreError> {
        self.check_cost(cost)?;
        let tat = tat_ns.unwrap_or(now_ns).max(now_ns);
        let ei = self.emission_ns;
        let burst_offset = ei.saturating_mul(self.burst);
        let new_tat = tat.saturating_add(ei.saturating_mul(cost));
        let diff = now_ns - (new_tat - burst_offset);
        if diff < 0 {
            return Ok(GcraDecision {
                allowed: false,
                remaining: (now_ns - (tat - burst_offset)).div_euclid(ei).max(0),
                retry_in: nanos(-diff),
                reset_in: nanos(tat - now_ns),
                new_tat: tat_ns.unwrap_or(now_ns),
            });
        }
        // when could an identical request pass after this one?
        let next = new_tat + ei * cost - burst_offset - now_ns;
        Ok(GcraDecision {
            allowed: true,
            remaining: diff.div_euclid(ei),
            retry_in: nanos(next),
            reset_in: nanos(new_tat - now_ns),
            new_tat,
        })
    }

    /// What spending `cost` would answer, without spending (the TAT to keep is the old one).
    pub fn check(
        &self,
        tat_ns: Option<i64>,
        now_ns: i64,
        cost: i64,
    ) -> Result<GcraDecision, CoreError> {
        let d = self.spend(tat_ns, now_ns, cost)?;
        Ok(GcraDecision {
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
    ) -> Result<GcraDecision, CoreError> {
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
        Ok(GcraDecision {
            allowed,
            remaining: (now_ns - (new_tat - burst_offset)).div_euclid(ei),
            retry_in: Duration::ZERO,
            reset_in: nanos(new_tat - now_ns),
            new_tat,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Boulder's published GCRA vectors (ratelimits/gcra_test.go: TestDecide and
    //! TestMaybeRefund), step by step, with a fake clock.

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

    #[test]
    fn boulder_decide_vectors() {
        let l = limit();
        let mut clk = Clock(1_700_000_000 * S);
        let d = l.spend(Some(clk.0), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (9, Duration::ZERO, secs(1))
        );

        let d = l.spend(Some(d.new_tat), clk.0, 9).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(9), secs(10))
        );
        assert_eq!(d.new_tat, clk.0 + 10 * S);

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(1), secs(10))
        );

        clk.0 += d.retry_in.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert_eq!(d.remaining, 1);

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(1), secs(10))
        );

        clk.0 += d.reset_in.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (9, Duration::ZERO, secs(1))
        );

        clk.0 += d.reset_in.as_nanos() as i64 - MS;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (9, Duration::ZERO, nanos(MS))
        );

        clk.0 += 20 * 3600 * S;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        let d = l.spend(Some(d.new_tat), clk.0, 10).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(10), secs(10))
        );

        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, Duration::ZERO, secs(10))
        );

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(1), secs(10))
        );

        clk.0 += d.retry_in.as_nanos() as i64;
        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(1), secs(10))
        );

        clk.0 += d.reset_in.as_nanos() as i64 / 2;
        let d = l.spend(Some(d.new_tat), clk.0, 7).expect("cost");
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_in, d.reset_in), (5, secs(2), secs(5)));
    }

    #[test]
    fn boulder_refund_vectors() {
        let l = limit();
        let mut clk = Clock(1_700_000_000 * S);
        let d = l.spend(Some(clk.0), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (9, Duration::ZERO, secs(1))
        );

        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        let d = l.refund(Some(d.new_tat), clk.0, 0).expect("cost");
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        let d = l.spend(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (9, Duration::ZERO, secs(1))
        );

        clk.0 += d.reset_in.as_nanos() as i64;
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.allowed, "a full bucket takes no refund");
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        let d = l.spend(Some(d.new_tat), clk.0, 10).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (0, secs(10), secs(10))
        );

        let d = l.refund(Some(d.new_tat), clk.0, 10).expect("cost");
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        clk.0 += 11 * S;
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(!d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );

        let d = l.spend(Some(d.new_tat), clk.0, 5).expect("cost");
        let d = l.refund(Some(d.new_tat), clk.0, 1).expect("cost");
        assert!(d.allowed);
        assert_eq!((d.remaining, d.retry_in), (6, Duration::ZERO));

        clk.0 += 2500 * MS;
        let d = l.spend(Some(d.new_tat), clk.0, 0).expect("cost");
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (8, Duration::ZERO, nanos(1500 * MS))
        );

        let d = l.refund(Some(d.new_tat), clk.0, 2).expect("cost");
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in),
            (10, Duration::ZERO, Duration::ZERO)
        );
    }

    #[test]
    fn check_spends_nothing() {
        let l = limit();
        let now = 1_700_000_000 * S;
        let d = l.check(None, now, 3).expect("cost");
        assert!(d.allowed);
        assert_eq!(d.remaining, 7);
        assert_eq!(d.new_tat, now);
    }

    #[test]
    fn costs_and_limits_are_validated() {
        let l = limit();
        assert!(matches!(
            l.spend(None, 0, 11),
            Err(CoreError::InvalidCost {
                cost: 11,
                burst: 10
            })
        ));
        assert!(l.spend(None, 0, -1).is_err());
        assert!(Gcra::new(0, 1, Duration::from_secs(1)).is_err());
        assert!(Gcra::new(1, 0, Duration::from_secs(1)).is_err());
        assert!(Gcra::new(1, 10, Duration::from_nanos(5)).is_err());
    }
}
