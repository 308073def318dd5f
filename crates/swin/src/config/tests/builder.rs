//! A config built in code is the config the same settings in TOML make, and a value the
//! file would refuse is refused with the file's error.

use super::*;
use crate::policy::algorithm::Algorithm;

fn toml(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text)
}

#[test]
fn a_built_config_is_the_toml_one() {
    let built = Config::builder()
        .data_dir("/var/lib/swin")
        .migrate(false)
        .shutdown_grace(Duration::from_secs(3))
        .store_timeout(Duration::from_secs(2))
        .answer_timeout(Duration::from_millis(250))
        .max_clock_offset(Duration::from_secs(4))
        .max_counters(5_000)
        .quota(crate::config::QuotaLimits {
            streams_per_client: 2,
            buckets_per_stream: 3,
            buckets_per_client: 4,
            buckets: 5,
        })
        .store("r", StoreConfig::redis("redis://h:6379").prefix("app"))
        .store(
            "p",
            StoreConfig::postgres("postgres://u@h/db")
                .max_connections(3)
                .ca_file("/etc/ca.pem"),
        )
        .store(
            "c",
            StoreConfig::redis_cluster(["redis://h1:7000", "redis://h2:7001"]).wait_replicas(1),
        )
        .store("s", StoreConfig::sqlite("sqlite::memory:"))
        .namespace(
            NamespaceConfig::builder("api")
                .store("r")
                .window_sizes([60, 3600])
                .sync_rate(1.0)
                .limit(60, 100.0)
                .limit(3600, 1000.0)
                .admission(AdmissionMode::Strict {
                    on_store_failure: OnStoreFailure::Deny,
                })
                .count_denied(true)
                .key_from("client_address"),
        )
        .namespace(
            NamespaceConfig::builder("login")
                .store("p")
                .sync_rate(0.0)
                .algorithm(Algorithm::Gcra)
                .gcra(5, 10, Duration::from_secs(60))
                .max_counters(100),
        )
        .namespace(
            NamespaceConfig::builder("jobs")
                .store("c")
                .sync_rate(0.5)
                .concurrency(20, Duration::from_millis(1500)),
        )
        .namespace(
            NamespaceConfig::builder("local")
                .window_sizes([1])
                .sync_rate(-1.0)
                .allow_decrements(true)
                .shadow(true)
                .limit(1, 5.0)
                .envoy_response_headers(false)
                .envoy_dynamic_metadata(true),
        )
        .build()
        .expect("valid");
    let file = toml(
        r#"
data_dir = "/var/lib/swin"
migrate = false
shutdown_grace = 3
store_timeout = 2
answer_timeout = 0.25
max_clock_offset = 4
max_counters = 5000

[quota]
streams_per_client = 2
buckets_per_stream = 3
buckets_per_client = 4
buckets = 5

[stores.r]
kind = "redis"
url = "redis://h:6379"
prefix = "app"

[stores.p]
kind = "postgres"
url = "postgres://u@h/db"
max_connections = 3
ca_file = "/etc/ca.pem"

[stores.c]
kind = "redis_cluster"
urls = ["redis://h1:7000", "redis://h2:7001"]
wait_replicas = 1

[stores.s]
kind = "sqlite"
url = "sqlite::memory:"

[[namespaces]]
name = "api"
store = "r"
window_sizes = [60, 3600]
sync_rate = 1
limits = [{ window_size = 60, limit = 100 }, { window_size = 3600, limit = 1000 }]
admission = "strict"
on_store_failure = "deny"
count_denied = true
key_from = "client_address"

[[namespaces]]
name = "login"
store = "p"
sync_rate = 0
algorithm = "gcra"
gcra = { burst = 5, count = 10, period = "1m" }
max_counters = 100

[[namespaces]]
name = "jobs"
store = "c"
sync_rate = 0.5
algorithm = "concurrency"
limit = 20
lease_ttl = 1.5

[[namespaces]]
name = "local"
window_sizes = [1]
sync_rate = -1
allow_decrements = true
shadow = true
limits = [{ window_size = 1, limit = 5 }]
envoy_response_headers = false
envoy_dynamic_metadata = true
"#,
    )
    .expect("valid");
    assert_eq!(built, file);
}

#[test]
fn what_a_builder_leaves_out_has_the_file_defaults() {
    let built = Config::builder()
        .namespace(
            NamespaceConfig::builder("a")
                .window_sizes([60])
                .sync_rate(-1.0),
        )
        .build()
        .expect("valid");
    let file =
        toml("[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n").expect("valid");
    assert_eq!(built, file);
    assert_eq!(built.data_dir(), Path::new(defaults::DATA_DIR));
    assert_eq!(
        built.store_timeout(),
        Duration::from_secs_f64(defaults::STORE_TIMEOUT_SECS)
    );
}

#[test]
fn a_wrong_value_gets_the_error_the_file_gets() {
    let local = || {
        NamespaceConfig::builder("a")
            .window_sizes([60])
            .sync_rate(-1.0)
    };
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n";
    let cases: Vec<(ConfigBuilder, String)> = vec![
        (
            Config::builder().namespace(NamespaceConfig::builder("a").window_sizes([0]).sync_rate(-1.0)),
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [0]\nsync_rate = -1\n".into(),
        ),
        (
            Config::builder().namespace(local()).namespace(local()),
            format!("{ns}{ns}"),
        ),
        (
            Config::builder().namespace(local().sync_rate(1.0).store("x")),
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"x\"\n"
                .into(),
        ),
        (
            Config::builder().namespace(local().limit(60, -1.0)),
            format!("{ns}limits = [{{ window_size = 60, limit = -1 }}]\n"),
        ),
        (
            Config::builder().namespace(local().admission(AdmissionMode::Strict {
                on_store_failure: OnStoreFailure::Local,
            })),
            format!("{ns}admission = \"strict\"\non_store_failure = \"local\"\n"),
        ),
        (
            Config::builder().store_timeout(Duration::ZERO).namespace(local()),
            format!("store_timeout = 0\n{ns}"),
        ),
        (
            Config::builder()
                .store("m", StoreConfig::redis("postgres://u:hunter2@h/db"))
                .namespace(local()),
            format!("[stores.m]\nkind = \"redis\"\nurl = \"postgres://u:hunter2@h/db\"\n{ns}"),
        ),
        (
            Config::builder()
                .store("m", StoreConfig::sqlite("sqlite::memory:").prefix("p"))
                .namespace(local()),
            format!("[stores.m]\nkind = \"sqlite\"\nurl = \"sqlite::memory:\"\nprefix = \"p\"\n{ns}"),
        ),
        (
            Config::builder().namespace(
                NamespaceConfig::builder("a")
                    .sync_rate(-1.0)
                    .concurrency(0, Duration::from_secs(30)),
            ),
            "[[namespaces]]\nname = \"a\"\nsync_rate = -1\nalgorithm = \"concurrency\"\nlimit = 0\nlease_ttl = 30\n"
                .into(),
        ),
        (
            Config::builder().namespace(local()).quota(crate::config::QuotaLimits {
                buckets: 0,
                ..Default::default()
            }),
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n[quota]\nstreams_per_client = 64\nbuckets_per_stream = 10000\nbuckets_per_client = 50000\nbuckets = 0\n"
                .into(),
        ),
    ];
    // no namespace at all
    assert_eq!(
        Config::builder().build().expect_err("refused").to_string(),
        toml("").expect_err("refused").to_string()
    );
    for (built, text) in cases {
        let built = built.build().expect_err("refused");
        let file = toml(&text).expect_err("refused");
        assert_eq!(built.to_string(), file.to_string());
        assert_ne!(
            built.field, "namespaces",
            "{built}: the case tries what it means to"
        );
    }
}
