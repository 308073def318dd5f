//! Prometheus text exposition of the node's counters, gathered at scrape time from the
//! engines and tables, plus HTTP request counts kept here.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use swin_sync::NamespaceSync;

/// Counters bumped on every request: lock-free maps (a mutex here would be the one lock
/// every request takes), keyed by namespace, and by route then status.
#[derive(Debug, Default)]
pub struct Metrics {
    http: papaya::HashMap<String, papaya::HashMap<u16, AtomicU64>>,
    increments: papaya::HashMap<String, AtomicU64>,
    /// Decisions by namespace: denied, allowed.
    decisions: [papaya::HashMap<String, AtomicU64>; 2],
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

    pub fn increments(&self, namespace: &str, n: u64) {
        bump(&self.increments, namespace, || namespace.to_owned(), n);
    }

    pub fn decision(&self, namespace: &str, allowed: bool) {
        bump(
            &self.decisions[usize::from(allowed)],
            namespace,
            || namespace.to_owned(),
            1,
        );
    }

    fn sorted_increments(&self) -> Vec<(String, u64)> {
        sorted(&self.increments)
    }

    fn sorted_decisions(&self) -> Vec<(String, &'static str, u64)> {
        let mut v = Vec::new();
        for (i, name) in ["denied", "allowed"].into_iter().enumerate() {
            v.extend(
                sorted(&self.decisions[i])
                    .into_iter()
                    .map(|(ns, n)| (ns, name, n)),
            );
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

    /// The Prometheus text of these counters and of each namespace's engine.
    pub fn render(&self, engines: &[&NamespaceSync]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP swin_increments_total Increments counted, by namespace.\n# TYPE swin_increments_total counter");
        for (ns, v) in self.sorted_increments() {
            let _ = writeln!(
                out,
                "swin_increments_total{{namespace=\"{}\"}} {v}",
                esc(&ns)
            );
        }
        let _ = writeln!(out, "# HELP swin_decisions_total Limit decisions (/hit, /v1/hits, /v1/auth), by namespace and outcome.\n# TYPE swin_decisions_total counter");
        for (ns, decision, v) in self.sorted_decisions() {
            let _ = writeln!(
                out,
                "swin_decisions_total{{namespace=\"{}\",decision=\"{decision}\"}} {v}",
                esc(&ns)
            );
        }
        let _ = writeln!(out, "# HELP swin_http_requests_total HTTP requests, by route and status.\n# TYPE swin_http_requests_total counter");
        for (route, status, v) in self.sorted_http() {
            let _ = writeln!(
                out,
                "swin_http_requests_total{{route=\"{}\",status=\"{status}\"}} {v}",
                esc(&route)
            );
        }
        let gauges: [(&str, &str, &str); 8] = [
            (
                "swin_buckets",
                "gauge",
                "GCRA buckets held in local memory.",
            ),
            (
                "swin_counters",
                "gauge",
                "Counters held in local memory (key x window size).",
            ),
            (
                "swin_evictions_total",
                "counter",
                "Counters evicted to stay under max_counters.",
            ),
            (
                "swin_pending_diffs",
                "gauge",
                "Windows drained but not yet confirmed by the store.",
            ),
            ("swin_sync_failures_total", "counter", "Syncs that failed."),
            (
                "swin_rejected_windows_total",
                "counter",
                "Windows the store refused for good (logged with their key) and dropped.",
            ),
            (
                "swin_syncs_total",
                "counter",
                "Syncs that reached the store.",
            ),
            (
                "swin_degraded",
                "gauge",
                "1 while the namespace cannot reach its store.",
            ),
        ];
        for (name, kind, help) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for sync in engines {
                let st = sync.status();
                let c = sync.counters();
                let v = match name {
                    "swin_counters" => c.len() as f64,
                    "swin_buckets" => c.buckets().len() as f64,
                    "swin_evictions_total" => c.evictions() as f64,
                    "swin_pending_diffs" => st.pending_diffs as f64,
                    "swin_sync_failures_total" => st.failures as f64,
                    "swin_rejected_windows_total" => st.rejected_windows as f64,
                    "swin_syncs_total" => st.syncs as f64,
                    _ => f64::from(u8::from(st.degraded.is_some())),
                };
                let _ = writeln!(out, "{name}{{namespace=\"{}\"}} {v}", esc(sync.name()));
            }
        }
        let _ = writeln!(out, "# HELP swin_sync_duration_seconds Duration of syncs.\n# TYPE swin_sync_duration_seconds histogram");
        for sync in engines {
            let st = sync.status();
            let name = esc(sync.name());
            let mut cumulative = 0;
            for (le, n) in swin_sync::SYNC_BUCKETS_SECS
                .iter()
                .zip(st.duration_buckets.iter())
            {
                cumulative += n;
                let _ = writeln!(out, "swin_sync_duration_seconds_bucket{{namespace=\"{name}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(
                out,
                "swin_sync_duration_seconds_bucket{{namespace=\"{name}\",le=\"+Inf\"}} {}",
                st.syncs
            );
            let _ = writeln!(
                out,
                "swin_sync_duration_seconds_sum{{namespace=\"{name}\"}} {}",
                st.duration_sum_secs
            );
            let _ = writeln!(
                out,
                "swin_sync_duration_seconds_count{{namespace=\"{name}\"}} {}",
                st.syncs
            );
        }
        out
    }
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

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
