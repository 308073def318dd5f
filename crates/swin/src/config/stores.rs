//! The `[stores.<name>]` sections: each store kind with the settings it takes, and
//! nothing it would silently ignore.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{defaults, Parser};
use crate::config::ConfigError;
pub use swin_sync::Access;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    kind: String,
    url: Option<String>,
    /// A Redis Cluster's seed nodes.
    urls: Option<Vec<String>>,
    max_connections: Option<u32>,
    /// Redis Cluster: replicas that must acknowledge a push before it counts as done.
    wait_replicas: Option<u32>,
    prefix: Option<String>,
    /// The environment variable that holds the password (PostgreSQL, Redis).
    password_env: Option<String>,
    /// A CA certificate (PEM) to verify the server's TLS certificate by.
    ca_file: Option<String>,
}

/// One store of the config (`[stores.<name>]`): its kind and URL; the rest is the
/// library's. Its `Debug` output redacts the URL's password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig(pub(crate) Spec);

/// A store as the config gives it, typed by kind.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Spec {
    /// PostgreSQL (`kind = "postgres"`).
    Postgres {
        /// Its connection URL, the password in `password_env` rather than here.
        url: String,
        /// The pool's size.
        max_connections: u32,
        /// Password and TLS.
        access: Access,
    },
    /// A Redis server (`kind = "redis"`).
    Redis {
        /// Its URL (`redis://` or `rediss://`).
        url: String,
        /// Every key's prefix.
        prefix: String,
        /// Password and TLS.
        access: Access,
    },
    /// A Redis Cluster (`kind = "redis_cluster"`).
    RedisCluster {
        /// Seed nodes: the node finds the others from them.
        urls: Vec<String>,
        /// Every key's prefix (in one hash slot per counter).
        prefix: String,
        /// Password and TLS.
        access: Access,
        /// Replicas that must acknowledge a push before it counts as done.
        wait_replicas: u32,
    },
    /// A SQLite file (`kind = "sqlite"`), for nodes of one machine.
    Sqlite {
        /// Its URL (`sqlite://path`).
        url: String,
    },
}

impl StoreConfig {
    /// What kind of store it is.
    pub fn kind(&self) -> swin_sync::store::StoreKind {
        use swin_sync::store::StoreKind;
        match &self.0 {
            Spec::Postgres { .. } => StoreKind::Postgres,
            Spec::Redis { .. } => StoreKind::Redis,
            Spec::RedisCluster { .. } => StoreKind::RedisCluster,
            Spec::Sqlite { .. } => StoreKind::Sqlite,
        }
    }

    /// The URL as configured (a cluster's first seed); it may hold a password: print
    /// it with the password hidden.
    pub fn url(&self) -> &str {
        match &self.0 {
            Spec::Postgres { url, .. } | Spec::Redis { url, .. } | Spec::Sqlite { url } => url,
            Spec::RedisCluster { urls, .. } => urls.first().map_or("", String::as_str),
        }
    }

    /// Tells stores apart without naming their URL (which may hold a password): FNV-1a
    /// of kind, URL and prefix. The spool keeps it to send counts only where they
    /// belong; it must stay the same across versions, so no std hasher (and stores
    /// without a prefix hash the default one, as they always have).
    pub(crate) fn fingerprint(&self) -> String {
        let (prefix, urls) = match &self.0 {
            Spec::Redis { prefix, .. } => (prefix.as_str(), String::new()),
            Spec::RedisCluster { prefix, urls, .. } => (prefix.as_str(), urls.join(" ")),
            _ => (defaults::REDIS_PREFIX, String::new()),
        };
        let url = if urls.is_empty() { self.url() } else { &urls };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [self.kind().name(), url, prefix] {
            for b in part.bytes().chain([0]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(self.kind().name());
        match &self.0 {
            Spec::RedisCluster { urls, .. } => {
                let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
                d.field("urls", &urls)
            }
            _ => d.field("url", &redact(self.url())),
        };
        match &self.0 {
            Spec::Postgres {
                max_connections,
                access,
                ..
            } => d
                .field("max_connections", max_connections)
                .field("access", access),
            Spec::Redis { prefix, access, .. } => d.field("prefix", prefix).field("access", access),
            Spec::RedisCluster {
                prefix,
                access,
                wait_replicas,
                ..
            } => d
                .field("prefix", prefix)
                .field("access", access)
                .field("wait_replicas", wait_replicas),
            Spec::Sqlite { .. } => &mut d,
        };
        d.finish()
    }
}

/// More replicas than any shard plausibly has: a push would never be confirmed.
const MAX_WAIT_REPLICAS: u32 = 16;

impl Parser<'_> {
    /// Validates every `[stores.<name>]`; the URL may come from `SWIN_STORE_<NAME>_URL`.
    pub(super) fn stores(
        &self,
        raw: BTreeMap<String, RawStore>,
    ) -> Result<BTreeMap<String, StoreConfig>, ConfigError> {
        let mut stores = BTreeMap::new();
        for (name, s) in raw {
            let store = self.store(&name, s)?;
            stores.insert(name, store);
        }
        Ok(stores)
    }

    fn store(&self, name: &str, s: RawStore) -> Result<StoreConfig, ConfigError> {
        let f = |k: &str| format!("stores.{name}.{k}");
        let schemes = self.schemes(&s.kind, &f("kind"))?;
        let (url, urls) = if s.kind == "redis_cluster" {
            (String::new(), self.seeds(name, &s, schemes)?)
        } else {
            (self.url(name, &s, schemes)?, Vec::new())
        };
        self.keys_of_its_kind(&s, &f)?;
        let access = self.access(&s, &f)?;
        self.typed(s, url, urls, access, &f)
    }

    /// The URL schemes a store of `kind` takes.
    fn schemes(&self, kind: &str, field: &str) -> Result<&'static [&'static str], ConfigError> {
        Ok(match kind {
            "postgres" => &["postgres://", "postgresql://"],
            "redis" => &["redis://", "rediss://", "redis+unix://"],
            "redis_cluster" => &["redis://", "rediss://"],
            "sqlite" => &["sqlite:"],
            other => {
                return Err(self.err(
                    field,
                    format!(
                        "{other:?} is not \"postgres\", \"redis\", \"redis_cluster\" or \"sqlite\""
                    ),
                ))
            }
        })
    }

    fn check_scheme(
        &self,
        field: &str,
        url: &str,
        schemes: &[&str],
        kind: &str,
    ) -> Result<(), ConfigError> {
        if !schemes.iter().any(|p| url.starts_with(p)) {
            return Err(self.err(field, format!("{:?} is not a {kind} URL", redact(url))));
        }
        Ok(())
    }

    /// A store's `url` (or `SWIN_STORE_<NAME>_URL`).
    fn url(&self, name: &str, s: &RawStore, schemes: &[&str]) -> Result<String, ConfigError> {
        let f = |k: &str| format!("stores.{name}.{k}");
        if s.urls.is_some() {
            return Err(self.err(&f("urls"), "applies to redis_cluster stores only".into()));
        }
        let var = format!("SWIN_STORE_{}_URL", name.to_uppercase().replace('-', "_"));
        let (url, url_field) = self.overridden(&f("url"), &var, s.url.clone());
        let Some(url) = url else {
            return Err(self.err(&url_field, "is required".into()));
        };
        self.check_scheme(&url_field, &url, schemes, &s.kind)?;
        Ok(url)
    }

    /// A Redis Cluster's seed nodes (`urls`, or `SWIN_STORE_<NAME>_URLS`, separated by
    /// commas), each parsed as the store will (nothing is connected): a database other
    /// than 0, a URL redis-rs cannot read, or TLS on some seeds only is an error.
    fn seeds(
        &self,
        name: &str,
        s: &RawStore,
        schemes: &[&str],
    ) -> Result<Vec<String>, ConfigError> {
        let f = |k: &str| format!("stores.{name}.{k}");
        if s.url.is_some() {
            return Err(self.err(
                &f("url"),
                "a redis_cluster store takes `urls`, its seed nodes".into(),
            ));
        }
        let var = format!("SWIN_STORE_{}_URLS", name.to_uppercase().replace('-', "_"));
        let (urls, field): (Vec<String>, String) = match (self.env)(&var) {
            Some(v) => (
                v.split(',').map(|u| u.trim().to_owned()).collect(),
                format!("{} (from {var})", f("urls")),
            ),
            None => (s.urls.clone().unwrap_or_default(), f("urls")),
        };
        if urls.is_empty() {
            return Err(self.err(&field, "needs at least one seed node URL".into()));
        }
        for u in &urls {
            self.check_scheme(&field, u, schemes, &s.kind)?;
            let seed = std::slice::from_ref(u);
            if let Err(e) = swin_sync::store::RedisStore::cluster(seed, "", &Access::default(), 0) {
                let why = match e {
                    swin_sync::StoreError::Protocol(why) => why,
                    _ => "not a Redis URL".into(),
                };
                return Err(self.err(&field, format!("{:?}: {why}", redact(u))));
            }
        }
        if urls.iter().any(|u| u.starts_with("rediss://"))
            && !urls.iter().all(|u| u.starts_with("rediss://"))
        {
            return Err(self.err(&field, "mixes rediss:// and redis:// seeds".into()));
        }
        Ok(urls)
    }

    /// Keys that belong to some kinds of store only are refused on the others.
    fn keys_of_its_kind(
        &self,
        s: &RawStore,
        f: &dyn Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        let only = |key: &str, set: bool, kind: &str| {
            if set && s.kind != kind {
                return Err(self.err(&f(key), format!("applies to {kind} stores only")));
            }
            Ok(())
        };
        only("max_connections", s.max_connections.is_some(), "postgres")?;
        if s.kind != "redis_cluster" {
            only("prefix", s.prefix.is_some(), "redis")?;
        }
        only("wait_replicas", s.wait_replicas.is_some(), "redis_cluster")?;
        let server_only = |key: &str, set: bool| {
            if set && s.kind == "sqlite" {
                return Err(self.err(&f(key), "applies to postgres and redis stores".into()));
            }
            Ok(())
        };
        server_only("password_env", s.password_env.is_some())?;
        server_only("ca_file", s.ca_file.is_some())
    }

    /// The password (read from `password_env`) and the CA file.
    fn access(&self, s: &RawStore, f: &dyn Fn(&str) -> String) -> Result<Access, ConfigError> {
        let password = match &s.password_env {
            None => None,
            Some(var) => Some((self.env)(var).ok_or_else(|| {
                self.err(
                    &f("password_env"),
                    format!("the environment variable {var:?} is not set"),
                )
            })?),
        };
        let ca_file = match &s.ca_file {
            Some(path) if path.is_empty() => {
                return Err(self.err(&f("ca_file"), "is empty".into()));
            }
            path => path.as_ref().map(std::path::PathBuf::from),
        };
        Ok(Access { password, ca_file })
    }

    /// The store, typed by its kind, with its kind's own settings checked.
    fn typed(
        &self,
        s: RawStore,
        url: String,
        urls: Vec<String>,
        access: Access,
        f: &dyn Fn(&str) -> String,
    ) -> Result<StoreConfig, ConfigError> {
        Ok(StoreConfig(match s.kind.as_str() {
            "postgres" => {
                let max_connections = s
                    .max_connections
                    .unwrap_or(defaults::POSTGRES_MAX_CONNECTIONS);
                if max_connections == 0 {
                    return Err(self.err(&f("max_connections"), "must be above 0".into()));
                }
                Spec::Postgres {
                    url,
                    max_connections,
                    access,
                }
            }
            "redis" => Spec::Redis {
                url,
                prefix: s.prefix.unwrap_or_else(|| defaults::REDIS_PREFIX.into()),
                access,
            },
            "redis_cluster" => {
                let wait_replicas = s.wait_replicas.unwrap_or(0);
                if wait_replicas > MAX_WAIT_REPLICAS {
                    return Err(self.err(
                        &f("wait_replicas"),
                        format!("{wait_replicas} is above {MAX_WAIT_REPLICAS}"),
                    ));
                }
                Spec::RedisCluster {
                    urls,
                    prefix: s.prefix.unwrap_or_else(|| defaults::REDIS_PREFIX.into()),
                    access,
                    wait_replicas,
                }
            }
            _ => Spec::Sqlite { url },
        }))
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
