//! How a Prometheus metric family is built from labelled samples: the one place the
//! exposition's protobuf types are filled in.

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A sample's labels, in order: name, value.
pub(super) type Labels = Vec<(&'static str, String)>;

pub(super) fn metric(labels: Labels) -> Metric {
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

pub(super) fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    metrics: Vec<Metric>,
) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

pub(super) fn counter_family(
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

pub(super) fn float_counter_family(
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

pub(super) fn gauge_family(
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
