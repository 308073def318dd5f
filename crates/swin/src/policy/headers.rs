//! The RateLimit headers of a decision (draft-ietf-httpapi-ratelimit-headers) and its
//! Retry-After, written once for every door: HTTP sets them on its response, Envoy's
//! service hands them to Envoy in `response_headers_to_add`.

use std::borrow::Cow;
use std::sync::Arc;

use swin_core::Decision;

use super::limits::ceil_secs;

/// The header values of one decision.
#[derive(Debug)]
pub struct RateLimitHeaders<'a> {
    /// `RateLimit-Policy`: one item per limit of the key.
    pub(crate) policy: Cow<'a, str>,
    /// `RateLimit`: the state of the strictest limit; `t` on a denial is when this hit
    /// would pass.
    pub(crate) state: String,
    /// `Retry-After` on a denial, never earlier than `t` and at least 1.
    pub(crate) retry_after: Option<u64>,
}

impl<'a> RateLimitHeaders<'a> {
    /// `RateLimit-Policy`: one item per limit of the key.
    pub fn policy(&self) -> &Cow<'a, str> {
        &self.policy
    }

    /// `RateLimit`: the state of the strictest limit; `t` on a denial is when this hit
    /// would pass.
    pub fn state(&self) -> &str {
        &self.state
    }

    /// `Retry-After` on a denial, never earlier than `t` and at least 1.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

impl<'a> RateLimitHeaders<'a> {
    /// The headers of `decision`, taken under `policy` (the name of its limit) among the
    /// key's `policies` (their items).
    pub fn of(policies: &'a [Arc<str>], policy: &str, decision: &Decision) -> Self {
        let t = if decision.allowed {
            ceil_secs(decision.reset_after)
        } else {
            ceil_secs(decision.retry_after)
        };
        RateLimitHeaders {
            policy: match policies {
                [one] => Cow::Borrowed(&**one),
                _ => Cow::Owned(policies.join(", ")),
            },
            state: state_item(policy, decision.remaining, t),
            retry_after: (!decision.allowed).then_some(t.max(1)),
        }
    }
}

impl RateLimitHeaders<'_> {
    /// Sets `RateLimit-Policy`, `RateLimit` and (on a denial) `Retry-After` on `h`.
    pub(crate) fn write_to(&self, h: &mut http::HeaderMap) {
        use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
        const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
        const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
        if let Ok(p) = HeaderValue::from_str(&self.policy) {
            h.insert(RATELIMIT_POLICY, p);
        }
        if let Ok(s) = HeaderValue::from_str(&self.state) {
            h.insert(RATELIMIT, s);
        }
        if let Some(t) = self.retry_after {
            h.insert(RETRY_AFTER, HeaderValue::from(t));
        }
    }
}

/// Sets the headers of a hit's answer on `h`: the RateLimit headers of `decision` under
/// `policy` among `policies`, and [`SHADOW_DENIED`] when it passed only because what would
/// deny it is in shadow.
pub fn write_headers(
    h: &mut http::HeaderMap,
    policies: &[Arc<str>],
    policy: &str,
    decision: &Decision,
    shadow_denied: bool,
) {
    RateLimitHeaders::of(policies, policy, decision).write_to(h);
    if shadow_denied {
        if let Ok(s) = http::HeaderValue::from_str(&shadow_item(policy, decision)) {
            h.insert(http::HeaderName::from_static(SHADOW_DENIED), s);
        }
    }
}

/// The header a hit allowed only because what would deny it is in shadow answers with:
/// `"60s";t=12`, the limit (or rule) that would have denied it and in how many seconds
/// the same hit would have passed.
pub const SHADOW_DENIED: &str = "swin-shadow-denied";

/// The [`SHADOW_DENIED`] header's value for a hit that would have been denied by
/// `policy`, passing `decision.retry_after` later.
pub fn shadow_item(policy: &str, decision: &Decision) -> String {
    format!("\"{policy}\";t={}", ceil_secs(decision.retry_after).max(1))
}

/// `"60s";r=12;t=30`. A whole `remaining` (the usual case) is written as an integer,
/// without going through the float formatter; a fraction as Rust writes an f64.
pub(crate) fn state_item(policy: &str, remaining: f64, t: u64) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(policy.len() + 32);
    s.push('"');
    s.push_str(policy);
    s.push_str("\";r=");
    let whole = remaining.fract() == 0.0 && remaining.abs() < 9.0e15;
    let _ = if whole {
        write!(s, "{}", remaining as i64)
    } else {
        write!(s, "{remaining}")
    };
    let _ = write!(s, ";t={t}");
    s
}

#[cfg(test)]
mod tests {
    use super::state_item;

    #[test]
    fn the_state_item_writes_whole_counts_as_integers() {
        assert_eq!(state_item("60s", 12.0, 30), "\"60s\";r=12;t=30");
        assert_eq!(
            state_item("60s", 999_999_990.0, 60),
            "\"60s\";r=999999990;t=60"
        );
        assert_eq!(state_item("api.60s", 2.5, 1), "\"api.60s\";r=2.5;t=1");
        assert_eq!(state_item("gcra", -0.0, 0), "\"gcra\";r=0;t=0");
        assert_eq!(
            state_item("60s", 1e300, 0),
            format!("\"60s\";r={};t=0", 1e300)
        );
    }
}
