//! Replies lost after the store applied the write (a relay between the node and the
//! store drops the reply and cuts the connection), for leases and runtime limits: an
//! acquire, a renewal and a release each apply once and answer what the store did (the
//! node sends them again within `answer_timeout`), a release sent again by its client
//! is told it was released (`replayed`) instead of "not live", and a runtime limit set
//! or removed answers truthfully — never "nothing was changed" after the store changed
//! it. On PostgreSQL and Redis, each asserting the slots in flight or the stored limit
//! exactly.

use std::time::Duration;

use swin_testkit::cluster::{key_call, Node, TestStore};
use swin_testkit::Relay;

use super::support::node_in;

const LIMIT: u64 = 3;

/// `slots` (leases, limit 3, 60 s) and `api` (hits, 5 an hour, runtime limits).
fn config(section: &str) -> String {
    format!(
        "store_timeout = 1\nanswer_timeout = 0.5\n{section}
[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = 60
sync_rate = 0.2
store = \"main\"

[[namespaces]]
name = \"api\"
window_sizes = [3600]
sync_rate = 0.2
store = \"main\"
limits = [{{ window_size = 3600, limit = 5 }}]
"
    )
}

/// A node over `store` through a relay of its own.
async fn node_via(store: &TestStore) -> (tempfile::TempDir, Relay, Node) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    (dir, relay, node)
}

/// Makes the node's store connections (and Redis's scripts) ready, with a call that
/// prepares none of the statements armed below: a renewal of a lease never granted
/// (404), a read of a key's limits.
async fn warm(c: &reqwest::Client, node: &Node) {
    let renew = serde_json::json!({"lease": "never", "ttl": 1});
    let (s, v) = lease(c, node, "warm", "renew", renew).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = limits(c, node, reqwest::Method::GET, "warm", None).await;
    assert_eq!(s, 200, "{v}");
}

/// Arms `relay` to lose the reply of the next write of `store` that holds every one of
/// `redis` (a script call's keys and arguments), or, on PostgreSQL, the `COMMIT` of the
/// transaction whose statement holds `sql` (the first of its kind on the node: later
/// ones are sent as prepared statements, without their text).
fn arm(relay: &Relay, store: &TestStore, redis: &[&[u8]], sql: &[u8]) {
    if store.url.starts_with("redis") {
        relay.lose_reply_to(redis);
    } else {
        relay.lose_reply_after(&[sql], &[b"COMMIT"]);
    }
}

/// A call on `key` of `slots`: status and body.
async fn lease(
    c: &reqwest::Client,
    node: &Node,
    key: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    key_call(c, &node.base, "slots", key, op, body).await
}

/// The slots of `key` in flight, as an acquire of every slot finds them (granted, it
/// is released again).
async fn in_flight(c: &reqwest::Client, node: &Node, key: &str) -> u64 {
    let all = serde_json::json!({"count": LIMIT});
    let (s, v) = lease(c, node, key, "acquire", all).await;
    match s {
        200 => {
            let (s, r) = lease(
                c,
                node,
                key,
                "release",
                serde_json::json!({"lease": v["lease"]}),
            )
            .await;
            assert_eq!(s, 200, "{r}");
            0
        }
        429 => v["in_flight"].as_u64().expect("in_flight"),
        _ => panic!("{s} {v}"),
    }
}

/// A release whose reply is lost ends the lease once and answers 200; the client's
/// release sent again answers 200 `replayed` (not 404), and every slot is free.
async fn a_release_whose_reply_is_lost_answers_released(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    let held = serde_json::json!({"lease": "rel-1"});
    let acquire = serde_json::json!({"lease": "rel-1", "count": 2});
    let (s, v) = lease(&c, &node, "k", "acquire", acquire).await;
    assert_eq!(s, 200, "{v}");
    arm(
        &relay,
        store,
        &[b"rel-1", b"\r\n$0\r\n\r\n"],
        b"lease = $3 AND expires_at > $4",
    );
    let (s, v) = lease(&c, &node, "k", "release", held.clone()).await;
    assert_eq!((s, relay.lost()), (200, 1), "{v}");
    assert_eq!(
        v["replayed"],
        serde_json::Value::Null,
        "its own release: {v}"
    );
    let (s, again) = lease(&c, &node, "k", "release", held.clone()).await;
    assert_eq!(s, 200, "a release sent again: {again}");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(
        in_flight(&c, &node, "k").await,
        0,
        "released once, every slot free"
    );
    // a renewal of the released lease is 404: it is not live
    let renew = serde_json::json!({"lease": "rel-1", "ttl": 30});
    let (s, v) = lease(&c, &node, "k", "renew", renew).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("unknown_lease")),
        "{v}"
    );
}

/// A renewal whose reply is lost moves the lapse once and answers 200 with it: the lease
/// outlives its first lapse, and the client's renewal sent again answers 200.
async fn a_renewal_whose_reply_is_lost_answers_renewed(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    let acquire = serde_json::json!({"lease": "ren-1", "count": 2, "ttl": 2});
    let (s, v) = lease(&c, &node, "k", "acquire", acquire).await;
    assert_eq!(s, 200, "{v}");
    arm(
        &relay,
        store,
        &[b"ren-1", b":leases"],
        b"UPDATE swin_leases SET expires_at",
    );
    let renew = serde_json::json!({"lease": "ren-1", "ttl": 60});
    let (s, v) = lease(&c, &node, "k", "renew", renew.clone()).await;
    assert_eq!((s, relay.lost()), (200, 1), "{v}");
    assert_eq!(v["renewed"], true, "{v}");
    // past its first lapse (2 s), the lease still holds its 2 slots
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(in_flight(&c, &node, "k").await, 2, "renewed: still held");
    let (s, v) = lease(&c, &node, "k", "renew", renew).await;
    assert_eq!(s, 200, "a renewal sent again: {v}");
    let (s, v) = lease(
        &c,
        &node,
        "k",
        "release",
        serde_json::json!({"lease": "ren-1"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(in_flight(&c, &node, "k").await, 0);
}

/// An acquire under the client's lease id whose reply is lost is granted once: its
/// slots count once, and the client's acquire sent again replaces it (200, the same
/// slots in flight).
async fn an_acquire_whose_reply_is_lost_is_granted_once(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    warm(&c, &node).await;
    arm(
        &relay,
        store,
        &[b"acq-1", b":leases"],
        b"INSERT INTO swin_leases",
    );
    let acquire = serde_json::json!({"lease": "acq-1", "count": 2});
    let (s, v) = lease(&c, &node, "k", "acquire", acquire.clone()).await;
    assert_eq!((s, relay.lost()), (200, 1), "{v}");
    assert_eq!(
        (v["lease"].as_str(), v["in_flight"].as_u64()),
        (Some("acq-1"), Some(2)),
        "{v}"
    );
    let (s, v) = lease(&c, &node, "k", "acquire", acquire).await;
    assert_eq!(
        (s, v["in_flight"].as_u64()),
        (200, Some(2)),
        "sent again: {v}"
    );
    assert_eq!(in_flight(&c, &node, "k").await, 2, "counted once");
    let (s, v) = lease(
        &c,
        &node,
        "k",
        "release",
        serde_json::json!({"lease": "acq-1"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(in_flight(&c, &node, "k").await, 0);
}

/// An acquire under an id the node makes whose reply is lost is granted once and
/// answered with that id: releasing it frees every slot.
async fn an_acquire_of_the_node_s_id_whose_reply_is_lost_is_granted_once(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    warm(&c, &node).await;
    arm(
        &relay,
        store,
        &[b"slots:anon}:leases"],
        b"INSERT INTO swin_leases",
    );
    let (s, v) = lease(
        &c,
        &node,
        "anon",
        "acquire",
        serde_json::json!({"count": 2}),
    )
    .await;
    assert_eq!((s, relay.lost()), (200, 1), "{v}");
    assert_eq!(v["in_flight"], 2, "{v}");
    assert_eq!(in_flight(&c, &node, "anon").await, 2, "counted once");
    let (s, r) = lease(
        &c,
        &node,
        "anon",
        "release",
        serde_json::json!({"lease": v["lease"]}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(in_flight(&c, &node, "anon").await, 0);
}

/// A release whose every reply is lost within `answer_timeout` answers 503
/// `outcome_unknown` (not "nothing was changed": the store ended the lease); the
/// client's release sent again answers 200 `replayed`, and every slot is free.
async fn a_release_whose_every_reply_is_lost_is_unknown_then_replayed(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    let held = serde_json::json!({"lease": "rel-2"});
    let acquire = serde_json::json!({"lease": "rel-2", "count": 2});
    let (s, v) = lease(&c, &node, "k", "acquire", acquire).await;
    assert_eq!(s, 200, "{v}");
    for _ in 0..1_000 {
        arm(
            &relay,
            store,
            &[b"rel-2", b"\r\n$0\r\n\r\n"],
            b"lease = $3 AND expires_at > $4",
        );
    }
    let (s, v) = lease(&c, &node, "k", "release", held.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    assert!(relay.lost() > 1, "sent again: {}", relay.lost());
    relay.disarm();
    let (s, again) = lease(&c, &node, "k", "release", held).await;
    assert_eq!((s, &again["replayed"]), (200, &true.into()), "{again}");
    assert_eq!(in_flight(&c, &node, "k").await, 0, "released once");
}

/// An acquire under the client's id whose every reply is lost answers 503
/// `outcome_unknown` (the store granted it); the client's acquire sent again replaces
/// it: 200, its slots counted once.
async fn an_acquire_whose_every_reply_is_lost_is_unknown_then_replaced(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    warm(&c, &node).await;
    for _ in 0..1_000 {
        arm(
            &relay,
            store,
            &[b"acq-2", b":leases"],
            b"INSERT INTO swin_leases",
        );
    }
    let acquire = serde_json::json!({"lease": "acq-2", "count": 2});
    let (s, v) = lease(&c, &node, "k", "acquire", acquire.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    relay.disarm();
    let (s, v) = lease(&c, &node, "k", "acquire", acquire).await;
    assert_eq!(
        (s, v["in_flight"].as_u64()),
        (200, Some(2)),
        "sent again: {v}"
    );
    assert_eq!(in_flight(&c, &node, "k").await, 2, "counted once");
}

/// Envoy's end of a request (a negative hit, ended by key and count, not by lease) whose
/// reply is lost is never sent again — a second attempt would end as many slots more —
/// and says the slots may have been ended (it was `store_unreachable`, which says
/// nothing changed): of 2 slots started, exactly 1 is ended.
async fn an_envoy_end_whose_reply_is_lost_ends_its_slots_once(store: &TestStore) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let grpc_port = swin_testkit::free_port();
    let text = format!(
        "grpc_listen = \"127.0.0.1:{grpc_port}\"\n{}",
        config(&store.section_via(&relay))
    );
    let _node = node_in(dir.path(), &text);
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut c = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    let mut send = async |n: u64, back: bool| {
        let d = RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "e".into(),
            }],
            hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: n }),
            is_negative_hits: back,
            ..Default::default()
        };
        let r = RateLimitRequest {
            domain: "slots".into(),
            descriptors: vec![d],
            hits_addend: 0,
        };
        c.should_rate_limit(r)
            .await
            .map(|r| r.into_inner().overall_code)
    };
    let ok = Code::Ok as i32;
    assert_eq!(send(2, false).await.expect("start"), ok);
    arm(
        &relay,
        store,
        &[b"$6\r\nenvoy.\r\n"],
        b"substr(lease, 1, length($4)) = $4",
    );
    let e = send(1, true).await.expect_err("its reply lost");
    assert_eq!(
        (e.code(), relay.lost()),
        (tonic::Code::Unavailable, 1),
        "{e:?}"
    );
    // not `store_unreachable` (which says nothing changed): the slots may have ended
    assert!(e.message().contains("may have ended the slots"), "{e:?}");
    // exactly one of the two slots ended: two more fit under 3, a third does not
    assert_eq!(send(2, false).await.expect("start"), ok, "one slot held");
    assert_eq!(
        send(1, false).await.expect("start"),
        Code::OverLimit as i32,
        "ended once, not twice"
    );
}

/// A call on `key`'s runtime limits in `api` (with `body`, if any).
async fn limits(
    c: &reqwest::Client,
    node: &Node,
    method: reqwest::Method,
    key: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let url = format!("{}/v1/namespaces/api/keys/{key}/limits", node.base);
    let mut req = c.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

fn limit(n: u32) -> Option<serde_json::Value> {
    Some(serde_json::json!({"limits": [{"window_size": 3600, "limit": n}]}))
}

/// A PUT of runtime limits whose reply is lost sets them and answers 200 (sent again by
/// the node: the same limits); the store holds them, and the client's PUT sent again
/// answers 200.
async fn a_limit_set_whose_reply_is_lost_answers_set(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    warm(&c, &node).await;
    arm(
        &relay,
        store,
        &[b"lim-put", b"set_by"],
        b"INSERT INTO swin_key_limits (namespace",
    );
    let (s, v) = limits(&c, &node, reqwest::Method::PUT, "lim-put", limit(7)).await;
    assert_eq!((s, relay.lost()), (200, 1), "{v}");
    let (s, v) = limits(&c, &node, reqwest::Method::GET, "lim-put", None).await;
    assert_eq!((s, v["source"].as_str()), (200, Some("override")), "{v}");
    assert_eq!(v["limits"][0]["limit"], 7.0, "the stored limit: {v}");
    let (s, v) = limits(&c, &node, reqwest::Method::PUT, "lim-put", limit(7)).await;
    assert_eq!(s, 200, "sent again: {v}");
}

/// A DELETE of runtime limits whose reply is lost removes them, and says so truthfully:
/// the node's second attempt finds none, so whether this request removed them is
/// unknown — 503 `outcome_unknown`, never "nothing was changed" — and the key is under
/// the config's limits in the store; the client's DELETE sent again answers 200
/// `deleted: false`.
async fn a_limit_removed_whose_reply_is_lost_is_not_answered_unchanged(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    let (s, v) = limits(&c, &node, reqwest::Method::PUT, "lim-del", limit(7)).await;
    assert_eq!(s, 200, "{v}");
    arm(
        &relay,
        store,
        &[b"lim-del", b"$6\r\n100000\r\n"],
        b"DELETE FROM swin_key_limits WHERE namespace",
    );
    let (s, v) = limits(&c, &node, reqwest::Method::DELETE, "lim-del", None).await;
    assert_eq!(relay.lost(), 1, "{v}");
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("nothing was changed"), "{v}");
    let (s, v) = limits(&c, &node, reqwest::Method::GET, "lim-del", None).await;
    assert_eq!(
        (s, v["source"].as_str()),
        (200, Some("config")),
        "removed: {v}"
    );
    let (s, v) = limits(&c, &node, reqwest::Method::DELETE, "lim-del", None).await;
    assert_eq!((s, &v["deleted"]), (200, &false.into()), "sent again: {v}");
}

/// A lease change whose reply comes later than `answer_timeout` — the store applied it
/// at once — is 503 `outcome_unknown`, never `store_unreachable` ("nothing was
/// changed"): a named acquire, a renewal and a release held up so each answered that
/// it changed nothing though the store held the lease, moved its lapse, ended it.
async fn lease_changes_whose_replies_come_late_are_not_answered_unchanged(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    warm(&c, &node).await;
    let late = Duration::from_millis(900);
    // Redis applies each change as one script call the moment it arrives; PostgreSQL's
    // transaction waits for each statement's reply before the next, so a late reply
    // may leave it undone: there the slots are either as before or as after
    let one_step = store.url.starts_with("redis");
    let mut slots = 0;
    for (op, body, after) in [
        (
            "acquire",
            serde_json::json!({"lease": "slow-1", "count": 2, "ttl": 600}),
            2,
        ),
        (
            "renew",
            serde_json::json!({"lease": "slow-1", "ttl": 900}),
            2,
        ),
        ("release", serde_json::json!({"lease": "slow-1"}), 0),
    ] {
        if slots == 0 && op != "acquire" {
            // PostgreSQL left the acquire undone: hold the lease for the next change
            let again = serde_json::json!({"lease": "slow-1", "count": 2, "ttl": 600});
            let (s, v) = lease(&c, &node, "k", "acquire", again).await;
            assert_eq!(s, 200, "{v}");
        }
        relay.delay_replies(late);
        let (s, v) = lease(&c, &node, "k", op, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (503, Some("outcome_unknown")),
            "{op}: {v}"
        );
        relay.delay_replies(Duration::ZERO);
        // the late replies drain before the next calls' come back
        tokio::time::sleep(late).await;
        let before = if op == "acquire" { 0 } else { 2 };
        slots = in_flight(&c, &node, "k").await;
        assert!(
            slots == after || (!one_step && slots == before),
            "after the {op}: {slots} in flight"
        );
    }
}

swin_testkit::for_stores!([postgres, redis] [
    lease_changes_whose_replies_come_late_are_not_answered_unchanged,
    a_release_whose_reply_is_lost_answers_released,
    a_renewal_whose_reply_is_lost_answers_renewed,
    an_acquire_whose_reply_is_lost_is_granted_once,
    an_acquire_of_the_node_s_id_whose_reply_is_lost_is_granted_once,
    a_release_whose_every_reply_is_lost_is_unknown_then_replayed,
    an_acquire_whose_every_reply_is_lost_is_unknown_then_replaced,
    an_envoy_end_whose_reply_is_lost_ends_its_slots_once,
    a_limit_set_whose_reply_is_lost_answers_set,
    a_limit_removed_whose_reply_is_lost_is_not_answered_unchanged,
]);
