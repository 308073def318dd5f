//! The instant every counting call is given: Unix time in milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Callers pass it in; the core never reads a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMs(pub i64);

impl UnixMs {
    /// Converts a wall-clock reading (taken by the caller).
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => UnixMs(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(before) => {
                UnixMs(-i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX))
            }
        }
    }

    pub fn from_secs(secs: i64) -> Self {
        UnixMs(secs.saturating_mul(1000))
    }

    /// Whole seconds, rounded towards minus infinity.
    pub fn secs(self) -> i64 {
        self.0.div_euclid(1000)
    }
}
