//! Envoy's answers from what the library decided: each descriptor's status, the
//! RateLimit headers of the strictest, and the dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use swin::requests::{Answer, Decided, Shown};
use swin::Decision;

use super::{leases, metadata};
use swin::policy::limits::KeyLimits;
use swin::policy::rules::{self, Rule};

/// The answer to `req`, from what its descriptors decided.
pub(super) fn response(req: &RateLimitRequest, decided: Decided) -> RateLimitResponse {
    let (with_headers, with_metadata) = decided.envoy_answers();
    let statuses: Vec<DescriptorStatus> = decided.answers().iter().map(status_of_answer).collect();
    let dynamic_metadata = with_metadata.then(|| {
        let applied: Vec<Option<&Rule>> = decided.answers().iter().map(|a| a.rule()).collect();
        metadata::of(req, &statuses, &applied)
    });
    RateLimitResponse {
        dynamic_metadata,
        overall_code: if decided.over() {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        response_headers_to_add: match with_headers {
            true => decided
                .headers()
                .into_iter()
                .map(|(key, value)| header(key, value))
                .collect(),
            false => Vec::new(),
        },
        ..Default::default()
    }
}

/// A descriptor's status from what the library decided: its rule's, showing a runtime
/// limit in `current_limit` when one replaced the rule's (its first window, in Envoy's
/// unit of that length; UNKNOWN for another length).
fn status_of_answer(a: &Answer) -> DescriptorStatus {
    let (rule, decision, denied, runtime) = match (a.rule(), &a.shown()) {
        (
            rule,
            Shown::Slots {
                ok,
                limit,
                remaining,
                until,
            },
        ) => return leases::status(rule, *ok, *limit, *remaining, *until),
        (_, Shown::NoRule) | (None, _) => return ok_without_limit(),
        (Some(_), Shown::Unlimited) => {
            return DescriptorStatus {
                limit_remaining: u32::MAX,
                ..ok_without_limit()
            }
        }
        (
            Some(rule),
            Shown::Decided {
                decision,
                denied,
                runtime,
            },
        ) => (rule, decision, *denied, runtime),
    };
    let mut status = descriptor_status(rule, decision, denied);
    if let (Some(r), Some(current)) = (runtime, &mut status.current_limit) {
        match &r.limits() {
            KeyLimits::Windows(w) => {
                if let Some(first) = w.limits().first() {
                    current.requests_per_unit = first.limit.min(f64::from(u32::MAX)) as u32;
                    current.unit = rules::unit_of(u64::from(first.window.secs()));
                }
            }
            KeyLimits::Gcra(g) => {
                current.requests_per_unit = g.count().clamp(0, i64::from(u32::MAX)) as u32;
                current.unit = rules::unit_of(g.period().as_secs());
            }
        }
    }
    status
}

pub(super) fn all_ok(n: usize) -> RateLimitResponse {
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
            name: rule.name().unwrap_or_default().to_owned(),
            requests_per_unit: rule.requests_per_unit(),
            unit: rule.unit(),
        }),
        limit_remaining: d.remaining.clamp(0.0, f64::from(u32::MAX)) as u32,
        duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: d.reset_after.as_secs() as i64,
            nanos: d.reset_after.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}

/// An Envoy response header: the one place an answer's headers become Envoy's type.
fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}
