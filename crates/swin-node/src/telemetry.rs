//! Logs, and traces over OTLP (`[telemetry]`).
//!
//! The request path makes its spans at TRACE level under targets of their own
//! ([`REQUEST`], and `swin::store` for store calls, made in swin-sync): the log's filter
//! (`RUST_LOG`, INFO by default) never takes them, so with no `otlp_endpoint` every one of
//! them is a callsite that is off — one cached check, no span made. With it, a layer of
//! tracing-opentelemetry takes those targets only and hands the spans to OpenTelemetry's
//! SDK, which exports them in batches over OTLP/gRPC from a thread of its own.
//!
//! Sampling is decided before a request's span is made ([`sample`]): a span made and
//! dropped by a sampler afterwards costs nearly what a kept one does (measured:
//! BENCHMARKS-HISTORY.md), so a request not sampled makes no span, and its store calls none
//! either (they are made only under a request's span).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::{LogFormat, TelemetryConfig};

pub use swin::spans::REQUEST;

/// `sample_ratio`, as f64 bits (set once, at start).
static RATIO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a request gets a span, and under which caller: `None` when traces are off or
/// it is not sampled; else the context its span is the child of (empty without a
/// caller). A caller's well-formed W3C `traceparent` decides by its sampled flag; without
/// one (or with a malformed one) a draw under `sample_ratio` does.
fn sample(headers: &axum::http::HeaderMap) -> Option<opentelemetry::Context> {
    use opentelemetry::trace::TraceContextExt;
    if !tracing::enabled!(target: REQUEST, tracing::Level::TRACE) {
        return None;
    }
    if let Some(caller) = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(caller)
    {
        return caller
            .is_sampled()
            .then(|| opentelemetry::Context::new().with_remote_span_context(caller));
    }
    let ratio = f64::from_bits(RATIO.load(std::sync::atomic::Ordering::Relaxed));
    (ratio >= 1.0 || rand::random::<f64>() < ratio).then(opentelemetry::Context::new)
}

/// The span of a request with `headers`: `make`'s, as the child of the caller's span if
/// it names one, when [`sample`] takes the request; none otherwise (with traces off, one
/// cached check).
pub fn request_span(
    headers: &axum::http::HeaderMap,
    make: impl FnOnce() -> tracing::Span,
) -> tracing::Span {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let Some(cx) = sample(headers) else {
        return tracing::Span::none();
    };
    let span = make();
    if cx.has_active_span() {
        let _ = span.set_parent(cx);
    }
    span
}

/// The caller's span of a well-formed W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`,
/// ids not all zero; checked here, as OpenTelemetry's propagator takes shorter ids).
fn caller(v: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let mut parts = v.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if version != "00"
        || parts.next().is_some()
        || !hex(trace, 32)
        || !hex(span, 16)
        || !hex(flags, 2)
        || zero(trace)
        || zero(span)
    {
        return None;
    }
    Some(SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    ))
}

/// What keeps the traces going until the node stops.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Sets the process's logging in `format`, and traces when `telemetry` says where to.
/// Needs the runtime (the exporter's channel lives on it).
pub fn init(format: LogFormat, telemetry: Option<&TelemetryConfig>) -> anyhow::Result<Telemetry> {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal()) // no colour codes in files and journals
        .with_writer(std::io::stderr);
    let log = match format {
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
        LogFormat::Pretty => fmt.with_filter(filter).boxed(),
    };
    let Some(config) = telemetry else {
        tracing_subscriber::registry().with(log).try_init()?;
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.otlp_endpoint.clone())
        .build()?;
    RATIO.store(
        config.sample_ratio.to_bits(),
        std::sync::atomic::Ordering::Relaxed,
    );
    // every span made is kept: the sampling is decided before a request's is made
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    // no busy/idle clocks, source locations or thread names per span: the figures a
    // span carries are its own fields
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("swin-node"))
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target().starts_with("swin::")
        }));
    tracing_subscriber::registry()
        .with(log)
        .with(traces)
        .try_init()?;
    tracing::info!(
        endpoint = config.otlp_endpoint,
        service = config.service_name,
        ratio = config.sample_ratio,
        "traces over OTLP"
    );
    Ok(Telemetry {
        provider: Some(provider),
    })
}

impl Telemetry {
    /// Exports the spans still waiting (the node is stopping).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // the SDK's shutdown blocks until its export thread has flushed
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(cause = %e, "the last traces were not exported");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::caller;

    fn parent_flags(v: &str) -> Option<u8> {
        caller(v).map(|c| c.trace_flags().to_u8())
    }

    #[test]
    fn only_a_well_formed_traceparent_has_flags() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-";
        assert_eq!(parent_flags(&format!("{ok}01")), Some(1));
        assert_eq!(parent_flags(&format!("{ok}00")), Some(0));
        assert_eq!(parent_flags(&format!(" {ok}01 ")), Some(1));
        for bad in [
            "",
            "00",
            "00-zz-yy-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
        ] {
            assert_eq!(parent_flags(bad), None, "{bad:?}");
        }
    }
}
