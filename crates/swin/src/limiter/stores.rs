//! The stores of a config: opening them (PostgreSQL and Redis connect on first use),
//! applying their schema, and each store's purge task.

use std::collections::BTreeMap;

use swin_sync::store::{PostgresStore, RedisStore, SqliteStore};
use swin_sync::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Control, Failure, LimiterError};
use crate::config::stores::Spec;
use crate::config::{Config, StoreConfig};

/// Opens the store `cfg` describes, named `name` in the config (PostgreSQL and Redis
/// connect on first use).
pub async fn open_store(name: &str, cfg: &StoreConfig) -> Result<Store, LimiterError> {
    let configure = |e| LimiterError::store(name, "configure", e);
    Ok(match &cfg.0 {
        Spec::Postgres {
            url,
            max_connections,
            access,
        } => Store::Postgres(
            PostgresStore::with_access(url, *max_connections, access).map_err(configure)?,
        ),
        Spec::Redis {
            url,
            prefix,
            access,
        } => Store::Redis(RedisStore::with_access(url, prefix, access).map_err(configure)?),
        Spec::RedisCluster {
            urls,
            prefix,
            access,
            wait_replicas,
        } => Store::Redis(
            RedisStore::cluster(urls, prefix, access, *wait_replicas).map_err(configure)?,
        ),
        Spec::Sqlite { url } => {
            if let Some(path) = url.strip_prefix("sqlite://") {
                if let Some(dir) = std::path::Path::new(path)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        LimiterError::store(name, "open", format!("create {}: {e}", dir.display()))
                    })?;
                }
            }
            Store::Sqlite(
                SqliteStore::connect(url)
                    .await
                    .map_err(|e| LimiterError::store(name, "open", e))?,
            )
        }
    })
}

/// Opens every store of the config (PostgreSQL and Redis connect on first use).
/// Nothing is migrated here.
pub(crate) async fn open_stores(
    config: &Config,
) -> Result<BTreeMap<String, (StoreConfig, Store)>, LimiterError> {
    let mut stores = BTreeMap::new();
    for (name, cfg) in &config.stores {
        let store = open_store(name, cfg).await?;
        stores.insert(name.clone(), (cfg.clone(), store));
    }
    Ok(stores)
}

/// `swin-node migrate`: applies the schema to every store, failing on the first error.
pub async fn migrate_all(config: &Config) -> Result<(), LimiterError> {
    for (name, (_, store)) in open_stores(config).await? {
        store
            .migrate()
            .await
            .map_err(|e| LimiterError::store(&name, "migrate", e))?;
    }
    Ok(())
}

/// A store of the config, connected, and the purge task that belongs to it.
#[derive(Debug)]
pub(super) struct Connected {
    pub(super) config: StoreConfig,
    pub(super) store: Store,
    /// Stops the store's purge task when the store is removed or replaced.
    pub(super) purge: CancellationToken,
}

impl Control {
    pub(super) fn add_store(&mut self, name: String, config: StoreConfig, store: Store) {
        let purge = self.shutdown.child_token();
        self.spawn_purge(&name, &store, purge.clone());
        if let Some(old) = self.stores.insert(
            name,
            Connected {
                config,
                store,
                purge,
            },
        ) {
            old.purge.cancel();
        }
    }

    /// Migrates a store; while it is unreachable the node still starts and serves from
    /// local memory, and this retries with backoff (syncs keep their diffs meanwhile).
    pub(super) fn spawn_migrate(
        &self,
        name: &str,
        store: &Store,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (name, store, cancel) = (name.to_owned(), store.clone(), self.shutdown.clone());
        let (done, done_rx) = tokio::sync::oneshot::channel();
        self.tracker.spawn(async move {
            let mut delay = std::time::Duration::from_millis(500);
            loop {
                match store.migrate().await {
                    Ok(()) => {
                        info!(store = name, "schema up to date");
                        let _ = done.send(());
                        return;
                    }
                    Err(e) => warn!(store = name, cause = %e, retry_in_ms = delay.as_millis() as u64, "migrate failed"),
                }
                tokio::select! { _ = cancel.cancelled() => return, _ = tokio::time::sleep(delay) => {} }
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
            }
        });
        done_rx
    }

    /// Every minute, expired windows, push records and lapsed idempotency records go; one task per store, stopped
    /// with `cancel` when the store is replaced or removed.
    pub(super) fn spawn_purge(&self, name: &str, store: &Store, cancel: CancellationToken) {
        let (store, name) = (store.clone(), name.to_owned());
        self.tracker.spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! { _ = cancel.cancelled() => return, _ = tick.tick() => {} }
                match store.purge(swin_sync::now()).await {
                    Ok(n) if n > 0 => info!(store = name, rows = n, "purged expired windows"),
                    Ok(_) => {}
                    Err(e) => warn!(store = name, cause = %e, "purge failed"),
                }
                match store.purge_idempotency(swin_sync::now()).await {
                    Ok(n) if n > 0 => {
                        info!(store = name, rows = n, "purged lapsed idempotency records")
                    }
                    Ok(_) => {}
                    Err(e) => warn!(store = name, cause = %e, "purging idempotency records failed"),
                }
            }
        });
    }
}

/// Opens a store and pings it within `timeout`.
pub(super) async fn open_answering(
    name: &str,
    cfg: &StoreConfig,
    timeout: std::time::Duration,
) -> Result<swin_sync::Store, LimiterError> {
    let store = open_store(name, cfg).await?;
    match tokio::time::timeout(timeout, store.ping()).await {
        Ok(Ok(_)) => Ok(store),
        Ok(Err(e)) => Err(LimiterError::store(name, "ping", e)),
        Err(_) => Err(Failure::StoreTimeout {
            store: name.to_owned(),
            timeout,
        }
        .into()),
    }
}
