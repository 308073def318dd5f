//! `[quota]`: caps on what Envoy's quota service takes from its clients (its engine is
//! `crate::shares`).

/// Caps on what the quota service takes from its clients (`[quota]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Streams one client may hold open (per token with `[auth]`, else per peer address);
    /// past it a stream is refused.
    pub(crate) streams_per_client: usize,
    /// Live buckets one stream may hold; past it a new bucket is abandoned.
    pub(crate) buckets_per_stream: usize,
    /// Live buckets one client may hold across its streams; past it a new bucket is
    /// abandoned (one client cannot take the node's room from the others).
    pub(crate) buckets_per_client: usize,
    /// Live buckets across the node's streams; past it a new bucket is abandoned.
    pub(crate) buckets: usize,
}

impl QuotaLimits {}

impl Default for QuotaLimits {
    fn default() -> Self {
        QuotaLimits {
            streams_per_client: 64,
            // a report of the most buckets one report may hold (shares::MAX_BUCKETS_PER_REPORT)
            buckets_per_stream: 10_000,
            buckets_per_client: 50_000,
            buckets: 100_000,
        }
    }
}
