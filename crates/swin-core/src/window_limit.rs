//! Allow or deny a hit against a limit on one window size, from the window counts a
//! table holds: the sliding window (the weighted previous window counts) and the fixed
//! window (only the current window counts). Being limited is a value ([`Decision`]),
//! not an error.

use std::time::Duration;

use crate::{CoreError, Decision, UnixMs, WindowSize};

/// How a window limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowAlgorithm {
    Sliding,
    Fixed,
}

/// At most `limit` hits per `window`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowLimit {
    pub window: WindowSize,
    pub limit: f64,
    pub algorithm: WindowAlgorithm,
    /// Decided but not enforced: a hit only this limit would deny is let through (and
    /// counted), marked as a would-be denial.
    pub shadow: bool,
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(u64::try_from(v.max(0)).unwrap_or(u64::MAX))
}

impl WindowLimit {
    pub fn new(
        window: WindowSize,
        limit: f64,
        algorithm: WindowAlgorithm,
    ) -> Result<Self, CoreError> {
        // past 2^53 no count could tell the limit from its neighbours, nor reach it
        if !(limit.is_finite() && limit > 0.0 && limit < crate::MAX_COUNT) {
            return Err(CoreError::InvalidLimit(format!(
                "a window limit must be above 0 and below 2^53 ({}), got {limit}",
                crate::MAX_COUNT
            )));
        }
        Ok(WindowLimit {
            window,
            limit,
            algorithm,
            shadow: false,
        })
    }

    /// The same limit, in shadow when `on`.
    pub fn shadowed(self, on: bool) -> Self {
        WindowLimit { shadow: on, ..self }
    }

    /// The most one hit may cost under this limit when it is enforced: the limit, and at
    /// least 1 (a hit of cost 1 under a limit below 1 is denied, not an error).
    pub fn most_at_once(&self) -> f64 {
        self.limit.max(1.0)
    }

    /// A cost this limit takes when it is enforced: between 0 and [`Self::most_at_once`].
    /// A limit in shadow takes any cost [`crate::check_cost`] takes (it decides, never
    /// refuses).
    pub fn check_cost(&self, cost: f64) -> Result<(), CoreError> {
        crate::check_cost(cost)?;
        if !self.shadow && cost > self.most_at_once() {
            return Err(CoreError::InvalidCost {
                cost,
                max: self.most_at_once(),
                what: "a number",
            });
        }
        Ok(())
    }

    /// Decides a hit of `cost` given the key's counts in the current and previous window
    /// (cluster totals plus local hits), without counting it. Any cost
    /// [`crate::check_cost`] takes is decided (whether it is more than the limit allows
    /// at once is the caller's check, [`Self::check_cost`]): one more than the limit is
    /// denied, with the wait until nothing counted now weighs on the window.
    pub fn decide(
        &self,
        current: f64,
        previous: f64,
        now: UnixMs,
        cost: f64,
    ) -> Result<Decision, CoreError> {
        crate::check_cost(cost)?;
        let s = i64::from(self.window.secs()) * 1000;
        let into = now.0.rem_euclid(s);
        let to_end = s - into;
        if cost > self.limit {
            // never passes: denied, until what counts now weighs nothing
            let rate = match self.algorithm {
                WindowAlgorithm::Fixed => current,
                WindowAlgorithm::Sliding => current + previous * self.window.previous_weight(now),
            };
            let until = match self.algorithm {
                WindowAlgorithm::Fixed => to_end,
                WindowAlgorithm::Sliding => to_end + s,
            };
            return Ok(Decision {
                allowed: false,
                limit: self.limit,
                remaining: (self.limit - rate).max(0.0).floor(),
                reset_after: ms(until),
                retry_after: ms(until),
                debt: (rate - self.limit).max(0.0),
            });
        }
        match self.algorithm {
            WindowAlgorithm::Fixed => {
                let allowed = current + cost <= self.limit;
                let used = if allowed { current + cost } else { current };
                Ok(Decision {
                    allowed,
                    limit: self.limit,
                    remaining: (self.limit - used).max(0.0).floor(),
                    reset_after: if current > 0.0 || allowed && cost > 0.0 {
                        ms(to_end)
                    } else {
                        Duration::ZERO
                    },
                    retry_after: if allowed { Duration::ZERO } else { ms(to_end) },
                    debt: (used - self.limit).max(0.0),
                })
            }
            WindowAlgorithm::Sliding => {
                let weight = self.window.previous_weight(now);
                let rate = current + previous * weight;
                let allowed = rate + cost <= self.limit;
                let used = if allowed { rate + cost } else { rate };
                let current_after = if allowed { current + cost } else { current };
                let reset_after = if current_after > 0.0 {
                    ms(to_end + s) // it weighs on the next window until that one ends
                } else if previous > 0.0 {
                    ms(to_end)
                } else {
                    Duration::ZERO
                };
                let retry_after = if allowed {
                    Duration::ZERO
                } else {
                    ms(self.wait_for(current, previous, into, s, cost))
                };
                Ok(Decision {
                    allowed,
                    limit: self.limit,
                    remaining: (self.limit - used).max(0.0).floor(),
                    reset_after,
                    retry_after,
                    debt: (used - self.limit).max(0.0),
                })
            }
        }
    }

    /// Milliseconds from `into` (ms into the window) until `cost` fits under the limit
    /// as the previous window's weight falls, here or in the next window.
    fn wait_for(&self, current: f64, previous: f64, into: i64, s: i64, cost: f64) -> i64 {
        let room = self.limit - current - cost;
        if room >= 0.0 && previous > 0.0 {
            // previous · (s − t)/s ≤ room  ⇔  t ≥ s · (1 − room / previous)
            let t = (s as f64 * (1.0 - room / previous)).ceil() as i64;
            let t = self.first_fit(current, previous, t.max(into), s, cost);
            return (t - into).max(0);
        }
        // next window: today's count becomes the previous one
        let room = self.limit - cost;
        let t = if current > 0.0 {
            let t = (s as f64 * (1.0 - room / current)).ceil().max(0.0) as i64;
            self.first_fit(0.0, current, t, s, cost)
        } else {
            0
        };
        (s - into) + t
    }

    /// The closed form above rounds in floating point; step forward from its answer to
    /// the first millisecond at which `decide` itself (the same expression) allows the hit,
    /// so that waiting `retry_after` is always enough. A few steps at most.
    fn first_fit(&self, current: f64, previous: f64, mut t: i64, s: i64, cost: f64) -> i64 {
        while t < s && current + previous * ((s - t) as f64 / s as f64) + cost > self.limit {
            t += 1;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(size: u64, limit: f64, algorithm: WindowAlgorithm) -> WindowLimit {
        WindowLimit::new(WindowSize::new(size).expect("size"), limit, algorithm).expect("limit")
    }

    const T0: i64 = 1_763_784_000_000; // a minute boundary, ms

    #[test]
    fn sliding_allows_within_the_weighted_rate() {
        let l = lim(60, 30.0, WindowAlgorithm::Sliding);
        // current 10, previous 40, 30 s in: rate 30, so one more is over
        let d = l
            .decide(10.0, 40.0, UnixMs(T0 + 30_000), 1.0)
            .expect("cost");
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0.0);
        // 40·(60−t)/60 ≤ 19  ⇔  t ≥ 31.5 s: 1.5 s from now
        assert_eq!(d.retry_after, Duration::from_millis(1500));
        let later = l
            .decide(10.0, 40.0, UnixMs(T0 + 31_500), 1.0)
            .expect("cost");
        assert!(later.allowed);
        let d = l.decide(5.0, 40.0, UnixMs(T0 + 30_000), 1.0).expect("cost");
        assert!(d.allowed);
        assert_eq!(d.remaining, 4.0);
        assert_eq!(d.reset_after, Duration::from_secs(90));
    }

    #[test]
    fn sliding_waits_into_the_next_window_when_this_one_is_full() {
        let l = lim(60, 10.0, WindowAlgorithm::Sliding);
        let d = l.decide(10.0, 0.0, UnixMs(T0 + 50_000), 1.0).expect("cost");
        assert!(!d.allowed);
        // next window: 10·(60−t)/60 ≤ 9 ⇔ t ≥ 6 s; 10 s to the end + 6 s
        assert_eq!(d.retry_after, Duration::from_secs(16));
    }

    #[test]
    fn retry_after_survives_floating_point_rounding() {
        // 150 · 0.56 = 84.00000000000001 in f64, so the closed form's 26.4 s into the
        // next window is one millisecond short (found by the property test)
        let l = lim(60, 87.0, WindowAlgorithm::Sliding);
        let d = l.decide(150.0, 0.0, UnixMs(T0), 3.0).expect("cost");
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(86_401));
        let later = UnixMs(T0 + 86_401);
        assert!(l.decide(0.0, 150.0, later, 3.0).expect("cost").allowed);
    }

    #[test]
    fn fixed_counts_only_the_current_window() {
        let l = lim(60, 5.0, WindowAlgorithm::Fixed);
        let d = l
            .decide(4.0, 100.0, UnixMs(T0 + 20_000), 1.0)
            .expect("cost");
        assert!(d.allowed);
        assert_eq!(d.remaining, 0.0);
        assert_eq!(d.reset_after, Duration::from_secs(40));
        let d = l.decide(5.0, 0.0, UnixMs(T0 + 20_000), 1.0).expect("cost");
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(40));
    }

    #[test]
    fn bad_limits_and_costs_are_errors() {
        assert!(WindowLimit::new(
            WindowSize::new(1).expect("size"),
            0.0,
            WindowAlgorithm::Fixed
        )
        .is_err());
        let l = lim(1, 5.0, WindowAlgorithm::Sliding);
        assert!(l.check_cost(6.0).is_err());
        assert!(
            l.shadowed(true).check_cost(6.0).is_ok(),
            "a limit in shadow refuses no cost"
        );
        assert!(l.decide(0.0, 0.0, UnixMs(T0), f64::NAN).is_err());
        assert!(l.decide(0.0, 0.0, UnixMs(T0), -1.0).is_err());
    }

    #[test]
    fn a_cost_above_the_limit_is_denied_and_a_hit_under_a_limit_below_one_too() {
        let l = lim(60, 5.0, WindowAlgorithm::Sliding);
        let d = l
            .decide(0.0, 0.0, UnixMs(T0 + 10_000), 6.0)
            .expect("decided");
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(110));
        let half = lim(60, 0.5, WindowAlgorithm::Fixed);
        assert!(half.check_cost(1.0).is_ok());
        assert!(half.check_cost(1.5).is_err());
        let d = half.decide(0.0, 0.0, UnixMs(T0), 1.0).expect("decided");
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0.0);
    }

    /// A count past the limit (a commit's overrun charged as debt): every hit is denied,
    /// with the exact wait until the windows bring the key back under, and the debt is
    /// how far past the limit the count is.
    #[test]
    fn a_count_past_the_limit_denies_until_the_windows_bring_it_back_under() {
        // sliding: 10 a minute, 25 counted 50 s in
        let l = lim(60, 10.0, WindowAlgorithm::Sliding);
        let now = UnixMs(T0 + 50_000);
        let d = l.decide(25.0, 0.0, now, 0.0).expect("decided");
        assert!(!d.allowed, "past the limit: not even a hit of 0 passes");
        assert_eq!((d.debt, d.remaining), (15.0, 0.0));
        let d = l.decide(25.0, 0.0, now, 1.0).expect("decided");
        assert!(!d.allowed);
        // next window: 25·(60−t)/60 + 1 ≤ 10 ⇔ t ≥ 38.4 s; 10 s to its start + 38.4 s
        assert_eq!(d.retry_after, Duration::from_millis(48_400));
        let at = T0 + 60_000 + 38_400;
        assert!(
            !l.decide(0.0, 25.0, UnixMs(at - 1), 1.0)
                .expect("decided")
                .allowed
        );
        let d = l.decide(0.0, 25.0, UnixMs(at), 1.0).expect("decided");
        assert!(d.allowed);
        assert_eq!(d.debt, 0.0);
        // the previous window past the limit alone: the weight falls within this one
        let d = l.decide(0.0, 40.0, UnixMs(T0), 1.0).expect("decided");
        assert!(!d.allowed);
        assert_eq!(d.debt, 30.0);
        // 40·(60−t)/60 + 1 ≤ 10 ⇔ t ≥ 46.5 s
        assert_eq!(d.retry_after, Duration::from_millis(46_500));
        assert!(
            l.decide(0.0, 40.0, UnixMs(T0 + 46_500), 1.0)
                .expect("decided")
                .allowed
        );
        // a cost of the whole limit waits until nothing counted now weighs
        let d = l.decide(25.0, 0.0, now, 10.0).expect("decided");
        assert_eq!(d.retry_after, Duration::from_secs(70));
        assert!(
            l.decide(0.0, 0.0, UnixMs(T0 + 120_000), 10.0)
                .expect("decided")
                .allowed
        );

        // fixed: denied until the window ends, whatever the debt
        let l = lim(60, 10.0, WindowAlgorithm::Fixed);
        let d = l.decide(25.0, 0.0, now, 1.0).expect("decided");
        assert!(!d.allowed);
        assert_eq!((d.debt, d.retry_after), (15.0, Duration::from_secs(10)));
        assert!(
            l.decide(0.0, 25.0, UnixMs(T0 + 60_000), 1.0)
                .expect("decided")
                .allowed
        );
        // an allowed hit leaves no debt; one that fills the limit exactly neither
        let d = l.decide(9.0, 0.0, now, 1.0).expect("decided");
        assert!(d.allowed);
        assert_eq!(d.debt, 0.0);
    }
}
