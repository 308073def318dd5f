//! What the hostile tests share: a node from a config file, acknowledged increments, the
//! spool files a node left, and a database that does not exist.

use std::path::{Path, PathBuf};

use swin_testkit::cluster::{use_node_binary, Node};

/// A `swin-node` process on `config`, its spool under `data/` beside it.
pub fn node(config: &Path) -> Node {
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    Node::spawn(config)
}

/// `n` increments of `key` in `namespace`, each acknowledged (200).
pub async fn increment(client: &reqwest::Client, base: &str, namespace: &str, key: &str, n: usize) {
    for _ in 0..n {
        let r = client
            .post(format!(
                "{base}/v1/namespaces/{namespace}/keys/{key}/increment"
            ))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 200);
    }
}

/// The spool files under `dir/data`.
pub fn spool_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join("data"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("spool-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The URL of a database the test PostgreSQL does not have.
pub fn missing_postgres_database() -> String {
    let (server, _) = swin_testkit::postgres_admin_url()
        .rsplit_once('/')
        .map(|(s, d)| (s.to_owned(), d.to_owned()))
        .expect("a URL with a database");
    format!("{server}/swin_no_such_database_{}", std::process::id())
}

/// A node over a Redis server of its own (one the test can stop, hang or restart): the
/// node, the server, its port, and the directory both keep their files in. `config`
/// makes the node's config from the store.
pub struct OwnRedis {
    pub node: Node,
    pub server: Option<swin_testkit::ChildGuard>,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl OwnRedis {
    pub fn start(config: impl Fn(&swin_testkit::cluster::TestStore) -> String) -> OwnRedis {
        let dir = tempfile::tempdir().expect("dir");
        let port = swin_testkit::free_port();
        let server = Some(swin_testkit::start_redis(port, dir.path()));
        let store = swin_testkit::cluster::TestStore::redis_at(
            &format!("redis://127.0.0.1:{port}"),
            "hostile",
        );
        let path = dir.path().join("swin.toml");
        std::fs::write(&path, config(&store)).expect("config");
        let node = node(&path);
        OwnRedis {
            node,
            server,
            port,
            dir,
        }
    }

    /// A node over `server`, a Redis the test started on `port` and filled, with its
    /// files in `dir`; `config` makes the node's config from the `[stores.main]` section
    /// (prefix `hostile`). Unlike [`OwnRedis::start`], nothing here deletes the keys the
    /// test wrote.
    pub fn around(
        server: swin_testkit::ChildGuard,
        port: u16,
        dir: tempfile::TempDir,
        config: impl Fn(&str) -> String,
    ) -> OwnRedis {
        let section = format!(
            "[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\nprefix = \"hostile\"\n"
        );
        let path = dir.path().join("swin.toml");
        std::fs::write(&path, config(&section)).expect("config");
        let node = node(&path);
        OwnRedis {
            node,
            server: Some(server),
            port,
            dir,
        }
    }

    /// Starts the server again (its data kept) after `self.server.take()` stopped it.
    pub fn restart(&mut self) {
        self.server = Some(swin_testkit::start_redis(self.port, self.dir.path()));
    }

    pub fn server(&self) -> &swin_testkit::ChildGuard {
        self.server.as_ref().expect("the server is running")
    }
}

/// Envoy's `ShouldRateLimit` of one descriptor `user=<key>` on `domain` with `n` hits,
/// or with `back`, Envoy's negative hits (refunds, or ends of requests in flight): the
/// overall code, or the gRPC error's.
pub async fn envoy(
    c: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
    domain: &str,
    key: &str,
    n: u64,
    back: bool,
) -> Result<i32, tonic::Code> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let d = RateLimitDescriptor {
        entries: vec![Entry {
            key: "user".into(),
            value: key.into(),
        }],
        hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: n }),
        is_negative_hits: back,
        ..Default::default()
    };
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    })
    .await
    .map(|r| r.into_inner().overall_code)
    .map_err(|s| s.code())
}

/// Waits for a reload to be served: the node's one namespace shows `field` = `value`.
pub async fn applied(c: &reqwest::Client, base: &str, field: &str, value: serde_json::Value) {
    swin_testkit::cluster::within(
        std::time::Duration::from_secs(10),
        "the reload is applied",
        async || {
            let v: serde_json::Value = c
                .get(format!("{base}/v1/namespaces"))
                .send()
                .await
                .expect("get")
                .json()
                .await
                .expect("json");
            v["namespaces"][0][field] == value
        },
    )
    .await;
}

/// A node of `config`, written as `swin.toml` in `dir`.
pub fn node_in(dir: &Path, config: &str) -> Node {
    let path = dir.join("swin.toml");
    std::fs::write(&path, config).expect("write config");
    node(&path)
}

/// `method` on `url` with the JSON `body`: the status and the answer (JSON, else its
/// text as a string).
pub async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c
        .request(method, url)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let answer = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, answer)
}

/// POST of `body` to `url`.
pub async fn post(
    c: &reqwest::Client,
    url: String,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    call(c, reqwest::Method::POST, url, body).await
}
