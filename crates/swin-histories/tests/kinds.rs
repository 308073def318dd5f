//! The checks of the request kinds beyond counts, on histories written by hand: leases
//! certainly held past their limit, an answer whose `remaining` the next request did not
//! get, a refusal saying "retry now", Envoy's descriptors counted on their counter keys,
//! and the order shrinking tries smaller runs in.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};
use swin_histories::check::{check, Expect, Report};
use swin_histories::history::{Answer, Kind, Request};
use swin_histories::run::Options;
use swin_histories::setup::{Mode, StoreKind};

#[allow(clippy::too_many_arguments)]
fn at(
    op: u64,
    start: u64,
    end: u64,
    kind: Kind,
    ns: &str,
    key: &str,
    body: Value,
    answer: Value,
) -> Request {
    let status = if answer["allowed"] == false { 429 } else { 200 };
    Request {
        op,
        client: 0,
        node: 0,
        start_ms: start,
        end_ms: end,
        kind,
        ns: ns.into(),
        key: key.into(),
        path: format!("/v1/namespaces/{ns}/keys/{key}"),
        body,
        idem: None,
        answer: Answer::Status {
            status,
            body: answer.to_string(),
        },
    }
}

fn expect(store: &[(&str, &str, f64)], sync_ms: u64) -> Expect {
    Expect {
        store: store
            .iter()
            .map(|(ns, k, v)| ((ns.to_string(), k.to_string()), *v))
            .collect(),
        strict_limits: BTreeMap::new(),
        events: Vec::new(),
        sync_ms,
    }
}

fn found<'a>(report: &'a Report, check_name: &str) -> Vec<&'a str> {
    report
        .violations
        .iter()
        .filter(|v| v.check == check_name)
        .map(|v| v.key.as_str())
        .collect()
}

fn acquire(op: u64, start: u64, lease: &str, ttl: u64) -> Request {
    at(
        op,
        start,
        start + 5,
        Kind::Acquire,
        "jobs",
        "jk-0",
        json!({"count": 1, "ttl": ttl}),
        json!({"allowed": true, "lease": lease, "in_flight": 1, "limit": 3}),
    )
}

#[test]
fn four_leases_certainly_held_under_a_limit_of_three_are_a_violation() {
    let h: Vec<Request> = (0..4)
        .map(|i| acquire(i + 1, i * 10, &format!("l{i}"), 10))
        .collect();
    let report = check(&h, &expect(&[], 0));
    assert_eq!(found(&report, "leases"), vec!["jobs/jk-0"], "{report:?}");
}

#[test]
fn a_lease_released_or_lapsed_before_the_next_is_granted_frees_its_slot() {
    let mut h: Vec<Request> = (0..3)
        .map(|i| acquire(i + 1, i * 10, &format!("l{i}"), 1))
        .collect();
    h.push(at(
        4,
        35,
        40,
        Kind::Release,
        "jobs",
        "jk-0",
        json!({"lease": "l0"}),
        json!({"released": true, "lease": "l0"}),
    ));
    h.push(acquire(5, 45, "l3", 1));
    // leases of 1 s granted before 50 ms have lapsed (less the margin) by 2 s
    for (i, start) in [2000, 2010, 2020].into_iter().enumerate() {
        h.push(acquire(6 + i as u64, start, &format!("l{}", 4 + i), 1));
    }
    let report = check(&h, &expect(&[], 0));
    assert_eq!(found(&report, "leases"), Vec::<&str>::new(), "{report:?}");
    // without the release, four are held at 45 ms
    h.remove(3);
    let report = check(&h, &expect(&[], 0));
    assert_eq!(found(&report, "leases"), vec!["jobs/jk-0"], "{report:?}");
}

fn hit(op: u64, start: u64, cost: f64, answer: Value) -> Request {
    at(
        op,
        start,
        start + 5,
        Kind::Hit,
        "main",
        "hk-0",
        json!({"cost": cost}),
        answer,
    )
}

#[test]
fn remaining_that_the_next_request_does_not_get_is_a_violation() {
    let h = vec![
        hit(
            1,
            0,
            1.0,
            json!({"allowed": true, "limit": 10.0, "remaining": 5.0}),
        ),
        hit(
            2,
            20,
            2.0,
            json!({"allowed": false, "limit": 10.0, "remaining": 0.0, "retry_after": 30.0}),
        ),
    ];
    let report = check(&h, &expect(&[("main", "hk-0", 1.0)], 0));
    assert_eq!(found(&report, "answers"), vec!["main/hk-0"], "{report:?}");
}

/// A node cut from the store answers from its own view until a sync reaches the store
/// again — after the cut ends too, until its next tick: a pair a second after a cut is
/// not weighed; three seconds after, it is.
#[test]
fn remaining_is_not_weighed_until_a_node_cut_off_has_synced_again() {
    let pair = |at: u64| {
        vec![
            hit(
                1,
                at,
                1.0,
                json!({"allowed": true, "limit": 10.0, "remaining": 5.0}),
            ),
            hit(
                2,
                at + 20,
                2.0,
                json!({"allowed": false, "limit": 10.0, "remaining": 0.0, "retry_after": 30.0}),
            ),
        ]
    };
    let cut = swin_histories::history::Event {
        node: Some(1),
        start_ms: 5_000,
        end_ms: 6_000,
        disruption: swin_histories::history::Disruption::Away,
        what: "cut node 1 from the store 1000 ms".into(),
    };
    let mut e = expect(&[("main", "hk-0", 1.0)], 0);
    e.events.push(cut);
    let report = check(&pair(7_073), &e);
    assert_eq!(found(&report, "answers"), Vec::<&str>::new(), "{report:?}");
    let report = check(&pair(9_000), &e);
    assert_eq!(found(&report, "answers"), vec!["main/hk-0"], "{report:?}");
}

#[test]
fn remaining_is_not_weighed_across_another_request_of_the_key() {
    let mut h = vec![
        hit(
            1,
            0,
            1.0,
            json!({"allowed": true, "limit": 10.0, "remaining": 5.0}),
        ),
        hit(
            2,
            20,
            2.0,
            json!({"allowed": false, "limit": 10.0, "remaining": 0.0, "retry_after": 30.0}),
        ),
    ];
    // an increment of the key in flight between the two
    h.push(at(
        3,
        6,
        25,
        Kind::Increment,
        "main",
        "hk-0",
        json!({"value": 5}),
        json!({"count": 6.0}),
    ));
    let report = check(&h, &expect(&[("main", "hk-0", 6.0)], 0));
    assert_eq!(found(&report, "answers"), Vec::<&str>::new(), "{report:?}");
}

#[test]
fn a_reserve_over_several_keys_refused_for_another_key_is_not_this_keys_refusal() {
    let mut b = at(
        2,
        20,
        25,
        Kind::Reserve,
        "main",
        "",
        json!({"cost": 10, "keys": ["hk-0", "hk-2"]}),
        json!({"allowed": false, "remaining": 0.0, "retry_after": 60.0, "keys": [
            {"key": "hk-0", "allowed": true, "remaining": 1087.0},
            {"key": "hk-2", "allowed": false, "remaining": 0.0, "retry_after": 60.0}]}),
    );
    b.path = "/v1/namespaces/main/reserve".into();
    let h = vec![
        hit(
            1,
            0,
            1.0,
            json!({"allowed": true, "limit": 2000.0, "remaining": 1103.0}),
        ),
        b,
    ];
    let report = check(&h, &expect(&[("main", "hk-0", 1.0)], 0));
    assert_eq!(found(&report, "answers"), Vec::<&str>::new(), "{report:?}");
}

#[test]
fn a_refusal_saying_retry_now_is_a_violation() {
    let h = vec![hit(
        1,
        0,
        1.0,
        json!({"allowed": false, "limit": 10.0, "remaining": 0.0, "retry_after": 0.0}),
    )];
    let report = check(&h, &expect(&[], 0));
    assert_eq!(found(&report, "answers"), vec!["main/hk-0"], "{report:?}");
}

fn rls(op: u64, users: &[&str], addend: u64, overall: &str) -> Request {
    let descriptors: Vec<Value> = users.iter().map(|u| json!([["user", u]])).collect();
    let mut r = at(
        op,
        op * 10,
        op * 10 + 5,
        Kind::Rls,
        "edge",
        "",
        json!({"domain": "edge", "descriptors": descriptors, "hits_addend": addend}),
        json!({"overall_code": overall}),
    );
    r.path = "grpc ShouldRateLimit".into();
    r
}

#[test]
fn envoy_descriptors_count_on_their_counter_keys_all_or_nothing() {
    let h = vec![
        rls(1, &["u0", "u1"], 2, "OK"),
        rls(2, &["u0"], 3, "OVER_LIMIT"),
    ];
    let exact = expect(&[("edge", "user=u0", 2.0), ("edge", "user=u1", 2.0)], 200);
    let report = check(&h, &exact);
    assert!(report.violations.is_empty(), "{report:?}");
    let counted_denied = expect(&[("edge", "user=u0", 5.0), ("edge", "user=u1", 2.0)], 200);
    let report = check(&h, &counted_denied);
    assert_eq!(
        found(&report, "exactly-once"),
        vec!["edge/user=u0"],
        "{report:?}"
    );
}

#[test]
fn shrinking_tries_fewer_clients_then_fewer_seconds() {
    let o = Options {
        store: StoreKind::Redis,
        mode: Mode::Sync,
        faults: Vec::new(),
        seconds: 40,
        seed: 3,
        nodes: 3,
        clients: 6,
        node_binary: String::new(),
        out: PathBuf::new(),
        shrink_runs: 4,
    };
    let a = swin_histories::shrink::smaller(&o, false).expect("smaller");
    assert_eq!((a.clients, a.seconds, a.seed), (3, 40, 3));
    let b = swin_histories::shrink::smaller(&a, true).expect("smaller");
    assert_eq!((b.clients, b.seconds), (3, 20));
    let mut tiny = o.clone();
    tiny.clients = 1;
    tiny.seconds = 5;
    assert!(swin_histories::shrink::smaller(&tiny, false).is_none());
}

fn resv(op: u64, kind: Kind, body: Value, status: u16, answer: Value) -> Request {
    let mut r = at(
        op,
        op * 10,
        op * 10 + 5,
        kind,
        "main",
        "hk-0",
        body,
        answer.clone(),
    );
    r.answer = Answer::Status {
        status,
        body: answer.to_string(),
    };
    r
}

#[test]
fn a_reservation_total_past_its_history_or_a_404_while_open_is_a_violation() {
    let reserved = resv(
        1,
        Kind::Reserve,
        json!({"cost": 10}),
        200,
        json!({"reservation": "r1", "allowed": true, "remaining": 90.0}),
    );
    // an extend answered "nothing was changed" that the store applied: the next one's
    // total says so
    let unchanged = resv(
        2,
        Kind::Extend,
        json!({"reservation": "r1", "cost": 5}),
        503,
        json!({"error": {"code": "store_unreachable"}}),
    );
    let extended = resv(
        3,
        Kind::Extend,
        json!({"reservation": "r1", "cost": 5}),
        200,
        json!({"reservation": "r1", "total": 20.0, "allowed": true, "remaining": 80.0}),
    );
    let h = vec![reserved.clone(), unchanged, extended];
    let report = check(&h, &expect(&[("main", "hk-0", 20.0)], 200));
    assert_eq!(
        found(&report, "reservation-total"),
        vec!["main/r1"],
        "{report:?}"
    );

    let lost = resv(
        2,
        Kind::Commit,
        json!({"reservation": "r1", "cost": 4}),
        503,
        json!({"error": {"code": "store_failed"}}),
    );
    let gone = resv(
        3,
        Kind::Commit,
        json!({"reservation": "r1", "cost": 4}),
        404,
        json!({"error": {"code": "unknown_reservation"}}),
    );
    let report = check(
        &[reserved, lost, gone],
        &expect(&[("main", "hk-0", 10.0)], 200),
    );
    assert_eq!(
        found(&report, "reservation-open"),
        vec!["main/r1"],
        "{report:?}"
    );
}
