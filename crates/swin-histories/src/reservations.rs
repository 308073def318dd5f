//! What a reservation's answers say against what its history allows: an extend's
//! answered `total` and a commit's answered `estimate` lie within the totals the history
//! allows (the reserve's cost, the acknowledged extends, each extend of unknown outcome
//! at most once), and a commit is never answered 404 `unknown_reservation` while the
//! history holds the reservation open (opened, never settled, no commit of unknown
//! outcome before it). The counts alone miss both: a commit is booked as its answer
//! says, so a total raised by an extend answered "nothing was changed" gives back what
//! it charged, and a commit lost then 404 leaves the estimate charged, as a reservation
//! never committed does.

use std::collections::BTreeMap;

use crate::history::{error_code, outcome, Kind, Outcome, Request};
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
}

fn outside(check: &'static str, h: &Held, id: &str, what: String, op: u64) -> Violation {
    Violation {
        check,
        key: format!("{}/{id}", h.ns),
        what,
        ops: vec![op],
    }
}

pub fn reservations(history: &[Request], report: &mut Report) {
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
                        report.checks += 1;
                        let t = body["total"].as_f64().unwrap_or(h.lo);
                        if t > h.hi + EPSILON || t < h.lo - EPSILON {
                            let what = format!(
                                "an extend answered total {t} where the history allows {}..{}",
                                h.lo, h.hi
                            );
                            report
                                .violations
                                .push(outside("reservation-total", h, id, what, op));
                        }
                    }
                    Outcome::Unknown => h.hi += c,
                    _ => {}
                }
            }
            (Kind::Commit, _) => {
                if let Some(h) = held.get_mut(id) {
                    commit(h, id, op, &out, report);
                }
            }
            _ => {}
        }
    }
}

/// A commit of the reservation `h`: its estimate within the history's, never a 404
/// while it is open.
fn commit(h: &mut Held, id: &str, op: u64, out: &Outcome, report: &mut Report) {
    if h.settled {
        return;
    }
    match &out {
        Outcome::Kept { status: 200, body } if body["committed"] == true => {
            h.settled = true;
            report.checks += 1;
            let e = body["estimate"].as_f64().unwrap_or(h.lo);
            if e > h.hi + EPSILON || e < h.lo - EPSILON {
                let what = format!(
                    "a commit answered estimate {e} where the history allows {}..{}",
                    h.lo, h.hi
                );
                report
                    .violations
                    .push(outside("reservation-total", h, id, what, op));
            }
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
