//! A big keyspace holds up nothing: a Redis holding 300,000 counter hashes, and the node
//! answers as soon as it has reached its store (it answered only once its warm-up's SCAN
//! was over), lists the namespace as warming meanwhile, counts exactly through the
//! background load, never SCANs the keyspace at a scrape (every scrape walked it for the
//! leases in flight) and serves a reload while the new namespace warms up.

use std::time::Duration;

use swin_testkit::cluster::{metric_value, metrics_text, within};

use super::support::OwnRedis;

const KEYS: usize = 300_000;

fn config(section: &str, sync_rate: f64) -> String {
    format!(
        "{section}
[[namespaces]]
name = \"api\"
window_sizes = [3600]
sync_rate = {sync_rate}
store = \"main\"
limits = [{{ window_size = 3600, limit = 3 }}]

[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = 5
sync_rate = 1
store = \"main\"
"
    )
}

/// SCAN commands the server has run so far.
async fn scans(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_scan:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

async fn store_keys(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    redis::cmd("DBSIZE").query_async(c).await.expect("dbsize")
}

async fn readyz(c: &reqwest::Client, base: &str) -> (u16, serde_json::Value) {
    let r = c
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    (r.status().as_u16(), r.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_keyspace_holds_up_no_start_scrape_or_reload() {
    // the store is filled before the node starts: a Redis of its own, then the node
    let dir = tempfile::tempdir().expect("dir");
    let port = swin_testkit::free_port();
    let server = swin_testkit::start_redis(port, dir.path());
    let url = format!("redis://127.0.0.1:{port}");
    let mut r = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let start = now - now % 3600;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(10_000) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("HSET")
                .arg(format!("hostile:{{3:api:k{i}}}:3600"))
                .arg(start)
                .arg(1)
                .ignore();
        }
        let () = p.query_async(&mut r).await.expect("fill");
    }
    let mut own = OwnRedis::around(server, port, dir, |s| config(s, 0.5));
    let c = reqwest::Client::new();
    let base = own.node.base.clone();

    // answering at once, the namespace's totals still loading
    let (s, v) = readyz(&c, &base).await;
    assert_eq!(store_keys(&mut r).await, KEYS as u64);
    assert_eq!(s, 200, "{v}");
    assert!(
        v["warming"]
            .as_array()
            .is_some_and(|w| w.iter().any(|n| n == "api")),
        "{v}"
    );

    // counts stay exact through the background load: k7 holds 1 of its 3
    let hit = |key: &'static str| {
        let (c, base) = (c.clone(), base.clone());
        async move {
            c.post(format!("{base}/v1/namespaces/api/keys/{key}/hit"))
                .send()
                .await
                .expect("hit")
                .status()
                .as_u16()
        }
    };
    assert_eq!(
        [hit("k7").await, hit("k7").await, hit("k7").await],
        [200, 200, 429]
    );

    // a scrape reads the leases in flight without a SCAN of the keyspace
    let (s, v) = swin_testkit::cluster::key_call(
        &c,
        &base,
        "slots",
        "job",
        "acquire",
        serde_json::json!({"count": 2}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    within(Duration::from_secs(60), "the warm-up ends", async || {
        readyz(&c, &base).await.1.get("warming").is_none()
    })
    .await;
    let mut r = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let before = scans(&mut r).await;
    for _ in 0..5 {
        let text = metrics_text(&c, &base).await;
        assert_eq!(
            metric_value(&text, "swin_leases_in_flight{namespace=\"slots\"}"),
            Some(2.0)
        );
    }
    assert_eq!(scans(&mut r).await, before, "a scrape SCANned the keyspace");

    // a reload that rebuilds the big namespace is served while it warms up again
    let section =
        format!("[stores.main]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"hostile\"\n");
    std::fs::write(own.dir.path().join("swin.toml"), config(&section, 0.25)).expect("config");
    own.node.signal("HUP");
    super::support::applied(&c, &base, "sync_rate", 0.25.into()).await;
    assert_eq!(hit("k7").await, 429, "its count kept through the reload");
    drop(own.server.take());
}
