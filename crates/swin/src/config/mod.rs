//! Configuration: TOML parsed into raw serde structs, then validated into [`Config`],
//! one section at a time: the top level here, `stores` and `namespaces` beside it,
//! the limits in [`crate::policy::limits`]. Errors name the file, the field and why; every
//! default is in [`defaults`].

mod admission;
mod auth;
mod namespaces;
mod settings;
mod stores;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use self::admission::{AdmissionMode, OnStoreFailure, STRICT_SHADOW};
pub use self::auth::{AuthConfig, Scope, Token};
pub use self::namespaces::{
    Concurrency, NamespaceConfig, MAX_CONCURRENCY, MAX_LEASE_TTL_SECS, MIN_TTL_SECS,
};
pub use self::stores::{redact, StoreConfig};

/// The embedded default (`config/swin.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/swin.toml");
/// What [`DEFAULT_CONFIG`] is called in errors and logs.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded config/swin.toml>";

/// What a setting is when the config leaves it out (docs/configuration.md lists them).
pub mod defaults {
    /// `listen`: HTTP on loopback, port 7070.
    pub const LISTEN: &str = "127.0.0.1:7070";
    /// `body_limit`: 1 MiB.
    pub const BODY_LIMIT: usize = 1 << 20;
    /// `header_timeout`, in seconds.
    pub const HEADER_TIMEOUT_SECS: f64 = 10.0;
    /// `idle_timeout`, in seconds.
    pub const IDLE_TIMEOUT_SECS: f64 = 60.0;
    /// `body_timeout`, in seconds.
    pub const BODY_TIMEOUT_SECS: f64 = 30.0;
    /// `max_connections`, per listener.
    pub const MAX_CONNECTIONS: usize = 10_000;
    /// Items of one `/v1/increments` or `/v1/hits` batch.
    pub const MAX_BATCH: usize = 1_000;
    /// `shutdown_grace`, in seconds.
    pub const SHUTDOWN_GRACE_SECS: f64 = 10.0;
    /// `store_timeout`, in seconds.
    pub const STORE_TIMEOUT_SECS: f64 = 5.0;
    /// `answer_timeout`, in seconds.
    pub const ANSWER_TIMEOUT_SECS: f64 = 0.5;
    /// `max_clock_offset`, in seconds.
    pub const MAX_CLOCK_OFFSET_SECS: f64 = 1.0;
    /// Per namespace and window size: the counter table's own default.
    pub const MAX_COUNTERS: usize = swin_core::DEFAULT_MAX_COUNTERS;
    /// `data_dir` (the spool).
    pub const DATA_DIR: &str = "./data";
    /// A PostgreSQL store's pool size (`max_connections`).
    pub const POSTGRES_MAX_CONNECTIONS: u32 = 8;
    /// A Redis store's key prefix (`prefix`).
    pub const REDIS_PREFIX: &str = "swin";
}

/// A config that cannot be run: the file, the field (dotted, with indexes) and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ConfigError {
    /// The file (or [`DEFAULT_CONFIG_NAME`]).
    pub file: String,
    /// The field, as `namespaces[2].limits[0].limit`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    grpc_listen: Option<String>,
    migrate: Option<bool>,
    log_format: Option<String>,
    body_limit: Option<usize>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    header_timeout: Option<f64>,
    idle_timeout: Option<f64>,
    body_timeout: Option<f64>,
    max_connections: Option<usize>,
    max_batch: Option<usize>,
    shutdown_grace: Option<f64>,
    store_timeout: Option<f64>,
    answer_timeout: Option<f64>,
    max_clock_offset: Option<f64>,
    max_counters: Option<usize>,
    data_dir: Option<String>,
    #[serde(default)]
    stores: BTreeMap<String, stores::RawStore>,
    #[serde(default)]
    namespaces: Vec<namespaces::RawNamespace>,
    auth: Option<auth::RawAuth>,
    tls: Option<RawTls>,
    telemetry: Option<RawTelemetry>,
    quota: Option<RawQuota>,
}

/// `[quota]`: caps on what Envoy's quota service takes from its clients.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    streams_per_client: Option<usize>,
    buckets_per_stream: Option<usize>,
    buckets_per_client: Option<usize>,
    buckets: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    otlp_endpoint: Option<String>,
    service_name: Option<String>,
    sample_ratio: Option<f64>,
}

/// Traces over OTLP/gRPC (`[telemetry]`): a span per request, its store calls as
/// children. Read at start only.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `http://host:4317`: an OpenTelemetry collector's OTLP/gRPC endpoint.
    pub otlp_endpoint: String,
    /// `service.name` of the spans (default `swin-node`).
    pub service_name: String,
    /// The share of requests traced, 0 to 1 (default 1), drawn per request; a request whose
    /// caller sent a `traceparent` follows the caller's sampling.
    pub sample_ratio: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

/// TLS on both listeners (HTTPS and gRPC): a PEM certificate chain and its private key,
/// and, for mutual TLS, the CA every client's certificate must be signed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The PEM certificate chain.
    pub cert: std::path::PathBuf,
    /// Its PEM private key.
    pub key: std::path::PathBuf,
    /// Clients must present a certificate this CA (PEM, one or more) signed.
    pub client_ca: Option<std::path::PathBuf>,
}

/// How the node logs (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// The validated configuration the node runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The HTTP listener's address (`listen`).
    pub listen: SocketAddr,
    /// Envoy's rate limit service (gRPC) listens here; none: no gRPC server.
    pub grpc_listen: Option<SocketAddr>,
    /// Runs the stores' migrations at start (`migrate`, default true).
    pub migrate: bool,
    /// `log_format`.
    pub log_format: LogFormat,
    /// The largest request body accepted, in bytes (`body_limit`).
    pub body_limit: usize,
    /// How long a stop lets requests in flight finish (`shutdown_grace`).
    pub shutdown_grace: Duration,
    /// The longest a store call may take before it counts as failed (`store_timeout`).
    pub store_timeout: Duration,
    /// The longest a request waits for a store (at most `store_timeout`): past it, it is
    /// answered as its namespace's `on_store_failure` says, and the store call goes on.
    pub answer_timeout: Duration,
    /// How far the node's clock may be from the store's before it says so (logged,
    /// `swin_clock_offset_exceeded`); it decides in the store's time either way.
    pub max_clock_offset: Duration,
    /// Where the spool lives (`./data` unless set; `SWIN_DATA_DIR` overrides).
    pub data_dir: std::path::PathBuf,
    /// The stores by name (`[stores.<name>]`).
    pub stores: BTreeMap<String, StoreConfig>,
    /// The namespaces (`[[namespaces]]`), in file order.
    pub namespaces: Vec<NamespaceConfig>,
    /// Bearer tokens and their scopes; `None` (no `[auth]`): every route is open.
    pub auth: Option<AuthConfig>,
    /// Peers whose `X-Forwarded-For` and `X-Real-IP` are believed (none by default).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The timeouts and cap both listeners hold connections to.
    pub connections: ConnectionLimits,
    /// Serve HTTPS with these files (`None`: plain HTTP).
    pub tls: Option<TlsConfig>,
    /// Items of one batch (`/v1/increments`, `/v1/hits`).
    pub max_batch: usize,
    /// Traces over OTLP; `None` (no `otlp_endpoint`): none, at no cost.
    pub telemetry: Option<TelemetryConfig>,
    /// Caps of Envoy's quota service (`[quota]`).
    pub quota: crate::shares::QuotaLimits,
}

/// What one connection may take of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From accepting a connection, or the end of a response, to a request's last
    /// header line.
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// To receive a request's whole body.
    pub body_timeout: Duration,
    /// Open connections; a new one past this closes the one idle the longest (or, when
    /// every one has a request in flight, is refused).
    pub max_connections: usize,
}

/// One file being validated: where errors point, and the environment's overrides.
struct Parser<'a> {
    file: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Parser<'_> {
    fn err(&self, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            field: field.to_owned(),
            message,
        }
    }

    /// The value of `var` when set, else the file's; and the field to blame, which
    /// names the variable when the value came from it.
    fn overridden(&self, field: &str, var: &str, file: Option<String>) -> (Option<String>, String) {
        match (self.env)(var) {
            Some(v) => (Some(v), format!("{field} (from {var})")),
            None => (file, field.to_owned()),
        }
    }

    /// A number of seconds between 0 and a day, `default` when absent.
    fn secs(&self, field: &str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
        let v = v.unwrap_or(default);
        if !(v.is_finite() && v > 0.0 && v < 86_400.0) {
            return Err(self.err(
                field,
                format!("{v} is not a number of seconds between 0 and 86400"),
            ));
        }
        Ok(Duration::from_secs_f64(v))
    }

    fn toml(&self, text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let field = e.span().map_or("(toml)".to_string(), |s| {
                let (line, column) = line_and_column(text, s.start);
                format!("(toml, line {line}, column {column})")
            });
            self.err(&field, e.message().trim().replace('\n', "; "))
        })
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let connections = self.connections(&raw)?;
        let listen = self.address("listen", "SWIN_LISTEN", raw.listen, Some(defaults::LISTEN))?;
        let listen = listen.expect("a default");
        let grpc_listen = self.address("grpc_listen", "SWIN_GRPC_LISTEN", raw.grpc_listen, None)?;
        let trusted_proxies = self.trusted_proxies(&raw.trusted_proxies)?;
        let body_limit = raw.body_limit.unwrap_or(defaults::BODY_LIMIT);
        if body_limit == 0 {
            return Err(self.err("body_limit", "must be above 0".into()));
        }
        let store_timeout = self.secs(
            "store_timeout",
            raw.store_timeout,
            defaults::STORE_TIMEOUT_SECS,
        )?;
        let answer_timeout = self
            .secs(
                "answer_timeout",
                raw.answer_timeout,
                defaults::ANSWER_TIMEOUT_SECS,
            )?
            .min(store_timeout);
        let max_counters = raw.max_counters.unwrap_or(defaults::MAX_COUNTERS);
        let max_batch = raw.max_batch.unwrap_or(defaults::MAX_BATCH);
        if max_batch == 0 {
            return Err(self.err("max_batch", "must be above 0".into()));
        }
        let stores = self.stores(raw.stores)?;
        Ok(Config {
            listen,
            grpc_listen,
            migrate: self.migrate(raw.migrate)?,
            log_format: self.log_format(raw.log_format)?,
            body_limit,
            shutdown_grace: self.secs(
                "shutdown_grace",
                raw.shutdown_grace,
                defaults::SHUTDOWN_GRACE_SECS,
            )?,
            store_timeout,
            answer_timeout,
            max_clock_offset: self.secs(
                "max_clock_offset",
                raw.max_clock_offset,
                defaults::MAX_CLOCK_OFFSET_SECS,
            )?,
            connections,
            namespaces: self.namespaces(raw.namespaces, &stores, max_counters)?,
            stores,
            auth: self.auth(raw.auth)?,
            trusted_proxies,
            max_batch,
            tls: self.tls(raw.tls)?,
            telemetry: self.telemetry(raw.telemetry)?,
            quota: self.quota(raw.quota)?,
            data_dir: self.data_dir(raw.data_dir)?,
        })
    }
}

impl Config {
    /// Reads and validates the config file at `path`, with the `SWIN_*` environment
    /// overrides the daemon takes (`SWIN_LISTEN`, `SWIN_DATA_DIR`, …).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            field: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&name, &text, &|k| std::env::var(k).ok())
    }

    /// Validates a config given as TOML text, as a program embedding a
    /// [`Limiter`](crate::Limiter) holds it: the same keys as the daemon's file, no
    /// environment overrides.
    ///
    /// ```
    /// let config = swin::config::Config::from_toml(r#"
    /// [[namespaces]]
    /// name = "api"
    /// window_sizes = [60]
    /// sync_rate = -1
    /// limits = [{ window_size = 60, limit = 100 }]
    /// "#).expect("a valid config");
    /// assert_eq!(config.namespaces[0].name, "api");
    /// ```
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse("(config)", text, &|_| None)
    }

    /// The config the daemon runs without a file (config/swin.toml).
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Config::parse(DEFAULT_CONFIG_NAME, DEFAULT_CONFIG, &|k| {
            std::env::var(k).ok()
        })
    }

    /// Parses and validates `text`; `env` looks up overrides (`SWIN_LISTEN`, …).
    pub fn parse(
        file: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let p = Parser { file, env };
        p.config(p.toml(text)?)
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reference_tests;
