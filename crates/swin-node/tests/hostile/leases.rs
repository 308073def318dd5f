//! Concurrency leases when things go wrong: a store that goes away refuses acquires,
//! releases and renewals (503) and none of them changes a slot, so the count in flight
//! afterwards is exact; an acquire cut short by a store that hangs is ended by the node
//! (no client knows its id) instead of holding its slots until its lapse; a lease id
//! given for another key releases nothing; a reload that changes the limit keeps the
//! leases held; Envoy's starts and ends (negative hits) through a hung or gone store
//! leave the slots exact.

use std::time::Duration;

use swin_testkit::cluster::{key_call, within, TestStore};

use super::support::{applied, envoy, node, OwnRedis};

const LIMIT: u64 = 3;

fn config(store: &TestStore) -> String {
    format!(
        "store_timeout = 1\n{}
[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = 60
sync_rate = 0.2
store = \"main\"
",
        store.section()
    )
}

/// A call on a key of `slots`: status and body.
async fn post(
    c: &reqwest::Client,
    base: &str,
    key: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    key_call(c, base, "slots", key, op, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_refuses_lease_calls_and_changes_no_slot() {
    let mut own = OwnRedis::start(config);
    let c = reqwest::Client::new();
    let base = &own.node.base.clone();
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({"count": 2})).await;
    assert_eq!(s, 200, "{v}");
    let held = serde_json::json!({"lease": v["lease"]});

    drop(own.server.take()); // the store goes away
    for (op, body) in [
        ("acquire", serde_json::json!({})),
        ("acquire", serde_json::json!({"lease": "mine"})),
        ("release", held.clone()),
        ("renew", held.clone()),
    ] {
        let (s, v) = post(&c, base, "k", op, body).await;
        assert_eq!(s, 503, "{op}: {v}");
        // the first call may find the node's connection broken under it (the store
        // went away as it was sent), and a call that outwaits its time may have been
        // applied in time with its reply late: whether the store took it, the node
        // cannot tell, and says so; what follows checks that nothing was taken
        let code = v["error"]["code"].as_str();
        assert!(
            matches!(code, Some("store_unreachable" | "outcome_unknown")),
            "{op}: {v}"
        );
    }

    own.restart();
    // the first acquire that reaches the store finds exactly the lease held before:
    // the failed release freed nothing, the failed acquires took nothing
    within(
        Duration::from_secs(15),
        "acquires go through again",
        async || {
            let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
            if s == 200 {
                assert_eq!(v["in_flight"], LIMIT, "{v}");
            }
            s == 200
        },
    )
    .await;
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!((s, v["in_flight"].clone()), (429, LIMIT.into()), "{v}");
    let (s, v) = post(&c, base, "k", "release", held).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({"count": 2})).await;
    assert_eq!((s, v["in_flight"].clone()), (200, LIMIT.into()), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_short_by_a_hanging_store_does_not_hold_its_slots() {
    let own = OwnRedis::start(config);
    let c = reqwest::Client::new();
    let base = &own.node.base.clone();
    let (s, _) = post(&c, base, "warm", "acquire", serde_json::json!({})).await;
    assert_eq!(s, 200);

    own.server().signal("STOP");
    // queued in the hung server: it runs when the server wakes, after the node gave up
    let (s, v) = post(
        &c,
        base,
        "k",
        "acquire",
        serde_json::json!({"count": LIMIT}),
    )
    .await;
    assert_eq!(s, 503, "{v}");
    own.server().signal("CONT");
    // well before its 60 s lapse, the node has ended the lease no client knows
    let took = within(
        Duration::from_secs(10),
        "the slots are free again",
        async || {
            let (s, v) = post(
                &c,
                base,
                "k",
                "acquire",
                serde_json::json!({"count": LIMIT}),
            )
            .await;
            assert!(s == 200 || s == 429 || s == 503, "{s} {v}");
            s == 200
        },
    )
    .await;
    println!("the cut-short acquire's slots were free {took:?} after the store woke");
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!(
        (s, v["in_flight"].clone()),
        (429, LIMIT.into()),
        "exact: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_id_of_another_key_releases_nothing() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(&store)).expect("config");
    let n = node(&path);
    let c = reqwest::Client::new();
    let base = &n.base;
    let (_, v) = post(
        &c,
        base,
        "a",
        "acquire",
        serde_json::json!({"count": LIMIT}),
    )
    .await;
    let lease = serde_json::json!({"lease": v["lease"]});
    let (_, other) = post(&c, base, "b", "acquire", serde_json::json!({})).await;
    for (key, body) in [
        ("b", lease.clone()),
        ("c", lease.clone()),
        ("a", serde_json::json!({"lease": other["lease"]})),
    ] {
        let (s, v) = post(&c, base, key, "release", body.clone()).await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (404, "unknown_lease".into()),
            "{key}: {v}"
        );
        let (s, _) = post(&c, base, key, "renew", body).await;
        assert_eq!(s, 404, "{key}");
    }
    let (s, v) = post(&c, base, "a", "acquire", serde_json::json!({})).await;
    assert_eq!((s, v["in_flight"].clone()), (429, LIMIT.into()), "{v}");
    let (s, v) = post(&c, base, "b", "acquire", serde_json::json!({"count": 2})).await;
    assert_eq!((s, v["in_flight"].clone()), (200, LIMIT.into()), "{v}");
    drop(n);
}

/// A reload that changes `limit` applies to the next acquire and keeps every lease held:
/// raised, one more fits; lowered under what is held, nothing is taken away and nothing
/// more is granted until releases bring the key under the new limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_limit_and_keeps_the_leases_held() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(&store)).expect("config");
    let n = node(&path);
    let c = reqwest::Client::new();
    let base = &n.base;
    let (s, first) = post(
        &c,
        base,
        "k",
        "acquire",
        serde_json::json!({"count": LIMIT}),
    )
    .await;
    assert_eq!(s, 200, "{first}");
    let reload_to = async |limit: u64| {
        let text = config(&store).replace(&format!("limit = {LIMIT}"), &format!("limit = {limit}"));
        std::fs::write(&path, text).expect("config");
        n.signal("HUP");
        applied(&c, base, "limit", limit.into()).await;
    };
    reload_to(LIMIT + 1).await;
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!(
        (s, v["in_flight"].clone(), v["limit"].clone()),
        (200, (LIMIT + 1).into(), (LIMIT + 1).into()),
        "{v}"
    );
    let second = serde_json::json!({"lease": v["lease"]});
    reload_to(1).await;
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!(
        (s, v["in_flight"].clone()),
        (429, (LIMIT + 1).into()),
        "held leases still count: {v}"
    );
    let (s, _) = post(
        &c,
        base,
        "k",
        "release",
        serde_json::json!({"lease": first["lease"]}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!(
        (s, v["in_flight"].clone()),
        (429, 1.into()),
        "at the new limit of 1: {v}"
    );
    let (s, _) = post(&c, base, "k", "release", second).await;
    assert_eq!(
        s, 200,
        "a lease granted before the reload releases after it"
    );
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!((s, v["in_flight"].clone()), (200, 1.into()), "{v}");
}

/// Envoy's door when the store hangs or goes away: a request cut short by a hung store
/// is UNAVAILABLE (Envoy's failure mode decides) and the node ends the slots it may have
/// taken; while the store is gone, starts and ends are UNAVAILABLE and change nothing:
/// afterwards the slots held are exactly those granted and not ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_requests_through_a_hanging_or_gone_store_leave_the_slots_exact() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;
    let grpc_port = swin_testkit::free_port();
    let mut own =
        OwnRedis::start(|s| format!("grpc_listen = \"127.0.0.1:{grpc_port}\"\n{}", config(s)));
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut c = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{grpc_port}"),
    )
    .await
    .expect("connect");
    assert_eq!(envoy(&mut c, "slots", "k", 1, false).await, Ok(OK));

    own.server().signal("STOP");
    assert_eq!(
        envoy(&mut c, "slots", "k", 2, false).await,
        Err(tonic::Code::Unavailable),
        "cut short by the hung store"
    );
    own.server().signal("CONT");
    let took = within(
        Duration::from_secs(10),
        "the cut-short request's slots are free again",
        async || {
            let r = envoy(&mut c, "slots", "k", 2, false).await;
            assert!(matches!(r, Ok(_) | Err(tonic::Code::Unavailable)), "{r:?}");
            r == Ok(OK)
        },
    )
    .await;
    println!("the cut-short Envoy request's slots were free {took:?} after the store woke");
    assert_eq!(
        envoy(&mut c, "slots", "k", 1, false).await,
        Ok(OVER),
        "exactly 3 held"
    );

    drop(own.server.take()); // the store goes away
    assert_eq!(
        envoy(&mut c, "slots", "k", 1, true).await,
        Err(tonic::Code::Unavailable)
    );
    assert_eq!(
        envoy(&mut c, "slots", "k", 1, false).await,
        Err(tonic::Code::Unavailable)
    );
    assert_eq!(
        envoy(&mut c, "slots", "other", 1, false).await,
        Err(tonic::Code::Unavailable)
    );
    own.restart();
    within(
        Duration::from_secs(15),
        "the store answers again",
        async || envoy(&mut c, "slots", "k", 1, false).await == Ok(OVER),
    )
    .await;
    // the failed end freed nothing and the failed starts took nothing
    assert_eq!(envoy(&mut c, "slots", "other", 3, false).await, Ok(OK));
    assert_eq!(envoy(&mut c, "slots", "k", 1, true).await, Ok(OK));
    assert_eq!(envoy(&mut c, "slots", "k", 1, false).await, Ok(OK));
    assert_eq!(envoy(&mut c, "slots", "k", 1, false).await, Ok(OVER));
}

/// A local-only concurrency namespace (no store: the node keeps the leases) that a
/// reload rebuilds (`lease_ttl` 30 → 31) keeps every live lease, HTTP's and Envoy's
/// starts alike: it forgot them all, and 6 were in flight under `limit = 3`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_a_local_namespace_keeps_its_leases() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    let grpc_port = swin_testkit::free_port();
    let config = |ttl: u32| {
        format!(
            "grpc_listen = \"127.0.0.1:{grpc_port}\"
[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = {ttl}
sync_rate = -1
"
        )
    };
    std::fs::write(&path, config(30)).expect("config");
    let n = node(&path);
    let c = reqwest::Client::new();
    let base = &n.base;
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut grpc = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{grpc_port}"),
    )
    .await
    .expect("connect");
    let (s, v) = post(
        &c,
        base,
        "k",
        "acquire",
        serde_json::json!({"count": LIMIT}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let held = v["lease"].clone();
    // Envoy's starts of requests on its own key (`user=k`): all three slots
    for code in [1, 1, 1, 2] {
        assert_eq!(envoy(&mut grpc, "slots", "k", 1, false).await, Ok(code));
    }

    std::fs::write(&path, config(31)).expect("config");
    n.signal("HUP");
    applied(&c, base, "lease_ttl", 31.0.into()).await;
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!(
        (s, v["in_flight"].clone()),
        (429, LIMIT.into()),
        "three held before the reload still count: {v}"
    );
    assert_eq!(
        envoy(&mut grpc, "slots", "k", 1, false).await,
        Ok(2),
        "Envoy's three held before the reload still count"
    );
    // Envoy's end frees one slot, and then exactly one more fits
    assert_eq!(envoy(&mut grpc, "slots", "k", 1, true).await, Ok(1));
    assert_eq!(envoy(&mut grpc, "slots", "k", 1, false).await, Ok(1));
    assert_eq!(envoy(&mut grpc, "slots", "k", 1, false).await, Ok(2));
    // and the HTTP leases end as they were granted
    let (s, v) = post(&c, base, "k", "release", serde_json::json!({"lease": held})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({})).await;
    assert_eq!((s, v["in_flight"].clone()), (200, 1.into()), "{v}");
}

/// A release or renewal refused while the store hangs (SIGSTOP: 503, nothing changed)
/// does not land when the store wakes up: the lease is still held, exactly, and renews
/// and releases once afterwards (the release landed, freeing a slot its client was told
/// was still taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_while_the_store_hangs_never_lands() {
    let own = OwnRedis::start(config);
    let c = reqwest::Client::new();
    let base = &own.node.base.clone();
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({"count": 2})).await;
    assert_eq!(s, 200, "{v}");
    let held = serde_json::json!({"lease": v["lease"]});

    own.server().signal("STOP");
    let t = std::time::Instant::now();
    for (op, body) in [
        ("release", held.clone()),
        ("renew", serde_json::json!({"lease": v["lease"], "ttl": 5})),
    ] {
        let (s, v) = post(&c, base, "k", op, body).await;
        assert_eq!(s, 503, "{op}: {v}");
    }
    let refused_in = t.elapsed();
    own.server().signal("CONT");

    // the refused release freed nothing: one slot of three is left, once the store
    // answers again (the first calls after the hang may still be refused)
    within(
        Duration::from_secs(15),
        "acquires go through again",
        async || {
            post(&c, base, "other", "acquire", serde_json::json!({}))
                .await
                .0
                == 200
        },
    )
    .await;
    let (s, v) = post(&c, base, "k", "acquire", serde_json::json!({"count": 2})).await;
    assert_eq!((s, v["in_flight"].clone()), (429, 2.into()), "{v}");
    // and the refused renewal left its lapse alone: the lease still lives its 60 s
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (s, v) = post(&c, base, "k", "release", held).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &c,
        base,
        "k",
        "acquire",
        serde_json::json!({"count": LIMIT}),
    )
    .await;
    assert_eq!(s, 200, "every slot free after the one release: {v}");
    assert!(refused_in < Duration::from_secs(2), "{refused_in:?}");
}
