//! How a sync tick spaces its store calls. A sync's pushes and reads go in chunks of 500
//! windows; sent back to back, a node holding 10,000 busy keys kept a Redis on the same
//! two cores busy for 150-400 ms each second, and the requests sharing those cores
//! queued behind it (p99 at half the periodic peak: 47-100 ms, against 3-9 ms with no
//! sync; BENCHMARKS.md, "A sync's burst"). A tick of the sync loop therefore waits after
//! each store call as long as that call took, until the tick has used half its period:
//! the store and the cores get half their time back between a sync's calls, and a
//! sync still ends within its period. A sync that is short anyway (one chunk, a quiet
//! node) never waits; a sync asked for over the API, or the last one at a stop, is not
//! paced.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub(super) struct Pace {
    started: Instant,
    /// How long the sync may run before it stops waiting between calls.
    budget: Duration,
    /// How long the sync's last store call took: the wait before the next.
    last: Option<Duration>,
}

impl Pace {
    /// No waits: calls back to back.
    pub(super) fn none() -> Self {
        Pace::within(Duration::ZERO)
    }

    /// Waits between calls while the sync has run less than `budget`.
    pub(super) fn within(budget: Duration) -> Self {
        Pace {
            started: Instant::now(),
            budget,
            last: None,
        }
    }

    /// Runs one store call of the sync (with what it does with the answer), first waiting
    /// as long as the call before it took, at most what is left of the budget.
    pub(super) async fn call<T>(&mut self, f: impl Future<Output = T>) -> T {
        if let Some(took) = self.last.take() {
            let wait = took.min(self.budget.saturating_sub(self.started.elapsed()));
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let started = Instant::now();
        let out = f.await;
        self.last = Some(started.elapsed());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn slow_call() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn waits_as_long_as_the_call_before_took_within_the_budget() {
        let t = tokio::time::Instant::now();
        let mut pace = Pace::within(Duration::from_millis(50));
        pace.call(slow_call()).await; // 20 ms, no wait before the first
        assert_eq!(t.elapsed(), Duration::from_millis(20));
        pace.call(slow_call()).await; // waits 20, then 20
        assert_eq!(t.elapsed(), Duration::from_millis(60));
        pace.call(slow_call()).await; // the budget (50 ms) is spent: no wait
        assert_eq!(t.elapsed(), Duration::from_millis(80));
    }

    #[tokio::test(start_paused = true)]
    async fn no_pace_never_waits() {
        let t = tokio::time::Instant::now();
        let mut pace = Pace::none();
        for _ in 0..3 {
            pace.call(slow_call()).await;
        }
        assert_eq!(t.elapsed(), Duration::from_millis(60));
    }
}
