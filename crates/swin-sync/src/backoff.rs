//! Capped exponential backoff with jitter, for retrying a store that is down.
//!
//! Written here rather than taken from a crate: it is a delay schedule inside the
//! engine's long-lived loops (reset on success, read for the failure count), not a
//! closure to retry, which is what `backon` is built around; and the `backoff` crate is
//! unmaintained.

use std::time::Duration;

use rand::Rng;

#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            failures: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// The wait before the next attempt: base × 2^failures, capped, with ±25 % jitter so
    /// the nodes of a cluster do not all come back at the same instant.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.failures.min(16));
        self.failures = self.failures.saturating_add(1);
        let capped = exp.min(self.max);
        let jitter = rand::thread_rng().gen_range(0.75..1.25);
        capped.mul_f64(jitter)
    }

    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(75) && first <= Duration::from_millis(125));
        for _ in 0..20 {
            assert!(b.next_delay() <= Duration::from_millis(2500));
        }
        assert_eq!(b.failures(), 21);
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
