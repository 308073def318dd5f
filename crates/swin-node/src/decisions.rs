//! Decisions: may a hit pass? The hit is decided against the key's limits and spent
//! when allowed (or denied too where the namespace counts denied hits). Giving back
//! (refunds, denied batches) is in `giving_back`; a request of several hits decided as
//! one (batches, Envoy's descriptors) in `requests`.
//!
//! Window limits: the hit is counted first and the decision taken on the counts before
//! it; a denied hit is then taken back out (unless the namespace sets `count_denied`).
//! GCRA: the bucket's TAT moves by compare-and-swap only when the spend is allowed. Two
//! hits racing for the last unit can both be denied, never both allowed, on one node;
//! across nodes the namespace's sync mode bounds the over-admission (synchronous: none).

use std::sync::Arc;

use serde::Serialize;
use swin_core::{Decision, Gcra};

use crate::config::{Admission, OnStoreFailure};
use crate::error::Error;
use crate::policy::input::check_key;
use crate::policy::limits::{ceil_secs, KeyLimits, Limits, WindowSet};
use crate::state::Namespace;
use swin_core::UnixMs;
use swin_sync::{now, StrictView};

/// One key's decision (the strictest of its limits'), and what its headers say.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub decision: Decision,
    /// `RateLimit-Policy` items of the key's limits.
    pub policies: Arc<[Arc<str>]>,
    /// The policy the decision comes from.
    pub policy: Arc<str>,
    /// Why a hit was refused other than by its counts: `store_unreachable` (a strict
    /// namespace with `on_store_failure = "deny"` whose store cannot be asked).
    pub reason: Option<&'static str>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }

    pub fn answer(&self) -> HitAnswer {
        HitAnswer {
            reason: self.reason,
            ..HitAnswer::from(&self.decision)
        }
    }
}

#[derive(Debug, Serialize)]
pub struct HitAnswer {
    pub allowed: bool,
    pub limit: f64,
    pub remaining: f64,
    /// Seconds until the counts this answer saw weigh nothing (GCRA: the bucket is full).
    pub reset_after: f64,
    /// Seconds until the same hit would pass; 0 when it passed.
    pub retry_after: f64,
    /// Set when the hit was refused for another reason than its counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// A refund's answer: how much it gave back (at most the cost asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunded: Option<f64>,
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
        }
    }
}

/// A GCRA limit as a quota policy: `burst` units, refilled over `burst` emission
/// intervals.
fn gcra_policy(g: &Gcra) -> String {
    let refill = g
        .emission_interval()
        .saturating_mul(g.burst().clamp(1, i64::from(u32::MAX)) as u32);
    format!("\"gcra\";q={};w={}", g.burst(), ceil_secs(refill))
}

fn gcra_verdict(g: &Gcra, decision: Decision) -> Verdict {
    Verdict {
        decision,
        policies: Arc::from([Arc::from(gcra_policy(g))]),
        policy: Arc::from("gcra"),
        reason: None,
    }
}

/// Everything `take` checks before it spends: the key, the cost, and that the namespace
/// has limits the cost fits. A batch checks every hit this way before spending any.
pub fn validate(ns: &Namespace, namespace: &str, key: &str, cost: f64) -> Result<(), Error> {
    check_key(key)?;
    Ok(limits_of(ns, namespace)?.for_key(key).check_cost(cost)?)
}

/// The namespace's limits; a namespace that only counts has none to decide against.
pub fn limits_of<'a>(ns: &'a Namespace, namespace: &str) -> Result<&'a Limits, Error> {
    ns.limits.as_ref().ok_or_else(|| {
        Error::BadRequest(format!(
            "namespace {namespace:?} has no limits to decide against"
        ))
    })
}

/// Decides a hit of `cost` on `key` and, unless `dry_run`, spends it when allowed (and
/// when denied too if the namespace counts denied hits).
pub async fn take(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
    dry_run: bool,
) -> Result<Verdict, Error> {
    validate(ns, namespace, key, cost)?;
    ns.first_touch(&[key], !dry_run).await;
    take_touched(ns, namespace, key, cost, dry_run).await
}

/// [`take`] of a key already validated and touched.
pub(crate) async fn take_touched(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
    dry_run: bool,
) -> Result<Verdict, Error> {
    let limits = limits_of(ns, namespace)?;
    take_under(
        ns,
        key,
        limits.for_key(key),
        cost,
        dry_run,
        limits.count_denied,
    )
    .await
}

/// Decides a hit of `cost` on `key` under `limits` (the key's own, or a descriptor
/// rule's), in the namespace's sync and admission mode. The key and cost are valid, and
/// the caller has touched the key (see [`Namespace::first_touch`]).
pub async fn take_under(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    cost: f64,
    dry_run: bool,
    count_denied: bool,
) -> Result<Verdict, Error> {
    let namespace = ns.sync.name();
    let now = now();
    let set = match limits {
        KeyLimits::Gcra(g) => {
            let cost = g.units(cost)?;
            if let (Admission::Strict { on_store_failure }, false) = (ns.admission, dry_run) {
                match ns.sync.admit_bucket(g, key, cost, now).await {
                    Ok(v) => {
                        if !v.allowed && count_denied {
                            ns.sync.spend(g, key, cost, now, true).await?;
                        }
                        return Ok(gcra_verdict(g, bucket_decision(g, &v, now, cost)?));
                    }
                    Err(_) if on_store_failure == OnStoreFailure::Deny => {
                        return Ok(Verdict {
                            reason: Some("store_unreachable"),
                            ..gcra_verdict(g, gcra_unreachable(g))
                        });
                    }
                    // on_store_failure = "local": decided on the local bucket, pushed later
                    Err(_) => {}
                }
            }
            let d = if dry_run {
                ns.sync.dry_run(g, key, cost, now).await?
            } else {
                ns.sync.spend(g, key, cost, now, count_denied).await?
            };
            return Ok(gcra_verdict(g, d));
        }
        KeyLimits::Windows(set) => set,
    };
    if let (Admission::Strict { on_store_failure }, false) = (ns.admission, dry_run) {
        match ns.sync.admit(key, set, cost, now).await {
            Ok(views) => {
                return strict_verdict(ns, set, &views, key, cost, now, count_denied).await
            }
            Err(_) if on_store_failure == OnStoreFailure::Deny => {
                return Ok(unreachable_verdict(set, now))
            }
            // on_store_failure = "local": decided below on the local view, counted
            // locally and pushed later, as eventual admission does
            Err(_) => {}
        }
    }
    let counters = ns.sync.counters();
    // counted now, every window at once (synchronous increments of the key share a
    // round trip); the decision is on the counts before this hit
    let counted = if dry_run {
        Vec::new()
    } else {
        together(
            ns.counts_in_the_store(),
            set.iter()
                .map(|l| ns.sync.increment(key, l.window.secs(), cost, now)),
        )
        .await
    };
    if counted.iter().any(Result::is_err) {
        let back = set
            .iter()
            .zip(&counted)
            .filter(|(_, r)| r.is_ok())
            .map(|(l, _)| ns.sync.increment(key, l.window.secs(), -cost, now));
        futures_util::future::join_all(back).await;
    }
    let counted: Vec<swin_core::WindowRate> = counted.into_iter().collect::<Result<_, _>>()?;
    // the strictest so far, as Decision::strictest picks it (the last of equals)
    let mut strictest: Option<(usize, Decision)> = None;
    for (i, l) in set.iter().enumerate() {
        let (current, previous) = match counted.get(i) {
            Some(r) => (r.current - cost, r.previous),
            None => {
                let r = counters.table(l.window.secs())?.rate(key, now, None);
                (r.current, r.previous)
            }
        };
        let d = l.decide(current, previous, now, cost)?;
        if strictest.is_none_or(|(_, s)| d.cmp_strictness(&s).is_ge()) {
            strictest = Some((i, d));
        }
    }
    let Some((i, decision)) = strictest else {
        return Err(Error::BadRequest(format!(
            "key {key:?} has no limits in namespace {namespace:?}"
        )));
    };
    if !decision.allowed && !dry_run && !count_denied {
        let back = set
            .iter()
            .map(|l| ns.sync.increment(key, l.window.secs(), -cost, now));
        for r in futures_util::future::join_all(back).await {
            r?;
        }
    }
    Ok(Verdict {
        decision,
        policies: set.items().clone(),
        policy: set.name(i).clone(),
        reason: None,
    })
}

/// A strict admission's answer: admitted or not as the quota said; the figures from the
/// window as the store last showed it. The counts used before this hit are the window's
/// count less what this node holds unused (and less this hit, when admitted). Denied
/// hits of a `count_denied` namespace still count, as plain increments.
pub(crate) async fn strict_verdict(
    ns: &Namespace,
    set: &WindowSet,
    views: &[StrictView],
    key: &str,
    cost: f64,
    now: UnixMs,
    count_denied: bool,
) -> Result<Verdict, Error> {
    let mut strictest: Option<(usize, Decision)> = None;
    for (i, (l, v)) in set.iter().zip(views).enumerate() {
        let spent = if v.allowed { cost } else { 0.0 };
        let before = (v.current - v.unused - spent).max(0.0);
        let mut d = l.decide(before, v.previous, now, cost)?;
        if v.allowed {
            d.allowed = true;
            d.retry_after = std::time::Duration::ZERO;
            d.remaining = d.remaining.max(v.unused.floor());
        } else if d.allowed {
            // the counts leave room, but other nodes hold it: it comes back to the store
            // when they do not use it
            d.allowed = false;
            d.remaining = 0.0;
            d.retry_after = std::time::Duration::from_millis(swin_sync::IDLE_MS as u64);
        }
        if strictest.is_none_or(|(_, s)| d.cmp_strictness(&s).is_ge()) {
            strictest = Some((i, d));
        }
    }
    let Some((i, decision)) = strictest else {
        return Err(Error::BadRequest(format!("key {key:?} has no limits")));
    };
    if !decision.allowed && count_denied {
        for l in set {
            ns.sync.increment(key, l.window.secs(), cost, now).await?;
        }
    }
    Ok(Verdict {
        decision,
        policies: set.items().clone(),
        policy: set.name(i).clone(),
        reason: None,
    })
}

/// A strict GCRA admission's answer: admitted or not as the reservation said; the
/// figures from the bucket as the store last showed it (every node's grants counted as
/// spent) with this node's unspent units added back.
pub(crate) fn bucket_decision(
    g: &Gcra,
    v: &swin_sync::BucketView,
    now: UnixMs,
    cost: i64,
) -> Result<Decision, Error> {
    let now_ns = now.0.saturating_mul(1_000_000);
    let mut d = g.dry_run(v.tat_ns, now_ns, cost)?.decision;
    if v.allowed {
        let room = g.dry_run(v.tat_ns, now_ns, 0)?.decision.remaining;
        d.allowed = true;
        d.retry_after = std::time::Duration::ZERO;
        d.remaining = room + v.unused as f64;
    } else if d.allowed {
        // the bucket has the units but a reservation's share or horizon left them out:
        // ask again in a horizon
        d.allowed = false;
        d.remaining = 0.0;
        d.retry_after = swin_sync::horizon(g);
    }
    Ok(d)
}

/// A strict GCRA namespace with `on_store_failure = "deny"` whose store cannot be asked.
fn gcra_unreachable(g: &Gcra) -> Decision {
    Decision {
        allowed: false,
        limit: g.burst() as f64,
        remaining: 0.0,
        reset_after: std::time::Duration::ZERO,
        retry_after: std::time::Duration::from_secs(1),
    }
}

/// Strict, `on_store_failure = "deny"`, and the store cannot be asked: refused.
pub(crate) fn unreachable_verdict(set: &WindowSet, now: UnixMs) -> Verdict {
    let l = &set[0];
    let start_ms = l.window.start_of(now) * 1000;
    let to_end = (start_ms + i64::from(l.window.secs()) * 1000 - now.0).max(0);
    Verdict {
        decision: Decision {
            allowed: false,
            limit: l.limit,
            remaining: 0.0,
            reset_after: std::time::Duration::from_millis(to_end as u64),
            retry_after: std::time::Duration::from_secs(1),
        },
        policies: set.items().clone(),
        policy: set.name(0).clone(),
        reason: Some("store_unreachable"),
    }
}

/// Awaits every future: all at once when `at_once` (their store calls then share round
/// trips), else one after another (work that never waits on the store gains nothing
/// from being polled together).
pub async fn together<F: std::future::Future>(
    at_once: bool,
    futures: impl ExactSizeIterator<Item = F>,
) -> Vec<F::Output> {
    if at_once {
        return futures_util::future::join_all(futures).await;
    }
    let mut out = Vec::with_capacity(futures.len());
    for f in futures {
        out.push(f.await);
    }
    out
}

/// First touch for the keys of a request of several hits: one read per namespace for all
/// of its keys (see [`Namespace::first_touch`]).
pub async fn touch_all<'a>(hits: &[(&'a Namespace, &'a str)], counting: bool) {
    let mut touched: Vec<&Namespace> = Vec::new();
    for &(ns, _) in hits {
        if touched.iter().any(|n| std::ptr::eq(*n, ns)) {
            continue;
        }
        let keys: Vec<&str> = hits
            .iter()
            .filter(|(o, _)| std::ptr::eq(*o, ns))
            .map(|&(_, k)| k)
            .collect();
        ns.first_touch(&keys, counting).await;
        touched.push(ns);
    }
}

/// The results of a request's hits, each `Some` when it succeeded, and the first failure
/// with its index.
pub fn first_failure<T, E>(results: Vec<Result<T, E>>) -> (Vec<Option<T>>, Option<(usize, E)>) {
    let mut out = Vec::with_capacity(results.len());
    let mut failed = None;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => out.push(Some(v)),
            Err(e) => {
                out.push(None);
                failed.get_or_insert((i, e));
            }
        }
    }
    (out, failed)
}
