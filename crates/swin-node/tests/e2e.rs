//! The real binary against the real stores: two nodes converge on PostgreSQL, Redis and
//! SQLite; increments followed at once by SIGTERM are all in the store; SIGHUP reloads;
//! a node started while its store is down serves, reports degraded, and catches up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use swin_testkit::cluster::{read, use_node_binary, within, ClusterStore, Node, TestStore};

/// The store's section and namespace `api` (window 3600 s, synced every 100 ms), then
/// `extra`.
fn write_config(dir: &Path, store: &TestStore, extra: &str) -> PathBuf {
    let path = dir.join("swin.toml");
    std::fs::write(&path, store.config(0.1) + extra).expect("write config");
    path
}

fn start(config: &Path) -> Node {
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    Node::spawn(config)
}

async fn stored(store: &TestStore, key: &str) -> f64 {
    store.totals("api").await.get(key).copied().unwrap_or(0.0)
}

/// The key's count over the current and previous hour as the node reports it (a test
/// that crosses the hour still sees every hit).
async fn count(client: &reqwest::Client, base: &str, ns: &str, key: &str) -> f64 {
    let n = read(client, base, ns, key).await;
    n.current + n.previous
}

async fn hit(client: &reqwest::Client, base: &str, ns: &str, key: &str, n: usize) {
    for _ in 0..n {
        let r = client
            .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/increment"))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 200);
    }
}

async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    within(Duration::from_secs(15), what, check).await;
}

/// Two nodes on one store: 50 hits on A and 70 on B read 120 on both within a few sync
/// periods and the store holds 120; then hits followed at once by SIGTERM all land.
async fn converge_and_terminate(backend: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &backend, "");
    let mut a = start(&config);
    let mut b = start(&config);
    let client = reqwest::Client::new();
    hit(&client, &a.base, "api", "shared", 50).await;
    hit(&client, &b.base, "api", "shared", 70).await;
    eventually("both nodes read 120", async || {
        count(&client, &a.base, "api", "shared").await == 120.0
            && count(&client, &b.base, "api", "shared").await == 120.0
    })
    .await;
    assert_eq!(stored(&backend, "shared").await, 120.0);

    hit(&client, &a.base, "api", "last", 33).await;
    let status = a.terminate();
    assert!(status, "SIGTERM exits 0");
    assert_eq!(stored(&backend, "last").await, 33.0);
    assert!(b.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_converge_and_sigterm_loses_nothing() {
    converge_and_terminate(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_nodes_converge_and_sigterm_loses_nothing() {
    let backend = TestStore::redis();
    converge_and_terminate(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_nodes_share_one_file_and_converge() {
    converge_and_terminate(TestStore::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_namespace_keeps_counts_and_rejects_a_bad_file() {
    let backend = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &backend, "");
    let mut node = start(&config);
    let client = reqwest::Client::new();
    hit(&client, &node.base, "api", "k", 5).await;

    let extra = "[[namespaces]]\nname = \"extra\"\nwindow_sizes = [60]\nsync_rate = -1\n";
    write_config(dir.path(), &backend, extra);
    node.signal("HUP");
    eventually("namespace extra appears", async || {
        client
            .post(format!(
                "{}/v1/namespaces/extra/keys/x/increment",
                node.base
            ))
            .send()
            .await
            .expect("post")
            .status()
            == 200
    })
    .await;
    assert_eq!(
        count(&client, &node.base, "api", "k").await,
        5.0,
        "api kept its counts"
    );

    // a file that does not parse, an empty one (it would remove every namespace), and
    // one whose store cannot be set up (with a namespace that must then not appear):
    // each is rejected with nothing changed
    let unusable = "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite:///proc/swin-nowhere/x.db\"\n\
         [[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = 0.1\nstore = \"main\"\n\
         [[namespaces]]\nname = \"late\"\nwindow_sizes = [60]\nsync_rate = -1\n";
    for bad in ["this is not toml [", "", unusable] {
        std::fs::write(&config, bad).expect("write");
        node.signal("HUP");
        tokio::time::sleep(Duration::from_millis(300)).await;
        hit(&client, &node.base, "extra", "x", 1).await;
    }
    assert_eq!(
        count(&client, &node.base, "extra", "x").await,
        4.0,
        "the old config stays"
    );
    let late = client
        .post(format!("{}/v1/namespaces/late/keys/x/increment", node.base))
        .send()
        .await
        .expect("post");
    assert_eq!(late.status(), 404, "a rejected reload adds nothing");

    // new limits on a local-only namespace: its counts (4 hits on x) stay
    let limited = format!("{extra}limits = [{{ window_size = 60, limit = 5 }}]\n");
    write_config(dir.path(), &backend, &limited);
    node.signal("HUP");
    let hit_x = async || {
        client
            .post(format!("{}/v1/namespaces/extra/keys/x/hit", node.base))
            .send()
            .await
            .expect("post")
            .status()
            .as_u16()
    };
    eventually("the limit applies", async || hit_x().await == 200).await;
    assert_eq!(
        hit_x().await,
        429,
        "4 counted before the reload + 1 = the limit"
    );
    assert!(node.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_while_redis_is_down_serves_and_catches_up() {
    let port = swin_testkit::free_port();
    let backend = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "swin");
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &backend, "");
    let mut node = start(&config);
    let client = reqwest::Client::new();
    hit(&client, &node.base, "api", "k", 10).await;
    eventually("readyz reports the store down", async || {
        let r = client
            .get(format!("{}/readyz", node.base))
            .send()
            .await
            .expect("get");
        r.status() == 503
    })
    .await;
    // what a client learns of the outage is a short reason, never the store's own error
    // (its address, an OS error number, a script hash): that stays in the log
    eventually("a sync has failed", async || {
        let r = client
            .get(format!("{}/v1/namespaces", node.base))
            .send()
            .await
            .expect("get");
        !r.text()
            .await
            .expect("body")
            .contains("\"degraded_reason\":null")
    })
    .await;
    let leaks = ["os error", "refused", "127.0.0.1", "redis:", "NOSCRIPT"];
    let mut bodies = Vec::new();
    for (method, path, want) in [
        ("GET", "/readyz".to_owned(), 503),
        ("GET", "/v1/namespaces".to_owned(), 200),
        ("DELETE", "/v1/namespaces/api/keys/k".to_owned(), 503),
        ("POST", "/v1/namespaces/api/sync".to_owned(), 503),
    ] {
        let r = client
            .request(
                method.parse().expect("method"),
                format!("{}{path}", node.base),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), want, "{method} {path}");
        let body = r.text().await.expect("body");
        for leak in leaks {
            assert!(
                !body.contains(leak),
                "{method} {path} leaks {leak:?}: {body}"
            );
        }
        bodies.push(body);
    }
    assert!(bodies[0].contains("store_unreachable"), "{}", bodies[0]);
    assert!(
        bodies[1].contains("\"degraded_reason\":\"store_unreachable\""),
        "{}",
        bodies[1]
    );
    assert!(
        bodies[2].contains("\"code\":\"store_unreachable\""),
        "{}",
        bodies[2]
    );
    assert!(
        bodies[3].contains("\"code\":\"store_unreachable\""),
        "{}",
        bodies[3]
    );

    let data = tempfile::tempdir().expect("dir");
    let server = swin_testkit::start_redis(port, data.path());
    eventually("ready again and pushed", async || {
        let r = client
            .get(format!("{}/readyz", node.base))
            .send()
            .await
            .expect("get");
        r.status() == 200 && stored(&backend, "k").await == 10.0
    })
    .await;
    assert!(node.terminate());
    server.kill();
}

/// `check-config` takes the path as `migrate` does (`--config`) or as an argument, and
/// reports an error on one line, with the TOML line and column, and exit status 1 — no
/// backtrace even when RUST_BACKTRACE asks for one.
#[test]
fn check_config_reports_errors_on_one_line() {
    let dir = tempfile::tempdir().expect("dir");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n",
    )
    .expect("write");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "listen = \"127.0.0.1:1\"\nmigrate = maybe\n").expect("write");
    let run = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_swin-node"))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run swin-node")
    };
    for args in [
        vec!["check-config".as_ref(), good.as_os_str()],
        vec![
            "--config".as_ref(),
            good.as_os_str(),
            "check-config".as_ref(),
        ],
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let out = run(&[
        "check-config".as_ref(),
        "--config".as_ref(),
        bad.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("(toml, line 2, column 11)"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("backtrace"), "{err}");
}

/// The listener answers before the node has started (migrations, warm-ups, the spool):
/// a SIGHUP or SIGTERM then used to kill the process by the signal's default action.
/// Here the start takes seconds (a "PostgreSQL" that accepts and never answers); the
/// signals sent during it are acted on once the node serves, and it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_during_the_start_are_handled_once_the_node_serves() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("swin.toml");
    std::fs::write(
        &config,
        format!(
            "store_timeout = 1\nshutdown_grace = 2\n[stores.main]\nkind = \"postgres\"\n\
             url = \"postgres://postgres@127.0.0.1:{port}/swin\"\n\
             [[namespaces]]\nname = \"api\"\nwindow_sizes = [60]\nsync_rate = 0.1\nstore = \"main\"\n"
        ),
    )
    .expect("write");
    let mut node = start(&config);
    node.signal("HUP");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(node.terminate(), "SIGTERM during the start: a clean exit");
    drop(silent);
}

/// `hash-token` prints the SHA-256 `[auth]` wants, of the line on stdin.
#[test]
fn hash_token_prints_the_sha256_of_stdin() {
    use std::io::Write;
    for input in ["abc\n", "abc"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_swin-node"))
            .arg("hash-token")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

/// Tokens reload with SIGHUP: the old token stops working, the new one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_tokens() {
    let backend = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let token = |secret: &str| {
        format!(
            "\n[[auth.tokens]]\nname = \"app\"\nsha256 = \"{}\"\nscopes = [\"count\"]\n",
            swin_node::http::hash_token(secret.as_bytes())
        )
    };
    let config = write_config(dir.path(), &backend, &token("first"));
    let node = start(&config);
    let client = reqwest::Client::new();
    let status = |secret: &'static str| {
        let client = client.clone();
        let url = format!("{}/v1/namespaces/api/keys/k/increment", node.base);
        async move {
            client
                .post(url)
                .bearer_auth(secret)
                .send()
                .await
                .expect("post")
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("first").await, 200);
    assert_eq!(status("second").await, 401);
    write_config(dir.path(), &backend, &token("second"));
    node.signal("HUP");
    eventually("the new token works", async || {
        status("second").await == 200
    })
    .await;
    assert_eq!(status("first").await, 401);
}
