//! Decisions: may a hit pass? What a decision answers ([`Verdict`], and the JSON it serializes as);
//! every hit, alone or in a request of several, is decided by the request pipeline
//! (`pipeline`). Giving back (refunds) is in
//! `giving_back`; a request of several hits decided as one in `requests` (HTTP batches)
//! and `descriptors` (Envoy's).
//!
//! Window limits: the hit is counted first and the decision taken on the counts before
//! it; a denied hit is then taken back out (unless the namespace sets `count_denied`).
//! GCRA: the bucket's TAT moves by compare-and-swap only when the spend is allowed. Two
//! hits racing for the last unit can both be denied, never both allowed, on one node;
//! across nodes the namespace's sync mode bounds the over-admission (synchronous: none).

use std::sync::Arc;

use serde::Serialize;
use swin_core::{Decision, Gcra};

use crate::error::Error;
use crate::policy::headers;
use crate::policy::limits::{ceil_secs, KeyLimits, Limits};
use crate::state::Namespace;
pub use swin_sync::admission::together;
use swin_sync::admission::{Admitted, Bounds};

/// One key's decision (the strictest of its limits'), and what its headers say.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The decision: allowed, limit, remaining, reset and retry after.
    pub(crate) decision: Decision,
    /// `RateLimit-Policy` items of the key's limits.
    pub(crate) policies: Arc<[Arc<str>]>,
    /// The policy the decision comes from.
    pub(crate) policy: Arc<str>,
    /// Why a hit was refused other than by its counts: `store_unreachable` (a strict
    /// namespace with `on_store_failure = "deny"` whose store cannot be asked).
    pub(crate) reason: Option<&'static str>,
    /// Allowed only because what would deny it is in shadow (the namespace, or the limit
    /// that decided): `decision` holds what it would have said (`retry_after`: when the
    /// hit would have passed), but allowed.
    pub(crate) shadow_denied: bool,
}

impl Verdict {
    /// The decision: allowed, limit, remaining, reset and retry after.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The headers its answer carries, by name: `RateLimit-Policy` (one item per limit
    /// of the key), `RateLimit` (the state of the limit that decided), `Retry-After` when
    /// denied, `swin-shadow-denied` when it passed only because what would deny it is in
    /// shadow.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        headers_of(self, &self.policies, !self.decision.allowed, None)
    }

    /// Allowed only because what would deny it is in shadow (the namespace, or the limit
    /// that decided): `decision` holds what it would have said (`retry_after`: when the
    /// hit would have passed), but allowed.
    pub fn shadow_denied(&self) -> bool {
        self.shadow_denied
    }
}

impl Verdict {
    /// Whether the hit was admitted.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }

    /// The verdict of an allowed hit of `cost` that was given back (its request was
    /// refused as a whole): what remains is what remained before it.
    pub(crate) fn given_back(&self, cost: f64) -> Verdict {
        let mut v = self.clone();
        v.decision.remaining = (v.decision.remaining + cost).min(v.decision.limit);
        v
    }

    /// The answer a door shows for it (what it serializes as).
    pub(crate) fn answer(&self) -> HitAnswer {
        let mut a = HitAnswer {
            reason: self.reason,
            shadow_denied: self.shadow_denied,
            ..HitAnswer::from(&self.decision)
        };
        if self.shadow_denied {
            // it passed; when it would have passed is in the shadow header
            a.retry_after = 0.0;
        }
        a
    }
}

/// A verdict serializes as the doors show it: the JSON of `/hit` (`allowed`, `limit`,
/// `remaining`, `reset_after` and `retry_after` in seconds, `reason` when refused other
/// than by its counts, `shadow_denied` when set).
impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.answer().serialize(s)
    }
}

/// One hit's answer as the doors show it: the JSON of `/hit`.
#[derive(Debug, Serialize)]
pub(crate) struct HitAnswer {
    /// Whether the hit was admitted.
    pub(crate) allowed: bool,
    /// The limit that decided.
    pub(crate) limit: f64,
    /// What is left of it after this hit.
    pub(crate) remaining: f64,
    /// Seconds until the counts this answer saw weigh nothing (GCRA: the bucket is full).
    pub(crate) reset_after: f64,
    /// Seconds until the same hit would pass; 0 when it passed.
    pub(crate) retry_after: f64,
    /// Set when the hit was refused for another reason than its counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
    /// A refund's answer: how much it gave back (at most the cost asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) refunded: Option<f64>,
    /// Allowed only because the limits that would deny it are in shadow.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) shadow_denied: bool,
}

impl From<&Decision> for HitAnswer {
    fn from(d: &Decision) -> Self {
        HitAnswer {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after: d.reset_after.as_secs_f64(),
            retry_after: d.retry_after.as_secs_f64(),
            reason: None,
            refunded: None,
            shadow_denied: false,
        }
    }
}

/// The headers of `v` among `policies` (its own, or a request's every policy): the
/// RateLimit headers of its decision, Retry-After when `denied` (a door may let an
/// over-limit hit pass: Envoy's rules in shadow), and `swin-shadow-denied` for `v` when it
/// passed only because what would deny it is in shadow — or, failing that, for
/// `shadowed`, another hit of the request that did.
pub(crate) fn headers_of(
    v: &Verdict,
    policies: &[Arc<str>],
    denied: bool,
    shadowed: Option<&Verdict>,
) -> Vec<(&'static str, String)> {
    let d = &v.decision;
    let t = if d.allowed {
        ceil_secs(d.reset_after)
    } else {
        ceil_secs(d.retry_after)
    };
    let policy = match policies {
        [one] => one.to_string(),
        _ => policies.join(", "),
    };
    let mut out = Vec::with_capacity(3);
    out.push(("RateLimit-Policy", policy));
    out.push(("RateLimit", headers::state_item(&v.policy, d.remaining, t)));
    if denied && !d.allowed {
        out.push(("Retry-After", t.max(1).to_string()));
    }
    let shadow = if !denied && (v.shadow_denied || !d.allowed) {
        Some(v)
    } else {
        shadowed
    };
    if let Some(s) = shadow {
        out.push((
            headers::SHADOW_DENIED,
            headers::shadow_item(&s.policy, &s.decision),
        ));
    }
    out
}

/// A GCRA limit as a quota policy: `burst` units, refilled over `burst` emission
/// intervals.
fn gcra_policy(g: &Gcra) -> String {
    let refill = g
        .emission_interval()
        .saturating_mul(g.burst().clamp(1, i64::from(u32::MAX)) as u32);
    format!("\"gcra\";q={};w={}", g.burst(), ceil_secs(refill))
}

/// The admission's answer under `limits`, with the headers' policies.
pub(crate) fn verdict(limits: &KeyLimits, a: Admitted) -> Verdict {
    let (policies, policy) = match limits {
        KeyLimits::Gcra(g) => (Arc::from([Arc::from(gcra_policy(g))]), Arc::from("gcra")),
        KeyLimits::Windows(set) => (set.items().clone(), set.name(a.strictest).clone()),
    };
    Verdict {
        decision: a.decision,
        policies,
        policy,
        reason: a.reason,
        shadow_denied: a.shadow_denied,
    }
}

/// What the admission interface is asked about under `limits`.
pub(crate) fn bounds(limits: &KeyLimits) -> Bounds<'_> {
    match limits {
        KeyLimits::Gcra(g) => Bounds::Bucket(g),
        KeyLimits::Windows(set) => Bounds::Windows(set.limits()),
    }
}

/// The namespace's limits; a namespace that only counts has none to decide against.
pub(crate) fn limits_of<'a>(ns: &'a Namespace, namespace: &str) -> Result<&'a Limits, Error> {
    ns.limits.as_ref().ok_or_else(|| {
        Error::BadRequest(format!(
            "namespace {namespace:?} has no limits to decide against"
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use swin_core::Decision;

    use super::{headers_of, Verdict};

    fn verdict(allowed: bool, shadow_denied: bool) -> Verdict {
        Verdict {
            decision: Decision {
                allowed,
                limit: 10.0,
                remaining: if allowed { 4.0 } else { 0.0 },
                reset_after: Duration::from_millis(20_500),
                retry_after: Duration::from_millis(if allowed { 0 } else { 7_200 }),
                debt: 0.0,
            },
            policies: Arc::from([
                Arc::from("\"60s\";q=10;w=60"),
                Arc::from("\"1h\";q=100;w=3600"),
            ]),
            policy: Arc::from("60s"),
            reason: None,
            shadow_denied,
        }
    }

    fn names(h: &[(&'static str, String)]) -> Vec<&'static str> {
        h.iter().map(|(n, _)| *n).collect()
    }

    /// An allowed hit: the policies and the state (`t` until the counts weigh nothing),
    /// no Retry-After; denied: Retry-After, never earlier than `t`.
    #[test]
    fn a_verdicts_headers_say_its_state_and_retry_after_on_a_denial() {
        let v = verdict(true, false);
        let h = headers_of(&v, &v.policies, !v.decision.allowed, None);
        assert_eq!(
            h,
            [
                (
                    "RateLimit-Policy",
                    "\"60s\";q=10;w=60, \"1h\";q=100;w=3600".to_owned()
                ),
                ("RateLimit", "\"60s\";r=4;t=21".to_owned()),
            ]
        );
        let v = verdict(false, false);
        let h = headers_of(&v, &v.policies, true, None);
        assert_eq!(names(&h), ["RateLimit-Policy", "RateLimit", "Retry-After"]);
        assert_eq!(h[1].1, "\"60s\";r=0;t=8");
        assert_eq!(h[2].1, "8");
    }

    /// Passed only because of a shadow (the namespace's, or an Envoy rule's that let an
    /// over-limit hit pass): no Retry-After, and the shadow header names what would
    /// have denied it and when it would have passed; another hit of the request that
    /// did is named when the strictest did not.
    #[test]
    fn a_hit_let_through_by_a_shadow_says_so_and_asks_no_wait() {
        let mut v = verdict(true, true);
        v.decision.retry_after = Duration::from_secs(3);
        let h = headers_of(&v, &v.policies, false, None);
        assert_eq!(
            names(&h),
            ["RateLimit-Policy", "RateLimit", "swin-shadow-denied"]
        );
        assert_eq!(h[2].1, "\"60s\";t=3");
        let over = verdict(false, false);
        let h = headers_of(&over, &over.policies, false, None);
        assert_eq!(
            names(&h),
            ["RateLimit-Policy", "RateLimit", "swin-shadow-denied"]
        );
        assert_eq!(h[2].1, "\"60s\";t=8");
        let plain = verdict(true, false);
        let h = headers_of(&plain, &[Arc::from("\"b\";q=1")], false, Some(&v));
        assert_eq!(h[0].1, "\"b\";q=1");
        assert_eq!(h[2], ("swin-shadow-denied", "\"60s\";t=3".to_owned()));
    }
}
