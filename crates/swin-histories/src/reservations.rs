//! What a reservation's answers say against what its history allows: an extend's
//! answered `total` and a commit's answered `estimate` lie within the totals the history
//! allows (the reserve's cost, the acknowledged extends, each extend of unknown outcome
//! at most once), and a commit is never answered 404 `unknown_reservation` while the
//! history holds the reservation open (opened, never settled, no commit of unknown
//! outcome before it). The counts alone miss both: a commit is booked as its answer
//! says, so a total raised by an extend answered "nothing was changed" gives back what
//! it charged, and a commit lost then 404 leaves the estimate charged, as a reservation
//! never committed does. Under eventual admission a commit under the estimate on a key
//! of its own gives back all the difference (nothing else counts there to keep it
//! below zero).

use std::collections::BTreeMap;

use crate::history::{error_code, outcome, Kind, Outcome, Request};
use crate::plans::is_own;
use crate::verdict::{Report, Violation};

const EPSILON: f64 = 1e-6;

/// A reservation as its history bounds it.
#[derive(Debug)]
struct Held {
    ns: String,
    lo: f64,
    hi: f64,
    settled: bool,
    unknown_commit: bool,
    /// When the reserve's window ends (ms into the run, from its answer's `reset_after`).
    window_end_ms: f64,
}

fn outside(check: &'static str, h: &Held, id: &str, what: String, op: u64) -> Violation {
    Violation {
        check,
        key: format!("{}/{id}", h.ns),
        what,
        ops: vec![op],
    }
}

/// Checks the reservations of `history`; `strict` names the namespaces under strict
/// admission (their give-backs are not checked: see [`give_back`]).
pub fn reservations(history: &[Request], strict: &BTreeMap<String, f64>, report: &mut Report) {
    let mut ops: BTreeMap<u64, Vec<&Request>> = BTreeMap::new();
    for r in history {
        ops.entry(r.op).or_default().push(r);
    }
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    for (&op, attempts) in &ops {
        let first = attempts[0];
        let out = outcome(attempts);
        let id = first.body["reservation"].as_str().unwrap_or_default();
        let c = first.body["cost"].as_f64().unwrap_or(1.0);
        match (first.kind, &out) {
            (Kind::Reserve, Outcome::Kept { status: 200, body }) => {
                if let Some(id) = body["reservation"].as_str() {
                    let h = Held {
                        ns: first.ns.clone(),
                        lo: c,
                        hi: c,
                        settled: false,
                        unknown_commit: false,
                        window_end_ms: first.end_ms as f64
                            + body["reset_after"].as_f64().unwrap_or(0.0) * 1000.0,
                    };
                    held.insert(id.to_owned(), h);
                }
            }
            (Kind::Extend, _) => {
                let Some(h) = held.get_mut(id) else { continue };
                match &out {
                    Outcome::Kept { status: 200, body } => {
                        h.lo += c;
                        h.hi += c;
                        let t = body["total"].as_f64().unwrap_or(h.lo);
                        total_within(h, id, op, "an extend answered total", t, report);
                    }
                    Outcome::Unknown => h.hi += c,
                    _ => {}
                }
            }
            (Kind::Commit, _) => {
                if let Some(h) = held.get_mut(id) {
                    let eventual = !strict.contains_key(&h.ns);
                    commit(h, id, first, &out, eventual, report);
                }
            }
            _ => {}
        }
    }
}

/// An answer's total of the reservation `h` (`answered` says which: an extend's
/// `total`, a commit's `estimate`) within what the history allows.
fn total_within(h: &Held, id: &str, op: u64, answered: &str, t: f64, report: &mut Report) {
    report.checks += 1;
    if t > h.hi + EPSILON || t < h.lo - EPSILON {
        let what = format!("{answered} {t} where the history allows {}..{}", h.lo, h.hi);
        report
            .violations
            .push(outside("reservation-total", h, id, what, op));
    }
}

/// A commit of the reservation `h`: its estimate within the history's, never a 404
/// while it is open, and on a key of its own the give-back it asked.
fn commit(h: &mut Held, id: &str, r: &Request, out: &Outcome, eventual: bool, report: &mut Report) {
    if h.settled {
        return;
    }
    let op = r.op;
    if let Outcome::Kept { status: 200, body } = out {
        if eventual && is_own(&r.key) && body["committed"] == true {
            give_back(h, id, r, body, report);
        }
    }
    match &out {
        Outcome::Kept { status: 200, body } if body["committed"] == true => {
            h.settled = true;
            let e = body["estimate"].as_f64().unwrap_or(h.lo);
            total_within(h, id, op, "a commit answered estimate", e, report);
        }
        Outcome::Kept { status: 404, body }
            if error_code(body) == Some("unknown_reservation") && !h.unknown_commit =>
        {
            h.settled = true;
            report.checks += 1;
            let what = "a commit answered 404 unknown_reservation for a reservation the history holds open".to_owned();
            report
                .violations
                .push(outside("reservation-open", h, id, what, op));
        }
        Outcome::Unknown => h.unknown_commit = true,
        _ => {}
    }
}

/// A commit under the estimate of a reservation on a key of its own (nothing else
/// counts on it, and its day's window has not ended) gives back the difference: as
/// `given_back`, and what the store does not hold yet as `owed`. Less is a give-back
/// lost (the store then keeps the estimate charged for a smaller cost). Eventual
/// admission only: under strict admission a give-back on a node that holds nothing of
/// the key (another node reserved, or the node restarted since) gives nothing back, as
/// docs/api.md says, and the quota the reserve took stays counted.
fn give_back(h: &Held, id: &str, r: &Request, body: &serde_json::Value, report: &mut Report) {
    let (e, cost) = (body["estimate"].as_f64(), r.body["cost"].as_f64());
    let (Some(e), Some(cost)) = (e, cost) else {
        return;
    };
    if cost >= e || r.start_ms as f64 >= h.window_end_ms {
        return;
    }
    report.checks += 1;
    let back = body["given_back"].as_f64().unwrap_or(0.0) + body["owed"].as_f64().unwrap_or(0.0);
    if (back - (e - cost)).abs() > EPSILON {
        let what = format!(
            "a commit at {cost} of an estimate of {e} on a key of its own gave back {back} \
             (given_back + owed), not {}",
            e - cost
        );
        report
            .violations
            .push(outside("reservation-give-back", h, id, what, r.op));
    }
}
