//! Decisions over HTTP:
//! - `POST /v1/namespaces/{namespace}/keys/{key}/hit`: may this hit pass? 200 when
//!   allowed, 429 when denied, with the IETF `RateLimit-Policy` and `RateLimit` headers
//!   and, on a 429, `Retry-After`;
//! - `POST …/refund`: gives back hits admitted but not used;
//! - `POST /v1/hits`: several namespaces and keys at once, the strictest decision wins
//!   (Boulder's BatchSpend) and a denied batch spends nothing;
//! - `DELETE /v1/namespaces/{namespace}/keys/{key}`: resets the key across the cluster;
//! - `/v1/auth/{namespace}` (any method): the same decision for a proxy — nginx
//!   `auth_request`, Traefik ForwardAuth — with the key taken from a header or the
//!   client's address (`key_from`).
//!
//! Window limits: the hit is counted first and the decision taken on the counts before
//! it; a denied hit is then taken back out (unless the namespace sets `count_denied`).
//! GCRA: the bucket's TAT moves by compare-and-swap only when the spend is allowed. Two
//! hits racing for the last unit can both be denied, never both allowed, on one node;
//! across nodes the namespace's sync mode bounds the over-admission (synchronous: none).

use std::cmp::Reverse;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use swin_core::{Gcra, GcraDecision, WindowLimit};

use crate::app::{check_key, json_bytes, now, parse_json, ApiPath, AppState, Namespace};
use crate::error::ApiError;
use crate::limits::{ceil_secs, strictest, KeyFrom, KeyLimits, Limits};

/// Hits in one `/v1/hits` call.
const MAX_BATCH_HITS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HitBody {
    cost: f64,
    dry_run: bool,
}

impl Default for HitBody {
    fn default() -> Self {
        HitBody {
            cost: 1.0,
            dry_run: false,
        }
    }
}

/// One key's decision, and what its headers say.
#[derive(Debug, Clone)]
struct Verdict {
    allowed: bool,
    limit: f64,
    remaining: f64,
    reset_after: Duration,
    retry_after: Duration,
    /// `RateLimit-Policy` items of the key's limits.
    policies: Vec<String>,
    /// The policy the decision comes from.
    policy: String,
}

impl Verdict {
    /// The strictest first: a denial, then the longer wait, then fewer remaining.
    fn severity(&self) -> (bool, Duration, Reverse<i64>) {
        (
            !self.allowed,
            self.retry_after,
            Reverse(self.remaining as i64),
        )
    }

    fn answer(&self) -> HitAnswer {
        HitAnswer {
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            reset_after: self.reset_after.as_secs_f64(),
            retry_after: self.retry_after.as_secs_f64(),
        }
    }
}

#[derive(Debug, Serialize)]
struct HitAnswer {
    allowed: bool,
    limit: f64,
    remaining: f64,
    /// Seconds until the counts this answer saw weigh nothing (GCRA: the bucket is full).
    reset_after: f64,
    /// Seconds until the same hit would pass; 0 when it passed.
    retry_after: f64,
}

fn window_policy(l: &WindowLimit) -> (String, String) {
    let name = format!("{}s", l.window.secs());
    let item = format!("\"{name}\";q={};w={}", l.limit, l.window.secs());
    (name, item)
}

/// A GCRA limit as a quota policy: `burst` units, refilled over `burst` emission
/// intervals.
fn gcra_policy(g: &Gcra) -> String {
    let refill = g
        .emission_interval()
        .saturating_mul(g.burst().clamp(1, i64::from(u32::MAX)) as u32);
    format!("\"gcra\";q={};w={}", g.burst(), ceil_secs(refill))
}

fn gcra_verdict(g: &Gcra, d: GcraDecision) -> Verdict {
    Verdict {
        allowed: d.allowed,
        limit: g.burst() as f64,
        remaining: d.remaining as f64,
        reset_after: d.reset_in,
        retry_after: if d.allowed {
            Duration::ZERO
        } else {
            d.retry_in
        },
        policies: vec![gcra_policy(g)],
        policy: "gcra".into(),
    }
}

fn gcra_cost(cost: f64) -> Result<i64, ApiError> {
    if !(cost.is_finite() && cost >= 0.0 && cost.fract() == 0.0 && cost <= 1e15) {
        return Err(ApiError::BadRequest(format!(
            "cost must be a whole number of at least 0 for a gcra limit, got {cost}"
        )));
    }
    Ok(cost as i64)
}

fn check_cost(cost: f64) -> Result<(), ApiError> {
    if !(cost.is_finite() && (0.0..=swin_core::MAX_COUNT).contains(&cost)) {
        return Err(ApiError::BadRequest(format!(
            "cost must be a number from 0 to 2^53, got {cost}"
        )));
    }
    Ok(())
}

/// Everything `take` checks before it spends: the key, the cost, and that the namespace
/// has limits the cost fits. A batch checks every hit this way before spending any.
fn validate(ns: &Namespace, namespace: &str, key: &str, cost: f64) -> Result<(), ApiError> {
    check_key(key)?;
    check_cost(cost)?;
    match limits_of(ns, namespace)?.for_key(key) {
        KeyLimits::Gcra(_) => {
            gcra_cost(cost)?;
        }
        KeyLimits::Windows(set) => {
            for l in set {
                l.check_cost(cost)?;
            }
        }
    }
    Ok(())
}

/// The namespace's limits; a namespace that only counts has none to decide against.
fn limits_of<'a>(ns: &'a Namespace, namespace: &str) -> Result<&'a Limits, ApiError> {
    ns.limits.as_ref().ok_or_else(|| {
        ApiError::BadRequest(format!(
            "namespace {namespace:?} has no limits to decide against"
        ))
    })
}

/// Decides a hit of `cost` on `key` and, unless `dry_run`, spends it when allowed (and
/// when denied too if the namespace counts denied hits).
async fn take(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
    dry_run: bool,
) -> Result<Verdict, ApiError> {
    validate(ns, namespace, key, cost)?;
    let limits = limits_of(ns, namespace)?;
    let count_denied = limits.count_denied;
    let limits = limits.for_key(key);
    let now = now();
    let set = match limits {
        KeyLimits::Gcra(g) => {
            let cost = gcra_cost(cost)?;
            let d = if dry_run {
                ns.sync.check(g, key, cost, now).await?
            } else {
                ns.sync.spend(g, key, cost, now, count_denied).await?
            };
            return Ok(gcra_verdict(g, d));
        }
        KeyLimits::Windows(set) => set,
    };
    let counters = ns.sync.counters();
    let mut decisions = Vec::with_capacity(set.len());
    for l in set {
        let (current, previous) = if dry_run {
            let r = counters.table(l.window.secs())?.rate(key, now, None);
            (r.current, r.previous)
        } else {
            // counted now; the decision is on the counts before this hit
            let r = ns.sync.increment(key, l.window.secs(), cost, now).await?;
            (r.current - cost, r.previous)
        };
        decisions.push((*l, l.decide(current, previous, now, cost)?));
    }
    let Some((limit, d)) = strictest(&decisions) else {
        return Err(ApiError::BadRequest(format!(
            "key {key:?} has no limits in namespace {namespace:?}"
        )));
    };
    if !d.allowed && !dry_run && !count_denied {
        for l in set {
            ns.sync.increment(key, l.window.secs(), -cost, now).await?;
        }
    }
    Ok(Verdict {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after: d.reset_after,
        retry_after: d.retry_after,
        policies: set.iter().map(|l| window_policy(l).1).collect(),
        policy: window_policy(&limit).0,
    })
}

/// Takes back an allowed hit (a batch that was denied as a whole).
async fn give_back(ns: &Namespace, key: &str, cost: f64) -> Result<(), ApiError> {
    let now = now();
    match &ns.limits.as_ref().map(|l| l.for_key(key)) {
        Some(KeyLimits::Gcra(g)) => {
            ns.sync.refund_tokens(g, key, gcra_cost(cost)?, now).await?;
        }
        Some(KeyLimits::Windows(set)) => {
            for l in set {
                ns.sync.increment(key, l.window.secs(), -cost, now).await?;
            }
        }
        None => {}
    }
    Ok(())
}

/// The decision as an HTTP answer: `status` (200 unless given), the JSON `body`, and
/// the headers of draft-ietf-httpapi-ratelimit-headers: one policy per limit, the
/// current state of the strictest; `t` on a denial is when this hit would pass, and
/// Retry-After is never earlier than it.
fn respond(v: &Verdict, policies: &[String], status: StatusCode, body: impl Serialize) -> Response {
    let mut resp = (status, Json(body)).into_response();
    let h = resp.headers_mut();
    let t = if v.allowed {
        ceil_secs(v.reset_after)
    } else {
        ceil_secs(v.retry_after)
    };
    let state_header = format!("\"{}\";r={};t={}", v.policy, v.remaining, t);
    for (name, value) in [
        ("ratelimit-policy", policies.join(", ")),
        ("ratelimit", state_header),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if !v.allowed {
        h.insert("retry-after", HeaderValue::from(t.max(1)));
    }
    resp
}

fn status_of(v: &Verdict) -> StatusCode {
    if v.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

pub async fn hit(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let body: HitBody = parse_json(bytes.as_ref())?;
    let ns = state.namespace(&namespace)?;
    let v = take(&ns, &namespace, &key, body.cost, body.dry_run).await?;
    state.metrics.decision(&namespace, v.allowed);
    Ok(respond(&v, &v.policies, status_of(&v), v.answer()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RefundBody {
    cost: f64,
}

impl Default for RefundBody {
    fn default() -> Self {
        RefundBody { cost: 1.0 }
    }
}

/// `POST /v1/namespaces/{namespace}/keys/{key}/refund`: gives back `cost` of hits that
/// were admitted but not used, in every window the key's limits count in, never below
/// zero (GCRA: Boulder's refund, never past a full bucket). `allowed` says whether
/// anything was given back, and the rest describes the key's state after it, as a dry
/// run would.
pub async fn refund(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let body: RefundBody = parse_json(bytes.as_ref())?;
    check_key(&key)?;
    check_cost(body.cost)?;
    let ns = state.namespace(&namespace)?;
    let limits = limits_of(&ns, &namespace)?.for_key(&key);
    let now = now();
    let set = match limits {
        KeyLimits::Gcra(g) => {
            let d = ns
                .sync
                .refund_tokens(g, &key, gcra_cost(body.cost)?, now)
                .await?;
            let mut answer = gcra_verdict(g, d).answer();
            answer.allowed = d.allowed;
            answer.retry_after = 0.0;
            return Ok(Json(answer).into_response());
        }
        KeyLimits::Windows(set) => set,
    };
    let counters = ns.sync.counters();
    let mut refunded = 0.0f64;
    let mut decisions = Vec::new();
    for l in set {
        let table = counters.table(l.window.secs())?;
        let current = table.rate(&key, now, None).current;
        let back = body.cost.min(current.max(0.0));
        if back > 0.0 {
            ns.sync.increment(&key, l.window.secs(), -back, now).await?;
            refunded = refunded.max(back);
        }
        let r = table.rate(&key, now, None);
        decisions.push((*l, l.decide(r.current, r.previous, now, 0.0)?));
    }
    let Some((_, d)) = strictest(&decisions) else {
        return Err(ApiError::BadRequest(format!(
            "key {key:?} has no limits in namespace {namespace:?}"
        )));
    };
    let answer = HitAnswer {
        allowed: refunded > 0.0,
        limit: d.limit,
        remaining: d.remaining,
        reset_after: d.reset_after.as_secs_f64(),
        retry_after: 0.0,
    };
    Ok(Json(answer).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchHit {
    namespace: String,
    key: String,
    #[serde(default = "one")]
    cost: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    hits: Vec<BatchHit>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize)]
struct BatchResult<'a> {
    namespace: &'a str,
    key: &'a str,
    #[serde(flatten)]
    answer: HitAnswer,
}

#[derive(Debug, Serialize)]
struct BatchAnswer<'a> {
    #[serde(flatten)]
    answer: HitAnswer,
    /// Whether the hits were counted: only when every one was allowed (and not a dry run).
    spent: bool,
    results: Vec<BatchResult<'a>>,
}

/// `POST /v1/hits`, body `{"hits":[{"namespace":"api","key":"k","cost":1}, …],
/// "dry_run":false}`: every hit decided, the strictest wins (its fields at the top, its
/// status and headers on the response). All or nothing: when any hit is denied, the
/// allowed ones are given back, so a denied batch spends nothing (denied hits of a
/// `count_denied` namespace still count, as they would alone).
pub async fn batch(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let Some(bytes) = bytes else {
        return Err(ApiError::BadRequest(
            "body must be {\"hits\": [{\"namespace\": …, \"key\": …}, …]}".into(),
        ));
    };
    let body: BatchBody = parse_json(Some(&bytes))?;
    if body.hits.is_empty() || body.hits.len() > MAX_BATCH_HITS {
        return Err(ApiError::BadRequest(format!(
            "hits must hold 1 to {MAX_BATCH_HITS} hits, got {}",
            body.hits.len()
        )));
    }
    // every hit is checked before any is spent: a bad one rejects the batch untouched
    let mut namespaces: Vec<Arc<Namespace>> = Vec::with_capacity(body.hits.len());
    for (i, h) in body.hits.iter().enumerate() {
        let ns = state.namespace(&h.namespace)?;
        validate(&ns, &h.namespace, &h.key, h.cost).map_err(|e| e.at(&format!("hits[{i}]")))?;
        namespaces.push(ns);
    }
    let mut taken: Vec<(Arc<Namespace>, Verdict)> = Vec::with_capacity(body.hits.len());
    for (i, (h, ns)) in body.hits.iter().zip(namespaces).enumerate() {
        match take(&ns, &h.namespace, &h.key, h.cost, body.dry_run).await {
            Ok(mut v) => {
                v.policy = format!("{}.{}", h.namespace, v.policy);
                taken.push((ns, v));
            }
            Err(e) => {
                // what fails only while spending (a full table): nothing of the batch
                // stays counted
                give_back_all(&body.hits, &taken, body.dry_run).await?;
                return Err(e.at(&format!("hits[{i}]")));
            }
        }
    }
    let denied = taken.iter().any(|(_, v)| !v.allowed);
    for h in &body.hits {
        state.metrics.decision(&h.namespace, !denied);
    }
    if denied {
        give_back_all(&body.hits, &taken, body.dry_run).await?;
    }
    let Some(worst) = taken
        .iter()
        .map(|(_, v)| v)
        .max_by_key(|v| v.severity())
        .cloned()
    else {
        return Err(ApiError::Internal);
    };
    let mut policies: Vec<String> = Vec::new();
    for (h, (_, v)) in body.hits.iter().zip(&taken) {
        for p in &v.policies {
            let p = format!("\"{}.{}", h.namespace, p.trim_start_matches('"'));
            if !policies.contains(&p) {
                policies.push(p);
            }
        }
    }
    let answer = BatchAnswer {
        answer: worst.answer(),
        spent: !denied && !body.dry_run,
        results: body
            .hits
            .iter()
            .zip(&taken)
            .map(|(h, (_, v))| BatchResult {
                namespace: &h.namespace,
                key: &h.key,
                answer: v.answer(),
            })
            .collect(),
    };
    Ok(respond(&worst, &policies, status_of(&worst), answer))
}

async fn give_back_all(
    hits: &[BatchHit],
    taken: &[(Arc<Namespace>, Verdict)],
    dry_run: bool,
) -> Result<(), ApiError> {
    if dry_run {
        return Ok(());
    }
    for (h, (ns, v)) in hits.iter().zip(taken) {
        if v.allowed {
            give_back(ns, &h.key, h.cost).await?;
        }
    }
    Ok(())
}

/// `DELETE /v1/namespaces/{namespace}/keys/{key}`: the key's counts and bucket are
/// deleted in the store, then on this node; other nodes drop theirs at their next sync.
/// 503 when the store cannot be reached (nothing is reset then).
pub async fn reset(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    ns.sync
        .reset(&key)
        .await
        .map_err(|e| ApiError::Unavailable(format!("the store could not reset the key: {e}")))?;
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "key": key,
        "reset": true,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthQuery {
    cost: f64,
    /// The status of a denial: 429 (Traefik passes it on), or 401/403 for nginx, whose
    /// `auth_request` treats any other status as an error.
    deny_status: u16,
}

impl Default for AuthQuery {
    fn default() -> Self {
        AuthQuery {
            cost: 1.0,
            deny_status: 429,
        }
    }
}

/// The client's address as a proxy reports it: the first `X-Forwarded-For` entry, else
/// `X-Real-IP`, else the connection's peer.
fn client_address(parts: &Parts) -> Option<String> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if let Some(first) = header("x-forwarded-for").and_then(|v| v.split(',').next()) {
        let first = first.trim();
        if !first.is_empty() {
            return Some(first.to_owned());
        }
    }
    if let Some(ip) = header("x-real-ip") {
        return Some(ip.to_owned());
    }
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip().to_string())
}

/// `/v1/auth/{namespace}[?cost=1&deny_status=429]`, any method: a hit on the key the
/// namespace's `key_from` names, answered 200 (allowed) or `deny_status` (denied), with
/// the RateLimit headers either way. A request without the configured key header gets
/// 401: it carries nothing to limit by.
pub async fn auth(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    query: Result<Query<AuthQuery>, axum::extract::rejection::QueryRejection>,
    parts: Parts,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(format!("query: {}", e.body_text())))?;
    let deny = match q.deny_status {
        401 | 403 | 429 => {
            StatusCode::from_u16(q.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
        }
        other => {
            return Err(ApiError::BadRequest(format!(
                "deny_status must be 401, 403 or 429, got {other}"
            )))
        }
    };
    let ns = state.namespace(&namespace)?;
    let limits = limits_of(&ns, &namespace)?;
    let key = match &limits.key_from {
        KeyFrom::ClientAddress => client_address(&parts),
        KeyFrom::Header(h) => parts
            .headers
            .get(h.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned),
    };
    let Some(key) = key else {
        let what = match &limits.key_from {
            KeyFrom::ClientAddress => "no client address".to_owned(),
            KeyFrom::Header(h) => format!("header {h} is missing"),
        };
        return Ok((
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({"error": {"code": "no_key", "message": what}})),
        )
            .into_response());
    };
    let v = take(&ns, &namespace, &key, q.cost, false).await?;
    state.metrics.decision(&namespace, v.allowed);
    let status = if v.allowed { StatusCode::OK } else { deny };
    Ok(respond(&v, &v.policies, status, v.answer()))
}
