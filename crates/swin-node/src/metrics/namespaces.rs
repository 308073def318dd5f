//! Each namespace's families in `/metrics`: what its status shows at the scrape (the
//! document a [`swin::status::NamespaceStatus`] serializes as, made once per namespace
//! and scrape by [`super::document`], read by its fields), written as a table of gauges
//! and counters, with its sync durations.

use prometheus::proto::{Bucket, Histogram, MetricFamily, MetricType};
use serde_json::Value;

use super::families::{family, float_counter_family, gauge_family, metric};

/// A number of a status document, at its JSON pointer (`/syncs/failures`); a true flag
/// is 1. A field the document does not have is a bug in this table (the metrics tests
/// read every family): logged, and 0.
fn number(doc: &Value, pointer: &str) -> f64 {
    match doc.pointer(pointer) {
        Some(Value::Bool(b)) => f64::from(u8::from(*b)),
        Some(v) if v.is_number() => v.as_f64().unwrap_or(0.0),
        _ => {
            tracing::error!(pointer, "a namespace's status has no such number");
            0.0
        }
    }
}

/// The sync durations: their non-cumulative buckets made cumulative.
fn sync_histogram(doc: &Value) -> Histogram {
    let mut h = Histogram::default();
    h.set_sample_count(number(doc, "/syncs/syncs") as u64);
    h.set_sample_sum(number(doc, "/syncs/duration_sum_secs"));
    let buckets = doc
        .pointer("/syncs/duration_buckets")
        .and_then(Value::as_array);
    let mut cumulative = 0;
    h.set_bucket(
        buckets
            .into_iter()
            .flatten()
            .map(|b| {
                cumulative += number(b, "/1") as u64;
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(number(b, "/0"));
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect(),
    );
    h
}

/// How a namespace's sample is read: a gauge's value or a counter's, at a pointer into
/// its status document.
enum Sample {
    Gauge(&'static str),
    Counter(&'static str),
}

/// Each namespace's gauges and counters: name, help, and how its value is read.
const NAMESPACE_SAMPLES: &[(&str, &str, Sample)] = &[
    (
        "swin_buckets",
        "GCRA buckets held in local memory.",
        Sample::Gauge("/buckets"),
    ),
    (
        "swin_counters",
        "Counters held in local memory (key x window size).",
        Sample::Gauge("/counters"),
    ),
    (
        "swin_evictions_total",
        "Counters evicted to stay under max_counters.",
        Sample::Counter("/evictions"),
    ),
    (
        "swin_pending_diffs",
        "Window diffs drained but not yet confirmed by the store.",
        Sample::Gauge("/pending_diffs"),
    ),
    (
        "swin_pending_advances",
        "GCRA TAT advances drained but not yet confirmed by the store.",
        Sample::Gauge("/pending_advances"),
    ),
    (
        "swin_sync_failures_total",
        "Syncs that failed.",
        Sample::Counter("/syncs/failures"),
    ),
    (
        "swin_rejected_windows_total",
        "Windows the store refused for good (logged with their key) and dropped.",
        Sample::Counter("/syncs/rejected_windows"),
    ),
    (
        "swin_syncs_total",
        "Syncs that reached the store.",
        Sample::Counter("/syncs/syncs"),
    ),
    (
        "swin_first_touch_loads_total",
        "Keys this node held nothing for, read from the store before an answer.",
        Sample::Counter("/syncs/first_touch_loads"),
    ),
    (
        "swin_first_touch_fallbacks_total",
        "Keys this node held nothing for and answered from local knowledge: the store did not answer within store_timeout.",
        Sample::Counter("/syncs/first_touch_fallbacks"),
    ),
    (
        "swin_reservations_total",
        "Store calls of strict admission (holds of window quota, grants of bucket quota, taken or given back).",
        Sample::Counter("/reservations"),
    ),
    (
        "swin_strict_admission",
        "1 when the namespace admits strictly (admission = \"strict\"), else 0.",
        Sample::Gauge("/syncs/strict"),
    ),
    (
        "swin_degraded",
        "1 while the namespace cannot reach its store.",
        Sample::Gauge("/degraded"),
    ),
];

pub(super) fn namespace_families(namespaces: &[(String, Value)]) -> Vec<MetricFamily> {
    let docs: Vec<(Vec<(&str, String)>, &Value)> = namespaces
        .iter()
        .map(|(name, doc)| (vec![("namespace", name.clone())], doc))
        .collect();
    let mut out: Vec<MetricFamily> = NAMESPACE_SAMPLES
        .iter()
        .map(|(name, help, sample)| match sample {
            Sample::Gauge(at) => gauge_family(
                name,
                help,
                docs.iter().map(|(ns, d)| (ns.clone(), number(d, at))),
            ),
            Sample::Counter(at) => float_counter_family(
                name,
                help,
                docs.iter().map(|(ns, d)| (ns.clone(), number(d, at))),
            ),
        })
        .collect();
    let histograms = docs
        .iter()
        .map(|(ns, d)| {
            let mut m = metric(ns.clone());
            m.set_histogram(sync_histogram(d));
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
