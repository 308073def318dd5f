//! Stores as managed services run them: TLS with a private CA and a password that the
//! config names by environment variable only. Each test starts its own server (a
//! redis-server with a TLS port and an ACL user; a six-process Redis Cluster on TLS
//! ports with a password; a PostgreSQL with `ssl = on` and a scram-sha-256 role) and reaches it through the node's config and `open_store`: pushes
//! and reads are exact, a wrong password or a connection without TLS is refused, and the
//! password shows in no error and no `Debug` output.

use swin_core::Diff;
use swin_node::config::Config;
use swin_node::node::open_store;
use swin_sync::{Push, Store, WindowKey};
use swin_testkit::tls::{TlsPostgres, TlsRedis, PASSWORD};

const START: i64 = 1_763_784_000;

fn store_config(section: &str, password: &str) -> swin::config::StoreConfig {
    let text = format!(
        "[stores.main]\n{section}\n[[namespaces]]\nname = \"ns\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"main\"\n"
    );
    let env = |k: &str| (k == "SWIN_TEST_STORE_PASSWORD").then(|| password.to_string());
    let config = Config::parse("secured.toml", &text, &env).expect("config");
    let store = config.limiter().stores()["main"].clone();
    let debug = format!("{config:?}");
    assert!(!debug.contains(password), "{debug}");
    store
}

/// The store a `[stores.main]` section opens, its password in the environment.
async fn open(section: &str, password: &str) -> Store {
    open_store("main", &store_config(section, password))
        .await
        .expect("open")
}

/// Migrates, pushes 3 + 4 (exactly once: the second push repeats the first's number) and
/// reads 3 back.
async fn push_and_read(store: &Store) {
    store.migrate().await.expect("migrate");
    let diffs = [Diff {
        key: "k".into(),
        window_size: 60,
        window_start: START,
        value: 3.0,
    }];
    for _ in 0..2 {
        let push = Push {
            node_id: &swin_sync::PushId::from("n"),
            seq: Some(1),
            diffs: &diffs,
        };
        store.push("ns", push).await.expect("push");
    }
    let w = [WindowKey {
        key: "k".into(),
        window_size: 60,
        window_start: START,
    }];
    let totals = store.read("ns", &w).await.expect("read");
    assert_eq!(totals.len(), 1);
    assert_eq!(totals[0].count, 3.0);
}

/// The error, checked to name no password.
async fn refused(store: &Store) -> String {
    let e = store.ping().await.expect_err("refused").to_string();
    assert!(!e.contains(PASSWORD), "{e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_an_acl_user() {
    let server = TlsRedis::start();
    let ca = server.ca.ca_file.display();
    let url = server.url();
    let section = format!(
        "kind = \"redis\"\nurl = \"{url}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"\nca_file = \"{ca}\""
    );
    let store = open(&section, PASSWORD).await;
    push_and_read(&store).await;

    let wrong = open(&section, "not-the-password").await;
    let e = refused(&wrong).await;
    assert!(e.to_lowercase().contains("authentication failed"), "{e}");
    // without the CA the server's certificate is not trusted
    let untrusted =
        format!("kind = \"redis\"\nurl = \"{url}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"");
    let store = open(&untrusted, PASSWORD).await;
    refused(&store).await;
    // nor does the TLS port speak plain Redis
    let plain = format!(
        "kind = \"redis\"\nurl = \"redis://{}@127.0.0.1:{}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"",
        TlsRedis::USER,
        server.port
    );
    let store = open(&plain, PASSWORD).await;
    refused(&store).await;
}

/// A Redis Cluster that speaks TLS only (clients, replication, bus) and asks for a
/// password: the node reaches every shard over TLS with the CA given, as the seeds
/// announce them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_tls_with_a_password() {
    let cluster = swin_testkit::redis_cluster::RedisCluster::start_secured();
    let ca = cluster.tls.as_ref().expect("secured").ca_file.display();
    let urls = cluster.urls();
    let section = format!(
        "kind = \"redis_cluster\"\nurls = {:?}\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"\nca_file = \"{ca}\"",
        &urls[..1]
    );
    let store = open(&section, PASSWORD).await;
    push_and_read(&store).await;
    // keys on every shard: each is reached over TLS with the password
    let diffs: Vec<Diff> = (0..64)
        .map(|i| Diff {
            key: format!("spread-{i}").into(),
            window_size: 60,
            window_start: START,
            value: 1.0,
        })
        .collect();
    let push = Push {
        node_id: &swin_sync::PushId::from("n"),
        seq: Some(2),
        diffs: &diffs,
    };
    assert_eq!(store.push("ns", push).await.expect("push").totals.len(), 64);
    store.ping().await.expect("every primary answers");

    let wrong = open(&section, "not-the-password").await;
    let e = refused(&wrong).await;
    assert!(
        e.contains("WRONGPASS") || e.to_lowercase().contains("auth"),
        "{e}"
    );
    // without the CA the shards' certificates are not trusted
    let untrusted = format!(
        "kind = \"redis_cluster\"\nurls = {:?}\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"",
        &urls[..1]
    );
    refused(&open(&untrusted, PASSWORD).await).await;
    // nor do the TLS ports speak plain Redis
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    let plain = format!(
        "kind = \"redis_cluster\"\nurls = {:?}\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"",
        &plain[..1]
    );
    refused(&open(&plain, PASSWORD).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_with_a_scram_role() {
    let server = TlsPostgres::start().await;
    let ca = server.ca.ca_file.display();
    let url = server.url();
    let section = format!(
        "kind = \"postgres\"\nurl = \"{url}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\"\nca_file = \"{ca}\""
    );
    let store = open(&section, PASSWORD).await;
    push_and_read(&store).await;

    let wrong = open(&section, "not-the-password").await;
    let e = refused(&wrong).await;
    assert!(e.contains("password"), "{e}");
    // verify-full without the CA: the certificate is not trusted
    let untrusted = format!(
        "kind = \"postgres\"\nurl = \"{url}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\""
    );
    let store = open(&untrusted, PASSWORD).await;
    refused(&store).await;
    // without TLS the server lets no one in (pg_hba: hostssl only)
    let plain = url.replace("sslmode=verify-full", "sslmode=disable");
    let plain = format!(
        "kind = \"postgres\"\nurl = \"{plain}\"\npassword_env = \"SWIN_TEST_STORE_PASSWORD\""
    );
    let store = open(&plain, PASSWORD).await;
    let e = refused(&store).await;
    assert!(e.contains("no encryption") || e.contains("pg_hba"), "{e}");
}
