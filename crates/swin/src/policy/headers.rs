//! The headers of an answer, written once for every door: the RateLimit headers of a
//! decision (draft-ietf-httpapi-ratelimit-headers), its Retry-After and the shadow
//! header. Each answer hands them out by name ([`Verdict::headers`],
//! [`Batch::headers`](crate::requests::Batch::headers),
//! [`Decided::headers`](crate::requests::Decided::headers),
//! [`AcquireAnswer::headers`](crate::requests::AcquireAnswer::headers)): HTTP sets them
//! on its response, Envoy's service hands them to Envoy in `response_headers_to_add`,
//! the tower layer sets them on the inner service's answer.

use swin_core::Decision;

use super::limits::ceil_secs;

/// An answer's headers by name (`RateLimit-Policy`, `RateLimit`, `Retry-After`,
/// `swin-shadow-denied`), in the order a door sets them.
pub(crate) type Headers = Vec<(&'static str, String)>;

/// The header a hit allowed only because what would deny it is in shadow answers with:
/// `"60s";t=12`, the limit (or rule) that would have denied it and in how many seconds
/// the same hit would have passed.
pub(crate) const SHADOW_DENIED: &str = "swin-shadow-denied";

/// The headers of a concurrency limit of `limit` slots, `in_flight` of them held: with
/// Retry-After (and `t`) `retry_after_secs` when the request is `over`.
pub(crate) fn of_slots(limit: u64, in_flight: u64, over: bool, retry_after_secs: f64) -> Headers {
    let remaining = limit.saturating_sub(in_flight);
    let mut out = vec![("RateLimit-Policy", format!("\"concurrency\";q={limit}"))];
    if over {
        let t = retry_after_secs.ceil().max(1.0) as u64;
        out.push(("RateLimit", format!("\"concurrency\";r={remaining};t={t}")));
        out.push(("Retry-After", t.to_string()));
    } else {
        out.push(("RateLimit", format!("\"concurrency\";r={remaining}")));
    }
    out
}

/// Adds `headers` to `h` (names as HTTP/2 writes them; a value a header cannot carry
/// is left out). The RateLimit fields and the shadow header are lists: what `h` has of
/// them already (an inner layer's, limits stacked) stays, and these join it, so that a
/// client sees every limit it passed. Retry-After is one number of seconds: the longer
/// wait stays.
#[cfg(feature = "tower")]
pub(crate) fn write_to(h: &mut http::HeaderMap, headers: Headers) {
    use http::header::RETRY_AFTER;
    let secs = |v: &http::HeaderValue| v.to_str().ok()?.parse::<u64>().ok();
    for (name, value) in headers {
        let Ok(value) = http::HeaderValue::try_from(value) else {
            continue;
        };
        let name = header_name(name);
        if name != RETRY_AFTER {
            h.append(name, value);
        } else if h.get(&name).is_none_or(|old| secs(old) < secs(&value)) {
            h.insert(name, value);
        }
    }
}

/// The name of one of an answer's headers, as HTTP writes it.
#[cfg(feature = "tower")]
fn header_name(name: &'static str) -> http::HeaderName {
    use http::header::{HeaderName, RETRY_AFTER};
    match name {
        "RateLimit-Policy" => HeaderName::from_static("ratelimit-policy"),
        "RateLimit" => HeaderName::from_static("ratelimit"),
        "Retry-After" => RETRY_AFTER,
        _ => {
            debug_assert_eq!(name, SHADOW_DENIED);
            HeaderName::from_static(SHADOW_DENIED)
        }
    }
}

/// The [`SHADOW_DENIED`] header's value for a hit that would have been denied by
/// `policy`, passing `decision.retry_after` later.
pub(crate) fn shadow_item(policy: &str, decision: &Decision) -> String {
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
    use super::{of_slots, state_item};

    /// Slots: the slots left, and when over, `t` and Retry-After (at least a second).
    #[test]
    fn slots_headers_say_what_is_left_and_when_one_frees() {
        assert_eq!(
            of_slots(5, 3, false, 0.0),
            [
                ("RateLimit-Policy", "\"concurrency\";q=5".to_owned()),
                ("RateLimit", "\"concurrency\";r=2".to_owned()),
            ]
        );
        assert_eq!(
            of_slots(5, 6, true, 0.2),
            [
                ("RateLimit-Policy", "\"concurrency\";q=5".to_owned()),
                ("RateLimit", "\"concurrency\";r=0;t=1".to_owned()),
                ("Retry-After", "1".to_owned()),
            ]
        );
    }

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
