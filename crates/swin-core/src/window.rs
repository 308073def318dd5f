//! Window math: epoch-aligned windows, the previous window's weight and the sliding rate.

use crate::{CoreError, UnixMs};

/// The largest window size accepted: 366 days, so a window of a (leap) year works.
pub const MAX_WINDOW_SIZE_SECS: u32 = 366 * 86_400;

/// A window size in whole seconds, `1..=MAX_WINDOW_SIZE_SECS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WindowSize(u32);

impl WindowSize {
    pub fn new(secs: u64) -> Result<Self, CoreError> {
        match u32::try_from(secs) {
            Ok(s) if (1..=MAX_WINDOW_SIZE_SECS).contains(&s) => Ok(WindowSize(s)),
            _ => Err(CoreError::InvalidWindowSize {
                got: secs,
                max: MAX_WINDOW_SIZE_SECS,
            }),
        }
    }

    pub fn secs(self) -> u32 {
        self.0
    }

    fn millis(self) -> i64 {
        i64::from(self.0) * 1000
    }

    /// Start (Unix seconds) of the window containing `now`, aligned to the epoch.
    pub fn start_of(self, now: UnixMs) -> i64 {
        now.0.div_euclid(self.millis()) * i64::from(self.0)
    }

    /// Start of the window before the one containing `now`.
    pub fn previous_start_of(self, now: UnixMs) -> i64 {
        self.start_of(now) - i64::from(self.0)
    }

    /// Weight of the previous window at `now`: `(s - (now mod s)) / s`, in milliseconds,
    /// so it lies in `(0, 1]` and falls linearly across the current window.
    pub fn previous_weight(self, now: UnixMs) -> f64 {
        let s = self.millis();
        let into = now.0.rem_euclid(s);
        (s - into) as f64 / s as f64
    }
}

/// `current + previous * weight`: the weighted-previous-window estimate of the rate.
pub fn sliding_rate(current: f64, previous: f64, weight: f64) -> f64 {
    current + previous * weight
}

/// One key's view of one window size at an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowRate {
    pub window_size: u32,
    /// Start of the current window, Unix seconds.
    pub window_start: i64,
    pub current: f64,
    pub previous: f64,
    pub rate: f64,
}

impl WindowRate {
    /// The rate of `current` and `previous` counts; a count below zero (hits this node
    /// took back before the store's clamp reached it) reads as zero, as every store
    /// keeps it.
    pub fn at(size: WindowSize, now: UnixMs, current: f64, previous: f64) -> Self {
        let (current, previous) = (current.max(0.0), previous.max(0.0));
        WindowRate {
            window_size: size.secs(),
            window_start: size.start_of(now),
            current,
            previous,
            rate: sliding_rate(current, previous, size.previous_weight(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: u64) -> WindowSize {
        WindowSize::new(s).expect("valid size")
    }

    #[test]
    fn seed_example_half_way_through_the_window() {
        // current 10, previous 40, size 60, 30 s into the window -> 30
        let now = UnixMs::from_secs(1_763_784_000 + 30);
        let r = WindowRate::at(size(60), now, 10.0, 40.0);
        assert_eq!(r.window_start, 1_763_784_000);
        assert_eq!(r.rate, 30.0);
    }

    #[test]
    fn readme_example_current_10_previous_20() {
        let now = UnixMs::from_secs(1_763_784_000 + 30);
        assert_eq!(WindowRate::at(size(60), now, 10.0, 20.0).rate, 20.0);
    }

    #[test]
    fn weight_uses_milliseconds() {
        let now = UnixMs(1_763_784_000_000 + 15_500);
        let w = size(60).previous_weight(now);
        assert!((w - (60_000.0 - 15_500.0) / 60_000.0).abs() < 1e-12);
    }

    #[test]
    fn weight_is_one_at_the_boundary() {
        assert_eq!(size(60).previous_weight(UnixMs::from_secs(120)), 1.0);
    }

    #[test]
    fn windows_align_to_the_epoch() {
        assert_eq!(size(30).start_of(UnixMs::from_secs(95)), 90);
        assert_eq!(size(60).previous_start_of(UnixMs::from_secs(95)), 0);
        assert_eq!(size(1).start_of(UnixMs(1_999)), 1);
        // before 1970 still floors
        assert_eq!(size(60).start_of(UnixMs(-1)), -60);
    }

    #[test]
    fn sizes_are_validated() {
        assert!(WindowSize::new(0).is_err());
        assert!(WindowSize::new(1).is_ok());
        assert!(WindowSize::new(365 * 86_400).is_ok());
        assert!(WindowSize::new(u64::from(MAX_WINDOW_SIZE_SECS) + 1).is_err());
        assert!(WindowSize::new(u64::MAX).is_err());
    }

    #[test]
    fn year_windows_do_not_overflow() {
        let s = size(u64::from(MAX_WINDOW_SIZE_SECS));
        let now = UnixMs::from_secs(4_000_000_000);
        let w = s.previous_weight(now);
        assert!(w > 0.0 && w <= 1.0);
        assert!(s.start_of(now) <= now.secs());
    }
}
