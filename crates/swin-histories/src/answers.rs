//! Check (d), answers: a decision's `remaining` never promises what the next request of
//! the key is then refused, and a refusal's `retry_after` is never "now". A pair is
//! weighed only where nothing else could have moved the key between them: no other
//! request naming the key overlaps the pair, no fault of the nemesis either (nor ended
//! less than a tick and a push before it: a node answers from its own view until a sync
//! reaches the store again), and — where
//! a node decides from its own view (periodic, strict) — both on one node with no
//! request naming the key anywhere for a sync period and a store call before the first
//! (what other nodes took arrives with a sync).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::accounting::Key;
use crate::history::{Answer, Kind, Request};
use crate::verdict::{Expect, Report, Violation, PUSH_MS};

/// Slack for costs summed in floating point.
const EPSILON: f64 = 1e-6;

/// How long after a runtime limit change a pair of the key is not weighed.
const LIMITS_SETTLE_MS: u64 = 30_000;

/// How often an engine without a sync period (synchronous) syncs in the background: what
/// closes its breaker once the store is back.
const TICK_MS: u64 = 1_000;

/// The keys of the counts a request names (a batch: each item's; a reserve on the
/// namespace route: each of its keys; an extend or a commit on a namespace route: none
/// known here, so the namespace's every key — `"*"`).
fn keys_named(r: &Request) -> Vec<Key> {
    let one = |k: &str| (r.ns.clone(), k.to_owned());
    match r.kind {
        Kind::Batch => r.body["hits"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| {
                        (
                            i["namespace"].as_str().unwrap_or_default().to_owned(),
                            i["key"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ if !r.key.is_empty() => vec![one(&r.key)],
        Kind::Reserve => r.body["keys"]
            .as_array()
            .map(|ks| ks.iter().filter_map(|k| k.as_str()).map(one).collect())
            .unwrap_or_default(),
        _ => vec![one("*")],
    }
}

/// A decision on one key: allowed with `remaining`, or refused, with its cost.
#[derive(Debug, Clone, Copy)]
struct Decision {
    allowed: bool,
    remaining: f64,
    retry_after: f64,
}

/// `r`'s decision on `key`: over several keys, that key's part of the answer.
fn decision(r: &Request, key: &str) -> Option<Decision> {
    let Answer::Status { status, .. } = &r.answer else {
        return None;
    };
    let mut v: Value = r.json();
    if !matches!(*status, 200 | 429) {
        return None;
    }
    if let Some(parts) = v["keys"].as_array() {
        v = parts.iter().find(|p| p["key"] == key)?.clone();
    }
    if !v["allowed"].is_boolean() {
        return None;
    }
    Some(Decision {
        allowed: v["allowed"] == true,
        remaining: v["remaining"].as_f64()?,
        retry_after: v["retry_after"].as_f64().unwrap_or(0.0),
    })
}

/// Whether `r` is a decision the check weighs: a hit or a single-key reserve or commit.
fn weighed(r: &Request) -> bool {
    !r.key.is_empty() && matches!(r.kind, Kind::Hit | Kind::Reserve | Kind::Commit)
}

/// The cost `b` asks to be admitted for.
fn asked(b: &Request) -> Option<f64> {
    match b.kind {
        Kind::Hit if b.body["dry_run"] != true => b.body["cost"].as_f64(),
        Kind::Reserve => b.body["cost"].as_f64(),
        _ => None,
    }
}

pub fn answers(history: &[Request], expect: &Expect, report: &mut Report) {
    let mut by_key: BTreeMap<Key, Vec<&Request>> = BTreeMap::new();
    let mut wild: Vec<&Request> = Vec::new();
    for r in history {
        for k in keys_named(r) {
            if k.1 == "*" {
                wild.push(r);
            } else {
                by_key.entry(k).or_default().push(r);
            }
        }
    }
    for (key, mut rs) in by_key {
        rs.sort_by_key(|r| (r.start_ms, r.op));
        for (i, a) in rs.iter().enumerate() {
            let Some(da) = decision(a, &key.1).filter(|_| weighed(a)) else {
                continue;
            };
            if !da.allowed && da.retry_after <= 0.0 && a.kind == Kind::Hit {
                report.checks += 1;
                report.violations.push(Violation {
                    check: "answers",
                    key: format!("{}/{}", key.0, key.1),
                    what: "a refusal answered retry_after 0: retry now".into(),
                    ops: vec![a.op],
                });
            }
            let Some(b) = rs.get(i + 1) else { continue };
            let (Some(db), Some(cost)) = (decision(b, &key.1), asked(b)) else {
                continue;
            };
            if !da.allowed || db.allowed || b.start_ms < a.end_ms {
                continue;
            }
            if !quiet(a, b, &rs, i, &wild, &key, expect) {
                continue;
            }
            report.checks += 1;
            if cost <= da.remaining - EPSILON {
                report.violations.push(Violation {
                    check: "answers",
                    key: format!("{}/{}", key.0, key.1),
                    what: format!(
                        "op {} answered remaining {} and the next request of the key, op {} for {cost}, was refused with nothing between",
                        a.op, da.remaining, b.op
                    ),
                    ops: vec![a.op, b.op],
                });
            }
        }
    }
}

/// Whether nothing but `a` and `b` (the key's requests `rs[i]` and `rs[i + 1]`) could
/// have moved the key between them, within the mode's bound.
fn quiet(
    a: &Request,
    b: &Request,
    rs: &[&Request],
    i: usize,
    wild: &[&Request],
    key: &Key,
    expect: &Expect,
) -> bool {
    let eventual_local = expect.sync_ms > 0;
    let lead = if eventual_local {
        expect.sync_ms + PUSH_MS
    } else {
        0
    };
    // nodes may hold different configs after a reload, and a key's runtime
    // limits reach a node's cache within a few seconds of their change
    let reloaded = expect.events.iter().any(|e| e.what.starts_with("reload"));
    if (eventual_local || reloaded) && a.node != b.node {
        return false;
    }
    let retuned = rs.iter().any(|r| {
        matches!(r.kind, Kind::SetLimits | Kind::DeleteLimits)
            && r.start_ms <= b.end_ms
            && r.end_ms + LIMITS_SETTLE_MS >= a.start_ms
    });
    if retuned {
        return false;
    }
    let from = a.start_ms.saturating_sub(lead);
    let busy =
        |r: &&Request| r.op != a.op && r.op != b.op && r.start_ms <= b.end_ms && r.end_ms >= from;
    let ns_wild = wild.iter().any(|r| r.ns == key.0 && busy(r));
    let earlier = if i > 0 {
        rs[..i].iter().any(busy)
    } else {
        false
    };
    let others = rs[i + 1..].iter().any(busy);
    // a node cut off, paused or started again answers from its own view until a sync
    // reaches the store again (a synchronous engine's tick is a second), so a fault
    // weighs on the pairs up to a tick and a push after it ended
    let after = lead.max(TICK_MS + PUSH_MS);
    let faults = expect
        .events
        .iter()
        .any(|e| e.start_ms <= b.end_ms && e.end_ms + after >= a.start_ms);
    !(ns_wild || earlier || others || faults)
}
