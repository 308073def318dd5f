//! What a report's bucket is to the quota service: checked, matched by the namespace's
//! rules, and the limit its proxies share (the key's effective limits).

use std::time::Duration;

use super::{BucketId, Usage, MAX_PAIRS_PER_BUCKET};
use crate::policy::keys::counter_key;
use crate::policy::limits::KeyLimits;
use crate::policy::rules::RuleLimit;
use crate::state::Namespace;

/// What a bucket's rule makes of it.
pub(super) enum Ruled {
    /// Divided: the limit per unit, and the counter key.
    Shared {
        limit: f64,
        unit: Duration,
        key: String,
    },
    /// Every request passes; counted on the key (in shadow) or nowhere.
    Allow(Option<String>),
    Deny,
    Abandon,
}

/// What `ns`'s rules make of a bucket.
pub(super) fn ruled(ns: &Namespace, bucket: &BucketId) -> Ruled {
    let Some(rules) = &ns.rules else {
        return Ruled::Abandon;
    };
    let entries: Vec<(&str, &str)> = bucket
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some(found) = rules.lookup(&entries) else {
        return Ruled::Abandon;
    };
    let key = counter_key(&found.counted(&entries));
    let rule = &found.rule;
    match &rule.limit {
        RuleLimit::Limited(_) if rule.shadow => Ruled::Allow(Some(key)),
        // the key's effective limits: a runtime limit set on it replaces the rule's
        RuleLimit::Limited(config) => match shared_limit(&ns.effective(&key, config)) {
            Some((limit, unit)) => Ruled::Shared { limit, unit, key },
            // every limit in shadow: nothing to divide, every request counted
            None => Ruled::Allow(Some(key)),
        },
        RuleLimit::Unlimited => Ruled::Allow(None),
        RuleLimit::Blocked if rule.shadow => Ruled::Allow(None),
        RuleLimit::Blocked => Ruled::Deny,
        RuleLimit::InFlight(_) => Ruled::Abandon,
    }
}

/// The limit a bucket's proxies share and the time it is over (a token bucket's fill
/// interval): of the limits that deny, the strictest in rate — a window's limit over
/// its length, a GCRA bucket's count over its period; `None` when every limit is in
/// shadow.
fn shared_limit(limits: &KeyLimits) -> Option<(f64, Duration)> {
    match limits {
        KeyLimits::Windows(set) => set
            .iter()
            .filter(|w| !w.shadow)
            .map(|w| (w.limit, u64::from(w.window.secs())))
            .min_by(|a, b| (a.0 / a.1 as f64).total_cmp(&(b.0 / b.1 as f64)))
            .map(|(limit, secs)| (limit, Duration::from_secs(secs))),
        KeyLimits::Gcra(g) => {
            // over whole seconds (Envoy reads a fill interval's seconds), the same rate
            let period = g.period().as_secs_f64().max(1e-9);
            let unit = period.ceil().max(1.0);
            Some((
                g.count() as f64 * unit / period,
                Duration::from_secs_f64(unit),
            ))
        }
    }
}

/// A bucket as a report names it, checked and sorted; `None` for one with no pairs
/// (nothing can be told about it).
pub(super) fn checked(bucket: &BucketId) -> Result<Option<BucketId>, String> {
    if bucket.is_empty() {
        return Ok(None);
    }
    if bucket.len() > MAX_PAIRS_PER_BUCKET {
        return Err(format!(
            "a bucket has {} pairs; at most {MAX_PAIRS_PER_BUCKET}",
            bucket.len()
        ));
    }
    if let Some((k, _)) = bucket.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(format!("bucket pair {k:?} has an empty key or value"));
    }
    let mut sorted = bucket.clone();
    sorted.sort();
    Ok(Some(sorted))
}

/// The keys of the report's buckets that `taken` keeps: first touched (their counts and
/// runtime limits, for those this node holds nothing of: one store read for all) before
/// they are divided.
pub(super) fn keys(
    ns: &Namespace,
    usages: &[Usage],
    taken: impl FnOnce(Vec<String>) -> Vec<String>,
) -> Vec<String> {
    let Some(rules) = &ns.rules else {
        return Vec::new();
    };
    let keys: Vec<String> = usages
        .iter()
        .filter_map(|u| {
            let bucket = checked(&u.bucket).ok()??;
            let entries: Vec<(&str, &str)> = bucket
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let found = rules.lookup(&entries)?;
            Some(counter_key(&found.counted(&entries)))
        })
        .collect();
    taken(keys)
}
