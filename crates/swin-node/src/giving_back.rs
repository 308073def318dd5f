//! Giving back: a hit allowed and then not wanted (a batch or an Envoy request denied as
//! a whole) is taken back out; a refund gives back hits admitted but not used, never
//! below zero, reading the cluster's count first.

use swin_core::{check_cost, Decision};

use crate::config::Admission;
use crate::decisions::{
    bucket_decision, limits_of, strict_verdict, unreachable_verdict, HitAnswer,
};
use crate::error::Error;
use crate::policy::input::check_key;
use crate::policy::limits::KeyLimits;
use crate::state::Namespace;
use swin_sync::now;

/// Takes back an allowed hit (a batch that was denied as a whole).
pub async fn give_back(ns: &Namespace, key: &str, cost: f64) -> Result<(), Error> {
    match ns.limits.as_ref().map(|l| l.for_key(key)) {
        Some(limits) => give_back_under(ns, key, limits, cost).await,
        None => Ok(()),
    }
}

/// Takes back a hit allowed under `limits` (the key's own, or a descriptor rule's).
pub async fn give_back_under(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    cost: f64,
) -> Result<(), Error> {
    let now = now();
    match limits {
        KeyLimits::Gcra(g) if is_strict(ns) => {
            ns.sync.give_back_units(key, g.units(cost)?, now);
        }
        KeyLimits::Gcra(g) => {
            ns.sync.refund_tokens(g, key, g.units(cost)?, now).await?;
        }
        KeyLimits::Windows(set) if is_strict(ns) => {
            ns.sync.give_back(key, set, cost, now);
        }
        KeyLimits::Windows(set) => {
            for l in set {
                ns.sync.increment(key, l.window.secs(), -cost, now).await?;
            }
        }
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
                refunded: Some(back as f64),
                ..HitAnswer::from(&d)
            });
        }
        KeyLimits::Gcra(g) => {
            let d = ns.sync.refund_tokens(g, key, g.units(cost)?, now).await?;
            return Ok(HitAnswer {
                refunded: Some(if d.allowed { cost } else { 0.0 }),
                ..HitAnswer::from(&d)
            });
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
            refunded: Some(back),
            ..after.answer()
        });
    }
    // the cluster's count of the key, not only this node's: a refund may come to a node
    // that did not admit the hits (or never held the key); a store that cannot be read
    // is an error, never a refund of nothing that says it succeeded
    if ns.sync.mode() != swin_sync::SyncMode::LocalOnly {
        ns.sync
            .load_key(key, now)
            .await
            .map_err(|e| Error::store(&e, "refund: read the key's count"))?;
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
        refunded: Some(refunded),
        ..HitAnswer::from(d)
    })
}
