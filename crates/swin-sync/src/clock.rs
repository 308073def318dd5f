//! The cluster's clock: the store's. Windows, buckets, lease lapses and reservation ttls
//! outlive one node, so a node decides them in the store's time: its own clock plus an
//! offset it measures against the store at every sync ([`Clock::observe`], from the time
//! a ping answers with and the round trip around it). A store without a clock of its own
//! (SQLite: one machine) leaves the node's. Until a first measurement, and for a node
//! with no store, the offset is zero.
//!
//! One offset per node: the stores of one cluster are expected to share a clock (an
//! operator's NTP); a measurement that moves the offset by less than [`JITTER_MS`] is
//! not applied, so a node's time does not wander by its round trips' noise.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use swin_core::UnixMs;

/// Offsets closer than this to the one in force are not applied.
pub const JITTER_MS: i64 = 10;

/// A measurement whose round trip took longer than this says too little to apply.
pub const MAX_ROUND_TRIP: Duration = Duration::from_secs(1);

/// How far the node's clock may be from the store's before the node says so (the
/// default of `max_clock_offset`).
pub const DEFAULT_MAX_OFFSET: Duration = Duration::from_secs(1);

/// The node's clock and its offset to the store's.
#[derive(Debug)]
pub struct Clock {
    offset_ms: AtomicI64,
    measured: AtomicBool,
    /// Past this the offset is logged (once each time it crosses) and flagged.
    max_offset_ms: AtomicI64,
    beyond: AtomicBool,
    /// When the last measurement was taken (the node's clock, ms), to measure at most
    /// once a second however many namespaces sync.
    last_ms: AtomicI64,
}

static CLOCK: Clock = Clock {
    offset_ms: AtomicI64::new(0),
    measured: AtomicBool::new(false),
    max_offset_ms: AtomicI64::new(DEFAULT_MAX_OFFSET.as_millis() as i64),
    beyond: AtomicBool::new(false),
    last_ms: AtomicI64::new(i64::MIN),
};

/// The node's clock.
pub fn clock() -> &'static Clock {
    &CLOCK
}

/// The node's own wall clock, uncorrected.
pub fn system_now() -> UnixMs {
    UnixMs::from_system_time(SystemTime::now())
}

impl Clock {
    /// The store's time as this node knows it: its own clock plus the offset.
    pub fn now(&self) -> UnixMs {
        UnixMs(
            system_now()
                .0
                .saturating_add(self.offset_ms.load(Ordering::Relaxed)),
        )
    }

    /// The offset in force (store minus node, ms), if one was ever measured.
    pub fn offset_ms(&self) -> Option<i64> {
        self.measured
            .load(Ordering::Relaxed)
            .then(|| self.offset_ms.load(Ordering::Relaxed))
    }

    /// Whether the node's clock is further from the store's than `max_clock_offset`.
    pub fn beyond_bound(&self) -> bool {
        self.beyond.load(Ordering::Relaxed)
    }

    pub fn set_max_offset(&self, max: Duration) {
        let ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
        self.max_offset_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether a measurement is due (one a second at most, for the whole node); claims
    /// it when it is.
    pub fn due(&self) -> bool {
        let now = system_now().0;
        let last = self.last_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) >= 1_000
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// A ping sent at `sent` and answered at `received` (the node's own clock) said the
    /// store's time was `store`: the offset is the store's time minus the middle of the
    /// round trip. Answers the offset in force afterwards.
    pub fn observe(&self, store: UnixMs, sent: UnixMs, received: UnixMs) -> i64 {
        let rtt = received.0.saturating_sub(sent.0);
        let current = self.offset_ms.load(Ordering::Relaxed);
        if !(0..=MAX_ROUND_TRIP.as_millis() as i64).contains(&rtt) {
            return current;
        }
        let offset = store.0.saturating_sub(sent.0 + rtt / 2);
        let first = !self.measured.swap(true, Ordering::Relaxed);
        if first || (offset - current).abs() >= JITTER_MS {
            self.offset_ms.store(offset, Ordering::Relaxed);
        }
        let applied = self.offset_ms.load(Ordering::Relaxed);
        let beyond = applied.abs() > self.max_offset_ms.load(Ordering::Relaxed);
        if beyond != self.beyond.swap(beyond, Ordering::Relaxed) || (first && beyond) {
            if beyond {
                tracing::warn!(
                    offset_ms = applied,
                    "this node's clock is off the store's by more than max_clock_offset: it decides in the store's time"
                );
            } else {
                tracing::info!(
                    offset_ms = applied,
                    "this node's clock is back within max_clock_offset of the store's"
                );
            }
        }
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Clock {
        Clock {
            offset_ms: AtomicI64::new(0),
            measured: AtomicBool::new(false),
            max_offset_ms: AtomicI64::new(1_000),
            beyond: AtomicBool::new(false),
            last_ms: AtomicI64::new(i64::MIN),
        }
    }

    #[test]
    fn the_offset_is_the_store_time_minus_the_middle_of_the_round_trip() {
        let c = fresh();
        assert_eq!(c.offset_ms(), None);
        // sent at 1,000, answered at 1,020: the store said 41,010 in the middle
        assert_eq!(
            c.observe(UnixMs(41_010), UnixMs(1_000), UnixMs(1_020)),
            40_000
        );
        assert_eq!(c.offset_ms(), Some(40_000));
        assert!(c.beyond_bound());
        // jitter below JITTER_MS is not applied; a real move is
        assert_eq!(
            c.observe(UnixMs(41_015), UnixMs(1_000), UnixMs(1_020)),
            40_000
        );
        assert_eq!(c.observe(UnixMs(1_010), UnixMs(1_000), UnixMs(1_020)), 0);
        assert!(!c.beyond_bound());
        // a round trip too long (or backwards) says too little
        assert_eq!(c.observe(UnixMs(99_999), UnixMs(1_000), UnixMs(5_000)), 0);
        assert_eq!(c.observe(UnixMs(99_999), UnixMs(1_000), UnixMs(900)), 0);
    }

    #[test]
    fn now_is_the_own_clock_plus_the_offset() {
        let c = fresh();
        c.observe(UnixMs(system_now().0 - 40_000), system_now(), system_now());
        let d = system_now().0 - c.now().0;
        assert!((39_900..=40_100).contains(&d), "{d}");
    }
}
