//! The `/metrics` exposition, built at each scrape from the node's counters and from
//! what each namespace's engine and tables hold: every metric's name, help and labels.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::proto::{Histogram, MetricFamily, MetricType};
use swin::status::NodeStatus;

use super::families::{counter_family, family, float_counter_family, gauge_family, metric};
use super::namespaces::namespace_families;
use super::{Map, Metrics};

impl Metrics {
    /// The exposition of these counters, of each namespace's status (its name and
    /// document, see [`super::document`]), of the node's
    /// clock, of the slots in flight of each concurrency namespace (`in_flight`) and of
    /// the reservations open (`open`), both read from the stores at the scrape (a
    /// namespace whose store did not answer is left out).
    pub fn render(
        &self,
        namespaces: &[(String, serde_json::Value)],
        node: &NodeStatus,
        in_flight: &[(String, u64)],
        open: &[(String, u64)],
    ) -> String {
        let mut families = self.request_families();
        families.extend(self.operation_families());
        families.extend(self.node_gauges(&super::document(node), in_flight, open));
        families.push(self.duration_family());
        families.extend(namespace_families(namespaces));
        // a family without samples (no decision yet) is left out, as registries do
        families.retain(|f| !f.get_metric().is_empty());
        let mut out = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
            // only a family built wrong gets here: a bug, shown rather than hidden
            tracing::error!(cause = %e, "metrics exposition failed");
        }
        out
    }

    /// What requests did on this node: counters by namespace, rule, route, token, domain.
    fn request_families(&self) -> Vec<MetricFamily> {
        vec![
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
                "Envoy rate limit service calls (ShouldRateLimit), by domain (unknown: no namespace of this node) and answer code.",
                nested(&self.rls)
                    .into_iter()
                    .map(|(domain, code, v)| (vec![("domain", domain), ("code", code.to_owned())], v)),
            ),
            counter_family(
                "swin_quota_actions_total",
                "Bucket actions Envoy's rate limit quota service told proxies through this node, by domain (unknown: no namespace of this node) and action (assign, allow_all, deny_all, abandon; refused: a report that ended its stream).",
                nested(&self.quota).into_iter().map(|(domain, action, v)| {
                    (vec![("domain", domain), ("action", action.to_owned())], v)
                }),
            ),
        ]
    }

    /// What operators and clients changed through this node: runtime limits, leases,
    /// reservations and their cost.
    fn operation_families(&self) -> Vec<MetricFamily> {
        vec![
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
                "Reserve, extend and commit calls through this node, by namespace and outcome (reserved, denied, extended, extend_denied, committed, not_open: a commit of a reservation lapsed or never made, replayed: a commit of a reservation committed already at its cost, told how). reserved less committed is what lapsed (settled at its total) or is open.",
                nested(&self.reservations).into_iter().map(|(namespace, outcome, v)| {
                    (vec![("namespace", namespace), ("outcome", outcome.to_owned())], v)
                }),
            ),
            float_counter_family(
                "swin_reservation_cost_total",
                "Cost through reservations on this node, by namespace and part: reserved (estimates spent, on each key), extended (added by extends, on each key), charged (beyond the total, at commit), given_back (of the estimate, at commit), uncharged (beyond the estimate but past the limit).",
                nested(&self.reservation_costs)
                    .into_iter()
                    .map(|(namespace, part, bits)| {
                        (
                            vec![("namespace", namespace), ("part", part.to_owned())],
                            f64::from_bits(bits),
                        )
                    }),
            ),
        ]
    }

    /// The node's own gauges: connections, its clock against the store's, and what is
    /// in flight across the cluster (leases, open reservations) at this scrape.
    fn node_gauges(
        &self,
        node: &serde_json::Value,
        in_flight: &[(String, u64)],
        open: &[(String, u64)],
    ) -> Vec<MetricFamily> {
        let mut out = Vec::new();
        out.push(gauge_family(
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
        out.push(gauge_family(
            "swin_quota_streams",
            "Streams of Envoy's rate limit quota service open on this node (one per proxy).",
            [(
                Vec::new(),
                self.quota_streams.load(Ordering::Relaxed) as f64,
            )],
        ));
        out.push(gauge_family(
            "swin_clock_offset_seconds",
            "The store's clock minus this node's, as last measured (0 until a store with a clock of its own answers); decisions are taken in the store's time.",
            [(
                Vec::new(),
                node["offset_ms"].as_f64().unwrap_or(0.0) / 1e3,
            )],
        ));
        out.push(gauge_family(
            "swin_spool_files",
            "Spool files in data_dir: diffs a stop could not push, not yet pushed by a start (or unreadable, left for an operator).",
            [(Vec::new(), node["spooled_files"].as_f64().unwrap_or(0.0))],
        ));
        out.push(gauge_family(
            "swin_clock_offset_exceeded",
            "1 while this node's clock is further from the store's than max_clock_offset.",
            [(
                Vec::new(),
                f64::from(u8::from(node["beyond_bound"] == true)),
            )],
        ));
        out.push(gauge_family(
            "swin_leases_in_flight",
            "Slots of live concurrency leases, by namespace, across the cluster as the store counts them at this scrape (a local-only namespace: this node's).",
            in_flight
                .iter()
                .map(|(n, v)| (vec![("namespace", n.clone())], *v as f64)),
        ));
        out.push(gauge_family(
            "swin_reservations_open",
            "Reservations made and not yet committed or lapsed, by namespace, across the cluster as the store counts them at this scrape (namespaces this node has reserved in).",
            open.iter()
                .map(|(n, v)| (vec![("namespace", n.clone())], *v as f64)),
        ));
        out
    }

    /// Request durations, by door and route.
    fn duration_family(&self) -> MetricFamily {
        family(
        "swin_request_duration_seconds",
        "How long requests took on this node, from their head read to their answer made, by door (http, grpc) and route (HTTP route pattern or gRPC method).",
        MetricType::HISTOGRAM,
        {
            let http = self.http.pin();
            let grpc = self.grpc_latency.pin();
            let doors: [(&str, Vec<(String, Histogram)>); 2] = [
                ("http", http.iter().map(|(r, h)| (r.clone(), h.latency.histogram())).collect()),
                ("grpc", grpc.iter().map(|(m, l)| (m.clone(), l.histogram())).collect()),
            ];
            doors
                .into_iter()
                .flat_map(|(door, mut rows)| {
                    rows.sort_by(|a, b| a.0.cmp(&b.0));
                    rows.into_iter().map(move |(route, h)| {
                        let mut m = metric(vec![("door", door.to_owned()), ("route", route)]);
                        m.set_histogram(h);
                        m
                    })
                })
                .collect()
        },
    )
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
        for (route, r) in self.http.pin().iter() {
            for (status, c) in r.statuses.pin().iter() {
                v.push((route.clone(), *status, c.load(Ordering::Relaxed)));
            }
        }
        v.sort();
        v
    }
}

fn nested(map: &Map<String, Map<&'static str, AtomicU64>>) -> Vec<(String, &'static str, u64)> {
    let mut v = Vec::new();
    for (outer, inner) in map.pin().iter() {
        for (k, c) in inner.pin().iter() {
            v.push((outer.clone(), *k, c.load(Ordering::Relaxed)));
        }
    }
    v.sort();
    v
}

fn nested_owned(map: &Map<String, Map<String, AtomicU64>>) -> Vec<(String, String, u64)> {
    let mut v = Vec::new();
    for (outer, inner) in map.pin().iter() {
        for (k, c) in inner.pin().iter() {
            v.push((outer.clone(), k.clone(), c.load(Ordering::Relaxed)));
        }
    }
    v.sort();
    v
}

fn sorted(map: &Map<String, AtomicU64>) -> Vec<(String, u64)> {
    let mut v: Vec<_> = map
        .pin()
        .iter()
        .map(|(k, c)| (k.clone(), c.load(Ordering::Relaxed)))
        .collect();
    v.sort();
    v
}
