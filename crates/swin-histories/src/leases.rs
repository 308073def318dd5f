//! The bound of leases: at no instant are more slots of a `jobs` key certainly held
//! than its limit. A lease is certainly held from the end of the acquire that answered
//! it allowed until the earliest of: the start of any release naming it, and its lapse
//! as the history bounds it from below (the acquire's start plus its `ttl`, moved on by
//! each renewal answered `renewed` that began while it was certainly held, to that
//! renewal's start plus its `ttl`), less a margin for the node's reading of the store's
//! clock. An answer's `in_flight` past the limit is a violation too.

use std::collections::BTreeMap;

use crate::history::{Kind, Request};
use crate::setup::JOBS_LIMIT;
use crate::verdict::{Report, Violation};

/// What a node's reading of the store's clock may be off by, with a round trip.
const MARGIN_MS: u64 = 250;

#[derive(Debug)]
struct Lease {
    key: String,
    count: u64,
    from: u64,
    until: u64,
    ops: Vec<u64>,
}

fn ttl_ms(r: &Request) -> u64 {
    (r.body["ttl"].as_f64().unwrap_or(30.0) * 1000.0) as u64
}

/// Every lease an acquire answered allowed, held as the history proves.
fn held(history: &[Request]) -> BTreeMap<String, Lease> {
    let mut leases: BTreeMap<String, Lease> = BTreeMap::new();
    let mut sorted: Vec<&Request> = history.iter().filter(|r| r.ns == "jobs").collect();
    sorted.sort_by_key(|r| (r.start_ms, r.op));
    for r in &sorted {
        let v = r.json();
        if r.kind != Kind::Acquire || !r.kept() || v["allowed"] != true {
            continue;
        }
        let Some(id) = v["lease"].as_str() else {
            continue;
        };
        leases.entry(id.to_owned()).or_insert(Lease {
            key: r.key.clone(),
            count: r.body["count"].as_u64().unwrap_or(1),
            from: r.end_ms,
            until: r.start_ms + ttl_ms(r),
            ops: vec![r.op],
        });
    }
    for r in &sorted {
        let Some(id) = r.body["lease"].as_str() else {
            continue;
        };
        let Some(l) = leases.get_mut(id) else {
            continue;
        };
        match r.kind {
            Kind::Release => l.until = l.until.min(r.start_ms),
            Kind::Renew
                if r.kept()
                    && r.json()["renewed"] == true
                    && r.start_ms + MARGIN_MS < l.until
                    && r.start_ms >= l.from =>
            {
                l.until = r.start_ms + ttl_ms(r);
                l.ops.push(r.op);
            }
            _ => {}
        }
    }
    for l in leases.values_mut() {
        l.until = l.until.saturating_sub(MARGIN_MS);
    }
    leases
}

pub fn leases(history: &[Request], report: &mut Report) {
    let limit = JOBS_LIMIT;
    for r in history
        .iter()
        .filter(|r| r.kind == Kind::Acquire && r.kept())
    {
        let n = r.json()["in_flight"].as_u64().unwrap_or(0);
        report.checks += 1;
        if n > limit {
            report.violations.push(Violation {
                check: "leases",
                key: format!("jobs/{}", r.key),
                what: format!("an acquire answered in_flight {n} under a limit of {limit}"),
                ops: vec![r.op],
            });
        }
    }
    let leases = held(history);
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases.values().filter(|l| l.until > l.from) {
        by_key.entry(&l.key).or_default().push(l);
    }
    for (key, ls) in by_key {
        report.checks += 1;
        // at each lease's first instant, the slots of every lease held then
        let over = ls.iter().find_map(|l| {
            let at = l.from;
            let now: Vec<&&Lease> = ls.iter().filter(|o| o.from <= at && at < o.until).collect();
            let slots: u64 = now.iter().map(|o| o.count).sum();
            (slots > limit).then_some((at, slots, now))
        });
        if let Some((at, slots, now)) = over {
            report.violations.push(Violation {
                check: "leases",
                key: format!("jobs/{key}"),
                what: format!("{slots} slots certainly held at {at} ms under a limit of {limit}"),
                ops: now.iter().flat_map(|l| l.ops.clone()).collect(),
            });
        }
    }
}
