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
//!
//! A concurrency namespace with descriptor rules (TOML `descriptors` or a YAML
//! `descriptors_file`, found as a namespace of hits finds them) limits each rule's
//! descriptors to its `requests_per_unit` in flight; descriptors that match no rule take
//! no slot and are OK, `unlimited` rules take none, `requests_per_unit: 0` blocks, and
//! `shadow_mode` takes the slots past the limit and answers OK. Without rules, every
//! descriptor counts under the namespace's `limit`.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

use super::{header, ok_without_limit, status_of, Asked};
use crate::config::{Concurrency, MAX_CONCURRENCY};
use crate::leases::{acquire_for_envoy, give_up, release_for_envoy, AcquireAnswer};
use crate::policy::keys;
use crate::policy::rules::{Found, Rule, RuleLimit};
use crate::state::{AppState, Namespace};

/// One descriptor of a request, on its key.
struct Slots {
    at: usize,
    key: String,
    count: u32,
    limit: u64,
    /// Its rule's `shadow_mode`: slots taken past `limit` too, the answer OK.
    shadow: bool,
    /// Its rule's name, for `current_limit.name`.
    name: Option<String>,
}

fn status(s: &Slots, ok: bool, remaining: u64, until: std::time::Duration) -> DescriptorStatus {
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: Some(RateLimit {
            name: s.name.clone().unwrap_or_default(),
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

/// What a descriptor does: take or end slots of a key, or answer without any (it
/// matched no rule, an `unlimited` one, or one that blocks: then whether it is over).
enum Plan {
    Slots(Slots),
    Answer(DescriptorStatus, bool),
}

/// Each descriptor's plan: its own `limit` first, else the namespace's rules (as a
/// namespace of hits finds them: the tree, `replaces`, `share_threshold`), else — a
/// namespace without rules — the namespace's `limit` on the descriptor's key.
fn plans(
    req: &RateLimitRequest,
    ns: &Namespace,
    c: &Concurrency,
    asked: &[Asked<'_>],
) -> Vec<Plan> {
    let slots = |at: usize, key: String, limit: u64, rule: Option<&Rule>| Slots {
        at,
        key,
        count: u32::try_from(asked[at].hits).unwrap_or(u32::MAX),
        limit,
        shadow: rule.is_some_and(|r| r.shadow),
        name: rule.and_then(|r| r.name.clone()),
    };
    let Some(rules) = &ns.rules else {
        return asked
            .iter()
            .enumerate()
            .map(|(at, a)| {
                let limit = req.descriptors[at]
                    .limit
                    .as_ref()
                    .map_or(c.limit, |o| u64::from(o.requests_per_unit));
                Plan::Slots(slots(at, keys::counter_key(&a.entries), limit, None))
            })
            .collect();
    };
    let found: Vec<Option<Found>> = asked.iter().map(|a| rules.lookup(&a.entries)).collect();
    // a rule named in another matched rule's `replaces` does not apply
    let replaced: Vec<&str> = found
        .iter()
        .flatten()
        .flat_map(|f| f.rule.replaces.iter().map(String::as_str))
        .collect();
    asked
        .iter()
        .zip(&found)
        .enumerate()
        .map(|(at, (a, f))| {
            let key = |f: &Found| match f.shared.is_empty() {
                true => keys::counter_key(&a.entries),
                false => keys::counter_key(&f.counted(&a.entries)),
            };
            if let Some(o) = &req.descriptors[at].limit {
                let key = f
                    .as_ref()
                    .map_or_else(|| keys::counter_key(&a.entries), key);
                return Plan::Slots(slots(at, key, u64::from(o.requests_per_unit), None));
            }
            let f = f.as_ref().filter(|f| {
                f.rule
                    .name
                    .as_deref()
                    .is_none_or(|n| !replaced.contains(&n))
            });
            let Some(f) = f else {
                return Plan::Answer(ok_without_limit(), false);
            };
            let rule = &*f.rule;
            match rule.limit {
                RuleLimit::InFlight(n) => Plan::Slots(slots(at, key(f), n, Some(rule))),
                // an end on a value that is blocked ends nothing
                RuleLimit::Blocked => {
                    let denied = !a.negative && !rule.shadow;
                    let s = slots(at, String::new(), 0, Some(rule));
                    Plan::Answer(status(&s, !denied, 0, std::time::Duration::ZERO), denied)
                }
                // `unlimited` (and, never here, limits of hits): no slot
                RuleLimit::Unlimited | RuleLimit::Limited(_) => Plan::Answer(
                    DescriptorStatus {
                        limit_remaining: u32::MAX,
                        ..ok_without_limit()
                    },
                    false,
                ),
            }
        })
        .collect()
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
    let mut statuses: Vec<DescriptorStatus> = vec![DescriptorStatus::default(); asked.len()];
    let mut over = false;
    let (mut ends, mut takes) = (Vec::new(), Vec::new());
    for (at, plan) in plans(req, ns, c, asked).into_iter().enumerate() {
        match plan {
            Plan::Slots(s) if asked[at].negative => ends.push(s),
            Plan::Slots(s) => takes.push(s),
            Plan::Answer(status, denied) => {
                over |= denied;
                statuses[at] = status;
            }
        }
    }

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
        .partition(|s| s.shadow || u64::from(s.count) <= s.limit);
    over |= !too_many.is_empty();
    for s in &too_many {
        statuses[s.at] = status(s, false, 0, std::time::Duration::ZERO);
    }
    // taken even when another descriptor is already over (and ended again below), so
    // that each descriptor's status says where its own key stands; a rule in shadow
    // mode takes its slots past its limit too (the same negative hits end them) and
    // answers what the limit would have said
    let mut taken = futures_util::future::join_all(fit.iter().map(|s| {
        let limit = if s.shadow { MAX_CONCURRENCY } else { s.limit };
        acquire_for_envoy(ns, c, &s.key, s.count, limit)
    }))
    .await;
    for (s, t) in fit.iter().zip(&mut taken) {
        if let (true, Ok(a)) = (s.shadow, t) {
            a.limit = s.limit;
        }
    }
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
        // a rule in shadow took slots past its limit: a would-be denial
        let shadow_denied = s.shadow && granted && a.acquired.in_flight > s.limit;
        state
            .metrics
            .decision(domain, "concurrency", granted, shadow_denied);
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
