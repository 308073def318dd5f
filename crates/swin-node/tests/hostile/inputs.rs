//! What a hostile client sends that a node must refuse whole, with an error that names
//! the item and the problem: an increment that takes a synchronous namespace's count
//! past 2^53 (the store refuses it: nothing may be acknowledged), batch items on unknown
//! namespaces or window sizes, increments on namespaces that count in no window, limits
//! calls on namespaces without limits, cursors that are no key, limits past 2^53, an
//! empty increments batch (as an empty hits batch), and a cost of `-0.0` echoed as 0. The
//! store's counts afterwards are exact.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use swin_testkit::cluster::{Node, TestStore};

/// 2^53, the count no window may reach.
const MAX: f64 = 9_007_199_254_740_992.0;

use super::support::{call, node_in as node, post};

/// The keys of `namespace` the store counts something for.
async fn counted(store: &TestStore, namespace: &str) -> BTreeMap<String, f64> {
    let mut all = store.totals(namespace).await;
    all.retain(|_, v| *v != 0.0);
    all
}

fn config(store: &TestStore) -> String {
    format!(
        "{}
[[namespaces]]
name = \"now\"
window_sizes = [60, 3600]
sync_rate = 0
store = \"main\"

[[namespaces]]
name = \"api\"
window_sizes = [60]
sync_rate = 0.1
store = \"main\"
limits = [{{ window_size = 60, limit = 10 }}]

[[namespaces]]
name = \"counting\"
window_sizes = [60]
sync_rate = 0.1
store = \"main\"

[[namespaces]]
name = \"bucket\"
sync_rate = 0.1
store = \"main\"
algorithm = \"gcra\"
gcra = {{ burst = 10, count = 10, period = \"1m\" }}

[[namespaces]]
name = \"slots\"
store = \"main\"
sync_rate = 0.1
algorithm = \"concurrency\"
limit = 3
",
        store.section()
    )
}

/// A synchronous namespace's store holds a key near 2^53 that a second node has not
/// seen there: that node's increment past it was answered 200 and then refused by the
/// store, the acknowledged value lost (a periodic namespace answered 400). Now 400
/// naming the bound, nothing counted; in a batch, nothing of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_increment_past_2_53_in_a_synchronous_namespace_is_refused_and_counts_nothing() {
    let store = TestStore::redis();
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, b) = (
        node(da.path(), &config(&store)),
        node(db.path(), &config(&store)),
    );
    let c = reqwest::Client::new();
    let url = |n: &Node, key: &str| format!("{}/v1/namespaces/now/keys/{key}/increment", n.base);
    let near = MAX - 10.0;
    // node b holds k at 1; node a then takes it near 2^53, which b does not see
    let (s, v) = post(&c, url(&b, "k"), json!({"value": 1, "window_size": 3600})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &c,
        url(&a, "k"),
        json!({"value": near - 1.0, "window_size": 3600}),
    )
    .await;
    assert_eq!(s, 200, "{v}");

    let (s, v) = post(&c, url(&b, "k"), json!({"value": 20, "window_size": 3600})).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (400, &json!("invalid_value")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("2^53"), "{message}");
    // each fits what b has seen, not both together what the store holds
    let batch = json!({"increments": [
        {"namespace": "now", "key": "other", "value": 5},
        {"namespace": "now", "key": "k", "value": 6, "window_size": 3600},
        {"namespace": "now", "key": "k", "value": 6, "window_size": 3600},
    ]});
    let (s, v) = post(&c, format!("{}/v1/increments", b.base), batch).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (400, &json!("invalid_value")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("increments[1]: ") || message.starts_with("increments[2]: "),
        "{message}"
    );

    // exactly the first two increments, nothing else (after a sync period: nothing lands later)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let want: BTreeMap<String, f64> = [("k".to_owned(), near)].into();
    assert_eq!(counted(&store, "now").await, want);
}

/// Every client error of a batch names its item (`hits[1]: `), keeping its status and
/// code: an unknown namespace in `/v1/hits` and `/v1/increments`, an unknown window size
/// in `/v1/increments` (these named nothing). Nothing of the batches is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_errors_name_their_item() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let cases = [
        (
            "hits",
            json!({"hits": [{"namespace": "api", "key": "k", "cost": 1}, {"namespace": "nope", "key": "k", "cost": 1}]}),
            404,
            "unknown_namespace",
        ),
        (
            "increments",
            json!({"increments": [{"namespace": "api", "key": "k"}, {"namespace": "nope", "key": "k"}]}),
            404,
            "unknown_namespace",
        ),
        (
            "increments",
            json!({"increments": [{"namespace": "api", "key": "k"}, {"namespace": "api", "key": "k", "window_size": 61}]}),
            400,
            "unknown_window_size",
        ),
    ];
    for (route, body, status, code) in cases {
        let (s, v) = post(&c, format!("{}/v1/{route}", n.base), body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{v}"
        );
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{route}[1]: ")), "{message}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counted(&store, "api").await, BTreeMap::new());
}

/// Calls that can change or say nothing are refused, each a 400 naming why, with the
/// store untouched: an increment on a GCRA or concurrency namespace (200 with no
/// windows), a list of runtime limits on a namespace without limits (200 empty where
/// the other limits calls answer 400), a cursor that is no key (`%00`), a runtime limit
/// past 2^53 (1e300).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_can_change_nothing_are_refused() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let ns = |path: &str| format!("{}/v1/namespaces/{path}", n.base);
    for (namespace, why) in [("bucket", "gcra"), ("slots", "concurrency")] {
        let (s, v) = post(&c, ns(&format!("{namespace}/keys/k/increment")), json!({})).await;
        assert_eq!(
            (s, &v["error"]["code"]),
            (400, &json!("bad_request")),
            "{v}"
        );
        let message = v["error"]["message"].as_str().expect("message");
        assert!(
            message.contains(why) && message.contains("no windows"),
            "{message}"
        );
    }
    let get = |url: String| call(&c, reqwest::Method::GET, url, Value::Null);
    let (s, v) = get(ns("counting/limits")).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("no limits"),
        "{v}"
    );
    let (s, v) = get(ns("api/limits?after=%00")).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (400, &json!("invalid_key")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .starts_with("after: "),
        "{v}"
    );
    let (s, v) = get(ns("api/limits?after=k")).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = call(
        &c,
        reqwest::Method::PUT,
        ns("api/keys/k/limits"),
        json!({"limits": [{"window_size": 60, "limit": 1e300}]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("2^53"),
        "{v}"
    );
    let (s, v) = get(ns("api/keys/k/limits")).await;
    assert_eq!((s, &v["source"]), (200, &json!("config")), "{v}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counted(&store, "bucket").await, BTreeMap::new());
    assert_eq!(counted(&store, "slots").await, BTreeMap::new());
}

/// A POST of `body` to `path` on `n`, under an `Idempotency-Key` if `key`: the status
/// and the body's text, as sent (a JSON value would hide a `-0.0`).
async fn post_text(
    c: &reqwest::Client,
    n: &Node,
    path: &str,
    key: Option<&str>,
    body: Value,
) -> (u16, String) {
    let mut r = c.post(format!("{}{path}", n.base)).json(&body);
    if let Some(key) = key {
        r = r.header("idempotency-key", key);
    }
    let r = r.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.text().await.expect("body"))
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).expect("JSON")
}

/// An empty `/v1/increments` batch was answered 200 with no results where an empty
/// `/v1/hits` batch is 400, so an `Idempotency-Key` on it kept nothing: now the same 400
/// as hits' (the key still records nothing: the same key then runs a batch). The store
/// counts exactly the one batch that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_increments_batch_is_refused_as_an_empty_hits_batch_is() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let (s, hits) = post_text(&c, &n, "/v1/hits", None, json!({"hits": []})).await;
    assert_eq!(s, 400, "{hits}");
    let hits = parsed(&hits);
    for key in [None, Some("empty-1")] {
        let (s, incs) = post_text(&c, &n, "/v1/increments", key, json!({"increments": []})).await;
        assert_eq!(s, 400, "{key:?}: {incs}");
        let incs = parsed(&incs);
        assert_eq!(incs["error"]["code"], hits["error"]["code"], "{incs}");
        let want = hits["error"]["message"]
            .as_str()
            .expect("message")
            .replacen("hits", "increments", 1);
        assert_eq!(incs["error"]["message"], json!(want), "{incs}");
    }
    let batch = json!({"increments": [{"namespace": "counting", "key": "e", "value": 2}]});
    let (s, v) = post_text(&c, &n, "/v1/increments", Some("empty-1"), batch).await;
    assert_eq!(s, 200, "the empty batch kept nothing under its key: {v}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let want: BTreeMap<String, f64> = [("e".to_owned(), 2.0)].into();
    assert_eq!(counted(&store, "counting").await, want);
}

/// A cost of `-0.0` was echoed as `-0.0` by reserve, extend and commit (one key and
/// several): now `0.0`, in every field that shows it. Nothing is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_of_minus_zero_is_echoed_as_zero() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let zero = json!({"cost": -0.0});
    let (s, reserved) = post_text(&c, &n, "/v1/namespaces/api/keys/z/reserve", None, zero).await;
    assert_eq!(s, 200, "{reserved}");
    let id = parsed(&reserved)["reservation"].clone();
    let several = json!({"keys": ["x", "y"], "cost": -0.0});
    let (s, multi) = post_text(&c, &n, "/v1/namespaces/api/reserve", None, several).await;
    assert_eq!(s, 200, "{multi}");
    let multi_id = parsed(&multi)["reservation"].clone();
    let mut answers = vec![reserved, multi];
    for (path, id) in [
        ("/v1/namespaces/api/keys/z/extend", &id),
        ("/v1/namespaces/api/keys/z/commit", &id),
        ("/v1/namespaces/api/extend", &multi_id),
        ("/v1/namespaces/api/commit", &multi_id),
    ] {
        let body = json!({"reservation": id, "cost": -0.0});
        let (s, v) = post_text(&c, &n, path, None, body).await;
        assert_eq!(s, 200, "{path}: {v}");
        answers.push(v);
    }
    for a in &answers {
        assert!(a.contains("\"cost\":0.0") && !a.contains("-0"), "{a}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counted(&store, "api").await, BTreeMap::new());
}
