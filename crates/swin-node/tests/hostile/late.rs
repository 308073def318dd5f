//! Synchronous namespaces (`sync_rate = 0`) whose store hangs past `answer_timeout`:
//! a request is answered before its store call ends, and that call lands later. What
//! the request answered as not spent must end up not counted in the store — a batch
//! refused as a whole (`/v1/hits`, Envoy's descriptors), a denied `/hit`, a reserve whose
//! record failed — and what it answered as spent counted once. And a reserve or a
//! refund on a hung store is answered within `answer_timeout`, not twice it or
//! `store_timeout`.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use swin_testkit::cluster::{key_call, within, TestStore};
use tonic::transport::Channel;

use super::support::OwnRedis;

const LIMIT: u32 = 5;

fn config(store: &TestStore, grpc_port: u16) -> String {
    let ns = |name: &str| {
        format!(
            "[[namespaces]]\nname = \"{name}\"\nwindow_sizes = [3600]\nsync_rate = 0\nstore = \"main\"\n\
             limits = [{{ window_size = 3600, limit = {LIMIT} }}]\n"
        )
    };
    format!(
        "store_timeout = 5\ngrpc_listen = \"127.0.0.1:{grpc_port}\"\n{}\n{}{}\
         [[namespaces]]\nname = \"reserve\"\nwindow_sizes = [3600]\nsync_rate = 0\nstore = \"main\"\n\
         limits = [{{ window_size = 3600, limit = 1000 }}]\n\
         [[namespaces]]\nname = \"envoy\"\nsync_rate = 0\nstore = \"main\"\n\
         [[namespaces.descriptors]]\nkey = \"user\"\n\
         rate_limit = {{ unit = \"hour\", requests_per_unit = {LIMIT} }}\n",
        store.section(),
        ns("batch"),
        ns("single"),
    )
}

/// Envoy's `ShouldRateLimit` on `domain` with one descriptor `user=<key>` of `hits` per
/// item: the overall code.
async fn envoy(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    items: &[(&str, u64)],
) -> i32 {
    let descriptors = items
        .iter()
        .map(|(key, hits)| RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: (*key).into(),
            }],
            hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: *hits }),
            ..Default::default()
        })
        .collect();
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    })
    .await
    .expect("answer")
    .into_inner()
    .overall_code
}

async fn hit(c: &reqwest::Client, base: &str, ns: &str, key: &str, cost: u32) -> u16 {
    key_call(c, base, ns, key, "hit", serde_json::json!({ "cost": cost }))
        .await
        .0
}

fn counts(items: &[(&str, f64)]) -> BTreeMap<String, f64> {
    items.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_synchronous_request_answered_as_not_spent_is_not_counted_when_its_store_call_lands_late(
) {
    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;
    let grpc_port = swin_testkit::free_port();
    let own = OwnRedis::start(|s| config(s, grpc_port));
    let (c, base) = (reqwest::Client::new(), own.node.base.clone());
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut g = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    // k1 holds 1, k2 is at its limit, in every namespace; the reserve's key holds 1
    for ns in ["batch", "single"] {
        assert_eq!(hit(&c, &base, ns, "k1", 1).await, 200, "{ns}");
        assert_eq!(hit(&c, &base, ns, "k2", LIMIT).await, 200, "{ns}");
    }
    assert_eq!(hit(&c, &base, "reserve", "k", 1).await, 200);
    assert_eq!(envoy(&mut g, "envoy", &[("k1", 1)]).await, OK);
    assert_eq!(
        envoy(&mut g, "envoy", &[("k2", u64::from(LIMIT))]).await,
        OK
    );

    // the store hangs for two seconds: each request is answered before its store call
    // ends, and the call lands once the store is back
    own.server().signal("STOP");
    let batch = async {
        let r = c
            .post(format!("{base}/v1/hits"))
            .json(&serde_json::json!({"hits": [
                {"namespace": "batch", "key": "k1", "cost": 3},
                {"namespace": "batch", "key": "k2", "cost": 1},
            ]}))
            .send()
            .await
            .expect("answer");
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.expect("json"))
    };
    let reserve = key_call(
        &c,
        &base,
        "reserve",
        "k",
        "reserve",
        serde_json::json!({"cost": 100}),
    );
    let (batch, single, reserve, envoy_code) = tokio::join!(
        batch,
        hit(&c, &base, "single", "k2", 1),
        reserve,
        envoy(&mut g, "envoy", &[("k1", 3), ("k2", 1)]),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    own.server().signal("CONT");
    assert_eq!(batch.0, 429, "{}", batch.1);
    assert_eq!(batch.1["spent"], false, "{}", batch.1);
    assert_eq!(single, 429);
    assert_eq!(reserve.0, 503, "{}", reserve.1);
    assert_eq!(envoy_code, OVER);

    // the store ends as the answers said: nothing of the refused requests, and stays so
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    let want = [
        ("batch", counts(&[("k1", 1.0), ("k2", 5.0)])),
        ("single", counts(&[("k1", 1.0), ("k2", 5.0)])),
        ("reserve", counts(&[("k", 1.0)])),
        ("envoy", counts(&[("user=k1", 1.0), ("user=k2", 5.0)])),
    ];
    for (ns, want) in &want {
        within(
            Duration::from_secs(20),
            "the store holds what the answers said",
            async || store.totals(ns).await == *want,
        )
        .await;
    }
    // longer than a sync period: what lands late would show by now
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (ns, want) in &want {
        assert_eq!(store.totals(ns).await, *want, "{ns}");
    }
}

/// A hung store: a reserve on a synchronous namespace waited twice `answer_timeout`
/// (its hit, then its record), a refund on a periodic one `store_timeout` (its read of
/// the key's count). Each is now answered within `answer_timeout` (1 s here, 5 s
/// `store_timeout`) with its 503, and leaves the store's counts as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_and_a_refund_on_a_hung_store_answer_within_answer_timeout() {
    let own = OwnRedis::start(|store| {
        let ns = |name: &str, rate: &str| {
            format!(
                "[[namespaces]]\nname = \"{name}\"\nwindow_sizes = [3600]\nsync_rate = {rate}\n\
                 store = \"main\"\nlimits = [{{ window_size = 3600, limit = 1000 }}]\n"
            )
        };
        format!(
            "store_timeout = 5\nanswer_timeout = 1\n{}\n{}{}",
            store.section(),
            ns("now", "0"),
            ns("tokens", "0.2")
        )
    });
    let (c, base) = (reqwest::Client::new(), own.node.base.clone());
    assert_eq!(hit(&c, &base, "now", "k", 1).await, 200);
    assert_eq!(hit(&c, &base, "tokens", "k", 5).await, 200);
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    within(Duration::from_secs(5), "pushed", async || {
        store.totals("tokens").await == counts(&[("k", 5.0)])
    })
    .await;

    own.server().signal("STOP");
    let timed = async |ns: &str, op: &str, body: serde_json::Value| {
        let t = std::time::Instant::now();
        let (s, v) = key_call(&c, &base, ns, "k", op, body).await;
        (s, v, t.elapsed())
    };
    let (s, v, took) = timed("now", "reserve", serde_json::json!({"cost": 100})).await;
    assert_eq!(s, 503, "{v}");
    assert!(
        took < Duration::from_millis(1600),
        "a reserve took {took:?}"
    );
    let (s, v, took) = timed("tokens", "refund", serde_json::json!({"cost": 2})).await;
    assert_eq!(s, 503, "{v}");
    assert!(took < Duration::from_millis(1600), "a refund took {took:?}");
    own.server().signal("CONT");

    for (ns, want) in [("now", 1.0), ("tokens", 5.0)] {
        within(
            Duration::from_secs(20),
            "the counts are as they were",
            async || store.totals(ns).await == counts(&[("k", want)]),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(store.totals("now").await, counts(&[("k", 1.0)]));
    assert_eq!(store.totals("tokens").await, counts(&[("k", 5.0)]));
}
