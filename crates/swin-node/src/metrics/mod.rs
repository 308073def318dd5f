//! The node's metrics: request counters kept here, and what each namespace's engine and
//! tables hold, read once per namespace at scrape time. The Prometheus text exposition
//! (names, escaping, histogram lines) is written by the `prometheus` crate's encoder from
//! metric families built here at each scrape.
//!
//! Why not the crates' own counter vectors: they take a lock on every lookup, and these
//! counters are bumped on every request, so the lock would be the one every request
//! takes. They stay lock-free maps of atomics, read at scrape time. (`prometheus-client`
//! writes OpenMetrics, whose counter descriptors `promtool check metrics` rejects.)
//!
//! The counters are here; the exposition built from them at each scrape (every
//! metric's name, help and labels) is in `render`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::proto::{Bucket, Histogram};
mod families;
mod namespaces;
mod render;

/// What one of the library's read-side snapshots (a namespace's status, the clock, a top
/// list) says, as it serializes: the documents the admin routes answer, whose fields
/// docs/api.md names, and whose numbers the metrics are.
pub fn document(snapshot: &impl serde::Serialize) -> serde_json::Value {
    // a snapshot is plain data: only a bug makes it fail to serialize
    serde_json::to_value(snapshot).unwrap_or_else(|e| {
        tracing::error!(cause = %e, "a status snapshot did not serialize");
        serde_json::Value::Null
    })
}

/// The counters' maps: their keys are routes, namespaces, rules, token names and
/// domains the config names (unknown ones are counted as `unknown`), so a fast hash
/// (foldhash, seeded per process) serves where SipHash's resistance buys nothing; a
/// request hashes a route or namespace four to six times.
pub(crate) type Map<K, V> = papaya::HashMap<K, V, foldhash::fast::RandomState>;

/// What `/metrics` answers with.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Counters bumped on every request, keyed by namespace, and by route then status.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP requests by route: their count by status and how long they took (one
    /// lookup of the route per request).
    http: Map<String, HttpRoute>,
    increments: Map<String, AtomicU64>,
    /// Decisions by namespace then rule (the limit or descriptor rule that decided):
    /// denied, allowed.
    decisions: [Map<String, Map<String, AtomicU64>>; 2],
    /// Hits allowed only because what would deny them is in shadow, by namespace then
    /// rule.
    shadow_denials: Map<String, Map<String, AtomicU64>>,
    /// Requests on routes that need a token, by token name ("" for none) then outcome.
    auth: Map<String, Map<&'static str, AtomicU64>>,
    /// Envoy rate limit service calls, by domain ("unknown" for no namespace) then code.
    rls: Map<String, Map<&'static str, AtomicU64>>,
    /// What Envoy's quota service told proxies through this node, by domain ("unknown"
    /// for no namespace) then action (assign, allow_all, deny_all, abandon, refused).
    quota: Map<String, Map<&'static str, AtomicU64>>,
    /// Streams of Envoy's quota service open on this node (one per proxy).
    pub quota_streams: Arc<AtomicUsize>,
    /// Runtime limits set or removed through this node, by namespace then change.
    limit_changes: Map<String, Map<&'static str, AtomicU64>>,
    /// Concurrency leases through this node, by namespace then outcome.
    leases: Map<String, Map<&'static str, AtomicU64>>,
    /// Reserve and commit calls through this node, by namespace then outcome.
    reservations: Map<String, Map<&'static str, AtomicU64>>,
    /// Reservations' costs through this node, by namespace then part (the bits of an f64).
    reservation_costs: Map<String, Map<&'static str, AtomicU64>>,
    /// How long gRPC calls took, by method.
    grpc_latency: Map<String, Latency>,
    /// Connections open on the HTTP listener, kept by the listener.
    pub http_connections: Arc<AtomicUsize>,
    /// Connections open on the gRPC listener, kept by the listener.
    pub grpc_connections: Arc<AtomicUsize>,
}

/// Upper bounds (seconds) of the request duration histogram's buckets.
pub const REQUEST_BUCKETS_SECS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// What is kept of an HTTP route's requests.
#[derive(Debug, Default)]
struct HttpRoute {
    /// By status.
    statuses: Map<u16, AtomicU64>,
    /// How long they took.
    latency: Latency,
}

/// Shards of a route's durations: each thread bumps its own, so two cores answering
/// the same route never pass a cache line back and forth per request.
const SHARDS: usize = 8;

/// The shard of the calling thread (threads take shards in turn).
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

/// Durations counted by one shard: a count per bucket (not cumulative; the last one past
/// every bound), and their sum in nanoseconds.
#[derive(Debug, Default)]
struct Shard {
    buckets: [AtomicU64; REQUEST_BUCKETS_SECS.len() + 1],
    sum_nanos: AtomicU64,
}

/// One route's request durations.
#[derive(Debug, Default)]
struct Latency {
    shards: [crossbeam_utils::CachePadded<Shard>; SHARDS],
}

impl Latency {
    fn record(&self, took: std::time::Duration) {
        let secs = took.as_secs_f64();
        let i = REQUEST_BUCKETS_SECS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(REQUEST_BUCKETS_SECS.len());
        let shard = &self.shards[shard()];
        shard.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn histogram(&self) -> Histogram {
        let count = |i: usize| -> u64 {
            self.shards
                .iter()
                .map(|s| s.buckets[i].load(Ordering::Relaxed))
                .sum()
        };
        let mut h = Histogram::default();
        let mut cumulative = 0;
        h.set_bucket(
            REQUEST_BUCKETS_SECS
                .iter()
                .enumerate()
                .map(|(i, le)| {
                    cumulative += count(i);
                    let mut b = Bucket::default();
                    b.set_upper_bound(*le);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect(),
        );
        h.set_sample_count(cumulative + count(REQUEST_BUCKETS_SECS.len()));
        let nanos: u64 = self
            .shards
            .iter()
            .map(|s| s.sum_nanos.load(Ordering::Relaxed))
            .sum();
        h.set_sample_sum(nanos as f64 / 1e9);
        h
    }
}

fn bump<K, Q>(map: &Map<K, AtomicU64>, key: &Q, owned: impl FnOnce() -> K, n: u64)
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ?Sized,
{
    let m = map.pin();
    match m.get(key) {
        Some(c) => c.fetch_add(n, Ordering::Relaxed),
        None => m
            .get_or_insert_with(owned(), AtomicU64::default)
            .fetch_add(n, Ordering::Relaxed),
    };
}

impl Metrics {
    /// An HTTP request on `route` (its pattern) answered with `status`, which took
    /// `took` from its head read to its answer made.
    pub fn http_request(&self, route: &str, status: u16, took: std::time::Duration) {
        let routes = self.http.pin();
        let r = match routes.get(route) {
            Some(r) => r,
            None => routes.get_or_insert_with(route.to_owned(), HttpRoute::default),
        };
        bump(&r.statuses, &status, || status, 1);
        r.latency.record(took);
    }

    /// A gRPC call of `method` that took `took`, from its head read to its answer made.
    pub fn grpc_took(&self, method: &str, took: std::time::Duration) {
        let methods = self.grpc_latency.pin();
        let latency = match methods.get(method) {
            Some(l) => l,
            None => methods.get_or_insert_with(method.to_owned(), Latency::default),
        };
        latency.record(took);
    }

    /// A request on a route that needs a token: `outcome` is allowed, forbidden (the
    /// token lacks the scope), unknown or missing (`token` is "" for the last two).
    pub fn auth(&self, token: &str, outcome: &'static str) {
        let tokens = self.auth.pin();
        let outcomes = match tokens.get(token) {
            Some(o) => o,
            None => tokens.get_or_insert_with(token.to_owned(), Default::default),
        };
        bump(outcomes, &outcome, || outcome, 1);
    }

    /// A `ShouldRateLimit` call answered with `code` (OK, OVER_LIMIT, or the gRPC error).
    pub fn rls_request(&self, domain: &str, code: &'static str) {
        let domains = self.rls.pin();
        let codes = match domains.get(domain) {
            Some(c) => c,
            None => domains.get_or_insert_with(domain.to_owned(), Default::default),
        };
        bump(codes, &code, || code, 1);
    }

    /// `n` bucket actions of `action` told to proxies of `domain` by the quota service.
    pub fn quota_told(&self, domain: &str, action: &'static str, n: u64) {
        let domains = self.quota.pin();
        let actions = match domains.get(domain) {
            Some(a) => a,
            None => domains.get_or_insert_with(domain.to_owned(), Default::default),
        };
        bump(actions, &action, || action, n);
    }

    /// Whether this node has taken a reserve call in `namespace`.
    pub fn reserved_in(&self, namespace: &str) -> bool {
        self.reservations.pin().contains_key(namespace)
    }
}

/// The pipeline records its outcomes here (see [`swin::recorder`]).
impl swin::recorder::Recorder for Metrics {
    fn increments(&self, namespace: &str, n: u64) {
        bump(&self.increments, namespace, || namespace.to_owned(), n);
    }

    /// A decision in `namespace` by `rule`: the name of the limit that decided (`60s`,
    /// `gcra`) or of the descriptor rule. Both come from the config (or a window size of
    /// it), so the labels do not grow with keys.
    /// `shadow_denied`: allowed only because what would deny it is in shadow (counted
    /// as allowed, and as a would-be denial).
    fn decision(&self, namespace: &str, rule: &str, allowed: bool, shadow_denied: bool) {
        let maps = std::iter::once(&self.decisions[usize::from(allowed)])
            .chain(shadow_denied.then_some(&self.shadow_denials));
        for map in maps {
            let namespaces = map.pin();
            let rules = match namespaces.get(namespace) {
                Some(r) => r,
                None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
            };
            bump(rules, rule, || rule.to_owned(), 1);
        }
    }

    /// A key's runtime limits `set` or `deleted` through this node's API.
    fn limit_change(&self, namespace: &str, change: &'static str) {
        let namespaces = self.limit_changes.pin();
        let changes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(changes, &change, || change, 1);
    }

    /// A lease call through this node: `acquired`, `denied`, `released`, `renewed`, or
    /// `not_live` (a release or renewal of a lease released, lapsed or never granted).
    fn lease(&self, namespace: &str, outcome: &'static str) {
        let namespaces = self.leases.pin();
        let outcomes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(outcomes, &outcome, || outcome, 1);
    }

    /// A reserve, extend or commit through this node: `reserved`, `denied`,
    /// `extended`, `extend_denied`, `committed`, `replayed` (a commit of a reservation
    /// committed already at its cost), or `not_open` (a commit of a reservation lapsed or
    /// never made).
    fn reservation(&self, namespace: &str, outcome: &'static str) {
        let namespaces = self.reservations.pin();
        let outcomes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(outcomes, &outcome, || outcome, 1);
    }

    /// Cost through reservations: `reserved` (estimates spent), `charged` (beyond the
    /// estimate), `given_back`, `uncharged` (beyond the estimate, past the limit).
    fn reservation_cost(&self, namespace: &str, part: &'static str, cost: f64) {
        if cost <= 0.0 {
            return;
        }
        let namespaces = self.reservation_costs.pin();
        let parts = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        let parts = parts.pin();
        let c = parts.get_or_insert_with(part, AtomicU64::default);
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some((f64::from_bits(bits) + cost).to_bits())
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Latency;

    #[test]
    fn durations_recorded_on_many_threads_add_up_in_one_histogram() {
        let latency = Latency::default();
        std::thread::scope(|s| {
            for t in 0..12u64 {
                let latency = &latency;
                s.spawn(move || {
                    for _ in 0..100 {
                        // 50 µs, 3 ms and 2 s: the first bucket, a middle one, past all
                        latency.record(Duration::from_micros(
                            [50, 3_000, 2_000_000][t as usize % 3],
                        ));
                    }
                });
            }
        });
        let h = latency.histogram();
        assert_eq!(h.get_sample_count(), 1200);
        let cumulative: Vec<u64> = h
            .get_bucket()
            .iter()
            .map(|b| b.cumulative_count())
            .collect();
        // ≤ 0.1 ms: 400; ≤ 5 ms: 800; ≤ 1 s: still 800; 400 past every bound
        assert_eq!(
            (cumulative[0], cumulative[5], cumulative[11]),
            (400, 800, 800)
        );
        let sum = h.get_sample_sum();
        let want = 400.0 * (50e-6 + 3e-3 + 2.0);
        assert!((sum - want).abs() < 1e-6, "{sum} against {want}");
    }
}
