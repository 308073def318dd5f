//! A namespace's idempotency settings (`idempotency_ttl`, `idempotency_max_keys`,
//! `idempotency_max_keys_per_client`): how long a retried request is answered with its
//! first answer, how many records the namespace keeps at most, and how many of them one
//! client may hold.

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
/// `idempotency_max_keys_per_client` when the config leaves it out is
/// `idempotency_max_keys` divided by this (so that a client alone fills at most a
/// sixteenth of the namespace's records)…
pub const DEFAULT_IDEMPOTENCY_CLIENT_DIVISOR: u64 = 16;
/// …but at least this many (and at most `idempotency_max_keys`).
pub const MIN_DEFAULT_IDEMPOTENCY_MAX_KEYS_PER_CLIENT: u64 = 1_000;

/// `idempotency_max_keys_per_client` when the config leaves it out, for a namespace of
/// `max_keys` records: a sixteenth of them, at least 1,000, at most all.
pub fn default_max_keys_per_client(max_keys: u64) -> u64 {
    (max_keys / DEFAULT_IDEMPOTENCY_CLIENT_DIVISOR)
        .max(MIN_DEFAULT_IDEMPOTENCY_MAX_KEYS_PER_CLIENT)
        .min(max_keys)
}

/// How a namespace keeps idempotency records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idempotency {
    /// How long a record answers retries (`idempotency_ttl`).
    pub(crate) ttl: Duration,
    /// Live records the namespace keeps at most, across the cluster
    /// (`idempotency_max_keys`).
    pub(crate) max_keys: u64,
    /// Live records one client may hold in the namespace, across the cluster
    /// (`idempotency_max_keys_per_client`).
    pub(crate) max_keys_per_client: u64,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            ttl: Duration::from_secs_f64(DEFAULT_IDEMPOTENCY_TTL_SECS),
            max_keys: DEFAULT_IDEMPOTENCY_MAX_KEYS,
            max_keys_per_client: default_max_keys_per_client(DEFAULT_IDEMPOTENCY_MAX_KEYS),
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

    /// Live records one client may hold in the namespace
    /// (`idempotency_max_keys_per_client`).
    pub fn max_keys_per_client(&self) -> u64 {
        self.max_keys_per_client
    }
}

impl Parser<'_> {
    /// `idempotency_ttl` (seconds), `idempotency_max_keys` and
    /// `idempotency_max_keys_per_client`, checked.
    pub(super) fn idempotency(
        &self,
        ttl: Option<f64>,
        max_keys: Option<i64>,
        per_client: Option<i64>,
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
        let max_keys_per_client = match per_client {
            None => default_max_keys_per_client(max_keys),
            Some(n) if (1..=max_keys as i64).contains(&n) => n as u64,
            Some(n) => {
                return Err(self.err(
                    &f("idempotency_max_keys_per_client"),
                    format!("{n} is not between 1 and idempotency_max_keys ({max_keys})"),
                ))
            }
        };
        Ok(Idempotency {
            ttl: Duration::from_secs_f64(ttl),
            max_keys,
            max_keys_per_client,
        })
    }
}
