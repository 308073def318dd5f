//! The spans of the request path: made at TRACE level under targets of their own
//! ([`REQUEST`] for a request, `swin::store` for its store calls, made in swin-sync), so
//! that a log filter never takes them and, with traces off, each is one cached check.

/// The target of a request's span (every door).
pub const REQUEST: &str = "swin::request";

/// Records what a request decided on its span, when traces are on: the namespace and
/// the outcome (`allowed`, `denied`, `shadow_denied`; the last hit's, for a request of
/// several).
pub(crate) fn decided(namespace: &str, outcome: &'static str) {
    if tracing::enabled!(target: REQUEST, tracing::Level::TRACE) {
        let span = tracing::Span::current();
        span.record("namespace", namespace);
        span.record("decision", outcome);
    }
}
