//! The daemon's configuration: one TOML file whose top-level keys are split between the
//! daemon and the library. The daemon's own (listeners and connections, logging,
//! tokens, TLS, telemetry, what a request may carry) are read here into [`Config`]; the
//! rest ([`swin::config::Config`]: stores, namespaces, timeouts of the stores) by the
//! library, which refuses a key neither takes. Errors name the file, the field and why,
//! as the library's do ([`ConfigError`]).

mod auth;
mod settings;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use swin::config::ConfigError;

pub use self::auth::{AuthConfig, Scope, Token};

/// The embedded default (`config/swin.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/swin.toml");
/// What [`DEFAULT_CONFIG`] is called in errors and logs.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded config/swin.toml>";

/// What a daemon setting is when the config leaves it out (docs/configuration.md lists
/// them, with the library's).
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
}

/// The daemon's keys of the file's top level; the others are the library's.
const KEYS: &[&str] = &[
    "listen",
    "grpc_listen",
    "log_format",
    "body_limit",
    "trusted_proxies",
    "header_timeout",
    "idle_timeout",
    "body_timeout",
    "max_connections",
    "max_batch",
    "auth",
    "tls",
    "telemetry",
];

/// The daemon's keys as the file has them (the library's are read by the library).
#[derive(Debug, Deserialize)]
struct RawNode {
    listen: Option<String>,
    grpc_listen: Option<String>,
    log_format: Option<String>,
    body_limit: Option<usize>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    header_timeout: Option<f64>,
    idle_timeout: Option<f64>,
    body_timeout: Option<f64>,
    max_connections: Option<usize>,
    max_batch: Option<usize>,
    auth: Option<auth::RawAuth>,
    tls: Option<settings::RawTls>,
    telemetry: Option<settings::RawTelemetry>,
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

/// The validated configuration the node runs with: its own settings, and the library's
/// ([`Config::limiter`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// The HTTP listener's address (`listen`).
    pub listen: SocketAddr,
    /// Envoy's rate limit service (gRPC) listens here; none: no gRPC server.
    pub grpc_listen: Option<SocketAddr>,
    /// `log_format`.
    pub log_format: LogFormat,
    /// The largest request body accepted, in bytes (`body_limit`).
    pub body_limit: usize,
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
    /// The library's share: stores, namespaces, the stores' timeouts, the spool.
    limiter: swin::config::Config,
}

/// One file being validated: where errors point, and the environment's overrides.
struct Parser<'a> {
    file: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Parser<'_> {
    fn err(&self, field: &str, message: String) -> ConfigError {
        ConfigError::new(self.file, field, message)
    }

    /// The value of `var` when set, else the file's; and the field to blame, which
    /// names the variable when the value came from it.
    fn overridden(&self, field: &str, var: &str, file: Option<String>) -> (Option<String>, String) {
        match (self.env)(var) {
            Some(v) => (Some(v), format!("{field} (from {var})")),
            None => (file, field.to_owned()),
        }
    }

    /// A number of seconds between 0 and a day, `default` when absent (as the library
    /// reads its own).
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

    /// The daemon's settings, then the library's (a file with neither listeners nor
    /// namespaces is blamed for its listeners first).
    fn config(&self, text: &str) -> Result<Config, ConfigError> {
        let raw: RawNode =
            toml::from_str(text).map_err(|e| ConfigError::from_toml(self.file, text, &e))?;
        let connections = self.connections(&raw)?;
        let listen = self.address("listen", "SWIN_LISTEN", raw.listen, Some(defaults::LISTEN))?;
        let listen = listen.expect("a default");
        let grpc_listen = self.address("grpc_listen", "SWIN_GRPC_LISTEN", raw.grpc_listen, None)?;
        let trusted_proxies = self.trusted_proxies(&raw.trusted_proxies)?;
        let body_limit = raw.body_limit.unwrap_or(defaults::BODY_LIMIT);
        if body_limit == 0 {
            return Err(self.err("body_limit", "must be above 0".into()));
        }
        let max_batch = raw.max_batch.unwrap_or(defaults::MAX_BATCH);
        if max_batch == 0 {
            return Err(self.err("max_batch", "must be above 0".into()));
        }
        let log_format = self.log_format(raw.log_format)?;
        let auth = self.auth(raw.auth)?;
        let tls = self.tls(raw.tls)?;
        let telemetry = self.telemetry(raw.telemetry)?;
        let limiter = swin::config::Config::parse_within(self.file, text, self.env, KEYS)?;
        Ok(Config {
            listen,
            grpc_listen,
            log_format,
            body_limit,
            auth,
            trusted_proxies,
            connections,
            tls,
            max_batch,
            telemetry,
            limiter,
        })
    }
}

impl Config {
    /// Reads and validates the config file at `path`, with the `SWIN_*` environment
    /// overrides (`SWIN_LISTEN`, `SWIN_DATA_DIR`, …).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&name, "(file)", format!("cannot read: {e}")))?;
        Config::parse(&name, &text, &|k| std::env::var(k).ok())
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
        Parser { file, env }.config(text)
    }

    /// What the limiter runs with: stores, namespaces, the stores' timeouts, the spool.
    pub fn limiter(&self) -> &swin::config::Config {
        &self.limiter
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reference_tests;
