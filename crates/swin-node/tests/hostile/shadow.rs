//! Shadow mode (`shadow = true` on a namespace or a limit) on every door: a hit its
//! limits would deny passes, is counted, and says so (`swin-shadow-denied`, the JSON's
//! `shadow_denied`, `swin_shadow_denials_total`); a limit enforced beside one in shadow
//! still denies; and through a store outage the hits a namespace in shadow let through
//! all reach the store, exactly.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use swin_testkit::cluster::{metric_value, metrics_text, within, TestStore};

use super::support::OwnRedis;

fn config(store: &TestStore, grpc_port: u16) -> String {
    format!(
        "store_timeout = 1
grpc_listen = \"127.0.0.1:{grpc_port}\"
{}
[[namespaces]]
name = \"shadowed\"
window_sizes = [3600]
sync_rate = 0.2
store = \"main\"
shadow = true
limits = [{{ window_size = 3600, limit = 3 }}]

[[namespaces]]
name = \"mixed\"
window_sizes = [60, 3600]
sync_rate = 0.2
store = \"main\"
limits = [{{ window_size = 60, limit = 6 }}, {{ window_size = 3600, limit = 2, shadow = true }}]

[[namespaces]]
name = \"strict\"
window_sizes = [3600]
sync_rate = 0.2
store = \"main\"
admission = \"strict\"
shadow = true
limits = [{{ window_size = 3600, limit = 3 }}]

[[namespaces]]
name = \"envoy\"
sync_rate = 0.2
store = \"main\"
shadow = true
[[namespaces.descriptors]]
key = \"user\"
rate_limit = {{ unit = \"hour\", requests_per_unit = 3 }}

[[namespaces]]
name = \"bucket\"
sync_rate = 0.2
store = \"main\"
algorithm = \"gcra\"
shadow = true
gcra = {{ burst = 2, count = 2, period = \"1h\" }}
",
        store.section()
    )
}

/// A hit's status, its `swin-shadow-denied` header, its `RateLimit` header and JSON.
async fn hit(
    c: &reqwest::Client,
    url: String,
    body: Option<serde_json::Value>,
) -> (u16, Option<String>, String, serde_json::Value) {
    let mut req = c.post(url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("hit");
    let header = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    let shadow = header("swin-shadow-denied");
    let state = header("ratelimit").unwrap_or_default();
    let status = r.status().as_u16();
    (status, shadow, state, r.json().await.unwrap_or_default())
}

/// `n` hits of `key` in `ns` on `/hit`: per hit, its status and whether it was let
/// through by shadow (asserting the answer agrees with the header).
async fn hits(c: &reqwest::Client, base: &str, ns: &str, key: &str, n: usize) -> Vec<(u16, bool)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let url = format!("{base}/v1/namespaces/{ns}/keys/{key}/hit");
        let (status, shadow, _, v) = hit(c, url, None).await;
        assert_eq!(
            v["shadow_denied"] == true,
            shadow.is_some(),
            "{v} {shadow:?}"
        );
        if shadow.is_some() {
            assert_eq!(
                (&v["allowed"], &v["retry_after"]),
                (&true.into(), &0.0.into())
            );
        }
        out.push((status, shadow.is_some()));
    }
    out
}

fn plain(n: usize) -> Vec<(u16, bool)> {
    vec![(200, false); n]
}

fn shadowed(n: usize) -> Vec<(u16, bool)> {
    vec![(200, true); n]
}

fn then(mut a: Vec<(u16, bool)>, b: Vec<(u16, bool)>) -> Vec<(u16, bool)> {
    a.extend(b);
    a
}

/// Envoy's answer to `n` hits of `user=<key>` on `domain`: the overall code and the
/// shadow header Envoy is asked to add, if any.
async fn envoy(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    key: &str,
    n: u64,
) -> (i32, Option<String>) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: key.into(),
                }],
                hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: n }),
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    let shadow = r
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "swin-shadow-denied")
        .map(|h| h.value.clone());
    (r.overall_code, shadow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_lets_hits_through_counted_and_says_so_on_every_door_and_through_an_outage() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let grpc_port = swin_testkit::free_port();
    let mut own = OwnRedis::start(|s| config(s, grpc_port));
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    let c = reqwest::Client::new();
    let base = own.node.base.clone();

    // /hit: a namespace in shadow lets the 4th and 5th hits through, saying which limit
    // would have denied them and what it would have said
    assert_eq!(
        hits(&c, &base, "shadowed", "k", 3).await,
        plain(3),
        "within the limit"
    );
    let (status, shadow, state, v) = hit(
        &c,
        format!("{base}/v1/namespaces/shadowed/keys/k/hit"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let shadow = shadow.expect("the shadow header");
    assert!(shadow.starts_with("\"3600s\";t="), "{shadow}");
    assert!(state.starts_with("\"3600s\";r=0;"), "{state}");
    assert_eq!(hits(&c, &base, "shadowed", "k", 1).await, shadowed(1));

    // a limit in shadow beside one enforced: the shadow one lets hits through, the
    // enforced one still denies (and a denied hit is not counted)
    assert_eq!(
        hits(&c, &base, "mixed", "m", 7).await,
        then(then(plain(2), shadowed(4)), vec![(429, false)])
    );
    // strict admission and GCRA in shadow
    assert_eq!(
        hits(&c, &base, "strict", "s", 5).await,
        then(plain(3), shadowed(2))
    );
    assert_eq!(
        hits(&c, &base, "bucket", "g", 4).await,
        then(plain(2), shadowed(2))
    );

    // /v1/hits: a batch spent whole, shadow header from the hit that would be denied
    let batch = |hits: serde_json::Value| {
        let c = c.clone();
        let url = format!("{base}/v1/hits");
        async move { hit(&c, url, Some(serde_json::json!({ "hits": hits }))).await }
    };
    let (status, shadow, _, v) = batch(serde_json::json!([
        {"namespace": "shadowed", "key": "b", "cost": 3},
        {"namespace": "shadowed", "key": "c", "cost": 1}
    ]))
    .await;
    assert_eq!((status, shadow.is_none()), (200, true), "{v}");
    let (status, shadow, _, v) = batch(serde_json::json!([
        {"namespace": "shadowed", "key": "c", "cost": 1},
        {"namespace": "shadowed", "key": "b", "cost": 1}
    ]))
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["spent"], true, "{v}");
    assert_eq!(v["results"][1]["shadow_denied"], true, "{v}");
    assert!(shadow.is_some_and(|s| s.starts_with("\"shadowed.3600s\";t=")));

    // /v1/auth (nginx): the key is the client's address
    let mut auth = Vec::new();
    for _ in 0..4 {
        let r = c
            .get(format!("{base}/v1/auth/shadowed"))
            .send()
            .await
            .expect("auth");
        auth.push((
            r.status().as_u16(),
            r.headers().contains_key("swin-shadow-denied"),
        ));
    }
    assert_eq!(auth, then(plain(3), shadowed(1)));

    // Envoy's door: OK, and the shadow header among the headers Envoy adds
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut g = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    assert_eq!(
        envoy(&mut g, "envoy", "e", 3).await,
        (Code::Ok as i32, None)
    );
    let (code, shadow) = envoy(&mut g, "envoy", "e", 2).await;
    assert_eq!(code, Code::Ok as i32);
    assert!(shadow.is_some_and(|s| s.starts_with("\"3600s\";t=")));

    // would-be denials by namespace and limit: /hit 2 + batch 1 + auth 1; Envoy 1
    let text = metrics_text(&c, &base).await;
    let denials = |ns: &str, rule: &str| {
        metric_value(
            &text,
            &format!("swin_shadow_denials_total{{namespace=\"{ns}\",rule=\"{rule}\"}}"),
        )
    };
    assert_eq!(denials("shadowed", "3600s"), Some(4.0), "{text}");
    assert_eq!(denials("envoy", "3600s"), Some(1.0), "{text}");
    assert_eq!(denials("mixed", "3600s"), Some(4.0));
    assert_eq!(denials("strict", "3600s"), Some(2.0));
    assert_eq!(denials("bucket", "gcra"), Some(2.0));

    // the store goes away: a namespace in shadow goes on letting hits through, counted,
    // and they all reach the store once it is back
    drop(own.server.take());
    assert_eq!(
        hits(&c, &base, "shadowed", "o", 5).await,
        then(plain(3), shadowed(2))
    );
    own.restart();
    within(
        Duration::from_secs(20),
        "every hit let through reaches the store",
        async || {
            // every namespace's: each syncs on its own timer
            let totals = store.totals_in("shadowed", Some(3600)).await;
            let sum = async |ns: &str| store.totals_in(ns, Some(3600)).await.values().sum::<f64>();
            totals.get("o") == Some(&5.0)
                && totals.get("k") == Some(&5.0)
                && sum("envoy").await == 5.0
                && sum("strict").await == 5.0
        },
    )
    .await;
    let totals = store.totals_in("shadowed", Some(3600)).await;
    // the batch's keys and the proxy's client: every hit counted, nothing else
    assert_eq!(totals.get("b"), Some(&4.0), "{totals:?}");
    assert_eq!(totals.get("c"), Some(&2.0), "{totals:?}");
    assert_eq!(totals.get("127.0.0.1"), Some(&4.0), "{totals:?}");
    assert_eq!(totals.values().sum::<f64>(), 20.0, "{totals:?}");
    // Envoy's 3 + 2, and strict's 5, counted too
    let envoy = store.totals_in("envoy", Some(3600)).await;
    assert_eq!(envoy.values().sum::<f64>(), 5.0, "{envoy:?}");
    let strict = store.totals_in("strict", Some(3600)).await;
    assert_eq!(strict.values().sum::<f64>(), 5.0, "{strict:?}");
    let mixed = store.totals_in("mixed", Some(60)).await;
    assert_eq!(
        mixed.get("m"),
        Some(&6.0),
        "the denied 7th is not counted: {mixed:?}"
    );
    drop(own);
}
