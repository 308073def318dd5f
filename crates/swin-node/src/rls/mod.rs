//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) over gRPC,
//! beside the HTTP API: a request's `domain` is a namespace and its descriptors are
//! decided by the library as one request ([`swin::descriptors`]: rules, overrides,
//! replaces, counting mode, all or nothing; on a concurrency namespace, slots of leases
//! instead, [`leases`]). This door checks the request's shape, renders the answer and
//! maps errors onto gRPC statuses.
//!
//! Answers: OVER_LIMIT when any descriptor (not in shadow mode) is over its limit, else
//! OK; one status per descriptor in order; descriptors that match no rule (or an unknown
//! domain) are OK with no limit, as envoyproxy/ratelimit answers. An empty domain, no
//! descriptors or a bad descriptor: INVALID_ARGUMENT. A store that a decision needs and
//! cannot ask (strict admission with `on_store_failure = "deny"`): UNAVAILABLE, so
//! Envoy's `failure_mode_deny` decides.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::listening;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::Descriptor;

mod answers;
mod metadata;
mod quota;

/// Envoy's rate limit service and every file it imports, as a FileDescriptorSet, for
/// server reflection (written by `scripts/rls-descriptors` from Envoy's published protos).
const RLS_DESCRIPTORS: &[u8] = include_bytes!("rls.fds");

/// The service over the node's namespaces.
#[derive(Debug, Clone)]
pub struct Rls {
    state: Arc<AppState>,
}

impl Rls {
    pub fn new(state: Arc<AppState>) -> Self {
        Rls { state }
    }
}

/// Serves the rate limit service and the standard health service on `listener` until
/// `stop`, then lets the calls in flight finish. Connections are held to `limits` as the
/// HTTP listener's are (see `crate::listening`). With `tls`, over TLS (the acceptor the HTTP
/// listener uses: one certificate, one client CA, one SIGHUP reload).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    tls: Option<crate::tls::Acceptor>,
    limits: crate::config::ConnectionLimits,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<Rls>>().await;
    health
        .set_serving::<RateLimitQuotaServiceServer<quota::Rlqs>>()
        .await;
    // reflection in both versions clients ask for (grpcurl: v1; grpcio: v1alpha)
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(RLS_DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let (v1, v1alpha) = (reflection().build_v1()?, reflection().build_v1alpha()?);
    tracing::info!(grpc = %listener.local_addr()?, "serving Envoy's rate limit service");
    let guard = {
        let state = state.clone();
        move |req: Request<()>| authorize(&state, req)
    };
    let open = state.metrics.grpc_connections.clone();
    let router = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(too_large_is_exhausted))
        .add_service(health_service)
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(RateLimitServiceServer::with_interceptor(
            Rls::new(state.clone()),
            guard.clone(),
        ))
        .add_service(RateLimitQuotaServiceServer::with_interceptor(
            quota::Rlqs::new(state.clone(), stop.clone()),
            guard,
        ));
    match tls {
        None => {
            let ready = |s| async move { Some(s) };
            let incoming = listening::incoming(listener, limits, stop.clone(), ready, open);
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await?
        }
        Some(tls) => {
            let ready =
                move |s| listening::handshake(s, tls.current(), limits.header_timeout, "grpc");
            let incoming = listening::incoming(listener, limits, stop.clone(), ready, open);
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await?
        }
    }
    Ok(())
}

/// A message past the decoding limit (4 MB) is RESOURCE_EXHAUSTED, as gRPC's other
/// servers answer (envoyproxy/ratelimit's among them); tonic answers OUT_OF_RANGE before
/// the service sees the request, in the answer's trailers (or its headers, for an answer
/// of trailers only). The code is rewritten there; every other answer passes unchanged.
fn too_large_is_exhausted(
    resp: axum::http::Response<tonic::body::Body>,
) -> axum::http::Response<tonic::body::Body> {
    use http_body_util::BodyExt;
    let (mut parts, body) = resp.into_parts();
    exhausted_if_too_large(&mut parts.headers);
    let body = body.map_frame(|mut frame| {
        if let Some(trailers) = frame.trailers_mut() {
            exhausted_if_too_large(trailers);
        }
        frame
    });
    axum::http::Response::from_parts(parts, tonic::body::Body::new(body))
}

fn exhausted_if_too_large(headers: &mut axum::http::HeaderMap) {
    // grpc-message as tonic writes it (percent-encoded: a space is %20), or plain
    const TOO_LARGE: [&[u8]; 2] = [
        b"Error,%20decoded%20message%20length%20too%20large",
        b"Error, decoded message length too large",
    ];
    // tonic::Code::OutOfRange as it is written in grpc-status
    const OUT_OF_RANGE: &[u8] = b"11";
    let too_large = headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() == OUT_OF_RANGE)
        && headers
            .get("grpc-message")
            .is_some_and(|m| TOO_LARGE.iter().any(|t| m.as_bytes().starts_with(t)));
    if too_large {
        let exhausted = tonic::Code::ResourceExhausted as i32;
        headers.insert("grpc-status", axum::http::HeaderValue::from(exhausted));
    }
}

/// The rate limit service takes the tokens and scopes of the HTTP API: the call's
/// `authorization` metadata carries `Bearer <token>`, and the token needs the `decide`
/// scope (it spends quota, as `/hit` does). Health and reflection stay open.
fn authorize(state: &AppState, req: Request<()>) -> Result<Request<()>, Status> {
    let value = req.metadata().get("authorization").map(|v| v.as_bytes());
    match caller(state, value, true)? {
        Some(token) => {
            let mut req = req;
            req.extensions_mut().insert(Caller(token));
            Ok(req)
        }
        None => Ok(req),
    }
}

/// Who made a call, by the token it carried (with `[auth]`).
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub String);

/// The name of the token an `authorization` value carries, when it may decide (`None`
/// without `[auth]`); the status that refuses it otherwise. A quota stream asks again at
/// each report: a token removed by a reload ends the streams it opened.
/// `record`: counted in `swin_auth_total` (a call once, not each report of a stream).
pub(crate) fn caller(
    state: &AppState,
    value: Option<&[u8]>,
    record: bool,
) -> Result<Option<String>, Status> {
    use crate::auth::{check_authorization, Denied};
    let auth = state.auth.load();
    let Some(auth) = auth.as_ref() else {
        return Ok(None);
    };
    let scope = crate::config::Scope::Decide;
    match check_authorization(auth, value, &[scope]) {
        Ok(token) => {
            if record {
                state.metrics.auth(&token.name, "allowed");
            }
            Ok(Some(token.name.clone()))
        }
        Err(Denied::Missing) => {
            state.metrics.auth("", "missing");
            Err(Status::unauthenticated(
                "this service needs a bearer token (authorization: Bearer …)",
            ))
        }
        Err(Denied::Unknown) => {
            state.metrics.auth("", "unknown");
            tracing::info!("gRPC call with an unknown token");
            Err(Status::unauthenticated("unknown token"))
        }
        Err(Denied::Scope(token)) => {
            state.metrics.auth(&token.name, "forbidden");
            tracing::warn!(
                token = token.name,
                scope = scope.name(),
                "token lacks the scope"
            );
            Err(Status::permission_denied(format!(
                "token {:?} does not have the {:?} scope",
                token.name,
                scope.name()
            )))
        }
    }
}

/// A call's `domain` in the metrics of both services: the domain when it is a namespace
/// this node serves (`served`), else `unknown`. Clients pick domains, so every domain
/// that is no namespace shares one series: a label per domain would grow `/metrics` by a
/// series for each one a client makes up.
fn domain_label(domain: &str, served: bool) -> &str {
    if served {
        domain
    } else {
        "unknown"
    }
}

fn invalid(why: String) -> Status {
    Status::invalid_argument(why)
}

/// A request's descriptors, checked; at most `max` of them (`max_batch`, the cap on an
/// HTTP batch too): more is RESOURCE_EXHAUSTED.
fn check(req: &RateLimitRequest, max: usize) -> Result<Vec<Descriptor<'_>>, Status> {
    if req.domain.is_empty() {
        return Err(invalid("domain must not be empty".into()));
    }
    if req.descriptors.is_empty() {
        return Err(invalid("descriptors must not be empty".into()));
    }
    if req.descriptors.len() > max {
        return Err(Status::resource_exhausted(format!(
            "descriptors: {} in one request; the most is {max} (max_batch)",
            req.descriptors.len()
        )));
    }
    // hits_addend 0 counts as 1, as Envoy sends it
    let default_hits = u64::from(req.hits_addend.max(1));
    Ok(req
        .descriptors
        .iter()
        .map(|d| asked(d, default_hits))
        .collect())
}

fn asked(d: &RateLimitDescriptor, default_hits: u64) -> Descriptor<'_> {
    let entries: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    Descriptor::new(
        entries,
        d.hits_addend.map_or(default_hits, |h| h.value),
        d.is_negative_hits,
        d.limit.as_ref().map(|o| (o.requests_per_unit, o.unit)),
    )
}

fn status_of(e: &Error) -> Status {
    match e {
        Error::Store { reason, .. } => Status::unavailable(*reason),
        Error::OutcomeUnknown(m) => Status::unavailable(m.clone()),
        Error::Unavailable(m) => Status::unavailable(m.clone()),
        Error::Internal => Status::internal("internal error"),
        other => Status::invalid_argument(other.to_string()),
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let start = std::time::Instant::now();
        let (metadata, _, req) = request.into_parts();
        let headers = metadata.into_headers();
        // none unless traces are on and this call is sampled
        let span = crate::telemetry::request_span(&headers, || {
            tracing::trace_span!(
            target: crate::telemetry::REQUEST,
            "request",
            otel.name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = "envoy.service.ratelimit.v3.RateLimitService",
            rpc.method = "ShouldRateLimit",
            rpc.grpc.status_code = tracing::field::Empty,
            namespace = tracing::field::Empty,
            decision = tracing::field::Empty,
            envoy.overall_code = tracing::field::Empty,
            )
        });
        let (answer, req, known) =
            tracing::Instrument::instrument(self.answer(req), span.clone()).await;
        let code = match &answer {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => "OVER_LIMIT",
            Ok(_) => "OK",
            Err(s) if s.code() == tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
            Err(s) if s.code() == tonic::Code::Unavailable => "UNAVAILABLE",
            Err(s) if s.code() == tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Err(_) => "INTERNAL",
        };
        span.record(
            "rpc.grpc.status_code",
            answer.as_ref().map_or_else(|s| s.code() as i32, |_| 0),
        );
        span.record("envoy.overall_code", code);
        self.state
            .metrics
            .rls_request(domain_label(&req.domain, known), code);
        self.state
            .metrics
            .grpc_took("ShouldRateLimit", start.elapsed());
        answer.map(Response::new)
    }
}

impl Rls {
    /// A `ShouldRateLimit` call's answer, the request back, and whether its domain is a
    /// namespace.
    async fn answer(
        &self,
        req: RateLimitRequest,
    ) -> (Result<RateLimitResponse, Status>, RateLimitRequest, bool) {
        let known = self.state.limiter.serves(&req.domain).is_ok();
        (self.decide(&req, known).await, req, known)
    }

    async fn decide(
        &self,
        req: &RateLimitRequest,
        known: bool,
    ) -> Result<RateLimitResponse, Status> {
        let asked = check(req, self.state.max_batch)?;
        if !known {
            return Ok(answers::all_ok(asked.len()));
        }
        // the limiter runs it to its end where it waits on the store: Envoy giving up
        // (its timeout is 20 ms by default) leaves all of it counted or none
        match self.state.limiter.descriptors(&req.domain, &asked).await {
            Ok(decided) => Ok(answers::response(req, decided)),
            // retired by a reload since it was looked up: a domain not served
            Err(swin::error::Error::UnknownNamespace(_)) => Ok(answers::all_ok(asked.len())),
            Err(e) => Err(status_of(&e)),
        }
    }
}
