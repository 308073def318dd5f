//! Strict admission while its store hangs (SIGSTOP): each hit is answered within
//! `store_timeout` (by `on_store_failure`), and once the store is known to be down the
//! hits after it are answered without waiting, as synchronous mode does. (Every hit
//! waited up to twice `store_timeout`: ~30 answers a second instead of ~1,500.)

use std::time::Duration;

async fn hangs(on_failure: &str, expect: u16) {
    let port = swin_testkit::free_port();
    let redis_dir = tempfile::tempdir().expect("dir");
    let redis = swin_testkit::start_redis(port, redis_dir.path());
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!(
            "store_timeout = 1\nshutdown_grace = 2\n[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\nprefix = \"swin\"\n\
             [[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = 0.2\nstore = \"main\"\n\
             limits = [{{ window_size = 3600, limit = 100000 }}]\nadmission = \"strict\"\non_store_failure = \"{on_failure}\"\n"
        ),
    )
    .expect("write");
    let mut n = super::support::node(&path);
    // a client that gives up half a second past store_timeout
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .expect("client");
    let warm = client
        .post(format!("{}/v1/namespaces/api/keys/warm/hit", n.base))
        .send()
        .await
        .expect("answer");
    assert_eq!(warm.status(), 200);
    redis.signal("STOP");
    // eight clients for four seconds, new keys each time (none served from quota held)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, base) = (client.clone(), n.base.clone());
            tokio::spawn(async move {
                let (mut codes, mut late) = (Vec::new(), 0);
                let mut i = 0;
                while tokio::time::Instant::now() < deadline && i < 100_000 {
                    let r = client
                        .post(format!("{base}/v1/namespaces/api/keys/w{w}k{i}/hit"))
                        .send()
                        .await;
                    match r {
                        Ok(r) => codes.push(r.status().as_u16()),
                        Err(_) => late += 1,
                    }
                    i += 1;
                }
                (codes, late)
            })
        })
        .collect();
    let (mut codes, mut late) = (Vec::new(), 0);
    for w in workers {
        let (c, l) = w.await.expect("worker");
        codes.extend(c);
        late += l;
    }
    redis.signal("CONT");
    eprintln!(
        "on_store_failure = {on_failure}: {} answers in 4 s while the store hangs, {late} later than store_timeout + 0.5 s",
        codes.len()
    );
    assert_eq!(late, 0, "hits not answered within store_timeout");
    assert!(
        codes.iter().all(|c| *c == expect),
        "on_store_failure = {on_failure}: {codes:?}"
    );
    assert!(n.terminate());
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_admission_denies_within_store_timeout_while_the_store_hangs() {
    hangs("deny", 429).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_admission_decides_locally_within_store_timeout_while_the_store_hangs() {
    hangs("local", 200).await;
}
