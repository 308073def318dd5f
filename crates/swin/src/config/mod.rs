//! Configuration: TOML (text, or a table of a program's own file) read into raw serde structs, then
//! validated into [`Config`], one section at a time: the top level here, `stores` and
//! `namespaces` beside it, the limits in `policy::limits`. Errors name the file,
//! the field and why; every default is in docs/configuration.md.
//!
//! The library's keys share a file with those of a program embedding it (the daemon's
//! `listen`, `[auth]`, …): [`Config::parse_within`] reads its own and leaves the
//! program's to it, and a key neither takes is refused.

mod admission;
#[cfg(test)]
#[cfg(test)]
mod builder;
mod concurrency;
mod idempotency;
mod keys;
mod namespaces;
mod quota;
mod reservations;
mod settings;
pub(crate) mod stores;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub(crate) use self::admission::STRICT_SHADOW;
pub(crate) use self::admission::{AdmissionMode, OnStoreFailure};
#[cfg(test)]
#[cfg(test)]
pub(crate) use self::builder::ConfigBuilder;
pub(crate) use self::concurrency::Concurrency;
pub(crate) use self::concurrency::{MAX_CONCURRENCY, MAX_LEASE_TTL_SECS, MIN_TTL_SECS};
pub(crate) use self::idempotency::Idempotency;
pub use self::namespaces::NamespaceConfig;
pub(crate) use self::quota::QuotaLimits;
pub(crate) use self::reservations::ReservationCaps;
pub use self::stores::StoreConfig;
/// The kinds of store a config names.
pub use swin_sync::store::StoreKind;

/// What a setting is when the config leaves it out (docs/configuration.md lists them).
pub(crate) mod defaults {
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

/// A config that cannot be run: `file: field: why`, the file (or what stands for it:
/// `(config)` for [`Config::from_toml`]), the field (dotted, with indexes, as
/// `namespaces[2].limits[0].limit`) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ConfigError {
    file: String,
    field: String,
    message: String,
}

impl ConfigError {
    /// `file: field: message`.
    pub fn new(file: &str, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: file.to_owned(),
            field: field.to_owned(),
            message,
        }
    }

    /// A TOML error in `text` (syntax, or a value of the wrong type), at its line and
    /// column.
    pub fn from_toml(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
        let field = e.span().map_or("(toml)".to_string(), |s| {
            let (line, column) = line_and_column(text, s.start);
            format!("(toml, line {line}, column {column})")
        });
        ConfigError::new(file, &field, e.message().trim().replace('\n', "; "))
    }
}

/// The library's keys of a config's top level (a file's other keys are refused, or left
/// to the program that embeds the library: [`Config::parse_within`]).
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    migrate: Option<bool>,
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

/// The validated configuration a [`Limiter`](crate::Limiter) runs with: its stores, its
/// namespaces and how it talks to the stores.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Runs the stores' migrations at start (`migrate`, default true).
    pub(crate) migrate: bool,
    /// How long a stop lets requests in flight finish (`shutdown_grace`).
    pub(crate) shutdown_grace: Duration,
    /// The longest a store call may take before it counts as failed (`store_timeout`).
    pub(crate) store_timeout: Duration,
    /// The longest a request waits for a store (at most `store_timeout`): past it, it is
    /// answered as its namespace's `on_store_failure` says, and the store call goes on.
    pub(crate) answer_timeout: Duration,
    /// How far the node's clock may be from the store's before it says so (logged,
    /// `swin_clock_offset_exceeded`); it decides in the store's time either way.
    pub(crate) max_clock_offset: Duration,
    /// Where the spool lives (`./data` unless set; `SWIN_DATA_DIR` overrides).
    pub(crate) data_dir: std::path::PathBuf,
    /// The stores by name (`[stores.<name>]`).
    pub(crate) stores: BTreeMap<String, StoreConfig>,
    /// The namespaces (`[[namespaces]]`), in file order.
    pub(crate) namespaces: Vec<NamespaceConfig>,
    /// Caps of Envoy's quota service (`[quota]`).
    pub(crate) quota: QuotaLimits,
}

/// One config being validated: where errors point, and the environment's overrides.
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

    fn toml<T: serde::de::DeserializeOwned>(&self, text: &str) -> Result<T, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::from_toml(self.file, text, &e))
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
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
        let stores = self.stores(raw.stores)?;
        Ok(Config {
            migrate: self.migrate(raw.migrate)?,
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
            namespaces: self.namespaces(raw.namespaces, &stores, max_counters)?,
            stores,
            quota: self.quota(raw.quota)?,
            data_dir: self.data_dir(raw.data_dir)?,
        })
    }
}

impl Config {
    /// A config built in code, checked by the same rules as a file when it is built.
    #[cfg(test)]
    #[cfg(test)]
    pub(crate) fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// Validates a config given as TOML text, as a program embedding a
    /// [`Limiter`](crate::Limiter) holds it: the library's keys, no environment
    /// overrides.
    ///
    /// ```
    /// let config = swin::config::Config::from_toml(r#"
    /// [[namespaces]]
    /// name = "api"
    /// window_sizes = [60]
    /// sync_rate = -1
    /// limits = [{ window_size = 60, limit = 100 }]
    /// "#).expect("a valid config");
    /// assert_eq!(config.namespaces()[0].name(), "api");
    /// ```
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse("(config)", text, &|_| None)
    }

    /// Validates a config given as a TOML table (the builder's), with no environment
    /// overrides; `file` is what errors call it.
    #[cfg(test)]
    pub(crate) fn from_table(file: &str, table: toml::Table) -> Result<Config, ConfigError> {
        let p = Parser {
            file,
            env: &|_| None,
        };
        p.known_keys(table.keys().map(|k| (k.as_str(), "(toml)".to_owned())), &[])?;
        let raw = RawConfig::deserialize(toml::Value::Table(table))
            .map_err(|e| p.err("(toml)", e.message().trim().replace('\n', "; ")))?;
        p.config(raw)
    }

    /// Parses and validates `text`, every key of which is the library's; `env` looks up
    /// overrides (`SWIN_DATA_DIR`, `SWIN_MIGRATE`, `SWIN_STORE_<NAME>_URL`, …).
    pub(crate) fn parse(
        file: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_within(file, text, env, &[])
    }

    /// Parses and validates the library's share of `text`, a file that may also hold the
    /// top-level keys `others` (those of the program that embeds it: the daemon's
    /// `listen`, `[auth]`, …), which are left to that program; a key neither takes is
    /// refused, both lists named. `env` looks up overrides (`SWIN_DATA_DIR`,
    /// `SWIN_MIGRATE`, `SWIN_STORE_<NAME>_URL`, …).
    pub fn parse_within(
        file: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        others: &[&str],
    ) -> Result<Config, ConfigError> {
        let p = Parser { file, env };
        p.known_keys_of(text, others)?;
        p.config(p.toml(text)?)
    }

    /// How long a stop lets the work in flight finish (`shutdown_grace`).
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    /// The longest a store call may take (`store_timeout`).
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    /// Where the spool lives (`data_dir`).
    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The stores by name (`[stores.<name>]`).
    pub fn stores(&self) -> &BTreeMap<String, StoreConfig> {
        &self.stores
    }

    /// The namespaces, in file order (`[[namespaces]]`).
    pub fn namespaces(&self) -> &[NamespaceConfig] {
        &self.namespaces
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
