//! A namespace's idempotency settings (`idempotency_ttl`, `idempotency_max_keys`): how
//! long a retried request is answered with its first answer, and how many records the
//! namespace keeps at most.

use std::time::Duration;

use super::{ConfigError, Parser};

/// `idempotency_ttl` when the config leaves it out: a day.
pub const DEFAULT_IDEMPOTENCY_TTL_SECS: f64 = 86_400.0;
/// The shortest `idempotency_ttl`: a second.
pub const MIN_IDEMPOTENCY_TTL_SECS: f64 = 1.0;
/// The longest `idempotency_ttl`: 30 days.
pub const MAX_IDEMPOTENCY_TTL_SECS: f64 = 2_592_000.0;
/// `idempotency_max_keys` when the config leaves it out.
pub const DEFAULT_IDEMPOTENCY_MAX_KEYS: u64 = 100_000;
/// The most `idempotency_max_keys` may say.
pub const MAX_IDEMPOTENCY_MAX_KEYS: u64 = 1_000_000_000;

/// How a namespace keeps idempotency records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idempotency {
    /// How long a record answers retries (`idempotency_ttl`).
    pub(crate) ttl: Duration,
    /// Live records the namespace keeps at most, across the cluster
    /// (`idempotency_max_keys`).
    pub(crate) max_keys: u64,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            ttl: Duration::from_secs_f64(DEFAULT_IDEMPOTENCY_TTL_SECS),
            max_keys: DEFAULT_IDEMPOTENCY_MAX_KEYS,
        }
    }
}

impl Idempotency {
    /// How long a record answers retries (`idempotency_ttl`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Live records the namespace keeps at most (`idempotency_max_keys`).
    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }
}

impl Parser<'_> {
    /// `idempotency_ttl` (seconds) and `idempotency_max_keys`, checked.
    pub(super) fn idempotency(
        &self,
        ttl: Option<f64>,
        max_keys: Option<i64>,
        f: &dyn Fn(&str) -> String,
    ) -> Result<Idempotency, ConfigError> {
        let ttl = ttl.unwrap_or(DEFAULT_IDEMPOTENCY_TTL_SECS);
        if !(MIN_IDEMPOTENCY_TTL_SECS..=MAX_IDEMPOTENCY_TTL_SECS).contains(&ttl) {
            return Err(self.err(
                &f("idempotency_ttl"),
                format!(
                    "{ttl} is not a number of seconds from {MIN_IDEMPOTENCY_TTL_SECS} to {MAX_IDEMPOTENCY_TTL_SECS} (30 days)"
                ),
            ));
        }
        let max_keys = match max_keys {
            None => DEFAULT_IDEMPOTENCY_MAX_KEYS,
            Some(n) if (1..=MAX_IDEMPOTENCY_MAX_KEYS as i64).contains(&n) => n as u64,
            Some(n) => {
                return Err(self.err(
                    &f("idempotency_max_keys"),
                    format!("{n} is not between 1 and {MAX_IDEMPOTENCY_MAX_KEYS}"),
                ))
            }
        };
        Ok(Idempotency {
            ttl: Duration::from_secs_f64(ttl),
            max_keys,
        })
    }
}
