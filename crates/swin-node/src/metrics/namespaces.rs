//! Each namespace's families in `/metrics`: what its status shows at the scrape
//! ([`NamespaceStatus`], read once per namespace), written as a table of gauges and
//! counters, with its sync durations.

use prometheus::proto::{Bucket, Histogram, MetricFamily, MetricType};
use swin::status::{NamespaceStatus, SyncCounts};

use super::families::{counter_family, family, gauge_family, metric};

/// The sync durations: their non-cumulative buckets made cumulative.
fn sync_histogram(st: &SyncCounts) -> Histogram {
    let mut h = Histogram::default();
    h.set_sample_count(st.syncs);
    h.set_sample_sum(st.duration_sum_secs);
    let mut cumulative = 0;
    h.set_bucket(
        st.duration_buckets
            .iter()
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
/// How a namespace's sample is read: a gauge's value or a counter's.
enum Sample {
    Gauge(fn(&NamespaceStatus) -> f64),
    Counter(fn(&NamespaceStatus) -> u64),
}

/// Each namespace's gauges and counters: name, help, and how its value is read.
const NAMESPACE_SAMPLES: &[(&str, &str, Sample)] = &[
    (
        "swin_buckets",
        "GCRA buckets held in local memory.",
        Sample::Gauge(|n| n.buckets as f64),
    ),
    (
        "swin_counters",
        "Counters held in local memory (key x window size).",
        Sample::Gauge(|n| n.counters as f64),
    ),
    (
        "swin_evictions_total",
        "Counters evicted to stay under max_counters.",
        Sample::Counter(|n| n.evictions),
    ),
    (
        "swin_pending_diffs",
        "Window diffs drained but not yet confirmed by the store.",
        Sample::Gauge(|n| n.pending_diffs as f64),
    ),
    (
        "swin_pending_advances",
        "GCRA TAT advances drained but not yet confirmed by the store.",
        Sample::Gauge(|n| n.pending_advances as f64),
    ),
    (
        "swin_sync_failures_total",
        "Syncs that failed.",
        Sample::Counter(|n| n.syncs.failures),
    ),
    (
        "swin_rejected_windows_total",
        "Windows the store refused for good (logged with their key) and dropped.",
        Sample::Counter(|n| n.syncs.rejected_windows),
    ),
    (
        "swin_syncs_total",
        "Syncs that reached the store.",
        Sample::Counter(|n| n.syncs.syncs),
    ),
    (
        "swin_first_touch_loads_total",
        "Keys this node held nothing for, read from the store before an answer.",
        Sample::Counter(|n| n.syncs.first_touch_loads),
    ),
    (
        "swin_first_touch_fallbacks_total",
        "Keys this node held nothing for and answered from local knowledge: the store did not answer within store_timeout.",
        Sample::Counter(|n| n.syncs.first_touch_fallbacks),
    ),
    (
        "swin_reservations_total",
        "Store calls of strict admission (holds of window quota, grants of bucket quota, taken or given back).",
        Sample::Counter(|n| n.reservations),
    ),
    (
        "swin_strict_admission",
        "1 when the namespace admits strictly (admission = \"strict\"), else 0.",
        Sample::Gauge(|n| f64::from(u8::from(n.syncs.strict))),
    ),
    (
        "swin_degraded",
        "1 while the namespace cannot reach its store.",
        Sample::Gauge(|n| f64::from(u8::from(n.degraded))),
    ),
];

pub(super) fn namespace_families(namespaces: &[NamespaceStatus]) -> Vec<MetricFamily> {
    let ns = |n: &NamespaceStatus| vec![("namespace", n.name.clone())];
    let mut out: Vec<MetricFamily> = NAMESPACE_SAMPLES
        .iter()
        .map(|(name, help, sample)| match sample {
            Sample::Gauge(v) => gauge_family(name, help, namespaces.iter().map(|n| (ns(n), v(n)))),
            Sample::Counter(v) => {
                counter_family(name, help, namespaces.iter().map(|n| (ns(n), v(n))))
            }
        })
        .collect();
    let histograms = namespaces
        .iter()
        .map(|n| {
            let mut m = metric(ns(n));
            m.set_histogram(sync_histogram(&n.syncs));
            m
        })
        .collect();
    out.push(family(
        "swin_sync_duration_seconds",
        "Duration of syncs.",
        MetricType::HISTOGRAM,
        histograms,
    ));
    out
}
