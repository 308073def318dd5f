//! The spool as an operator's bad day and a hostile hand meet it: it is private, a
//! `data_dir` that cannot take one stops the start (not the stop), and a file that holds
//! what no request could count (a value of 1e308, a namespace no longer configured) is
//! left alone instead of written to the store.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use swin_testkit::cluster::{metric_value, metrics_text, within, TestStore};

use super::support::{increment, node, spool_files};

fn config(port: u16, api: bool) -> String {
    let mut c = format!(
        "store_timeout = 1\nshutdown_grace = 3\n[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\nprefix = \"swin\"\n\
         [[namespaces]]\nname = \"other\"\nwindow_sizes = [60]\nsync_rate = -1\n"
    );
    if api {
        c += "[[namespaces]]\nname = \"api\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.2\n";
    }
    c
}

/// `swin_spool_files` as the node's `/metrics` shows it.
async fn spool_gauge(client: &reqwest::Client, base: &str) -> f64 {
    let text = metrics_text(client, base).await;
    metric_value(&text, "swin_spool_files")
        .unwrap_or_else(|| panic!("no swin_spool_files in {text}"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_is_private_and_checked_like_a_request_on_replay() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    let port = swin_testkit::free_port();
    std::fs::write(&path, config(port, true)).expect("write");
    // the store is not there: five hits are acknowledged and spooled at the stop
    let mut n = node(&path);
    let client = reqwest::Client::new();
    increment(&client, &n.base, "api", "k", 5).await;
    assert!(n.terminate(), "spooled, exit 0");
    let files = spool_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].clone();
    assert_eq!(
        mode(&dir.path().join("data")),
        0o700,
        "the spool's directory"
    );
    assert_eq!(mode(&file), 0o600, "the spool: it holds keys");
    let original = std::fs::read_to_string(&file).expect("read");
    let mut v: serde_json::Value = serde_json::from_str(&original).expect("json");
    // the five hits, in one chunk or in several (a sync round may fall between them);
    // every one of them made a value no request could send
    let chunks = v["entries"][0]["unconfirmed"]["chunks"]
        .as_array_mut()
        .expect("chunks");
    let mut spooled = 0.0;
    for chunk in chunks {
        let value = &mut chunk["rows"]["diffs"][0][3];
        spooled += value.as_f64().expect("a count");
        *value = serde_json::json!(1e308);
    }
    assert_eq!(spooled, 5.0, "{original}");
    std::fs::write(&file, v.to_string()).expect("tamper");

    let redis_dir = tempfile::tempdir().expect("dir");
    let redis = swin_testkit::start_redis(port, redis_dir.path());
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "swin");
    // a value no request could send: not replayed, the file left for the operator
    let mut n = node(&path);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(file.exists(), "a damaged spool is left alone");
    assert_eq!(
        spool_gauge(&client, &n.base).await,
        1.0,
        "the operator sees it"
    );
    assert!(
        store.totals("api").await.is_empty(),
        "nothing of it written"
    );
    assert!(n.terminate());
    // the file as it was, but the namespace is no longer configured: left alone too
    std::fs::write(&file, &original).expect("restore");
    std::fs::write(&path, config(port, false)).expect("write");
    let mut n = node(&path);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        file.exists(),
        "a spool for a namespace not configured is left alone"
    );
    assert!(
        store.totals("api").await.is_empty(),
        "nothing of it written"
    );
    assert!(n.terminate());
    // configured again: replayed exactly once, the file gone
    std::fs::write(&path, config(port, true)).expect("write");
    let mut n = node(&path);
    within(Duration::from_secs(10), "5 in the store", async || {
        store.totals("api").await.get("k") == Some(&5.0)
    })
    .await;
    within(Duration::from_secs(5), "the spool removed", async || {
        !file.exists()
    })
    .await;
    assert_eq!(spool_gauge(&client, &n.base).await, 0.0);
    assert!(n.terminate());
    assert_eq!(store.totals("api").await.get("k"), Some(&5.0), "once");
    drop(redis);
}

/// A link named like a spool file in `data_dir` (someone who can write there, or an
/// operator linking a spool in from a volume): the node starts, leaves the link and its
/// target alone — the target's mode unchanged (the start used to chmod whatever the
/// link pointed to, 0600: any file on the machine, as the node's user) — and shows it
/// as a spool it could not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_named_like_a_spool_file_is_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let outside = tempfile::tempdir().expect("outside");
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "not a spool").expect("write");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("mode");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).expect("mode");
    let link = data.join("spool-1795957700000-1-link.json");
    std::os::unix::fs::symlink(&victim, &link).expect("link");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(swin_testkit::free_port(), true)).expect("write");
    let mut n = node(&path);
    let client = reqwest::Client::new();
    assert_eq!(mode(&victim), 0o644, "the link's target keeps its mode");
    assert_eq!(
        spool_gauge(&client, &n.base).await,
        1.0,
        "the operator sees it"
    );
    assert!(n.terminate(), "exit 0");
    assert!(link.is_symlink(), "the link left where it is");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("read"),
        "not a spool"
    );
}

/// `data_dir` a file, not a directory: the node refuses to start and says why, instead
/// of finding out at the stop that has to spool.
#[test]
fn a_data_dir_that_cannot_take_a_spool_stops_the_start() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(swin_testkit::free_port(), true)).expect("write");
    let not_a_dir = dir.path().join("data");
    std::fs::write(&not_a_dir, "a file").expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_swin-node"))
        .arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", swin_testkit::free_port()))
        .env("SWIN_DATA_DIR", &not_a_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started with a data_dir it cannot spool to");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(!status.success(), "{err}");
    assert!(err.contains("data_dir"), "{err}");
}
