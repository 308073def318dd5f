//! The requests a client draws: one in six a lease, a runtime limit change or an Envoy
//! request, the rest hits, increments, batches, refunds and reservations (see
//! [`crate::workload`]).

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use crate::history::Kind;
use crate::setup::{hot_keys, JOBS_KEYS};

/// A reservation a client holds open.
#[derive(Debug, Clone)]
pub(crate) struct Open {
    pub(crate) id: String,
    pub(crate) ns: String,
    /// Its key on a key route; `None`: made on the namespace route.
    pub(crate) key: Option<String>,
    pub(crate) total: f64,
}

/// A lease a client holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) lease: String,
    pub(crate) key: String,
}

/// How a request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Post,
    Put,
    Delete,
    /// Envoy's `ShouldRateLimit` on the node's gRPC port (`body` is the request).
    Grpc,
}

/// One request to send.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) kind: Kind,
    pub(crate) method: Method,
    pub(crate) ns: String,
    pub(crate) key: String,
    pub(crate) path: String,
    pub(crate) body: Value,
}

fn key_plan(kind: Kind, ns: &str, key: &str, op: &str, body: Value) -> Plan {
    Plan {
        kind,
        method: Method::Post,
        ns: ns.to_owned(),
        key: key.to_owned(),
        path: format!("/v1/namespaces/{ns}/keys/{key}/{op}"),
        body,
    }
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

/// The next request of a client holding `open` reservations and `held` leases: one in
/// six a lease, a runtime limit change or an Envoy request.
pub(crate) fn draw(rng: &mut StdRng, open: &[Open], held: &[Held], id: usize, n: u64) -> Plan {
    match rng.gen_range(0..120) {
        0..=99 => counts(rng, open),
        100..=107 => lease(rng, held, id, n),
        108..=109 => limits(rng),
        _ => rls(rng),
    }
}

/// Acquire (named by the client half the time, so that its retry replaces itself),
/// renew or release.
fn lease(rng: &mut StdRng, held: &[Held], id: usize, n: u64) -> Plan {
    let roll = rng.gen_range(0..10);
    if held.is_empty() || roll < 5 {
        let key = JOBS_KEYS[rng.gen_range(0..JOBS_KEYS.len())];
        let mut body = json!({"count": rng.gen_range(1..=2), "ttl": rng.gen_range(2..=8)});
        if rng.gen_bool(0.5) {
            body["lease"] = json!(format!("c{id}-l{n}"));
        }
        return key_plan(Kind::Acquire, "jobs", key, "acquire", body);
    }
    let h = &held[rng.gen_range(0..held.len())];
    if roll < 7 {
        let body = json!({"lease": h.lease, "ttl": rng.gen_range(2..=8)});
        key_plan(Kind::Renew, "jobs", &h.key, "renew", body)
    } else {
        key_plan(
            Kind::Release,
            "jobs",
            &h.key,
            "release",
            json!({"lease": h.lease}),
        )
    }
}

/// The runtime limits of `main/hk-2`: set (below, near or above the config's), or gone.
fn limits(rng: &mut StdRng) -> Plan {
    let path = "/v1/namespaces/main/keys/hk-2/limits".to_owned();
    let (kind, method, body) = if rng.gen_bool(0.7) {
        let limit = [150.0, 400.0, 2500.0][rng.gen_range(0..3)];
        let body = json!({"limits": [{"window_size": 86400, "limit": limit}]});
        (Kind::SetLimits, Method::Put, body)
    } else {
        (Kind::DeleteLimits, Method::Delete, Value::Null)
    };
    Plan {
        kind,
        method,
        ns: "main".into(),
        key: "hk-2".into(),
        path,
        body,
    }
}

/// `ShouldRateLimit` on `edge`: one user's descriptor, or both (all or nothing).
fn rls(rng: &mut StdRng) -> Plan {
    let users = crate::setup::EDGE_USERS;
    let first = users[rng.gen_range(0..users.len())];
    let mut descriptors = vec![json!([["user", first]])];
    if rng.gen_bool(0.3) {
        let other = users
            .iter()
            .find(|u| **u != first)
            .copied()
            .unwrap_or(first);
        descriptors.push(json!([["user", other]]));
    }
    Plan {
        kind: Kind::Rls,
        method: Method::Grpc,
        ns: "edge".into(),
        key: String::new(),
        path: "grpc ShouldRateLimit".into(),
        body: json!({"domain": "edge", "descriptors": descriptors, "hits_addend": rng.gen_range(1..=3)}),
    }
}

/// Hits, increments, batches, refunds, reserves, extends and commits.
fn counts(rng: &mut StdRng, open: &[Open]) -> Plan {
    let ns = if rng.gen_bool(0.75) { "main" } else { "side" };
    let key = pick(rng, hot_keys(ns));
    let roll = rng.gen_range(0..100);
    let c = rng.gen_range(1..=3) as f64;
    match roll {
        0..=24 if rng.gen_bool(0.1) => key_plan(
            Kind::Hit,
            ns,
            key,
            "hit",
            json!({"cost": c, "dry_run": true}),
        ),
        0..=24 => key_plan(Kind::Hit, ns, key, "hit", json!({"cost": c})),
        25..=31 => key_plan(Kind::Increment, ns, key, "increment", json!({"value": c})),
        32..=41 => batch(rng, c),
        42..=48 => key_plan(Kind::Refund, ns, key, "refund", json!({"cost": c})),
        49..=60 => {
            let e = rng.gen_range(5..=20) as f64;
            key_plan(
                Kind::Reserve,
                ns,
                key,
                "reserve",
                json!({"cost": e, "ttl": 600}),
            )
        }
        61..=66 => {
            let e = rng.gen_range(5..=20) as f64;
            let keys = hot_keys("main");
            let (a, b) = (rng.gen_range(0..keys.len()), rng.gen_range(0..keys.len()));
            let ks: Vec<&str> = if a == b {
                vec![keys[a]]
            } else {
                vec![keys[a], keys[b]]
            };
            Plan {
                kind: Kind::Reserve,
                method: Method::Post,
                ns: "main".into(),
                key: String::new(),
                path: "/v1/namespaces/main/reserve".into(),
                body: json!({"keys": ks, "cost": e, "ttl": 600}),
            }
        }
        _ if open.is_empty() => key_plan(Kind::Hit, ns, key, "hit", json!({"cost": c})),
        67..=78 => {
            let o = &open[rng.gen_range(0..open.len())];
            reservation_plan(
                Kind::Extend,
                o,
                "extend",
                json!({"reservation": o.id, "cost": c * 2.0}),
            )
        }
        _ => {
            let o = &open[rng.gen_range(0..open.len())];
            let total = o.total.round() as i64;
            let cost = if rng.gen_bool(0.6) {
                rng.gen_range(0..=total)
            } else {
                rng.gen_range(total..=2 * total)
            };
            reservation_plan(
                Kind::Commit,
                o,
                "commit",
                json!({"reservation": o.id, "cost": cost}),
            )
        }
    }
}

/// A key of its own for a reservation of client `id`'s `n`th request: nothing else
/// counts on it, so the store's count of it is only what the node pushed of the
/// reservation (none of it, while a push that failed is owed), and the commit that
/// follows gives back into that alone.
pub(crate) fn own_key(id: usize, n: u64) -> String {
    format!("own-c{id}-{n}")
}

/// A reservation of 10–40 on a key of its own (client `id`'s `n`th request).
pub(crate) fn own_reserve(rng: &mut StdRng, id: usize, n: u64) -> Plan {
    let e = rng.gen_range(10..=40) as f64;
    let body = json!({"cost": e, "ttl": 600});
    key_plan(Kind::Reserve, "main", &own_key(id, n), "reserve", body)
}

/// Whether `key` is a reservation's key of its own ([`own_key`]).
pub(crate) fn is_own(key: &str) -> bool {
    key.starts_with("own-")
}

/// The commit of a reservation on a key of its own, under its estimate (none of it
/// used, half, or all but one).
pub(crate) fn own_commit(rng: &mut StdRng, o: &Open) -> Plan {
    let total = o.total.round() as i64;
    let cost = [0, total / 2, total - 1][rng.gen_range(0..3)];
    reservation_plan(
        Kind::Commit,
        o,
        "commit",
        json!({"reservation": o.id, "cost": cost}),
    )
}

fn batch(rng: &mut StdRng, c: f64) -> Plan {
    let (a, b) = (pick(rng, hot_keys("main")), pick(rng, hot_keys("side")));
    let hits = json!([
        {"namespace": "main", "key": a, "cost": c},
        {"namespace": "side", "key": b, "cost": rng.gen_range(1..=2)},
    ]);
    Plan {
        kind: Kind::Batch,
        method: Method::Post,
        ns: "main".into(),
        key: String::new(),
        path: "/v1/hits".into(),
        body: json!({"hits": hits}),
    }
}

fn reservation_plan(kind: Kind, o: &Open, op: &str, body: Value) -> Plan {
    match &o.key {
        Some(k) => key_plan(kind, &o.ns, k, op, body),
        None => Plan {
            kind,
            method: Method::Post,
            ns: o.ns.clone(),
            key: String::new(),
            path: format!("/v1/namespaces/{}/{op}", o.ns),
            body,
        },
    }
}
