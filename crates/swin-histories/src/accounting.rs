//! What a history says each key should hold: per key, the range the store's count may
//! take (acknowledged charges exactly, each request of unknown outcome at most once),
//! and what was admitted against what was given back (for the bound of strict
//! admission). Charges follow docs/api.md: an allowed hit or batch item its cost, an
//! increment its value, a refund minus what it `refunded`, a reservation its estimate
//! and every extend, then at its commit `charged − given_back − owed` as the answer
//! says (a reservation never committed stays at its total).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::history::{outcome, Kind, Outcome, Request};

/// A key: its namespace and name.
pub type Key = (String, String);

/// What one key's requests add up to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// The least the store may hold.
    pub lo: f64,
    /// The most the store may hold.
    pub hi: f64,
    /// Costs admitted and acknowledged (hits, batch items, reserves, extends).
    pub admitted: f64,
    /// What may have made room again (refunds, give-backs, acknowledged or not).
    pub given_back: f64,
    /// Operations that charged the key.
    pub ops: Vec<u64>,
    /// Operations of unknown outcome among them.
    pub unknown: Vec<u64>,
}

/// A reservation as the history shows it.
#[derive(Debug)]
struct Resv {
    ns: String,
    keys: Vec<String>,
    /// Its total: the least and the most it may be.
    lo: f64,
    hi: f64,
    settled: bool,
    /// Commits of unknown outcome: their operation and cost.
    unknown_commits: Vec<(u64, f64)>,
}

#[derive(Debug, Default)]
struct Ledger {
    keys: BTreeMap<Key, Tally>,
    resv: BTreeMap<String, Resv>,
    /// Operations whose charge a crash may have lost (answered by a node killed before
    /// its next successful sync): counted as of unknown outcome.
    lossy: BTreeSet<u64>,
}

impl Ledger {
    fn tally(&mut self, ns: &str, key: &str) -> &mut Tally {
        self.keys
            .entry((ns.to_owned(), key.to_owned()))
            .or_default()
    }

    /// A charge of `cost` known to have happened (admitted: counts against a limit).
    fn charge(&mut self, op: u64, ns: &str, key: &str, cost: f64, admitted: bool) {
        let lossy = self.lossy.contains(&op);
        let t = self.tally(ns, key);
        if lossy {
            t.lo += cost.min(0.0);
            t.hi += cost.max(0.0);
            t.admitted += if admitted { cost } else { 0.0 };
            t.ops.push(op);
            t.unknown.push(op);
            return;
        }
        t.lo += cost;
        t.hi += cost;
        if admitted {
            t.admitted += cost;
        }
        t.ops.push(op);
    }

    /// A change of unknown outcome: somewhere in `lo..=hi` (one of them 0).
    fn maybe(&mut self, op: u64, ns: &str, key: &str, lo: f64, hi: f64) {
        let t = self.tally(ns, key);
        t.lo += lo;
        t.hi += hi;
        t.given_back += (-lo).max(0.0);
        t.ops.push(op);
        t.unknown.push(op);
    }
}

fn cost(body: &Value, field: &str) -> f64 {
    body[field].as_f64().unwrap_or(1.0)
}

/// Every key's tally over `history`, the charges of the operations in `lossy` taken
/// as of unknown outcome.
pub fn tally(history: &[Request], lossy: &BTreeSet<u64>) -> BTreeMap<Key, Tally> {
    let mut ops: BTreeMap<u64, Vec<&Request>> = BTreeMap::new();
    for r in history {
        ops.entry(r.op).or_default().push(r);
    }
    let mut ledger = Ledger {
        lossy: lossy.clone(),
        ..Ledger::default()
    };
    for (op, attempts) in &ops {
        let first = attempts[0];
        let out = outcome(attempts);
        match first.kind {
            Kind::Hit | Kind::Increment | Kind::Refund => single(&mut ledger, *op, first, &out),
            Kind::Batch => batch(&mut ledger, *op, first, &out),
            Kind::Reserve => reserve(&mut ledger, *op, first, &out),
            Kind::Extend => extend(&mut ledger, *op, first, &out),
            Kind::Commit => commit(&mut ledger, *op, first, &out),
            Kind::Rls => rls(&mut ledger, *op, first, &out),
            // leases hold slots, not counts; limit changes change no count
            Kind::Acquire | Kind::Renew | Kind::Release | Kind::SetLimits | Kind::DeleteLimits => {}
        }
    }
    unsettled(&mut ledger);
    ledger.keys
}

/// A hit, an increment or a refund of one key.
fn single(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    let (ns, key, b) = (&r.ns, &r.key, &r.body);
    match (r.kind, out) {
        (Kind::Hit, _) if b["dry_run"].as_bool() == Some(true) => {}
        (Kind::Hit, Outcome::Kept { status: 200, .. }) => {
            l.charge(op, ns, key, cost(b, "cost"), true)
        }
        (Kind::Hit, Outcome::Unknown) => l.maybe(op, ns, key, 0.0, cost(b, "cost")),
        (Kind::Increment, Outcome::Kept { status: 200, .. }) => {
            l.charge(op, ns, key, cost(b, "value"), false)
        }
        (Kind::Increment, Outcome::Unknown) => l.maybe(op, ns, key, 0.0, cost(b, "value")),
        (Kind::Refund, Outcome::Kept { status: 200, body }) => {
            let back = body["refunded"].as_f64().unwrap_or(0.0);
            l.charge(op, ns, key, -back, false);
            l.tally(ns, key).given_back += back;
        }
        (Kind::Refund, Outcome::Unknown) => l.maybe(op, ns, key, -cost(b, "cost"), 0.0),
        _ => {}
    }
}

/// `/v1/hits`: all or nothing.
fn batch(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    if r.body["dry_run"].as_bool() == Some(true) {
        return;
    }
    let items = r.body["hits"].as_array().cloned().unwrap_or_default();
    for item in items {
        let ns = item["namespace"].as_str().unwrap_or_default();
        let key = item["key"].as_str().unwrap_or_default();
        let c = cost(&item, "cost");
        match out {
            Outcome::Kept { status: 200, body } if body["spent"] != false => {
                l.charge(op, ns, key, c, true)
            }
            Outcome::Unknown => l.maybe(op, ns, key, 0.0, c),
            _ => {}
        }
    }
}

/// Envoy's `ShouldRateLimit`: `hits_addend` on each descriptor's counter key when the
/// answer is OK, nothing when OVER_LIMIT (all or nothing; denied hits not counted).
fn rls(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    let n = r.body["hits_addend"].as_f64().unwrap_or(1.0).max(1.0);
    let descriptors = r.body["descriptors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for d in &descriptors {
        let key = crate::rls::counter_key(d);
        match out {
            Outcome::Kept { status: 200, body } if body["overall_code"] == "OK" => {
                l.charge(op, &r.ns, &key, n, true)
            }
            Outcome::Unknown => l.maybe(op, &r.ns, &key, 0.0, n),
            _ => {}
        }
    }
}

/// The keys a reserve names: its key route's, or its body's.
fn reserve_keys(r: &Request) -> Vec<String> {
    if !r.key.is_empty() {
        return vec![r.key.clone()];
    }
    r.body["keys"]
        .as_array()
        .map(|ks| {
            ks.iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn reserve(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    let keys = reserve_keys(r);
    let c = cost(&r.body, "cost");
    match out {
        Outcome::Kept { status: 200, body } => {
            for k in &keys {
                l.charge(op, &r.ns, k, c, true);
            }
            if let Some(id) = body["reservation"].as_str() {
                let resv = Resv {
                    ns: r.ns.clone(),
                    keys,
                    lo: c,
                    hi: c,
                    settled: false,
                    unknown_commits: Vec::new(),
                };
                l.resv.insert(id.to_owned(), resv);
            }
        }
        Outcome::Unknown => {
            for k in &keys {
                l.maybe(op, &r.ns, k, 0.0, c);
            }
        }
        _ => {}
    }
}

fn extend(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    let id = r.body["reservation"].as_str().unwrap_or_default();
    let c = cost(&r.body, "cost");
    let Some(resv) = l.resv.get_mut(id) else {
        return;
    };
    let (ns, keys) = (resv.ns.clone(), resv.keys.clone());
    match out {
        Outcome::Kept { status: 200, .. } => {
            resv.lo += c;
            resv.hi += c;
            for k in &keys {
                l.charge(op, &ns, k, c, true);
            }
        }
        Outcome::Unknown => {
            resv.hi += c;
            for k in &keys {
                l.maybe(op, &ns, k, 0.0, c);
            }
        }
        _ => {}
    }
}

/// A settled key's part of a commit's answer: `charged`, and `given_back` + `owed`.
fn settlement(body: &Value, key: &str) -> (f64, f64) {
    let part = match body["keys"].as_array() {
        Some(parts) => parts
            .iter()
            .find(|p| p["key"] == key)
            .cloned()
            .unwrap_or(Value::Null),
        None => body.clone(),
    };
    let f = |n: &str| part[n].as_f64().unwrap_or(0.0);
    (f("charged"), f("given_back") + f("owed"))
}

fn commit(l: &mut Ledger, op: u64, r: &Request, out: &Outcome) {
    let id = r.body["reservation"].as_str().unwrap_or_default();
    let c = cost(&r.body, "cost");
    let Some(resv) = l.resv.get_mut(id) else {
        return;
    };
    if resv.settled {
        return;
    }
    match out {
        Outcome::Kept { status: 200, body } if body["committed"] == true => {
            resv.settled = true;
            let (ns, keys) = (resv.ns.clone(), resv.keys.clone());
            for k in &keys {
                let (charged, back) = settlement(body, k);
                l.charge(op, &ns, k, charged - back, false);
                l.tally(&ns, k).given_back += back;
            }
        }
        Outcome::Unknown => resv.unknown_commits.push((op, c)),
        _ => {}
    }
}

/// Reservations whose every commit was of unknown outcome: settled once at one of
/// those costs, or still at their total.
fn unsettled(l: &mut Ledger) {
    let mut changes = Vec::new();
    for resv in l.resv.values().filter(|r| !r.settled) {
        let Some(&(first, _)) = resv.unknown_commits.first() else {
            continue;
        };
        let costs = resv.unknown_commits.iter().map(|(_, c)| *c);
        let lo = costs
            .clone()
            .map(|c| (c - resv.hi).min(0.0))
            .fold(0.0, f64::min);
        let hi = costs.map(|c| (c - resv.lo).max(0.0)).fold(0.0, f64::max);
        let others: Vec<u64> = resv
            .unknown_commits
            .iter()
            .skip(1)
            .map(|(op, _)| *op)
            .collect();
        for k in &resv.keys {
            changes.push((first, others.clone(), resv.ns.clone(), k.clone(), lo, hi));
        }
    }
    for (op, others, ns, k, lo, hi) in changes {
        l.maybe(op, &ns, &k, lo, hi);
        l.tally(&ns, &k).unknown.extend(others);
    }
}
