//! `algorithm = "concurrency"`: a namespace that limits leases in flight per key
//! (`limit`, `lease_ttl`), and the keys of hits it does not take.

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
