//! Decisions: may a hit pass? The hit is decided against the key's limits and spent
//! when allowed (or denied too where the namespace counts denied hits); refunds give
//! back what was admitted and not used; a batch is decided as a whole, the strictest
//! decision winning, and a denied batch spends nothing.
//!
//! Window limits: the hit is counted first and the decision taken on the counts before
//! it; a denied hit is then taken back out (unless the namespace sets `count_denied`).
//! GCRA: the bucket's TAT moves by compare-and-swap only when the spend is allowed. Two
//! hits racing for the last unit can both be denied, never both allowed, on one node;
//! across nodes the namespace's sync mode bounds the over-admission (synchronous: none).

use std::sync::Arc;

use serde::Serialize;
use swin_core::{check_cost, Decision, Gcra};

use crate::config::{Admission, OnStoreFailure};
use crate::error::Error;
use crate::input::check_key;
use crate::limits::{ceil_secs, KeyLimits, Limits, WindowSet};
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
    check_cost(cost)?;
    match limits_of(ns, namespace)?.for_key(key) {
        KeyLimits::Gcra(g) => {
            g.units(cost)?;
        }
        KeyLimits::Windows(set) => {
            for l in set {
                l.check_cost(cost)?;
            }
        }
    }
    Ok(())
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
/// rule's), in the namespace's sync and admission mode. The key and cost are valid.
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
    // the strictest so far, as Decision::strictest picks it (the last of equals)
    let mut strictest: Option<(usize, Decision)> = None;
    for (i, l) in set.iter().enumerate() {
        let (current, previous) = if dry_run {
            let r = counters.table(l.window.secs())?.rate(key, now, None);
            (r.current, r.previous)
        } else {
            // counted now; the decision is on the counts before this hit
            let r = ns.sync.increment(key, l.window.secs(), cost, now).await?;
            (r.current - cost, r.previous)
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
        for l in set {
            ns.sync.increment(key, l.window.secs(), -cost, now).await?;
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
async fn strict_verdict(
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
fn bucket_decision(
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
fn unreachable_verdict(set: &WindowSet, now: UnixMs) -> Verdict {
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

/// Takes back an allowed hit (a batch that was denied as a whole).
pub async fn give_back(ns: &Namespace, key: &str, cost: f64) -> Result<(), Error> {
    let now = now();
    match &ns.limits.as_ref().map(|l| l.for_key(key)) {
        Some(KeyLimits::Gcra(g)) if is_strict(ns) => {
            ns.sync.give_back_units(key, g.units(cost)?, now);
        }
        Some(KeyLimits::Gcra(g)) => {
            ns.sync.refund_tokens(g, key, g.units(cost)?, now).await?;
        }
        Some(KeyLimits::Windows(set)) if is_strict(ns) => {
            ns.sync.give_back(key, set, cost, now);
        }
        Some(KeyLimits::Windows(set)) => {
            for l in set {
                ns.sync.increment(key, l.window.secs(), -cost, now).await?;
            }
        }
        None => {}
    }
    Ok(())
}

fn is_strict(ns: &Namespace) -> bool {
    matches!(ns.admission, Admission::Strict { .. })
}

/// Gives back `cost` of hits admitted but not used, in every window the key's limits
/// count in, never below zero (GCRA: Boulder's refund, never past a full bucket).
/// `allowed` says whether anything was given back; the rest describes the key after it,
/// as a dry run would.
pub async fn refund(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
) -> Result<HitAnswer, Error> {
    check_key(key)?;
    check_cost(cost)?;
    let limits = limits_of(ns, namespace)?.for_key(key);
    let now = now();
    let set = match limits {
        KeyLimits::Gcra(g) if is_strict(ns) => {
            // the units go back to this node, to spend again while its grant lasts
            let back = ns.sync.give_back_units(key, g.units(cost)?, now);
            let d = bucket_decision(g, &ns.sync.bucket_view(key, now), now, 0)?;
            return Ok(HitAnswer {
                allowed: back > 0,
                ..HitAnswer::from(&d)
            });
        }
        KeyLimits::Gcra(g) => {
            let d = ns.sync.refund_tokens(g, key, g.units(cost)?, now).await?;
            return Ok(HitAnswer::from(&d));
        }
        KeyLimits::Windows(set) => set,
    };
    if is_strict(ns) {
        // the quota goes back to this node, to admit again
        let back = ns.sync.give_back(key, set, cost, now);
        // the key after it: a hit of 0 is answered from what this node holds
        let views = ns.sync.admit(key, set, 0.0, now).await;
        let after = match views {
            Ok(views) => strict_verdict(ns, set, &views, key, 0.0, now, false).await?,
            Err(_) => unreachable_verdict(set, now),
        };
        return Ok(HitAnswer {
            allowed: back > 0.0,
            retry_after: 0.0,
            reason: None,
            ..after.answer()
        });
    }
    let counters = ns.sync.counters();
    let mut refunded = 0.0f64;
    let mut decisions = Vec::new();
    for l in set {
        let table = counters.table(l.window.secs())?;
        let current = table.rate(key, now, None).current;
        let back = cost.min(current.max(0.0));
        if back > 0.0 {
            ns.sync.increment(key, l.window.secs(), -back, now).await?;
            refunded = refunded.max(back);
        }
        let r = table.rate(key, now, None);
        decisions.push((*l, l.decide(r.current, r.previous, now, 0.0)?));
    }
    let Some((_, d)) = Decision::strictest(&decisions, |(_, d)| d) else {
        return Err(Error::BadRequest(format!(
            "key {key:?} has no limits in namespace {namespace:?}"
        )));
    };
    Ok(HitAnswer {
        allowed: refunded > 0.0,
        retry_after: 0.0,
        ..HitAnswer::from(d)
    })
}

/// One hit of a batch.
#[derive(Debug)]
pub struct Hit<'a> {
    pub ns: Arc<Namespace>,
    pub namespace: &'a str,
    pub key: &'a str,
    pub cost: f64,
}

/// What a batch decided: each hit's verdict, in order, and whether any was denied (then
/// nothing of the batch was spent).
#[derive(Debug)]
pub struct BatchVerdict {
    pub verdicts: Vec<Verdict>,
    pub denied: bool,
}

/// Decides every hit of a batch (Boulder's BatchSpend). Every hit is checked before any
/// is spent, so a bad one leaves the batch untouched; when one is denied, or fails while
/// spending (a full table), what the others took is given back. Errors come with the
/// failing hit's index.
pub async fn decide_all(hits: &[Hit<'_>], dry_run: bool) -> Result<BatchVerdict, (usize, Error)> {
    for (i, h) in hits.iter().enumerate() {
        validate(&h.ns, h.namespace, h.key, h.cost).map_err(|e| (i, e))?;
    }
    let mut verdicts: Vec<Verdict> = Vec::with_capacity(hits.len());
    for (i, h) in hits.iter().enumerate() {
        match take(&h.ns, h.namespace, h.key, h.cost, dry_run).await {
            Ok(v) => verdicts.push(v),
            Err(e) => {
                give_back_all(hits, &verdicts, dry_run)
                    .await
                    .map_err(|e| (i, e))?;
                return Err((i, e));
            }
        }
    }
    let denied = verdicts.iter().any(|v| !v.allowed());
    if denied {
        give_back_all(hits, &verdicts, dry_run)
            .await
            .map_err(|e| (0, e))?;
    }
    Ok(BatchVerdict { verdicts, denied })
}

/// Gives back every allowed hit of `verdicts` (the first hits of `hits`).
async fn give_back_all(hits: &[Hit<'_>], verdicts: &[Verdict], dry_run: bool) -> Result<(), Error> {
    if dry_run {
        return Ok(());
    }
    for (h, v) in hits.iter().zip(verdicts) {
        if v.allowed() {
            give_back(&h.ns, h.key, h.cost).await?;
        }
    }
    Ok(())
}
