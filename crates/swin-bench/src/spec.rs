//! What a load run is asked to do: where, how hard, for how long, and which requests.

use std::time::Duration;

use crate::keys::Keys;

#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// `host:port` of each node; connections are spread round robin.
    pub targets: Vec<String>,
    pub connections: usize,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    /// Requests per second over all connections; `None` is closed loop.
    pub rate: Option<f64>,
    pub keys: Keys,
    pub namespace: String,
    pub window_size: Option<u32>,
    /// Increments per request through `/v1/increments`; `None` sends single increments.
    pub batch: Option<usize>,
    /// Send `/hit` decisions instead of increments (200 admitted, 429 denied).
    pub hit: bool,
    /// Acquire a concurrency lease and release it, one after the other: one request of
    /// the report is the pair, its status the acquire's (200 granted, 429 full).
    pub lease: bool,
    /// Ask Envoy's rate limit service over gRPC instead (the namespace is the domain):
    /// one descriptor of these entries, `{key}` in a value replaced by the picked key.
    /// Statuses: 200 for OK, 429 for OVER_LIMIT, 1000 + the gRPC code for an error.
    pub grpc: Option<Vec<(String, String)>>,
    /// Count the answers 200 per window of this many seconds of the wall clock.
    pub windows: Option<u64>,
    /// Ask limitador-server's `POST /check_and_report` instead (the namespace as its
    /// namespace, the picked key as the value of `key`, delta 1): a peer under the same
    /// load from the same tool.
    pub limitador: bool,
    /// Write each answer's due time (unix µs) and latency (µs) to this file, a line
    /// each: to lay slow answers beside what the server did at the time.
    pub latency_log: Option<std::path::PathBuf>,
    pub progress: bool,
}
