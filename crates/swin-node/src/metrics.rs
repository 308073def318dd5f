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
//! One file past 500 lines on purpose: every metric's name, help and labels are here
//! beside the counter that feeds it, so the exposition reads as one list.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use swin_sync::{NamespaceSync, SyncStatus, SYNC_BUCKETS_SECS};

/// What `/metrics` answers with.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Counters bumped on every request, keyed by namespace, and by route then status.
#[derive(Debug, Default)]
pub struct Metrics {
    http: papaya::HashMap<String, papaya::HashMap<u16, AtomicU64>>,
    increments: papaya::HashMap<String, AtomicU64>,
    /// Decisions by namespace then rule (the limit or descriptor rule that decided):
    /// denied, allowed.
    decisions: [papaya::HashMap<String, papaya::HashMap<String, AtomicU64>>; 2],
    /// Hits allowed only because what would deny them is in shadow, by namespace then
    /// rule.
    shadow_denials: papaya::HashMap<String, papaya::HashMap<String, AtomicU64>>,
    /// Requests on routes that need a token, by token name ("" for none) then outcome.
    auth: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// Envoy rate limit service calls, by domain ("unknown" for no namespace) then code.
    rls: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// Runtime limits set or removed through this node, by namespace then change.
    limit_changes: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// Concurrency leases through this node, by namespace then outcome.
    leases: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// Reserve and commit calls through this node, by namespace then outcome.
    reservations: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// Reservations' costs through this node, by namespace then part (the bits of an f64).
    reservation_costs: papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
    /// How long requests took, by door then route (HTTP) or method (gRPC).
    latency: [papaya::HashMap<String, Latency>; 2],
    /// Connections open on the HTTP listener, kept by the listener.
    pub http_connections: Arc<AtomicUsize>,
    /// Connections open on the gRPC listener, kept by the listener.
    pub grpc_connections: Arc<AtomicUsize>,
}

/// Upper bounds (seconds) of the request duration histogram's buckets.
pub const REQUEST_BUCKETS_SECS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The doors a request duration is kept for.
#[derive(Debug, Clone, Copy)]
pub enum Door {
    Http = 0,
    Grpc = 1,
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

fn bump<K, Q>(map: &papaya::HashMap<K, AtomicU64>, key: &Q, owned: impl FnOnce() -> K, n: u64)
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
    pub fn http_request(&self, route: &str, status: u16) {
        let routes = self.http.pin();
        let statuses = match routes.get(route) {
            Some(s) => s,
            None => routes.get_or_insert_with(route.to_owned(), Default::default),
        };
        bump(statuses, &status, || status, 1);
    }

    /// A request through `door` on `route` (an HTTP route's pattern, or a gRPC method)
    /// that took `took`, from its head read to its answer made.
    pub fn request_took(&self, door: Door, route: &str, took: std::time::Duration) {
        let routes = self.latency[door as usize].pin();
        let latency = match routes.get(route) {
            Some(l) => l,
            None => routes.get_or_insert_with(route.to_owned(), Latency::default),
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

    pub fn increments(&self, namespace: &str, n: u64) {
        bump(&self.increments, namespace, || namespace.to_owned(), n);
    }

    /// A decision in `namespace` by `rule`: the name of the limit that decided (`60s`,
    /// `gcra`) or of the descriptor rule. Both come from the config (or a window size of
    /// it), so the labels do not grow with keys.
    /// `shadow_denied`: allowed only because what would deny it is in shadow (counted
    /// as allowed, and as a would-be denial).
    pub fn decision(&self, namespace: &str, rule: &str, allowed: bool, shadow_denied: bool) {
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

    /// A `ShouldRateLimit` call answered with `code` (OK, OVER_LIMIT, or the gRPC error).
    pub fn rls_request(&self, domain: &str, code: &'static str) {
        let domains = self.rls.pin();
        let codes = match domains.get(domain) {
            Some(c) => c,
            None => domains.get_or_insert_with(domain.to_owned(), Default::default),
        };
        bump(codes, &code, || code, 1);
    }

    /// A key's runtime limits `set` or `deleted` through this node's API.
    pub fn limit_change(&self, namespace: &str, change: &'static str) {
        let namespaces = self.limit_changes.pin();
        let changes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(changes, &change, || change, 1);
    }

    /// A lease call through this node: `acquired`, `denied`, `released`, `renewed`, or
    /// `not_live` (a release or renewal of a lease released, lapsed or never granted).
    pub fn lease(&self, namespace: &str, outcome: &'static str) {
        let namespaces = self.leases.pin();
        let outcomes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(outcomes, &outcome, || outcome, 1);
    }

    /// A reserve or commit through this node: `reserved`, `denied`, `committed`, or
    /// `not_open` (a commit of a reservation committed already, lapsed or never made).
    pub fn reservation(&self, namespace: &str, outcome: &'static str) {
        let namespaces = self.reservations.pin();
        let outcomes = match namespaces.get(namespace) {
            Some(c) => c,
            None => namespaces.get_or_insert_with(namespace.to_owned(), Default::default),
        };
        bump(outcomes, &outcome, || outcome, 1);
    }

    /// Cost through reservations: `reserved` (estimates spent), `charged` (beyond the
    /// estimate), `given_back`, `uncharged` (beyond the estimate, past the limit).
    pub fn reservation_cost(&self, namespace: &str, part: &'static str, cost: f64) {
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

    /// Whether this node has taken a reserve call in `namespace`.
    pub fn reserved_in(&self, namespace: &str) -> bool {
        self.reservations.pin().contains_key(namespace)
    }

    /// The exposition of these counters, of each namespace's engine, of the slots in
    /// flight of each concurrency namespace (`in_flight`) and of the reservations open
    /// (`open`), both read from the stores at the scrape (a namespace whose store did not
    /// answer is left out).
    pub fn render(
        &self,
        engines: &[&NamespaceSync],
        in_flight: &[(String, u64)],
        open: &[(String, u64)],
    ) -> String {
        let namespaces: Vec<NamespaceSample> =
            engines.iter().map(|s| NamespaceSample::of(s)).collect();
        let mut families = vec![
            counter_family(
                "swin_increments_total",
                "Increments counted, by namespace.",
                sorted(&self.increments)
                    .into_iter()
                    .map(|(n, v)| (vec![("namespace", n)], v)),
            ),
            counter_family(
                "swin_decisions_total",
                "Limit decisions (/hit, /v1/hits, /v1/auth, Envoy's descriptors), by namespace, rule (the limit or descriptor rule that decided) and outcome.",
                self.decisions
                    .iter()
                    .zip(["denied", "allowed"])
                    .flat_map(|(map, decision)| {
                        nested_owned(map).into_iter().map(move |(n, rule, v)| {
                            (
                                vec![
                                    ("namespace", n),
                                    ("rule", rule),
                                    ("decision", decision.to_owned()),
                                ],
                                v,
                            )
                        })
                    }),
            ),
            counter_family(
                "swin_shadow_denials_total",
                "Hits allowed only because the limit or rule that would deny them is in shadow, by namespace and rule.",
                nested_owned(&self.shadow_denials)
                    .into_iter()
                    .map(|(n, rule, v)| (vec![("namespace", n), ("rule", rule)], v)),
            ),
            counter_family(
                "swin_http_requests_total",
                "HTTP requests, by route and status.",
                self.sorted_http().into_iter().map(|(route, status, v)| {
                    (vec![("route", route), ("status", status.to_string())], v)
                }),
            ),
            counter_family(
                "swin_auth_requests_total",
                "Requests on routes that need a token, by token name and outcome (allowed, forbidden, unknown, missing).",
                self.sorted_auth()
                    .into_iter()
                    .map(|(token, outcome, v)| {
                        (vec![("token", token), ("outcome", outcome.to_owned())], v)
                    }),
            ),
            counter_family(
                "swin_rls_requests_total",
                "Envoy rate limit service calls (ShouldRateLimit), by domain and answer code.",
                nested(&self.rls)
                    .into_iter()
                    .map(|(domain, code, v)| (vec![("domain", domain), ("code", code.to_owned())], v)),
            ),
            counter_family(
                "swin_runtime_limit_changes_total",
                "Keys' runtime limits set or deleted through this node, by namespace and change.",
                nested(&self.limit_changes).into_iter().map(|(namespace, change, v)| {
                    (vec![("namespace", namespace), ("change", change.to_owned())], v)
                }),
            ),
            counter_family(
                "swin_lease_operations_total",
                "Concurrency lease calls through this node, by namespace and outcome (acquired, denied, released, renewed, not_live: a release or renewal of a lease no longer live). acquired less released is what lapsed or is in flight.",
                nested(&self.leases).into_iter().map(|(namespace, outcome, v)| {
                    (vec![("namespace", namespace), ("outcome", outcome.to_owned())], v)
                }),
            ),
            counter_family(
                "swin_reservation_operations_total",
                "Reserve and commit calls through this node, by namespace and outcome (reserved, denied, committed, not_open: a commit of a reservation committed already, lapsed or never made). reserved less committed is what lapsed (settled at its estimate) or is open.",
                nested(&self.reservations).into_iter().map(|(namespace, outcome, v)| {
                    (vec![("namespace", namespace), ("outcome", outcome.to_owned())], v)
                }),
            ),
            float_counter_family(
                "swin_reservation_cost_total",
                "Cost through reservations on this node, by namespace and part: reserved (estimates spent), charged (beyond the estimate, at commit), given_back (of the estimate, at commit), uncharged (beyond the estimate but past the limit).",
                nested(&self.reservation_costs)
                    .into_iter()
                    .map(|(namespace, part, bits)| {
                        (
                            vec![("namespace", namespace), ("part", part.to_owned())],
                            f64::from_bits(bits),
                        )
                    }),
            ),
        ];
        families.push(gauge_family(
            "swin_connections",
            "Connections open, by listener (http, grpc).",
            [
                ("http", &self.http_connections),
                ("grpc", &self.grpc_connections),
            ]
            .map(|(l, n)| {
                (
                    vec![("listener", l.to_owned())],
                    n.load(Ordering::Relaxed) as f64,
                )
            }),
        ));
        let clock = swin_sync::clock::clock();
        families.push(gauge_family(
            "swin_clock_offset_seconds",
            "The store's clock minus this node's, as last measured (0 until a store with a clock of its own answers); decisions are taken in the store's time.",
            [(
                Vec::new(),
                clock.offset_ms().unwrap_or(0) as f64 / 1e3,
            )],
        ));
        families.push(gauge_family(
            "swin_clock_offset_exceeded",
            "1 while this node's clock is further from the store's than max_clock_offset.",
            [(Vec::new(), f64::from(u8::from(clock.beyond_bound())))],
        ));
        families.push(gauge_family(
            "swin_leases_in_flight",
            "Slots of live concurrency leases, by namespace, across the cluster as the store counts them at this scrape (a local-only namespace: this node's).",
            in_flight
                .iter()
                .map(|(n, v)| (vec![("namespace", n.clone())], *v as f64)),
        ));
        families.push(gauge_family(
            "swin_reservations_open",
            "Reservations made and not yet committed or lapsed, by namespace, across the cluster as the store counts them at this scrape (namespaces this node has reserved in).",
            open.iter()
                .map(|(n, v)| (vec![("namespace", n.clone())], *v as f64)),
        ));
        families.push(family(
            "swin_request_duration_seconds",
            "How long requests took on this node, from their head read to their answer made, by door (http, grpc) and route (HTTP route pattern or gRPC method).",
            MetricType::HISTOGRAM,
            self.latency
                .iter()
                .zip(["http", "grpc"])
                .flat_map(|(map, door)| {
                    let mut rows: Vec<(String, Histogram)> = map
                        .pin()
                        .iter()
                        .map(|(route, l)| (route.clone(), l.histogram()))
                        .collect();
                    rows.sort_by(|a, b| a.0.cmp(&b.0));
                    rows.into_iter().map(move |(route, h)| {
                        let mut m = metric(vec![("door", door.to_owned()), ("route", route)]);
                        m.set_histogram(h);
                        m
                    })
                })
                .collect(),
        ));
        families.extend(namespace_families(&namespaces));
        // a family without samples (no decision yet) is left out, as registries do
        families.retain(|f| !f.get_metric().is_empty());
        let mut out = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
            // only a family built wrong gets here: a bug, shown rather than hidden
            tracing::error!(cause = %e, "metrics exposition failed");
        }
        out
    }

    fn sorted_auth(&self) -> Vec<(String, &'static str, u64)> {
        let mut v = Vec::new();
        for (token, outcomes) in self.auth.pin().iter() {
            for (outcome, c) in outcomes.pin().iter() {
                v.push((token.clone(), *outcome, c.load(Ordering::Relaxed)));
            }
        }
        v.sort();
        v
    }

    fn sorted_http(&self) -> Vec<(String, u16, u64)> {
        let mut v = Vec::new();
        for (route, statuses) in self.http.pin().iter() {
            for (status, c) in statuses.pin().iter() {
                v.push((route.clone(), *status, c.load(Ordering::Relaxed)));
            }
        }
        v.sort();
        v
    }
}

fn nested(
    map: &papaya::HashMap<String, papaya::HashMap<&'static str, AtomicU64>>,
) -> Vec<(String, &'static str, u64)> {
    let mut v = Vec::new();
    for (outer, inner) in map.pin().iter() {
        for (k, c) in inner.pin().iter() {
            v.push((outer.clone(), *k, c.load(Ordering::Relaxed)));
        }
    }
    v.sort();
    v
}

fn nested_owned(
    map: &papaya::HashMap<String, papaya::HashMap<String, AtomicU64>>,
) -> Vec<(String, String, u64)> {
    let mut v = Vec::new();
    for (outer, inner) in map.pin().iter() {
        for (k, c) in inner.pin().iter() {
            v.push((outer.clone(), k.clone(), c.load(Ordering::Relaxed)));
        }
    }
    v.sort();
    v
}

fn sorted(map: &papaya::HashMap<String, AtomicU64>) -> Vec<(String, u64)> {
    let mut v: Vec<_> = map
        .pin()
        .iter()
        .map(|(k, c)| (k.clone(), c.load(Ordering::Relaxed)))
        .collect();
    v.sort();
    v
}

/// One namespace as a scrape sees it: its engine's status read once.
#[derive(Debug)]
struct NamespaceSample {
    name: String,
    status: SyncStatus,
    counters: usize,
    buckets: usize,
    evictions: u64,
    reservations: u64,
    /// First touches: keys read from the store, keys answered from local knowledge.
    first_touches: (u64, u64),
    strict: bool,
}

impl NamespaceSample {
    fn of(sync: &NamespaceSync) -> Self {
        let c = sync.counters();
        NamespaceSample {
            name: sync.name().to_owned(),
            status: sync.status(),
            counters: c.len(),
            buckets: c.buckets().len(),
            evictions: c.evictions(),
            reservations: sync.reservations(),
            first_touches: sync.first_touches(),
            strict: sync.is_strict(),
        }
    }
}

type Labels = Vec<(&'static str, String)>;

fn metric(labels: Labels) -> Metric {
    let mut m = Metric::default();
    m.set_label(
        labels
            .into_iter()
            .map(|(name, value)| {
                let mut l = LabelPair::default();
                l.set_name(name.to_owned());
                l.set_value(value);
                l
            })
            .collect(),
    );
    m
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn counter_family(
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> MetricFamily {
    float_counter_family(
        name,
        help,
        samples.into_iter().map(|(labels, v)| (labels, v as f64)),
    )
}

fn float_counter_family(
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, f64)>,
) -> MetricFamily {
    let metrics = samples
        .into_iter()
        .map(|(labels, v)| {
            let mut m = metric(labels);
            let mut c = Counter::default();
            c.set_value(v);
            m.set_counter(c);
            m
        })
        .collect();
    family(name, help, MetricType::COUNTER, metrics)
}

fn gauge_family(
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, f64)>,
) -> MetricFamily {
    let metrics = samples
        .into_iter()
        .map(|(labels, v)| {
            let mut m = metric(labels);
            let mut g = Gauge::default();
            g.set_value(v);
            m.set_gauge(g);
            m
        })
        .collect();
    family(name, help, MetricType::GAUGE, metrics)
}

/// The engine's sync durations: its non-cumulative buckets made cumulative.
fn sync_histogram(st: &SyncStatus) -> Histogram {
    let mut h = Histogram::default();
    h.set_sample_count(st.syncs);
    h.set_sample_sum(st.duration_sum_secs);
    let mut cumulative = 0;
    h.set_bucket(
        SYNC_BUCKETS_SECS
            .iter()
            .zip(st.duration_buckets.iter())
            .map(|(le, n)| {
                cumulative += n;
                let mut b = Bucket::default();
                b.set_upper_bound(*le);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect(),
    );
    h
}

/// Per namespace: what its tables hold and how its syncs go.
fn namespace_families(namespaces: &[NamespaceSample]) -> Vec<MetricFamily> {
    let ns = |n: &NamespaceSample| vec![("namespace", n.name.clone())];
    let gauges = |name: &str, help: &str, v: fn(&NamespaceSample) -> f64| {
        gauge_family(name, help, namespaces.iter().map(|n| (ns(n), v(n))))
    };
    let counters = |name: &str, help: &str, v: fn(&NamespaceSample) -> u64| {
        counter_family(name, help, namespaces.iter().map(|n| (ns(n), v(n))))
    };
    let histograms = namespaces
        .iter()
        .map(|n| {
            let mut m = metric(ns(n));
            m.set_histogram(sync_histogram(&n.status));
            m
        })
        .collect();
    vec![
        gauges("swin_buckets", "GCRA buckets held in local memory.", |n| {
            n.buckets as f64
        }),
        gauges(
            "swin_counters",
            "Counters held in local memory (key x window size).",
            |n| n.counters as f64,
        ),
        counters(
            "swin_evictions_total",
            "Counters evicted to stay under max_counters.",
            |n| n.evictions,
        ),
        gauges(
            "swin_pending_diffs",
            "Window diffs drained but not yet confirmed by the store.",
            |n| n.status.pending_diffs as f64,
        ),
        gauges(
            "swin_pending_advances",
            "GCRA TAT advances drained but not yet confirmed by the store.",
            |n| n.status.pending_advances as f64,
        ),
        counters("swin_sync_failures_total", "Syncs that failed.", |n| {
            n.status.failures
        }),
        counters(
            "swin_rejected_windows_total",
            "Windows the store refused for good (logged with their key) and dropped.",
            |n| n.status.rejected_windows,
        ),
        counters("swin_syncs_total", "Syncs that reached the store.", |n| {
            n.status.syncs
        }),
        counters(
            "swin_first_touch_loads_total",
            "Keys this node held nothing for, read from the store before an answer.",
            |n| n.first_touches.0,
        ),
        counters(
            "swin_first_touch_fallbacks_total",
            "Keys this node held nothing for and answered from local knowledge: the store did not answer within store_timeout.",
            |n| n.first_touches.1,
        ),
        counters(
            "swin_reservations_total",
            "Store calls of strict admission (holds of window quota, grants of bucket quota, taken or given back).",
            |n| n.reservations,
        ),
        gauges(
            "swin_strict_admission",
            "1 when the namespace admits strictly (admission = \"strict\"), else 0.",
            |n| f64::from(u8::from(n.strict)),
        ),
        gauges(
            "swin_degraded",
            "1 while the namespace cannot reach its store.",
            |n| f64::from(u8::from(n.status.degraded.is_some())),
        ),
        family(
            "swin_sync_duration_seconds",
            "Duration of syncs.",
            MetricType::HISTOGRAM,
            histograms,
        ),
    ]
}

/// `swin_spool_files`: spool files waiting in `data_dir` (what a stop could not push and
/// a start has not yet pushed, or could not read), in the exposition format.
pub fn spool_gauge(files: usize) -> String {
    let family = gauge_family(
        "swin_spool_files",
        "Spool files in data_dir: diffs a stop could not push, not yet pushed by a start (or unreadable, left for an operator).",
        [(Vec::new(), files as f64)],
    );
    let mut out = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&[family], &mut out) {
        tracing::error!(cause = %e, "the spool gauge could not be written");
    }
    out
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
