//! Configuration: TOML parsed into raw serde structs, then validated into [`Config`].
//! Errors name the file, the field and why.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use swin_core::WindowSize;
use swin_sync::SyncMode;

/// The embedded default (`config/swin.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../../../config/swin.toml");
pub const DEFAULT_CONFIG_NAME: &str = "<embedded config/swin.toml>";

#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub field: String,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    migrate: Option<bool>,
    log_format: Option<String>,
    body_limit: Option<usize>,
    shutdown_grace: Option<f64>,
    store_timeout: Option<f64>,
    max_counters: Option<usize>,
    data_dir: Option<String>,
    #[serde(default)]
    stores: BTreeMap<String, RawStore>,
    #[serde(default)]
    namespaces: Vec<RawNamespace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: String,
    url: String,
    max_connections: Option<u32>,
    prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    name: String,
    #[serde(default)]
    window_sizes: Vec<i64>,
    sync_rate: f64,
    store: Option<String>,
    max_counters: Option<usize>,
    algorithm: Option<String>,
    #[serde(default)]
    limits: Vec<crate::limits::RawLimit>,
    gcra: Option<crate::limits::RawGcra>,
    count_denied: Option<bool>,
    key_from: Option<String>,
    #[serde(default)]
    overrides: Vec<crate::limits::RawOverride>,
    allow_decrements: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    Postgres,
    Redis,
    Sqlite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub kind: StoreKind,
    pub url: String,
    pub max_connections: u32,
    pub prefix: String,
}

impl StoreConfig {
    /// Tells stores apart without naming their URL (which may hold a password): FNV-1a
    /// of kind, URL and prefix. The spool keeps it to send counts only where they
    /// belong; it must stay the same across versions, so no std hasher.
    pub fn fingerprint(&self) -> String {
        let kind = match self.kind {
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::Sqlite => "sqlite",
        };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [kind, &self.url, &self.prefix] {
            for b in part.bytes().chain([0]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceConfig {
    pub name: String,
    pub window_sizes: Vec<WindowSize>,
    pub mode: SyncMode,
    /// `None` exactly when the namespace is local only.
    pub store: Option<String>,
    pub max_counters: usize,
    /// Limits that `/hit` decides against; `None` when the namespace only counts.
    pub limits: Option<crate::limits::Limits>,
    /// `/increment` takes negative values (default false).
    pub allow_decrements: bool,
}

/// The validated configuration the node runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub migrate: bool,
    pub log_format: LogFormat,
    pub body_limit: usize,
    pub shutdown_grace: Duration,
    pub store_timeout: Duration,
    /// Where the spool lives (`./data` unless set; `SWIN_DATA_DIR` overrides).
    pub data_dir: std::path::PathBuf,
    pub stores: BTreeMap<String, StoreConfig>,
    pub namespaces: Vec<NamespaceConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            field: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&name, &text, &|k| std::env::var(k).ok())
    }

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
        let err = |field: &str, message: String| ConfigError {
            file: file.to_owned(),
            field: field.to_owned(),
            message,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let field = e.span().map_or("(toml)".to_string(), |s| {
                let (line, column) = line_and_column(text, s.start);
                format!("(toml, line {line}, column {column})")
            });
            err(&field, e.message().trim().replace('\n', "; "))
        })?;
        // a value from the environment names its variable when it is at fault
        let from_env = |field: &str, var: &str, file: Option<String>| match env(var) {
            Some(v) => (Some(v), format!("{field} (from {var})")),
            None => (file, field.to_owned()),
        };

        let (listen_s, listen_field) = from_env("listen", "SWIN_LISTEN", raw.listen);
        let listen_s = listen_s.unwrap_or_else(|| "127.0.0.1:7070".into());
        let listen = listen_s.parse().map_err(|_| {
            err(
                &listen_field,
                format!("{listen_s:?} is not an address like 127.0.0.1:7070"),
            )
        })?;
        let migrate = match env("SWIN_MIGRATE") {
            Some(v) => parse_bool(&v).ok_or_else(|| {
                err(
                    "migrate",
                    format!("SWIN_MIGRATE={v:?} is not true or false"),
                )
            })?,
            None => raw.migrate.unwrap_or(true),
        };
        let (log_format, log_field) = from_env("log_format", "SWIN_LOG_FORMAT", raw.log_format);
        let log_format = match log_format.as_deref() {
            None | Some("pretty") => LogFormat::Pretty,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(err(
                    &log_field,
                    format!("{other:?} is not \"pretty\" or \"json\""),
                ))
            }
        };
        let body_limit = raw.body_limit.unwrap_or(1 << 20);
        if body_limit == 0 {
            return Err(err("body_limit", "must be above 0".into()));
        }
        let secs = |field: &str, v: Option<f64>, default: f64| -> Result<Duration, ConfigError> {
            let v = v.unwrap_or(default);
            if !(v.is_finite() && v > 0.0 && v < 86_400.0) {
                return Err(err(
                    field,
                    format!("{v} is not a number of seconds between 0 and 86400"),
                ));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let shutdown_grace = secs("shutdown_grace", raw.shutdown_grace, 10.0)?;
        let store_timeout = secs("store_timeout", raw.store_timeout, 5.0)?;
        let default_max = raw.max_counters.unwrap_or(1_000_000);

        let mut stores = BTreeMap::new();
        for (name, s) in raw.stores {
            let f = |k: &str| format!("stores.{name}.{k}");
            let kind = match s.kind.as_str() {
                "postgres" => StoreKind::Postgres,
                "redis" => StoreKind::Redis,
                "sqlite" => StoreKind::Sqlite,
                other => {
                    return Err(err(
                        &f("kind"),
                        format!("{other:?} is not \"postgres\", \"redis\" or \"sqlite\""),
                    ))
                }
            };
            let var = format!("SWIN_STORE_{}_URL", name.to_uppercase().replace('-', "_"));
            let (url, url_field) = from_env(&f("url"), &var, Some(s.url));
            let url = url.unwrap_or_default();
            let scheme_ok = match kind {
                StoreKind::Postgres => {
                    url.starts_with("postgres://") || url.starts_with("postgresql://")
                }
                StoreKind::Redis => {
                    url.starts_with("redis://")
                        || url.starts_with("rediss://")
                        || url.starts_with("redis+unix://")
                }
                StoreKind::Sqlite => url.starts_with("sqlite:"),
            };
            if !scheme_ok {
                return Err(err(
                    &url_field,
                    format!("{:?} is not a {} URL", redact(&url), s.kind),
                ));
            }
            let max_connections = s.max_connections.unwrap_or(8);
            if max_connections == 0 {
                return Err(err(&f("max_connections"), "must be above 0".into()));
            }
            stores.insert(
                name,
                StoreConfig {
                    kind,
                    url,
                    max_connections,
                    prefix: s.prefix.unwrap_or_else(|| "swin".into()),
                },
            );
        }

        let mut namespaces: Vec<NamespaceConfig> = Vec::new();
        for (i, n) in raw.namespaces.into_iter().enumerate() {
            let f = |k: &str| format!("namespaces[{i}].{k}");
            if n.name.is_empty() || n.name.len() > 256 {
                return Err(err(&f("name"), "must be 1 to 256 bytes".into()));
            }
            if namespaces.iter().any(|o| o.name == n.name) {
                return Err(err(&f("name"), format!("{:?} is defined twice", n.name)));
            }
            // a GCRA namespace needs no windows (it may still count in some)
            if n.window_sizes.is_empty() && n.algorithm.as_deref() != Some("gcra") {
                return Err(err(
                    &f("window_sizes"),
                    "needs at least one window size".into(),
                ));
            }
            let mut sizes = Vec::new();
            for s in &n.window_sizes {
                let size = u64::try_from(*s)
                    .ok()
                    .and_then(|s| WindowSize::new(s).ok())
                    .ok_or_else(|| {
                        err(
                            &f("window_sizes"),
                            format!(
                                "{s} is not between 1 and {} seconds",
                                swin_core::MAX_WINDOW_SIZE_SECS
                            ),
                        )
                    })?;
                if sizes.contains(&size) {
                    return Err(err(&f("window_sizes"), format!("{s} is listed twice")));
                }
                sizes.push(size);
            }
            let mode = SyncMode::from_rate(n.sync_rate)
                .ok_or_else(|| err(&f("sync_rate"), "must be a finite number".into()))?;
            let store = match (mode, n.store) {
                (SyncMode::LocalOnly, _) => None,
                (_, None) => {
                    return Err(err(
                        &f("store"),
                        "is required unless sync_rate < 0 (local only)".into(),
                    ))
                }
                (_, Some(s)) if !stores.contains_key(&s) => {
                    return Err(err(
                        &f("store"),
                        format!(
                            "{s:?} is not one of [stores]: {:?}",
                            stores.keys().collect::<Vec<_>>()
                        ),
                    ))
                }
                (_, Some(s)) => Some(s),
            };
            let max_counters = n.max_counters.unwrap_or(default_max);
            if max_counters == 0 {
                return Err(err(&f("max_counters"), "must be above 0".into()));
            }
            let allow_decrements = n.allow_decrements.unwrap_or(false);
            let raw = crate::limits::RawLimits {
                algorithm: n.algorithm,
                limits: n.limits,
                gcra: n.gcra,
                count_denied: n.count_denied,
                key_from: n.key_from,
                overrides: n.overrides,
            };
            let limits = crate::limits::validate(raw, &sizes)
                .map_err(|(field, why)| err(&f(&field), why))?;
            namespaces.push(NamespaceConfig {
                name: n.name,
                window_sizes: sizes,
                mode,
                store,
                max_counters,
                limits,
                allow_decrements,
            });
        }
        if namespaces.is_empty() {
            // an empty or cut-off file must not take every namespace away on a reload
            return Err(err(
                "namespaces",
                "needs at least one [[namespaces]] entry".into(),
            ));
        }
        let (data_dir, data_field) = from_env("data_dir", "SWIN_DATA_DIR", raw.data_dir);
        let data_dir = data_dir.unwrap_or_else(|| "./data".into());
        if data_dir.is_empty() {
            return Err(err(&data_field, "must not be empty".into()));
        }
        Ok(Config {
            data_dir: data_dir.into(),
            listen,
            migrate,
            log_format,
            body_limit,
            shutdown_grace,
            store_timeout,
            stores,
            namespaces,
        })
    }
}

/// The URL with any password replaced by `***` (`scheme://user:***@host/…`), for error
/// messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
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
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn every_shipped_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("config dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).expect("read");
                Config::parse(&path.display().to_string(), &text, &no_env)
                    .unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 4, "expected the shipped configs, found {n}");
    }

    #[test]
    fn the_embedded_default_is_sqlite_on_7070() {
        let c = Config::parse("x", DEFAULT_CONFIG, &no_env).expect("valid");
        assert_eq!(c.listen.to_string(), "127.0.0.1:7070");
        assert_eq!(c.stores["main"].kind, StoreKind::Sqlite);
        let ns = &c.namespaces[0];
        assert_eq!(ns.name, "default");
        assert_eq!(
            ns.window_sizes.iter().map(|s| s.secs()).collect::<Vec<_>>(),
            vec![1, 60, 3600]
        );
    }

    #[test]
    fn environment_overrides_listen_and_store_urls() {
        let env = |k: &str| match k {
            "SWIN_LISTEN" => Some("0.0.0.0:9000".to_string()),
            "SWIN_STORE_MAIN_URL" => Some("sqlite::memory:".to_string()),
            _ => None,
        };
        let c = Config::parse("x", DEFAULT_CONFIG, &env).expect("valid");
        assert_eq!(c.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(c.stores["main"].url, "sqlite::memory:");
        // an override at fault is named
        let bad = |var: &'static str, value: &'static str| {
            move |k: &str| (k == var).then(|| value.to_string())
        };
        for (var, value, field) in [
            ("SWIN_LISTEN", "nowhere", "listen (from SWIN_LISTEN)"),
            (
                "SWIN_STORE_MAIN_URL",
                "mysql://x",
                "stores.main.url (from SWIN_STORE_MAIN_URL)",
            ),
            (
                "SWIN_LOG_FORMAT",
                "xml",
                "log_format (from SWIN_LOG_FORMAT)",
            ),
        ] {
            let e = Config::parse("x", DEFAULT_CONFIG, &bad(var, value)).expect_err("invalid");
            assert_eq!(e.field, field, "{e}");
        }
    }

    fn fails(text: &str, field: &str) {
        let e = Config::parse("f.toml", text, &no_env).expect_err("invalid");
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().starts_with("f.toml: "), "{e}");
    }

    #[test]
    fn passwords_never_reach_an_error() {
        assert_eq!(
            redact("postgres://app:s3cr@t@db:5432/swin?sslmode=require"),
            "postgres://app:***@db:5432/swin?sslmode=require"
        );
        assert_eq!(
            redact("redis://:pw@127.0.0.1:6379"),
            "redis://:***@127.0.0.1:6379"
        );
        assert_eq!(
            redact("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact("sqlite://data/swin.db"), "sqlite://data/swin.db");
        let e = Config::parse(
            "f.toml",
            "[stores.m]\nkind = \"redis\"\nurl = \"postgres://u:hunter2@h/db\"\n",
            &no_env,
        )
        .expect_err("wrong scheme");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        fails("listen = \"nope\"", "listen");
        fails(
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [0]\nsync_rate = -1",
            "namespaces[0].window_sizes",
        );
        fails(
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = []\nsync_rate = -1",
            "namespaces[0].window_sizes",
        );
        fails(
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = 1",
            "namespaces[0].store",
        );
        fails(
            "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = 1\nstore = \"x\"",
            "namespaces[0].store",
        );
        fails("[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1", "namespaces[1].name");
        fails("[stores.m]\nkind = \"mysql\"\nurl = \"x\"", "stores.m.kind");
        fails(
            "[stores.m]\nkind = \"redis\"\nurl = \"postgres://x\"",
            "stores.m.url",
        );
        fails("log_format = \"xml\"", "log_format");
        fails("", "namespaces");
        fails("listen = \"127.0.0.1:1\"\n", "namespaces");
        fails(
            "data_dir = \"\"\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
            "data_dir",
        );
        fails("bogus = 1", "(toml, line 1, column 1)");
        fails(
            "listen = \"127.0.0.1:1\"\nmigrate = maybe\n",
            "(toml, line 2, column 11)",
        );
    }
}
