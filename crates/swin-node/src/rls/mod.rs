//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) over gRPC,
//! beside the HTTP API: a request's `domain` is a namespace, each of its descriptors finds
//! a rule of the namespace's descriptor tree ([`rules`]) and is decided and counted like
//! a `/hit` on the counter key [`keys::counter_key`] — every sync mode, algorithm and
//! admission mode as over HTTP. Front-end layer, like `http`: it maps requests onto
//! `decisions` and errors onto gRPC statuses.
//!
//! Answers: OVER_LIMIT when any descriptor (not in shadow mode) is over its limit, else
//! OK; one status per descriptor in order; descriptors that match no rule (or an unknown
//! domain) are OK with no limit, as envoyproxy/ratelimit answers. An empty domain, no
//! descriptors or a bad descriptor: INVALID_ARGUMENT. A descriptor with
//! `is_negative_hits` gives its hits back as `/refund` does (never below zero; always
//! OK); on a concurrency namespace (`algorithm = "concurrency"`) descriptors take and end
//! slots instead ([`leases`]). A store that a decision needs and
//! cannot ask (strict admission with `on_store_failure = "deny"`): UNAVAILABLE, so
//! Envoy's `failure_mode_deny` decides.
//!
//! Over 500 lines: `decide` is the door's one path from a request to its answer (rules,
//! overrides, replaces, counting mode, all or nothing, headers), kept in one piece so
//! that it reads in the order it runs; the listener (`incoming`) and the dynamic metadata
//! (`metadata`) live beside it.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use swin_core::Decision;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::decisions::{take_under, Verdict};
use crate::error::Error;
use crate::giving_back::{give_back_under, refund_under};
use crate::policy::algorithm::Algorithm;
use crate::policy::headers::{shadow_item, RateLimitHeaders, SHADOW_DENIED};
use crate::policy::keys;
use crate::policy::limits::KeyLimits;
use crate::policy::rules::{self, Found, Rule, RuleLimit};
use crate::runtime_limits::Effective;
use crate::state::AppState;

mod incoming;
mod leases;
mod metadata;

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
/// HTTP listener's are (see `incoming`). With `tls`, over TLS (the acceptor the HTTP
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
            Rls::new(state),
            guard,
        ));
    match tls {
        None => {
            let ready = |s| async move { Some(s) };
            let incoming = incoming::incoming(listener, limits, stop.clone(), ready, open);
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await?
        }
        Some(tls) => {
            let ready = move |s| incoming::handshake(s, tls.current(), limits.header_timeout);
            let incoming = incoming::incoming(listener, limits, stop.clone(), ready, open);
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
    use crate::auth::{check_authorization, Denied};
    let auth = state.auth.load();
    let Some(auth) = auth.as_ref() else {
        return Ok(req);
    };
    let scope = crate::config::Scope::Decide;
    let value = req.metadata().get("authorization").map(|v| v.as_bytes());
    match check_authorization(auth, value, &[scope]) {
        Ok(token) => {
            state.metrics.auth(&token.name, "allowed");
            Ok(req)
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

/// A descriptor that counts: its index in the request, its counter key, its hits and
/// its rule (which has limits).
struct Take<'r> {
    at: usize,
    key: String,
    cost: f64,
    rule: &'r Rule,
    /// The rule's limits, or the runtime limits set on the descriptor's counter key.
    limits: Effective<'r>,
}

impl Take<'_> {
    /// The descriptor's status after `d`: the rule's, showing the runtime limit in
    /// `current_limit` when one replaced the rule's (its first window, in Envoy's unit
    /// of that length; UNKNOWN for another length).
    fn status(&self, d: &Decision, denied: bool) -> DescriptorStatus {
        let mut status = descriptor_status(self.rule, d, denied);
        if let (Effective::Runtime(r), Some(current)) = (&self.limits, &mut status.current_limit) {
            match &r.limits {
                KeyLimits::Windows(w) => {
                    if let Some(first) = w.first() {
                        current.requests_per_unit = first.limit.min(f64::from(u32::MAX)) as u32;
                        current.unit =
                            crate::policy::rules::unit_of(u64::from(first.window.secs()));
                    }
                }
                KeyLimits::Gcra(g) => {
                    current.requests_per_unit = g.count().clamp(0, i64::from(u32::MAX)) as u32;
                    current.unit = crate::policy::rules::unit_of(g.period().as_secs());
                }
            }
        }
        status
    }
}

/// One request descriptor, checked.
struct Asked<'a> {
    entries: Vec<(&'a str, &'a str)>,
    hits: u64,
    /// Envoy's `is_negative_hits`: the hits end slots taken before.
    negative: bool,
}

fn invalid(why: String) -> Status {
    Status::invalid_argument(why)
}

/// A request's descriptors, checked; at most `max` of them (`max_batch`, the cap on an
/// HTTP batch too): more is RESOURCE_EXHAUSTED.
fn check(req: &RateLimitRequest, max: usize) -> Result<Vec<Asked<'_>>, Status> {
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
    // a unit outside Envoy's RateLimitUnit (Envoy's own config refuses one) is a bad
    // request: no limit can be read from it, so nothing of the request is counted
    for (i, d) in req.descriptors.iter().enumerate() {
        if let Some(o) = &d.limit {
            if rules::unit_secs(o.unit).is_none() {
                return Err(invalid(format!(
                    "descriptors[{i}].limit.unit: {} is not a unit of time (SECOND 1, MINUTE 2, HOUR 3, DAY 4, MONTH 5, YEAR 6, WEEK 7)",
                    o.unit
                )));
            }
        }
    }
    // hits_addend 0 counts as 1, as Envoy sends it
    let default_hits = u64::from(req.hits_addend.max(1));
    Ok(req
        .descriptors
        .iter()
        .map(|d| asked(d, default_hits))
        .collect())
}

fn asked(d: &RateLimitDescriptor, default_hits: u64) -> Asked<'_> {
    let entries: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let hits = d.hits_addend.map_or(default_hits, |h| h.value);
    Asked {
        entries,
        hits,
        negative: d.is_negative_hits,
    }
}

/// The rule a descriptor's own `limit` sets for this request (envoyproxy/ratelimit's
/// override: its requests per unit, under the namespace's algorithm; its unit was
/// checked with the request). An override the algorithm cannot hold blocks that
/// descriptor instead of failing the request: an error would let Envoy's default
/// `failure_mode_deny: false` through, past the limits of the other descriptors.
fn override_rule(d: &RateLimitDescriptor, i: usize, algorithm: Algorithm) -> Option<Rule> {
    let o = d.limit.as_ref()?;
    let limit = match rules::unit_secs(o.unit) {
        // 0 per unit blocks, as a rule's requests_per_unit: 0 does
        Some(_) if o.requests_per_unit == 0 => RuleLimit::Blocked,
        Some(secs) => match rules::limit_for(f64::from(o.requests_per_unit), secs, algorithm) {
            Ok(l) => RuleLimit::Limited(l),
            Err(e) => {
                tracing::warn!(descriptor = i, cause = %e, "a descriptor's limit cannot be held: blocked");
                RuleLimit::Blocked
            }
        },
        None => RuleLimit::Blocked, // refused by `check`
    };
    Some(Rule {
        path: String::new(),
        limit,
        shadow: false,
        name: None,
        replaces: Vec::new(),
        requests_per_unit: o.requests_per_unit,
        unit: o.unit,
        metadata: None,
    })
}

fn status_of(e: &Error) -> Status {
    match e {
        Error::Store { reason, .. } => Status::unavailable(*reason),
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
        let span = crate::telemetry::request_span(crate::telemetry::sample(&headers), || {
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
        let domain = if known {
            req.domain.as_str()
        } else {
            // one series for every domain that is no namespace: clients pick domains
            "unknown"
        };
        self.state.metrics.rls_request(domain, code);
        self.state.metrics.request_took(
            crate::metrics::Door::Grpc,
            "ShouldRateLimit",
            start.elapsed(),
        );
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
        let ns = self.state.namespace(&req.domain).ok();
        let known = ns.is_some();
        match &ns {
            // run to its end in a task of its own: Envoy giving up (its timeout is 20 ms
            // by default) must not leave some descriptors counted and the rest not
            Some(n)
                if n.counts_in_the_store()
                    || (n.concurrency.is_some() && n.sync.store().is_some()) =>
            {
                use tracing::Instrument;
                let (this, ns) = (self.clone(), n.clone());
                let domain = req.domain.clone();
                let task = tokio::spawn(
                    async move { (this.decide(&req, Some(&ns)).await, req) }.in_current_span(),
                );
                match task.await {
                    Ok((answer, req)) => (answer, req, known),
                    Err(_) => (
                        Err(Status::internal("internal error")),
                        RateLimitRequest {
                            domain,
                            ..Default::default()
                        },
                        known,
                    ),
                }
            }
            _ => (self.decide(&req, ns.as_deref()).await, req, known),
        }
    }
}

impl Rls {
    async fn decide(
        &self,
        req: &RateLimitRequest,
        ns: Option<&crate::state::Namespace>,
    ) -> Result<RateLimitResponse, Status> {
        let asked = check(req, self.state.max_batch)?;
        let Some(ns) = ns else {
            return Ok(all_ok(asked.len()));
        };
        if let Some(c) = &ns.concurrency {
            return leases::decide(&self.state, req, ns, c, &asked).await;
        }

        let algorithm = match (&ns.rules, &ns.limits) {
            (Some(r), _) => r.algorithm(),
            (None, Some(l)) => l.algorithm(),
            (None, None) => Algorithm::default(),
        };
        // each descriptor's rule: its own override, else the tree's
        // every descriptor's rule before any is counted (no value fails: see
        // `keys::counter_key` and `override_rule`)
        let mut found: Vec<Option<Found>> = Vec::with_capacity(asked.len());
        for (i, (a, d)) in asked.iter().zip(&req.descriptors).enumerate() {
            let rule = match override_rule(d, i, algorithm) {
                Some(r) => Some(Found {
                    rule: Arc::new(r),
                    shared: Vec::new(),
                }),
                None => ns.rules.as_ref().and_then(|r| r.lookup(&a.entries)),
            };
            found.push(rule);
        }
        // a rule named in another matched rule's `replaces` does not apply
        let replaced: Vec<String> = found
            .iter()
            .flatten()
            .flat_map(|f| f.rule.replaces.iter().cloned())
            .collect();
        // `count_denied`: the namespace's (its rules carry it; without rules, its limits)
        let count_denied = match &ns.rules {
            Some(r) => r.count_denied(),
            None => ns.limits.as_ref().is_some_and(|l| l.count_denied),
        };
        // what each descriptor answers without counting, or the hit it takes
        let mut statuses: Vec<Option<DescriptorStatus>> = Vec::with_capacity(asked.len());
        let mut takes: Vec<Take> = Vec::new();
        // descriptors with `is_negative_hits`: hits given back (Envoy's refill)
        let mut refunds: Vec<Take> = Vec::new();
        let mut over = false;
        // the rules that apply, for the dynamic metadata (kept only when it is asked for)
        let with_metadata = ns.envoy_dynamic_metadata;
        let mut applied: Vec<Option<&Rule>> =
            Vec::with_capacity(if with_metadata { asked.len() } else { 0 });
        for (i, (a, f)) in asked.iter().zip(&found).enumerate() {
            let f = f
                .as_ref()
                .filter(|f| f.rule.name.as_ref().is_none_or(|n| !replaced.contains(n)));
            if with_metadata {
                applied.push(f.map(|f| &*f.rule));
            }
            let Some(f) = f else {
                statuses.push(Some(ok_without_limit()));
                continue;
            };
            let rule = &*f.rule;
            let limits = match &rule.limit {
                RuleLimit::Limited(l) => l,
                // envoyproxy/ratelimit: OK, remaining the largest number, no limit
                // (slots in flight are a concurrency namespace's, which `leases` decides)
                RuleLimit::Unlimited | RuleLimit::InFlight(_) => {
                    statuses.push(Some(DescriptorStatus {
                        limit_remaining: u32::MAX,
                        ..ok_without_limit()
                    }));
                    continue;
                }
                // a refund on a value that is blocked gives nothing back and is OK
                RuleLimit::Blocked if a.negative => {
                    statuses.push(Some(descriptor_status(rule, &blocked(), false)));
                    continue;
                }
                RuleLimit::Blocked => {
                    let denied = !rule.shadow;
                    over |= denied;
                    statuses.push(Some(descriptor_status(rule, &blocked(), denied)));
                    continue;
                }
            };
            let cost = a.hits as f64;
            if swin_core::check_cost(cost).is_err() && !a.negative {
                // more hits at once than any limit holds: over it, nothing counted (the
                // key's own limits, runtime ones among them, are checked after its touch)
                let denied = !rule.shadow;
                over |= denied;
                statuses.push(Some(descriptor_status(rule, &blocked(), denied)));
                continue;
            }
            statuses.push(None);
            let counted = if a.negative { &mut refunds } else { &mut takes };
            counted.push(Take {
                at: i,
                key: if f.shared.is_empty() {
                    keys::counter_key(&a.entries)
                } else {
                    keys::counter_key(&f.counted(&a.entries))
                },
                cost,
                rule,
                limits: Effective::Config(limits),
            });
        }
        // One request, one admission: the keys this node holds nothing for are read in
        // one call, the descriptors are decided together (synchronous increments of the
        // request share round trips), and a request that is over the limit counts
        // nothing on any descriptor.
        let keys: Vec<&str> = takes
            .iter()
            .chain(&refunds)
            .map(|t| t.key.as_str())
            .collect();
        ns.first_touch(&keys, true).await;
        for t in &mut refunds {
            if let Effective::Config(rule_limits) = t.limits {
                t.limits = ns.effective(&t.key, rule_limits);
            }
        }
        // refunds first, each on its own: an end of one thing beside the start of another
        let given = futures_util::future::join_all(
            refunds
                .iter()
                .map(|t| refund_under(ns, &t.key, &t.limits, t.cost)),
        )
        .await;
        for (t, after) in refunds.iter().zip(given) {
            let after = after.map_err(|e| status_of(&e))?;
            statuses[t.at] = Some(t.status(&after, false));
        }
        // runtime limits set on a descriptor's counter key replace its rule's limits
        takes.retain_mut(|t| {
            let Effective::Config(rule_limits) = t.limits else {
                return true;
            };
            t.limits = ns.effective(&t.key, rule_limits);
            if t.limits.check_cost_in(t.cost, t.rule.shadow).is_ok() {
                return true;
            }
            // more hits at once than the key's limits (the rule's or runtime ones) allow
            let denied = !t.rule.shadow;
            over |= denied;
            statuses[t.at] = Some(t.status(&blocked(), denied));
            false
        });
        let verdicts = futures_util::future::join_all(takes.iter().map(|t| {
            take_under(
                ns,
                &t.key,
                &t.limits,
                t.cost,
                false,
                count_denied,
                t.rule.shadow,
            )
        }))
        .await;
        let failed = verdicts.iter().find_map(|v| match v {
            Err(e) => Some(status_of(e)),
            Ok(v) if v.reason.is_some() => Some(Status::unavailable("store_unreachable")),
            Ok(_) => None,
        });
        let mut worst: Option<(&Verdict, bool)> = None;
        for (t, v) in takes.iter().zip(&verdicts) {
            let Ok(v) = v else { continue };
            // by the rule's name, or (unnamed) by the limit that decided
            let rule = t.rule.name.as_deref().unwrap_or(&v.policy);
            let denied = !v.decision.allowed && !t.rule.shadow;
            let shadow_denied = v.shadow_denied || (!v.decision.allowed && t.rule.shadow);
            self.state
                .metrics
                .decision(&req.domain, rule, !denied, shadow_denied);
            over |= denied;
            if count_denied && !v.decision.allowed {
                // the denied hit was counted too: nothing is left, as envoyproxy/ratelimit
                // answers
                let spent = Decision {
                    remaining: 0.0,
                    ..v.decision
                };
                statuses[t.at] = Some(t.status(&spent, denied));
            } else {
                statuses[t.at] = Some(t.status(&v.decision, denied));
            }
            let stricter = worst
                .as_ref()
                .is_none_or(|(w, _)| v.decision.cmp_strictness(&w.decision).is_ge());
            if stricter {
                worst = Some((v, denied));
            }
        }
        if over && !count_denied {
            // nothing of the request counted: a descriptor within its limit has what it
            // had before it (as envoyproxy/ratelimit answers with
            // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)
            for (t, v) in takes.iter().zip(&verdicts) {
                if let Ok(v) = v {
                    if v.allowed() {
                        let before = v.given_back(t.cost).decision;
                        statuses[t.at] = Some(t.status(&before, false));
                    }
                }
            }
        }
        if failed.is_some() || (over && !count_denied) {
            let back = takes
                .iter()
                .zip(&verdicts)
                .filter(|(_, v)| matches!(v, Ok(v) if v.allowed()))
                .map(|(t, _)| give_back_under(ns, &t.key, &t.limits, t.cost));
            let back: Result<(), Error> = futures_util::future::join_all(back)
                .await
                .into_iter()
                .collect();
            back.map_err(|e| status_of(&e))?;
        }
        if let Some(status) = failed {
            return Err(status);
        }
        let statuses: Vec<DescriptorStatus> = statuses
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        let dynamic_metadata = with_metadata.then(|| metadata::of(req, &statuses, &applied));
        Ok(RateLimitResponse {
            dynamic_metadata,
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: worst
                .filter(|_| ns.envoy_response_headers)
                .map(|(v, denied)| headers(v, denied))
                .unwrap_or_default(),
            ..Default::default()
        })
    }
}

/// Over the limit whatever happens: nothing to count, nothing to wait for.
fn blocked() -> Decision {
    Decision {
        allowed: false,
        limit: 0.0,
        remaining: 0.0,
        reset_after: std::time::Duration::ZERO,
        retry_after: std::time::Duration::ZERO,
    }
}

fn all_ok(n: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: (0..n).map(|_| ok_without_limit()).collect(),
        ..Default::default()
    }
}

pub(super) fn ok_without_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

fn descriptor_status(rule: &Rule, d: &Decision, denied: bool) -> DescriptorStatus {
    DescriptorStatus {
        code: if denied { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            // envoyproxy/ratelimit's: the rule's name, empty without one (Envoy adds a
            // non-empty name to X-RateLimit-Limit for clients to see)
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: rule.requests_per_unit,
            unit: rule.unit,
        }),
        limit_remaining: d.remaining.clamp(0.0, f64::from(u32::MAX)) as u32,
        duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: d.reset_after.as_secs() as i64,
            nanos: d.reset_after.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}

/// The IETF headers of the strictest descriptor, and Retry-After when over the limit.
fn headers(v: &Verdict, denied: bool) -> Vec<HeaderValue> {
    let h = RateLimitHeaders::of(&v.policies, &v.policy, &v.decision);
    let mut out = vec![
        header("RateLimit-Policy", h.policy.into_owned()),
        header("RateLimit", h.state),
    ];
    // a descriptor in shadow mode is over its limit but not denied: no Retry-After, and
    // the shadow header says which would have denied it
    if let (true, Some(t)) = (denied, h.retry_after) {
        out.push(header("Retry-After", t.to_string()));
    }
    if !denied && (v.shadow_denied || !v.decision.allowed) {
        out.push(header(SHADOW_DENIED, shadow_item(&v.policy, &v.decision)));
    }
    out
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}
