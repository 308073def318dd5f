//! The HTTP door as a hostile client uses it: forwarding headers with bytes that are
//! not ASCII, an IPv6 client moving inside its /64, keys that are not UTF-8, and a
//! refund sent to a node that did not admit the hits.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use swin_testkit::cluster::{within, Node, TestStore};

fn node(dir: &Path, config: &str) -> Node {
    let path = dir.join("swin.toml");
    std::fs::write(&path, config).expect("write config");
    super::support::node(&path)
}

/// Sends raw bytes on a fresh connection and reads the whole answer.
fn exchange(port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Behind nginx's `$proxy_add_x_forwarded_for`, a client that puts a byte that is not
/// ASCII in its own X-Forwarded-For and a new X-Real-IP each time: the address nginx
/// appended is still the key (it used to drop the whole line and believe X-Real-IP:
/// 8 of 8 admitted on a limit of 5).
#[test]
fn forwarding_headers_with_bytes_that_are_not_ascii_do_not_lift_a_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "trusted_proxies = [\"127.0.0.1/32\"]\n[[namespaces]]\nname = \"login\"\nwindow_sizes = [60]\nsync_rate = -1\nlimits = [{ window_size = 60, limit = 5 }]\n",
    );
    let mut codes = Vec::new();
    for i in 0..8 {
        let mut req =
            b"GET /v1/auth/login HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: \xff\xfe".to_vec();
        req.extend_from_slice(
            format!("{i}, 203.0.113.7\r\nX-Real-IP: 198.51.100.{i}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        );
        let answer = exchange(n.port, &req);
        codes.push(answer.get(9..12).unwrap_or("").to_owned());
    }
    assert_eq!(
        codes,
        ["200", "200", "200", "200", "200", "429", "429", "429"],
        "5 of a limit of 5 admitted"
    );
}

/// The status code of a raw exchange's answer, and its body.
fn code_and_body(answer: &str) -> (String, String) {
    let code = answer.get(9..12).unwrap_or("").to_owned();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

/// A hit of 1 on `key` of namespace `api`, on a connection of its own: code and body.
fn hit_api(port: u16, key: &str) -> (String, String) {
    let req = format!(
        "POST /v1/namespaces/api/keys/{key}/hit HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    code_and_body(&exchange(port, req.as_bytes()))
}

/// In a local-only namespace whose counter table is full (`max_counters`), a client at
/// its limit churns other keys at the window's turn: its counter, whose previous window
/// still weighs, is kept (it used to be evicted: its count started again at 0 and the
/// client was admitted past its limit); the churned keys wait for room (503).
#[test]
fn churning_keys_does_not_evict_a_local_count_that_still_weighs() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "[[namespaces]]\nname = \"api\"\nwindow_sizes = [3]\nsync_rate = -1\nmax_counters = 4\nlimits = [{ window_size = 3, limit = 5 }]\n",
    );
    let hit = |key: &str| hit_api(n.port, key);
    let ms_into_window = || {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis();
        (t % 3000) as u64
    };
    // the hits early in a window, the churn early in the next (the previous window
    // weighs about 90 % then), a local drain (every second) in between
    std::thread::sleep(Duration::from_millis(3000 - ms_into_window() + 50));
    for _ in 0..5 {
        assert_eq!(hit("victim").0, "200");
    }
    std::thread::sleep(Duration::from_millis(3000 - ms_into_window() + 50));
    let mut codes = Vec::new();
    for i in 0..10 {
        codes.push(hit(&format!("churn-{i}")).0);
    }
    assert!(
        codes.iter().all(|c| c == "200" || c == "503"),
        "churned keys are counted or wait for room: {codes:?}"
    );
    assert!(
        codes.iter().any(|c| c == "503"),
        "the table is full: {codes:?}"
    );
    let read =
        "GET /v1/namespaces/api/keys/victim HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let (code, body) = code_and_body(&exchange(n.port, read.as_bytes()));
    assert_eq!(code, "200", "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let previous = v.pointer("/windows/0/previous");
    assert_eq!(
        previous.and_then(serde_json::Value::as_f64),
        Some(5.0),
        "the victim's previous window: {v}"
    );
    let (code, body) = hit("victim");
    assert_eq!(code, "429", "past its limit: {body}");
}

/// The same in a local-only GCRA namespace: a client that spent its burst churns other
/// keys, each spending its own burst, into a full table (`max_counters`); its empty
/// bucket is kept (it used to be evicted, and the client spent a whole burst again).
#[test]
fn churning_keys_does_not_evict_a_local_bucket_that_is_not_full() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nmax_counters = 4\nalgorithm = \"gcra\"\ngcra = { burst = 5, count = 5, period = \"1h\" }\n",
    );
    let hit = |key: &str| hit_api(n.port, key).0;
    let codes: Vec<String> = (0..6).map(|_| hit("victim")).collect();
    assert_eq!(codes, ["200", "200", "200", "200", "200", "429"]);
    // the local loop folds the spends every second: then the churn
    std::thread::sleep(Duration::from_millis(1500));
    let mut churned = Vec::new();
    for i in 0..10 {
        for _ in 0..5 {
            churned.push(hit(&format!("churn-{i}")));
        }
    }
    assert!(
        churned.iter().any(|c| c == "503"),
        "the table is full: {churned:?}"
    );
    // folded again: the churned buckets could go now, the victim's is still kept
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(hit("victim"), "429", "the victim's empty bucket is kept");
}

/// An IPv6 client that sends each request from another address of its /64 (a host is
/// given 2^64 of them) is one client: its limit holds (it used to be a new key each
/// time: 8 of 8 admitted on a limit of 5), and a client of another /64 is another key.
#[test]
fn an_ipv6_client_moving_inside_its_64_does_not_lift_a_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "trusted_proxies = [\"127.0.0.1/32\"]\n[[namespaces]]\nname = \"login\"\nwindow_sizes = [60]\nsync_rate = -1\nlimits = [{ window_size = 60, limit = 5 }]\n",
    );
    let status = |from: &str| {
        let req = format!(
            "GET /v1/auth/login HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {from}\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(n.port, req.as_bytes());
        answer.get(9..12).unwrap_or("").to_owned()
    };
    let codes: Vec<String> = (1..=8)
        .map(|i| status(&format!("2001:db8:7:1:{i:x}:{i:x}:0:{i:x}")))
        .collect();
    assert_eq!(
        codes,
        ["200", "200", "200", "200", "200", "429", "429", "429"],
        "5 of a limit of 5 admitted"
    );
    assert_eq!(
        status("2001:db8:7::1"),
        "200",
        "another /64 is another client"
    );
    // the key is the /64, and an operator reads it back (its `/` escaped in the path)
    let read = exchange(
        n.port,
        b"GET /v1/namespaces/login/keys/2001:db8:7:1::%2F64 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(read.contains("\"current\":5.0"), "{read}");
    // an IPv4 client through NAT64 is that IPv4 client, not NAT64's /64
    for _ in 0..5 {
        assert_eq!(status("64:ff9b::203.0.113.7"), "200");
    }
    assert_eq!(status("203.0.113.7"), "429", "the same client natively");
    assert_eq!(status("64:ff9b::203.0.113.8"), "200", "another IPv4 client");
}

/// Behind a proxy that appends an empty value to X-Forwarded-For, or adds an X-Real-IP
/// beside the client's, the client could name any key — a victim's: no such request is
/// keyed by what the client wrote (both used to be: the client's address, left of the
/// empty entry or first of the two, was counted).
#[test]
fn a_client_written_address_is_not_believed_past_an_empty_hop_or_a_second_real_ip() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "trusted_proxies = [\"127.0.0.1/32\"]\n[[namespaces]]\nname = \"login\"\nwindow_sizes = [60]\nsync_rate = -1\nlimits = [{ window_size = 60, limit = 5 }]\n",
    );
    let status = |headers: &str| {
        let req =
            format!("GET /v1/auth/login HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n");
        let answer = exchange(n.port, req.as_bytes());
        answer.get(9..12).unwrap_or("").to_owned()
    };
    for h in [
        "X-Forwarded-For: 198.51.100.41,\r\n",
        "X-Forwarded-For: 198.51.100.41, , \r\n",
        "X-Real-IP: 198.51.100.41\r\nX-Real-IP: 198.51.100.42\r\n",
    ] {
        assert_eq!(status(h), "401", "{h:?}: no key, nothing counted");
    }
    let read = exchange(
        n.port,
        b"GET /v1/namespaces/login/keys/198.51.100.41 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(read.contains("\"current\":0.0"), "{read}");
}

/// A key that is not UTF-8 once percent-decoded is `invalid_key` on every route that
/// takes one, as the README says (it was `bad_request`).
#[test]
fn a_key_that_is_not_utf8_is_an_invalid_key() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "[[namespaces]]\nname = \"api\"\nwindow_sizes = [60]\nsync_rate = -1\nlimits = [{ window_size = 60, limit = 5 }]\n",
    );
    for (method, tail) in [
        ("POST", "/increment"),
        ("POST", "/hit"),
        ("POST", "/refund"),
        ("GET", ""),
        ("DELETE", ""),
    ] {
        let req = format!(
            "{method} /v1/namespaces/api/keys/%FF%FE{tail} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(n.port, req.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{method} {tail}: {answer}"
        );
        assert!(
            answer.contains("\"code\":\"invalid_key\""),
            "{method} {tail}: {answer}"
        );
    }
}

/// Node A admits 10 of 10 and syncs; the client's refund of 10 goes to node B, which
/// never held the key: B reads the cluster's count, gives back 10 and says so, and A
/// admits again once the refund is synced — exactly 0 left in the store. (B used to
/// answer `allowed: false, remaining: 10` and give nothing back.)
async fn a_refund_on_another_node_gives_back_what_was_admitted(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        "store_timeout = 2\n{}\n[[namespaces]]\nname = \"api\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.1\nlimits = [{{ window_size = 3600, limit = 10 }}]\n",
        store.section()
    );
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config).expect("write");
    let mut a = super::support::node(&path);
    let mut b = super::support::node(&path);
    let client = reqwest::Client::new();
    let hit = async |base: &str| {
        client
            .post(format!("{base}/v1/namespaces/api/keys/k/hit"))
            .send()
            .await
            .expect("hit")
            .status()
            .as_u16()
    };
    for _ in 0..10 {
        assert_eq!(hit(&a.base).await, 200);
    }
    assert_eq!(hit(&a.base).await, 429, "the limit holds on A");
    within(Duration::from_secs(10), "10 in the store", async || {
        store.totals("api").await.get("k") == Some(&10.0)
    })
    .await;
    let r = client
        .post(format!("{}/v1/namespaces/api/keys/k/refund", b.base))
        .json(&serde_json::json!({"cost": 10}))
        .send()
        .await
        .expect("refund");
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["refunded"], 10.0, "{body}");
    assert_eq!(body["allowed"], true, "{body}");
    assert_eq!(body["remaining"], 10.0, "{body}");
    within(Duration::from_secs(10), "0 in the store", async || {
        store.totals("api").await.get("k").copied().unwrap_or(0.0) == 0.0
    })
    .await;
    within(Duration::from_secs(10), "A admits again", async || {
        hit(&a.base).await == 200
    })
    .await;
    assert!(a.terminate() && b.terminate());
    assert_eq!(store.totals("api").await.get("k"), Some(&1.0), "exact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_refund_on_another_node_gives_back_what_was_admitted() {
    a_refund_on_another_node_gives_back_what_was_admitted(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_refund_on_another_node_gives_back_what_was_admitted() {
    a_refund_on_another_node_gives_back_what_was_admitted(TestStore::redis()).await;
}

/// An operator inspects a SQLite store with the `sqlite3` their system ships (Debian 12:
/// 3.40, before `unixepoch('subsec')`): `swin_rates` shows the counts a node pushed (it
/// showed no rows at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swin_rates_reads_with_the_systems_sqlite3() {
    let store = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut n = node(
        dir.path(),
        &format!(
            "{}\n[[namespaces]]\nname = \"api\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.1\n",
            store.section()
        ),
    );
    let client = reqwest::Client::new();
    super::support::increment(&client, &n.base, "api", "k", 3).await;
    assert!(n.terminate(), "the last push");
    let db = store.sqlite_path().expect("a file");
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT namespace, key, window_size, current FROM swin_rates")
        .output()
        .expect("sqlite3 on PATH (scripts/test installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.trim(), "api|k|3600|3.0", "sqlite3 {:?}", version());
}

fn version() -> String {
    std::process::Command::new("sqlite3")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
