//! Envoy's answers on concurrency namespaces (`algorithm = "concurrency"`, decided by
//! [`swin::descriptors`]): a descriptor's slots in flight as a status, and the headers
//! of the strictest acquire.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};

use swin::policy::rules::Rule;

/// A descriptor's slots: OK or over, its limit in flight (under its rule's name), the
/// slots left, and until a slot is sure to be free.
pub(super) fn status(
    rule: Option<&Rule>,
    ok: bool,
    limit: u64,
    remaining: u64,
    until: Duration,
) -> DescriptorStatus {
    DescriptorStatus {
        code: if ok { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: Some(RateLimit {
            name: rule.and_then(|r| r.name()).unwrap_or_default().to_owned(),
            requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
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
