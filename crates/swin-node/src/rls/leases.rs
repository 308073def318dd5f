//! Envoy's door on concurrency namespaces (`algorithm = "concurrency"`): each
//! descriptor's counter key ([`keys::counter_key`]) is a key of the namespace's leases
//! and its hits are slots. A request takes its descriptors' slots all or nothing, under
//! leases of [`ENVOY_LEASES`] that lapse after the namespace's `lease_ttl` (an Envoy that
//! dies frees its slots by then); the same descriptors sent again with
//! `is_negative_hits` — Envoy's way of ending a request (`apply_on_stream_done`) — end
//! that many slots of the key, the earliest to lapse first. A descriptor's own `limit`
//! replaces the namespace's `limit` for it (its `requests_per_unit`, in flight; its unit
//! is not read). Every node and store as over HTTP: a slot ended on one node is free on
//! every other at once.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

use super::{header, status_of, Asked};
use crate::config::Concurrency;
use crate::leases::{acquire_for_envoy, give_up, release_for_envoy, AcquireAnswer};
use crate::policy::keys;
use crate::state::{AppState, Namespace};

/// One descriptor of a request, on its key.
struct Slots {
    at: usize,
    key: String,
    count: u32,
    limit: u64,
}

fn status(s: &Slots, ok: bool, remaining: u64, until: std::time::Duration) -> DescriptorStatus {
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: u32::try_from(s.limit).unwrap_or(u32::MAX),
            // in flight, not per a unit of time
            unit: 0,
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: until.as_secs() as i64,
            nanos: until.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}

fn until(a: &AcquireAnswer, at: swin_core::UnixMs) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(at.0 - a.now.0).unwrap_or(0))
}

/// A request on a concurrency namespace: releases first (a request may end one thing
/// and start another), then the acquires, all or nothing.
pub(super) async fn decide(
    state: &AppState,
    req: &RateLimitRequest,
    ns: &Namespace,
    c: &Concurrency,
    asked: &[Asked<'_>],
) -> Result<RateLimitResponse, Status> {
    let domain = req.domain.as_str();
    let slots = |(at, a): (usize, &Asked<'_>)| Slots {
        at,
        key: keys::counter_key(&a.entries),
        count: u32::try_from(a.hits).unwrap_or(u32::MAX),
        limit: req.descriptors[at]
            .limit
            .as_ref()
            .map_or(c.limit, |o| u64::from(o.requests_per_unit)),
    };
    let (ends, takes): (Vec<_>, Vec<_>) = asked.iter().enumerate().partition(|(_, a)| a.negative);
    let ends: Vec<Slots> = ends.into_iter().map(slots).collect();
    let takes: Vec<Slots> = takes.into_iter().map(slots).collect();
    let mut statuses: Vec<DescriptorStatus> = vec![DescriptorStatus::default(); asked.len()];

    let ended =
        futures_util::future::join_all(ends.iter().map(|s| release_for_envoy(ns, &s.key, s.count)))
            .await;
    for (s, r) in ends.iter().zip(ended) {
        r.map_err(|e| status_of(&e))?;
        state.metrics.lease(domain, "released");
        statuses[s.at] = status(s, true, 0, std::time::Duration::ZERO);
    }

    // no slots (a descriptor's hits_addend 0): nothing to take
    for s in takes.iter().filter(|s| s.count == 0) {
        statuses[s.at] = status(s, true, 0, std::time::Duration::ZERO);
    }
    // more slots than the limit holds in all: over it, nothing taken
    let (fit, too_many): (Vec<&Slots>, Vec<&Slots>) = takes
        .iter()
        .filter(|s| s.count > 0)
        .partition(|s| u64::from(s.count) <= s.limit);
    let mut over = !too_many.is_empty();
    for s in &too_many {
        statuses[s.at] = status(s, false, 0, std::time::Duration::ZERO);
    }
    let taken = if over {
        Vec::new()
    } else {
        futures_util::future::join_all(
            fit.iter()
                .map(|s| acquire_for_envoy(ns, c, &s.key, s.count, s.limit)),
        )
        .await
    };
    let failed = taken.iter().find_map(|t| t.as_ref().err().map(status_of));
    over |= taken
        .iter()
        .any(|t| matches!(t, Ok(a) if !a.acquired.granted));
    if failed.is_some() || over {
        // all or nothing: what was granted is ended again
        let back = fit.iter().zip(&taken).filter_map(|(s, t)| match t {
            Ok(a) if a.acquired.granted => Some(give_up(ns, &s.key, a)),
            _ => None,
        });
        futures_util::future::join_all(back).await;
    }
    if let Some(status) = failed {
        return Err(status);
    }
    let mut strictest: Option<(&Slots, &AcquireAnswer)> = None;
    for (s, t) in fit.iter().zip(&taken) {
        let Ok(a) = t else { continue };
        let granted = a.acquired.granted;
        state
            .metrics
            .lease(domain, if granted { "acquired" } else { "denied" });
        state.metrics.decision(domain, "concurrency", granted);
        statuses[s.at] = if granted && !over {
            status(
                s,
                true,
                s.limit.saturating_sub(a.acquired.in_flight),
                until(a, a.expires_at),
            )
        } else if granted {
            // granted, then ended with the rest: as it was before
            let before = a.acquired.in_flight.saturating_sub(u64::from(s.count));
            status(
                s,
                true,
                s.limit.saturating_sub(before),
                std::time::Duration::ZERO,
            )
        } else {
            let at = a.acquired.earliest_lapse.unwrap_or(a.expires_at);
            status(
                s,
                false,
                s.limit.saturating_sub(a.acquired.in_flight),
                until(a, at),
            )
        };
        let stricter = strictest.is_none_or(|(_, w)| {
            (!granted && w.acquired.granted)
                || (granted == w.acquired.granted
                    && s.limit.saturating_sub(a.acquired.in_flight)
                        < w.limit.saturating_sub(w.acquired.in_flight))
        });
        if stricter {
            strictest = Some((s, a));
        }
    }
    Ok(RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: strictest
            .filter(|_| ns.envoy_response_headers)
            .map(|(_, a)| headers(a, over))
            .unwrap_or_default(),
        ..Default::default()
    })
}

/// The headers the HTTP door's acquire answers with.
fn headers(a: &AcquireAnswer, over: bool) -> Vec<HeaderValue> {
    let remaining = a.limit.saturating_sub(a.acquired.in_flight);
    let mut out = vec![header(
        "RateLimit-Policy",
        format!("\"concurrency\";q={}", a.limit),
    )];
    if over {
        let t = a.retry_after_secs().ceil().max(1.0) as u64;
        out.push(header(
            "RateLimit",
            format!("\"concurrency\";r={remaining};t={t}"),
        ));
        out.push(header("Retry-After", t.to_string()));
    } else {
        out.push(header(
            "RateLimit",
            format!("\"concurrency\";r={remaining}"),
        ));
    }
    out
}
