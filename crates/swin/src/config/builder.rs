//! A config built in code: [`ConfigBuilder`], with its stores ([`StoreBuilder`]) and
//! namespaces ([`NamespaceBuilder`]). Each method writes the key a file would hold, so
//! [`ConfigBuilder::build`] checks what it was given by the very path a file takes and
//! a wrong value gets the error, naming the same field, the file would.

use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use super::{AdmissionMode, Config, ConfigError, OnStoreFailure, StoreConfig};
use crate::policy::algorithm::Algorithm;

/// What errors call a config that was built, as they do one from
/// [`Config::from_toml`].
const BUILT: &str = "(config)";

/// Builds a [`Config`] in code ([`Config::builder`]); what it leaves out has the
/// default a file's does (docs/configuration.md).
#[derive(Debug, Clone, Default)]
pub(crate) struct ConfigBuilder {
    table: Table,
}

impl ConfigBuilder {
    /// Where the spool lives (`data_dir`).
    pub(crate) fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref().to_string_lossy().into_owned();
        self.table.insert("data_dir".into(), Value::String(dir));
        self
    }

    /// Whether the stores' migrations run at start (`migrate`, default true).
    pub(crate) fn migrate(mut self, migrate: bool) -> Self {
        self.table.insert("migrate".into(), Value::Boolean(migrate));
        self
    }

    /// How long a stop lets the work in flight finish (`shutdown_grace`).
    pub(crate) fn shutdown_grace(self, grace: Duration) -> Self {
        self.secs("shutdown_grace", grace)
    }

    /// The longest a store call may take (`store_timeout`).
    pub(crate) fn store_timeout(self, timeout: Duration) -> Self {
        self.secs("store_timeout", timeout)
    }

    /// The longest a request waits for a store (`answer_timeout`).
    pub(crate) fn answer_timeout(self, timeout: Duration) -> Self {
        self.secs("answer_timeout", timeout)
    }

    /// How far the node's clock may be from the store's (`max_clock_offset`).
    pub(crate) fn max_clock_offset(self, offset: Duration) -> Self {
        self.secs("max_clock_offset", offset)
    }

    /// The most counters a namespace keeps in memory, unless it says (`max_counters`).
    pub(crate) fn max_counters(mut self, max: usize) -> Self {
        self.table.insert("max_counters".into(), integer(max));
        self
    }

    /// Caps of Envoy's quota service (`[quota]`).
    pub(crate) fn quota(mut self, quota: crate::config::QuotaLimits) -> Self {
        let table = Table::from_iter([
            (
                "streams_per_client".into(),
                integer(quota.streams_per_client),
            ),
            (
                "buckets_per_stream".into(),
                integer(quota.buckets_per_stream),
            ),
            (
                "buckets_per_client".into(),
                integer(quota.buckets_per_client),
            ),
            ("buckets".into(), integer(quota.buckets)),
        ]);
        self.table.insert("quota".into(), Value::Table(table));
        self
    }

    /// A store (`[stores.<name>]`); a second of the same name replaces the first.
    pub(crate) fn store(mut self, name: &str, store: StoreBuilder) -> Self {
        let stores = self
            .table
            .entry("stores")
            .or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(stores) = stores {
            stores.insert(name.to_owned(), Value::Table(store.table));
        }
        self
    }

    /// A namespace (`[[namespaces]]`), after those added before.
    pub(crate) fn namespace(mut self, namespace: NamespaceBuilder) -> Self {
        let namespaces = self
            .table
            .entry("namespaces")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(namespaces) = namespaces {
            namespaces.push(Value::Table(namespace.table));
        }
        self
    }

    /// The config, checked as a file's is.
    pub(crate) fn build(self) -> Result<Config, ConfigError> {
        Config::from_table(BUILT, self.table)
    }

    fn secs(mut self, key: &str, d: Duration) -> Self {
        self.table.insert(key.into(), Value::Float(d.as_secs_f64()));
        self
    }
}

/// One store for [`ConfigBuilder::store`], made by [`StoreConfig::postgres`],
/// [`StoreConfig::redis`], [`StoreConfig::redis_cluster`] or [`StoreConfig::sqlite`].
/// Its password goes in its URL (a builder reads no environment).
#[derive(Debug, Clone)]
pub(crate) struct StoreBuilder {
    table: Table,
}

impl StoreBuilder {
    fn new(kind: &str, url: (&str, Value)) -> Self {
        let table = Table::from_iter([
            ("kind".into(), Value::String(kind.into())),
            (url.0.into(), url.1),
        ]);
        StoreBuilder { table }
    }

    /// Every key's prefix (Redis and Redis Cluster; default `swin`).
    pub(crate) fn prefix(mut self, prefix: &str) -> Self {
        self.table
            .insert("prefix".into(), Value::String(prefix.into()));
        self
    }

    /// The pool's size (PostgreSQL; default 8).
    pub(crate) fn max_connections(mut self, max: u32) -> Self {
        self.table
            .insert("max_connections".into(), Value::Integer(max.into()));
        self
    }

    /// Replicas that must acknowledge a push (Redis Cluster; default 0).
    pub(crate) fn wait_replicas(mut self, replicas: u32) -> Self {
        self.table
            .insert("wait_replicas".into(), Value::Integer(replicas.into()));
        self
    }

    /// A CA certificate (PEM) to verify the server's TLS certificate by.
    pub(crate) fn ca_file(mut self, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().to_string_lossy().into_owned();
        self.table.insert("ca_file".into(), Value::String(path));
        self
    }
}

impl super::NamespaceConfig {
    /// A namespace built in code, added with [`ConfigBuilder::namespace`] and checked
    /// with the rest of the config.
    pub(crate) fn builder(name: &str) -> NamespaceBuilder {
        NamespaceBuilder::new(name)
    }
}

impl StoreConfig {
    /// A PostgreSQL store at `url` (`postgres://…`).
    pub(crate) fn postgres(url: &str) -> StoreBuilder {
        StoreBuilder::new("postgres", ("url", Value::String(url.into())))
    }

    /// A Redis server at `url` (`redis://…`, `rediss://…`).
    pub(crate) fn redis(url: &str) -> StoreBuilder {
        StoreBuilder::new("redis", ("url", Value::String(url.into())))
    }

    /// A Redis Cluster, found from its seed nodes' URLs.
    pub(crate) fn redis_cluster<'a>(seeds: impl IntoIterator<Item = &'a str>) -> StoreBuilder {
        let seeds = seeds.into_iter().map(|u| Value::String(u.into())).collect();
        StoreBuilder::new("redis_cluster", ("urls", Value::Array(seeds)))
    }

    /// A SQLite file (`sqlite://path`, `sqlite::memory:`).
    pub(crate) fn sqlite(url: &str) -> StoreBuilder {
        StoreBuilder::new("sqlite", ("url", Value::String(url.into())))
    }
}

/// One namespace for [`ConfigBuilder::namespace`] ([`NamespaceConfig::builder`](super::NamespaceConfig::builder)). Like a
/// file's entry, it needs a `sync_rate`, and window sizes unless its algorithm counts in
/// none.
#[derive(Debug, Clone)]
pub(crate) struct NamespaceBuilder {
    table: Table,
}

impl NamespaceBuilder {
    pub(super) fn new(name: &str) -> Self {
        let table = Table::from_iter([("name".into(), Value::String(name.into()))]);
        NamespaceBuilder { table }
    }

    fn set(mut self, key: &str, value: Value) -> Self {
        self.table.insert(key.into(), value);
        self
    }

    fn push(mut self, key: &str, value: Value) -> Self {
        if let Value::Array(items) = self
            .table
            .entry(key)
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            items.push(value);
        }
        self
    }

    /// The window sizes it counts in, in seconds (`window_sizes`).
    pub(crate) fn window_sizes(self, secs: impl IntoIterator<Item = u64>) -> Self {
        let sizes = secs.into_iter().map(integer).collect();
        self.set("window_sizes", Value::Array(sizes))
    }

    /// How often it syncs, in seconds (`sync_rate`): 0 on every hit, below 0 never
    /// (local only).
    pub(crate) fn sync_rate(self, secs: f64) -> Self {
        self.set("sync_rate", Value::Float(secs))
    }

    /// The store it syncs with (`store`; none when local only).
    pub(crate) fn store(self, store: &str) -> Self {
        self.set("store", Value::String(store.into()))
    }

    /// The most counters it keeps in memory (`max_counters`).
    pub(crate) fn max_counters(self, max: usize) -> Self {
        self.set("max_counters", integer(max))
    }

    /// What its limits count with (`algorithm`; default sliding windows).
    pub(crate) fn algorithm(self, algorithm: Algorithm) -> Self {
        self.set("algorithm", Value::String(algorithm.name().into()))
    }

    /// A limit of `limit` hits per window of `window_size` seconds (`limits`), beside
    /// those added before.
    pub(crate) fn limit(self, window_size: u64, limit: f64) -> Self {
        let entry = Table::from_iter([
            ("window_size".into(), integer(window_size)),
            ("limit".into(), Value::Float(limit)),
        ]);
        self.push("limits", Value::Table(entry))
    }

    /// A GCRA bucket of `burst`, refilled by `count` every `period` (`gcra`; with
    /// [`Algorithm::Gcra`]).
    pub(crate) fn gcra(self, burst: i64, count: i64, period: Duration) -> Self {
        let gcra = Table::from_iter([
            ("burst".into(), Value::Integer(burst)),
            ("count".into(), Value::Integer(count)),
            (
                "period".into(),
                Value::String(humantime::format_duration(period).to_string()),
            ),
        ]);
        self.set("gcra", Value::Table(gcra))
    }

    /// Leases in flight per key, each living `lease_ttl` unless renewed
    /// (`algorithm = "concurrency"`, `limit`, `lease_ttl`).
    pub(crate) fn concurrency(self, limit: u64, lease_ttl: Duration) -> Self {
        self.algorithm(Algorithm::Concurrency)
            .set("limit", integer(limit))
            .set("lease_ttl", Value::Float(lease_ttl.as_secs_f64()))
    }

    /// How it admits (`admission`, `on_store_failure`).
    pub(crate) fn admission(self, admission: AdmissionMode) -> Self {
        let this = self.set("admission", Value::String(admission.name().into()));
        match admission {
            AdmissionMode::Eventual => this,
            AdmissionMode::Strict { on_store_failure } => {
                let failure = match on_store_failure {
                    OnStoreFailure::Local => "local",
                    OnStoreFailure::Deny => "deny",
                };
                this.set("on_store_failure", Value::String(failure.into()))
            }
        }
    }

    /// Denied hits count too (`count_denied`).
    pub(crate) fn count_denied(self, count_denied: bool) -> Self {
        self.set("count_denied", Value::Boolean(count_denied))
    }

    /// What a reservation's commit above its estimate does with the excess (`overrun`:
    /// `"debt"`, the default, or `"cap"`).
    pub(crate) fn overrun(self, overrun: crate::policy::limits::Overrun) -> Self {
        self.set("overrun", Value::String(overrun.name().into()))
    }

    /// Where a request's key comes from when it names none (`key_from`).
    pub(crate) fn key_from(self, key_from: &str) -> Self {
        self.set("key_from", Value::String(key_from.into()))
    }

    /// Increments may be negative (`allow_decrements`).
    pub(crate) fn allow_decrements(self, allow: bool) -> Self {
        self.set("allow_decrements", Value::Boolean(allow))
    }

    /// Every limit decides and counts but never denies (`shadow`).
    pub(crate) fn shadow(self, shadow: bool) -> Self {
        self.set("shadow", Value::Boolean(shadow))
    }

    /// Envoy's answers carry the RateLimit headers (`envoy_response_headers`, default
    /// true).
    pub(crate) fn envoy_response_headers(self, on: bool) -> Self {
        self.set("envoy_response_headers", Value::Boolean(on))
    }

    /// Envoy's answers carry dynamic metadata (`envoy_dynamic_metadata`, default false).
    pub(crate) fn envoy_dynamic_metadata(self, on: bool) -> Self {
        self.set("envoy_dynamic_metadata", Value::Boolean(on))
    }
}

/// A TOML integer (one past `i64::MAX` is written as the largest, which no check
/// takes either).
fn integer(n: impl TryInto<i64>) -> Value {
    Value::Integer(n.try_into().unwrap_or(i64::MAX))
}
