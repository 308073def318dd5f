//! The status page (`GET /ui`) in a real browser: Debian's Chromium, headless, opens it
//! on a node with `[auth]` the way an operator's browser does (the token as the Basic
//! password its login prompt takes), lets its script run, and the page it rendered is
//! read back: every namespace with its mode and store health, the most denied key, and,
//! once the node's store is stopped, the outage on the namespace that uses it and in the
//! banner, while the namespace without a store stays healthy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use swin_testkit::cluster::{use_node_binary, within, Node};

/// SWIN_CHROMIUM, else Debian's `chromium` (scripts/test installs it).
fn chromium() -> PathBuf {
    std::env::var_os("SWIN_CHROMIUM").map_or_else(|| "chromium".into(), PathBuf::from)
}

/// The page at `url` as the browser left it after running its script for a few
/// (virtual) seconds.
fn rendered(url: &str, profile: &Path) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium (scripts/test installs Debian's)");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The row of `namespace` in the rendered page.
fn row<'a>(page: &'a str, namespace: &str) -> &'a str {
    let start = page
        .find(&format!("<tr data-namespace=\"{namespace}\">"))
        .unwrap_or_else(|| panic!("no row for {namespace}: {page}"));
    let end = page[start..].find("</tr>").expect("row end") + start;
    &page[start..end]
}

/// A cell of `row` by its field.
fn field<'a>(row: &'a str, name: &str) -> &'a str {
    let marker = format!("data-field=\"{name}\"");
    let at = row
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name}: {row}"));
    let from = row[at..].find('>').expect("cell") + at + 1;
    let to = row[from..].find("</td>").expect("cell end") + from;
    &row[from..to]
}

fn config(redis_port: u16) -> String {
    let token = |name: &str, secret: &str, scopes: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = {scopes}\n",
            swin_node::http::hash_token(secret.as_bytes())
        )
    };
    format!(
        "store_timeout = 1
{}{}
[stores.main]
kind = \"redis\"
url = \"redis://127.0.0.1:{redis_port}\"
prefix = \"ui\"

[[namespaces]]
name = \"api\"
window_sizes = [60]
sync_rate = 0.2
store = \"main\"
limits = [{{ window_size = 60, limit = 2 }}]

[[namespaces]]
name = \"local\"
window_sizes = [60]
sync_rate = -1
shadow = true
limits = [{{ window_size = 60, limit = 5 }}]
",
        token("ops", "ops-secret", r#"["admin"]"#),
        token("app", "app-secret", r#"["decide"]"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_namespaces_denied_keys_and_a_store_outage_in_a_browser() {
    let dir = tempfile::tempdir().expect("dir");
    let redis_port = swin_testkit::free_port();
    let mut redis = Some(swin_testkit::start_redis(redis_port, dir.path()));
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(redis_port)).expect("config");
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let node = Node::spawn(&path);
    let c = reqwest::Client::new();
    let base = &node.base;

    // mallory is denied 3 times, alice never
    for (key, n) in [("mallory", 5), ("alice", 1)] {
        for _ in 0..n {
            c.post(format!("{base}/v1/namespaces/api/keys/{key}/hit"))
                .bearer_auth("app-secret")
                .send()
                .await
                .expect("hit");
        }
    }

    // a browser without credentials is asked for them; the token is the password, and
    // a token without the admin scope is refused
    let r = c.get(format!("{base}/ui")).send().await.expect("ui");
    assert_eq!(r.status(), 401);
    let challenges: Vec<_> = r
        .headers()
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().expect("ascii").to_owned())
        .collect();
    assert!(
        challenges
            .iter()
            .any(|c| c.starts_with("Basic realm=\"swin\"")),
        "{challenges:?}"
    );
    for (password, status) in [("wrong", 401), ("app-secret", 403), ("ops-secret", 200)] {
        let r = c
            .get(format!("{base}/ui/status"))
            .basic_auth("anyone", Some(password))
            .send()
            .await
            .expect("status");
        assert_eq!(r.status(), status, "{password}");
    }
    // Basic credentials open the page's routes only
    let r = c
        .get(format!("{base}/v1/namespaces"))
        .basic_auth("anyone", Some("ops-secret"))
        .send()
        .await
        .expect("namespaces");
    assert_eq!(r.status(), 401);

    let url = format!("http://ops:ops-secret@127.0.0.1:{}/ui", node.port);
    let profile = dir.path().join("chromium");
    let page = rendered(&url, &profile);
    let api = row(&page, "api");
    assert_eq!(field(api, "health"), "ok", "{api}");
    assert_eq!(field(api, "sync"), "every 0.2 s", "{api}");
    assert_eq!(field(api, "limits"), "sliding_window, eventual", "{api}");
    assert_eq!(field(api, "store"), "main", "{api}");
    let top = field(api, "top_denied");
    assert!(top.contains("<code>mallory</code> 3"), "{top}");
    assert!(!top.contains("alice"), "{top}");
    let local = row(&page, "local");
    assert_eq!(field(local, "limits"), "sliding_window, eventual, shadow");
    assert_eq!(field(local, "sync"), "local", "{local}");
    assert_eq!(field(local, "last_sync"), "—", "{local}");
    assert!(
        page.contains("<div id=\"banner\" role=\"alert\" class=\"\">"),
        "{page}"
    );

    // the store goes away: the page shows it on the namespace that uses it
    drop(redis.take());
    within(
        Duration::from_secs(15),
        "the node sees the outage",
        async || {
            let v: serde_json::Value = c
                .get(format!("{base}/v1/namespaces"))
                .bearer_auth("ops-secret")
                .send()
                .await
                .expect("namespaces")
                .json()
                .await
                .expect("json");
            v["namespaces"]
                .as_array()
                .expect("list")
                .iter()
                .any(|n| n["name"] == "api" && n["degraded"] == true)
        },
    )
    .await;
    let page = rendered(&url, &profile);
    let api = row(&page, "api");
    assert_eq!(field(api, "health"), "degraded: store_unreachable", "{api}");
    assert!(api.contains("class=\"degraded\""), "{api}");
    assert_eq!(field(row(&page, "local"), "health"), "ok");
    assert!(
        page.contains("class=\"shown\">Store trouble: api (store_unreachable)</div>"),
        "{page}"
    );
    drop(node);
}
