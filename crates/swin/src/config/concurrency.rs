//! `algorithm = "concurrency"`: a namespace that limits leases in flight per key
//! (`limit`, `lease_ttl`), and the keys of hits it does not take.

use super::{ConfigError, Parser};

/// A concurrency namespace's settings (`limit`, `lease_ttl`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concurrency {
    /// Slots in flight per key, across the cluster.
    pub(crate) limit: u64,
    /// A lease's life unless its acquire or a renewal says otherwise.
    pub(crate) lease_ttl: std::time::Duration,
}

impl Concurrency {
    /// Slots in flight per key, across the cluster (`limit`).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A lease's life unless its acquire or a renewal says otherwise (`lease_ttl`).
    pub fn lease_ttl(&self) -> std::time::Duration {
        self.lease_ttl
    }
}

pub use crate::policy::algorithm::MAX_CONCURRENCY;
/// The longest a lease may live without a renewal: a day.
pub const MAX_LEASE_TTL_SECS: f64 = 86_400.0;
/// The shortest lease or reservation: a millisecond (store times are kept in whole
/// milliseconds, so anything shorter lapses before it is granted).
pub const MIN_TTL_SECS: f64 = 0.001;
/// A lease's life when neither the config nor the acquire says.
pub const DEFAULT_LEASE_TTL_SECS: f64 = 30.0;

impl Parser<'_> {
    /// `algorithm = "concurrency"` with its `limit` and `lease_ttl` (its raw
    /// `algorithm` taken out of `n`: no limits of hits are read in its shape); `limit`
    /// and `lease_ttl` belong to such a namespace only, and limits of hits do not.
    pub(super) fn concurrency(
        &self,
        n: &mut super::namespaces::RawNamespace,
        algorithm: crate::policy::algorithm::Algorithm,
        f: &dyn Fn(&str) -> String,
    ) -> Result<Option<Concurrency>, ConfigError> {
        if algorithm != crate::policy::algorithm::Algorithm::Concurrency {
            for (set, key) in [
                (n.limit.is_some(), "limit"),
                (n.lease_ttl.is_some(), "lease_ttl"),
            ] {
                if set {
                    return Err(self.err(&f(key), "only with algorithm = \"concurrency\"".into()));
                }
            }
            return Ok(None);
        }
        n.algorithm = None;
        let hits_only = [
            (!n.limits.is_empty(), "limits"),
            (n.gcra.is_some(), "gcra"),
            (!n.overrides.is_empty(), "overrides"),
            (n.admission.is_some(), "admission"),
            (n.on_store_failure.is_some(), "on_store_failure"),
            (n.count_denied.is_some(), "count_denied"),
            (n.key_from.is_some(), "key_from"),
            (n.shadow.is_some(), "shadow"),
        ];
        if let Some((_, key)) = hits_only.iter().find(|(set, _)| *set) {
            return Err(self.err(
                &f(key),
                "limits hits; a concurrency namespace limits leases in flight (`limit`)".into(),
            ));
        }
        let limit = match n.limit {
            Some(l) if (1..=MAX_CONCURRENCY as i64).contains(&l) => l as u64,
            Some(l) => {
                return Err(self.err(
                    &f("limit"),
                    format!("{l} is not between 1 and {MAX_CONCURRENCY}"),
                ))
            }
            None => {
                return Err(self.err(
                    &f("limit"),
                    "algorithm = \"concurrency\" needs `limit` (leases in flight per key)".into(),
                ))
            }
        };
        let ttl = n.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL_SECS);
        if !((MIN_TTL_SECS..=MAX_LEASE_TTL_SECS).contains(&ttl)) {
            return Err(self.err(
                &f("lease_ttl"),
                format!(
                    "{ttl} is not a number of seconds from {MIN_TTL_SECS} (a millisecond) to {MAX_LEASE_TTL_SECS}"
                ),
            ));
        }
        Ok(Some(Concurrency {
            limit,
            lease_ttl: std::time::Duration::from_secs_f64(ttl),
        }))
    }
}
