//! Envoy's answers from what the library decided: each descriptor's status, the
//! RateLimit headers of the strictest, and the dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use swin::requests::{Answer, Decided};

use super::metadata;

/// The answer to `req`, from what its descriptors decided.
pub(super) fn response(req: &RateLimitRequest, decided: Decided) -> RateLimitResponse {
    let (with_headers, with_metadata) = decided.envoy_answers();
    let statuses: Vec<DescriptorStatus> = decided.answers().iter().map(status_of).collect();
    let dynamic_metadata = with_metadata.then(|| metadata::of(req, decided.answers()));
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

/// A descriptor's status, as the library read it.
fn status_of(a: &Answer) -> DescriptorStatus {
    DescriptorStatus {
        code: if a.over() { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: a.limit().map(|(name, requests_per_unit, unit)| RateLimit {
            // envoyproxy/ratelimit's: the rule's name, empty without one (Envoy adds a
            // non-empty name to X-RateLimit-Limit for clients to see)
            name: name.to_owned(),
            requests_per_unit,
            unit,
        }),
        limit_remaining: a.remaining(),
        duration_until_reset: a.reset_after().map(|d| {
            envoy_types::pb::google::protobuf::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }
        }),
        ..Default::default()
    }
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

/// An Envoy response header: the one place an answer's headers become Envoy's type.
fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}
