//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) over gRPC,
//! beside the HTTP API: a request's `domain` is a namespace, each of its descriptors finds
//! a rule of the namespace's descriptor tree ([`rules`]) and is decided and counted like
//! a `/hit` on the counter key [`rules::counter_key`] — every sync mode, algorithm and
//! admission mode as over HTTP. Front-end layer, like `http`: it maps requests onto
//! `decisions` and errors onto gRPC statuses.
//!
//! Answers: OVER_LIMIT when any descriptor (not in shadow mode) is over its limit, else
//! OK; one status per descriptor in order; descriptors that match no rule (or an unknown
//! domain) are OK with no limit, as envoyproxy/ratelimit answers. An empty domain, no
//! descriptors or a bad descriptor: INVALID_ARGUMENT. A store that a decision needs and
//! cannot ask (strict admission with `on_store_failure = "deny"`): UNAVAILABLE, so
//! Envoy's `failure_mode_deny` decides.

pub mod rules;

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

use self::rules::{Rule, RuleLimit};
use crate::decisions::{take_under, Verdict};
use crate::error::Error;
use crate::limits::{ceil_secs, KeyLimits};
use crate::state::AppState;

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
/// `stop`, then lets the calls in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
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
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(RateLimitServiceServer::new(Rls::new(state)))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await?;
    Ok(())
}

/// One request descriptor, checked.
struct Asked<'a> {
    entries: Vec<(&'a str, &'a str)>,
    hits: u64,
}

fn invalid(why: String) -> Status {
    Status::invalid_argument(why)
}

fn check(req: &RateLimitRequest) -> Result<Vec<Asked<'_>>, Status> {
    if req.domain.is_empty() {
        return Err(invalid("domain must not be empty".into()));
    }
    if req.descriptors.is_empty() {
        return Err(invalid("descriptors must not be empty".into()));
    }
    // hits_addend 0 counts as 1, as Envoy sends it
    let default_hits = u64::from(req.hits_addend.max(1));
    req.descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| asked(i, d, default_hits))
        .collect()
}

fn asked(i: usize, d: &RateLimitDescriptor, default_hits: u64) -> Result<Asked<'_>, Status> {
    if d.entries.is_empty() {
        return Err(invalid(format!("descriptors[{i}]: has no entries")));
    }
    if d.is_negative_hits {
        return Err(invalid(format!(
            "descriptors[{i}].is_negative_hits: not supported (refund over HTTP)"
        )));
    }
    let entries: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    if let Some((j, _)) = entries.iter().enumerate().find(|(_, (k, _))| k.is_empty()) {
        return Err(invalid(format!(
            "descriptors[{i}].entries[{j}].key: must not be empty"
        )));
    }
    let hits = d.hits_addend.map_or(default_hits, |h| h.value);
    Ok(Asked { entries, hits })
}

/// The rule a descriptor's own `limit` sets for this request (envoyproxy/ratelimit's
/// override: its requests per unit, under the namespace's algorithm).
fn override_rule(
    d: &RateLimitDescriptor,
    i: usize,
    algorithm: Option<&str>,
) -> Result<Option<Rule>, Status> {
    let Some(o) = &d.limit else {
        return Ok(None);
    };
    let secs = rules::unit_secs(o.unit).ok_or_else(|| {
        invalid(format!(
            "descriptors[{i}].limit.unit: {} is no unit",
            o.unit
        ))
    })?;
    // 0 per unit blocks, as a rule's requests_per_unit: 0 does
    let limit = if o.requests_per_unit == 0 {
        RuleLimit::Blocked
    } else {
        RuleLimit::Limited(
            rules::limit_for(f64::from(o.requests_per_unit), secs, algorithm)
                .map_err(|e| invalid(format!("descriptors[{i}].limit: {e}")))?,
        )
    };
    Ok(Some(Rule {
        path: String::new(),
        limit,
        shadow: false,
        name: None,
        replaces: Vec::new(),
        requests_per_unit: o.requests_per_unit,
        unit: o.unit,
    }))
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
        let req = request.into_inner();
        let ns = self.state.namespace(&req.domain).ok();
        let answer = self.decide(&req, ns.as_deref()).await;
        let code = match &answer {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => "OVER_LIMIT",
            Ok(_) => "OK",
            Err(s) if s.code() == tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
            Err(s) if s.code() == tonic::Code::Unavailable => "UNAVAILABLE",
            Err(_) => "INTERNAL",
        };
        let domain = if ns.is_some() {
            req.domain.as_str()
        } else {
            // one series for every domain that is no namespace: clients pick domains
            "unknown"
        };
        self.state.metrics.rls_request(domain, code);
        answer.map(Response::new)
    }
}

impl Rls {
    async fn decide(
        &self,
        req: &RateLimitRequest,
        ns: Option<&crate::state::Namespace>,
    ) -> Result<RateLimitResponse, Status> {
        let asked = check(req)?;
        let Some(ns) = ns else {
            return Ok(all_ok(asked.len()));
        };
        let algorithm = match (&ns.rules, &ns.limits) {
            (Some(r), _) => r.algorithm(),
            (None, Some(l)) => Some(l.algorithm()),
            (None, None) => None,
        };
        // each descriptor's rule: its own override, else the tree's
        let mut found: Vec<Option<Arc<Rule>>> = Vec::with_capacity(asked.len());
        for (i, (a, d)) in asked.iter().zip(&req.descriptors).enumerate() {
            let rule = match override_rule(d, i, algorithm)? {
                Some(r) => Some(Arc::new(r)),
                None => ns.rules.as_ref().and_then(|r| r.find(&a.entries)),
            };
            found.push(rule);
        }
        // a rule named in another matched rule's `replaces` does not apply
        let replaced: Vec<String> = found
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().cloned())
            .collect();
        let count_denied = ns.limits.as_ref().is_some_and(|l| l.count_denied);
        let mut statuses = Vec::with_capacity(asked.len());
        let mut worst: Option<(Verdict, bool)> = None;
        let mut over = false;
        for (i, (a, rule)) in asked.iter().zip(found).enumerate() {
            let rule = rule.filter(|r| r.name.as_ref().is_none_or(|n| !replaced.contains(n)));
            let Some(rule) = rule else {
                statuses.push(ok_without_limit());
                continue;
            };
            let limits = match &rule.limit {
                RuleLimit::Limited(l) => l,
                // envoyproxy/ratelimit: OK, remaining the largest number, no limit
                RuleLimit::Unlimited => {
                    statuses.push(DescriptorStatus {
                        limit_remaining: u32::MAX,
                        ..ok_without_limit()
                    });
                    continue;
                }
                RuleLimit::Blocked => {
                    let denied = !rule.shadow;
                    over |= denied;
                    statuses.push(descriptor_status(&rule, &blocked(), denied));
                    continue;
                }
            };
            let key = rules::counter_key(&a.entries);
            crate::input::check_key(&key).map_err(|e| invalid(format!("descriptors[{i}]: {e}")))?;
            let cost = a.hits as f64;
            if check_cost(limits, cost).is_err() {
                // more hits at once than the limit allows in all: over it, nothing counted
                let denied = !rule.shadow;
                over |= denied;
                statuses.push(descriptor_status(&rule, &blocked(), denied));
                continue;
            }
            let v = take_under(ns, &key, limits, cost, false, count_denied)
                .await
                .map_err(|e| status_of(&e))?;
            if v.reason.is_some() {
                return Err(Status::unavailable("store_unreachable"));
            }
            let denied = !v.decision.allowed && !rule.shadow;
            over |= denied;
            statuses.push(descriptor_status(&rule, &v.decision, denied));
            let stricter = worst
                .as_ref()
                .is_none_or(|(w, _)| v.decision.cmp_strictness(&w.decision).is_ge());
            if stricter {
                worst = Some((v, denied));
            }
        }
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: worst
                .map(|(v, denied)| headers(&v, denied))
                .unwrap_or_default(),
            ..Default::default()
        })
    }
}

fn check_cost(limits: &KeyLimits, cost: f64) -> Result<(), swin_core::CoreError> {
    swin_core::check_cost(cost)?;
    match limits {
        KeyLimits::Gcra(g) => g.units(cost).map(|_| ()),
        KeyLimits::Windows(set) => set.iter().try_for_each(|l| l.check_cost(cost)),
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

fn ok_without_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

fn descriptor_status(rule: &Rule, d: &Decision, denied: bool) -> DescriptorStatus {
    DescriptorStatus {
        code: if denied { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            name: rule.name.clone().unwrap_or_else(|| rule.path.clone()),
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
    let d = &v.decision;
    let t = if d.allowed {
        ceil_secs(d.reset_after)
    } else {
        ceil_secs(d.retry_after)
    };
    let mut out = vec![
        header("RateLimit-Policy", v.policies.join(", ")),
        header(
            "RateLimit",
            crate::http::state_item(&v.policy, d.remaining, t),
        ),
    ];
    if denied {
        out.push(header("Retry-After", t.max(1).to_string()));
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
