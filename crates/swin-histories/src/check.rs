//! The checks of a history against each mode's promise (docs/api.md, docs/design.md):
//! (a) exactly once — every key's store count within what acknowledged requests
//! charged and what requests of unknown outcome may have (each at most once), in every
//! mode (periodic sync counts exactly too; only its admission is loose);
//! (b) bounds — under strict admission, what a key admitted within its limit plus
//! what was given back (periodic and synchronous admission are not bounded so: the
//! first over-admits by a sync period, the second by hits decided while its store is
//! away); (c) idempotency — every answer kept under one `Idempotency-Key` is the first
//! one, byte for byte.

use std::collections::{BTreeMap, BTreeSet};

use crate::accounting::{tally, Key};
use crate::history::{Answer, Disruption, Event, Kind, Request};
pub use crate::verdict::{Expect, Report, Violation, PUSH_MS};

/// A count off by less than this is equal (costs with fractions are summed in floating point).
const EPSILON: f64 = 1e-6;

/// Operations answered by a node that was killed before its next successful sync
/// could push them (docs/design.md, "How consistent is it": a node that crashes loses
/// at most the hits it took since its last successful sync): from a sync period and a
/// store timeout before the kill, or from the start of a cut or pause that had not
/// ended by then.
pub fn lossy(history: &[Request], expect: &Expect) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let away = |e: &&Event| e.disruption == Disruption::Away;
    for kill in expect
        .events
        .iter()
        .filter(|e| e.disruption == Disruption::Kill)
    {
        let t = kill.start_ms;
        let mut from = t.saturating_sub(expect.sync_ms + PUSH_MS);
        for e in expect.events.iter().filter(away) {
            let here = e.node.is_none() || e.node == kill.node;
            if here && e.start_ms < t && e.end_ms + expect.sync_ms + PUSH_MS > from {
                from = from.min(e.start_ms);
            }
        }
        let struck = history
            .iter()
            .filter(|r| Some(r.node) == kill.node && r.end_ms >= from && r.start_ms <= t);
        out.extend(struck.map(|r| r.op));
    }
    out
}

/// Runs every check.
pub fn check(history: &[Request], expect: &Expect) -> Report {
    let mut report = Report::default();
    exactly_once(history, expect, &mut report);
    bounds(history, expect, &mut report);
    idempotency(history, &mut report);
    crate::reservations::reservations(history, &expect.strict_limits, &mut report);
    crate::leases::leases(history, &mut report);
    crate::answers::answers(history, expect, &mut report);
    report
}

/// Short list of operations for a message: the first few and how many more.
fn some(ops: &[u64]) -> String {
    const SHOWN: usize = 12;
    let head: Vec<String> = ops.iter().take(SHOWN).map(u64::to_string).collect();
    let more = ops.len().saturating_sub(SHOWN);
    if more > 0 {
        format!("[{} …and {more} more]", head.join(" "))
    } else {
        format!("[{}]", head.join(" "))
    }
}

fn exactly_once(history: &[Request], expect: &Expect, report: &mut Report) {
    let tallies = tally(history, &lossy(history, expect));
    // strict admission: a node killed holding quota leaves it counted until its window
    // ends (docs/api.md, "Quota goes back"), so the store may hold more than was charged
    let killed = expect
        .events
        .iter()
        .any(|e| e.disruption == Disruption::Kill);
    let unbounded = killed && !expect.strict_limits.is_empty();
    let mut keys: Vec<&Key> = tallies.keys().chain(expect.store.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        report.checks += 1;
        let stored = expect.store.get(key).copied().unwrap_or(0.0);
        let t = tallies.get(key).cloned().unwrap_or_default();
        let hi = if unbounded { f64::INFINITY } else { t.hi };
        if stored < t.lo - EPSILON || stored > hi + EPSILON {
            let what = format!(
                "store holds {stored}, acknowledged requests charged {}..{} ({} ops, {} of unknown outcome {}); off by {}",
                t.lo,
                t.hi,
                t.ops.len(),
                t.unknown.len(),
                some(&t.unknown),
                if stored < t.lo { stored - t.lo } else { stored - t.hi },
            );
            let mut ops = t.unknown.clone();
            ops.extend(in_flight(history, &t.ops, &expect.events));
            report.violations.push(Violation {
                check: "exactly-once",
                key: format!("{}/{}", key.0, key.1),
                what,
                ops,
            });
        }
    }
}

/// Which of `ops` had an attempt in flight on a node as its relay lost a store reply.
fn in_flight(history: &[Request], ops: &[u64], events: &[Event]) -> Vec<u64> {
    let lost: Vec<&Event> = events
        .iter()
        .filter(|e| e.disruption == Disruption::ReplyLost)
        .collect();
    let mut out: Vec<u64> = history
        .iter()
        .filter(|r| ops.contains(&r.op))
        .filter(|r| {
            lost.iter()
                .any(|e| e.node == Some(r.node) && r.start_ms <= e.end_ms && r.end_ms >= e.start_ms)
        })
        .map(|r| r.op)
        .collect();
    out.dedup();
    out
}

/// The most any runtime limit set on a key allowed (any `PUT`, whatever its answer).
fn runtime_limits(history: &[Request]) -> BTreeMap<Key, f64> {
    let mut out: BTreeMap<Key, f64> = BTreeMap::new();
    for r in history.iter().filter(|r| r.kind == Kind::SetLimits) {
        let most = r.body["limits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["limit"].as_f64())
            .fold(0.0, f64::max);
        let e = out.entry((r.ns.clone(), r.key.clone())).or_insert(0.0);
        *e = e.max(most);
    }
    out
}

fn bounds(history: &[Request], expect: &Expect, report: &mut Report) {
    let runtime = runtime_limits(history);
    for (key, t) in tally(history, &BTreeSet::new()) {
        let Some(&config) = expect.strict_limits.get(&key.0) else {
            continue;
        };
        // a key whose limits changed at run time: the most any of them allowed
        let limit = &runtime.get(&key).map_or(config, |l| l.max(config));
        report.checks += 1;
        if t.admitted > limit + t.given_back + EPSILON {
            let what = format!(
                "admitted {} under a limit of {limit} with {} given back (refunds, commits)",
                t.admitted, t.given_back
            );
            report.violations.push(Violation {
                check: "bounds",
                key: format!("{}/{}", key.0, key.1),
                what,
                ops: t.ops.clone(),
            });
        }
    }
}

fn idempotency(history: &[Request], report: &mut Report) {
    let mut by_op: BTreeMap<u64, Vec<&Request>> = BTreeMap::new();
    for r in history.iter().filter(|r| r.idem.is_some()) {
        by_op.entry(r.op).or_default().push(r);
    }
    for (op, attempts) in by_op {
        let kept: Vec<&&Request> = attempts.iter().filter(|r| r.kept()).collect();
        if kept.len() < 2 {
            continue;
        }
        report.checks += 1;
        let first = &kept[0].answer;
        if let Some(other) = kept.iter().find(|r| &r.answer != first) {
            let (Answer::Status { status: s1, .. }, Answer::Status { status: s2, .. }) =
                (first, &other.answer)
            else {
                continue;
            };
            report.violations.push(Violation {
                check: "idempotency",
                key: format!("{}/{}", kept[0].ns, kept[0].key),
                what: format!(
                    "a retry answered {s2} where the first answer was {s1}, or another body"
                ),
                ops: vec![op],
            });
        }
    }
}
