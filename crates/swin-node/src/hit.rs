//! `POST /v1/namespaces/{namespace}/keys/{key}/hit`: may this hit pass? 200 when allowed,
//! 429 when denied, with the IETF `RateLimit-Policy` and `RateLimit` headers and, on a
//! 429, `Retry-After`.
//!
//! The hit is counted first and the decision taken on the counts after it; a denied hit
//! is then taken back out (unless the namespace sets `count_denied`). Two hits racing for
//! the last unit can both be denied, never both allowed, on one node; across nodes the
//! namespace's sync mode bounds the over-admission (synchronous: none).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use swin_core::{WindowDecision, WindowLimit};

use crate::app::{check_key, json_bytes, now, parse_json, ApiPath, AppState};
use crate::error::ApiError;
use crate::limits::{ceil_secs, strictest};

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

#[derive(Debug, Serialize)]
struct HitAnswer {
    allowed: bool,
    limit: f64,
    remaining: f64,
    /// Seconds until the counts this answer saw weigh nothing.
    reset_after: f64,
    /// Seconds until the same hit would pass; 0 when it passed.
    retry_after: f64,
}

pub async fn hit(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let body: HitBody = parse_json(bytes.as_ref())?;
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let Some(limits) = &ns.limits else {
        return Err(ApiError::BadRequest(format!(
            "namespace {namespace:?} has no limits to decide against"
        )));
    };
    let set = limits.for_key(&key);
    let now = now();
    let counters = ns.sync.counters();
    let mut decisions: Vec<(WindowLimit, WindowDecision)> = Vec::with_capacity(set.len());
    for l in set {
        let (current, previous) = if body.dry_run {
            let r = counters.table(l.window.secs())?.rate(&key, now, None);
            (r.current, r.previous)
        } else {
            // counted now; the decision is on the counts before this hit
            let r = ns
                .sync
                .increment(&key, l.window.secs(), body.cost, now)
                .await?;
            (r.current - body.cost, r.previous)
        };
        decisions.push((*l, l.decide(current, previous, now, body.cost)?));
    }
    let Some((limit, d)) = strictest(&decisions) else {
        return Err(ApiError::BadRequest(format!(
            "key {key:?} has no limits in namespace {namespace:?}"
        )));
    };
    if !d.allowed && !body.dry_run && !limits.count_denied {
        for l in set {
            ns.sync
                .increment(&key, l.window.secs(), -body.cost, now)
                .await?;
        }
    }
    let answer = HitAnswer {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after: d.reset_after.as_secs_f64(),
        retry_after: d.retry_after.as_secs_f64(),
    };
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut resp = (status, Json(answer)).into_response();
    let h = resp.headers_mut();
    // draft-ietf-httpapi-ratelimit-headers: one policy per limit; the current state of
    // the strictest; `t` on a denial is when this hit would pass, and Retry-After is
    // never earlier than it
    let policies: Vec<String> = set
        .iter()
        .map(|l| format!("\"{}\";q={};w={}", policy_name(l), l.limit, l.window.secs()))
        .collect();
    let t = if d.allowed {
        ceil_secs(d.reset_after)
    } else {
        ceil_secs(d.retry_after)
    };
    let state_header = format!("\"{}\";r={};t={}", policy_name(&limit), d.remaining, t);
    for (name, value) in [
        ("ratelimit-policy", policies.join(", ")),
        ("ratelimit", state_header),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if !d.allowed {
        h.insert("retry-after", HeaderValue::from(t.max(1)));
    }
    Ok(resp)
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
/// zero. `allowed` says whether anything was given back (false when nothing was
/// counted), and the rest describes the key's state after it, as a dry run would.
pub async fn refund(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let body: RefundBody = parse_json(bytes.as_ref())?;
    check_key(&key)?;
    if !(body.cost.is_finite() && body.cost >= 0.0) {
        return Err(ApiError::BadRequest(format!(
            "cost must be a number of at least 0, got {}",
            body.cost
        )));
    }
    let ns = state.namespace(&namespace)?;
    let Some(limits) = &ns.limits else {
        return Err(ApiError::BadRequest(format!(
            "namespace {namespace:?} has no limits to refund against"
        )));
    };
    let now = now();
    let counters = ns.sync.counters();
    let mut refunded = 0.0f64;
    let mut decisions = Vec::new();
    for l in limits.for_key(&key) {
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

fn policy_name(l: &WindowLimit) -> String {
    format!("{}s", l.window.secs())
}
