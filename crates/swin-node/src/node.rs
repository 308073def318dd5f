//! Running a node: connect stores, build namespaces and their sync engines, serve HTTP,
//! reload on SIGHUP, and shut down with a last push.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context;
use swin_core::{CounterOptions, NamespaceCounters, Retention, UnixMs};
use swin_sync::store::{PostgresStore, RedisStore, SqliteStore};
use swin_sync::{NamespaceSync, Store, SyncMode};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::app::{app, AppState, Namespace, Namespaces};
use crate::config::{Config, NamespaceConfig, StoreConfig, StoreKind};

pub async fn connect_store(cfg: &StoreConfig) -> anyhow::Result<Store> {
    Ok(match cfg.kind {
        StoreKind::Postgres => Store::Postgres(
            PostgresStore::connect(&cfg.url, cfg.max_connections)
                .await
                .context("configure postgres")?,
        ),
        StoreKind::Redis => Store::Redis(
            RedisStore::connect(&cfg.url, &cfg.prefix)
                .await
                .context("connect to redis")?,
        ),
        StoreKind::Sqlite => {
            if let Some(path) = cfg.url.strip_prefix("sqlite://") {
                if let Some(dir) = std::path::Path::new(path)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("create {}", dir.display()))?;
                }
            }
            Store::Sqlite(
                SqliteStore::connect(&cfg.url)
                    .await
                    .context("open sqlite")?,
            )
        }
    })
}

/// Connects (or, for PostgreSQL and Redis, prepares to connect to) every store of the
/// config. Nothing is migrated here.
pub async fn connect_stores(
    config: &Config,
) -> anyhow::Result<BTreeMap<String, (StoreConfig, Store)>> {
    let mut stores = BTreeMap::new();
    for (name, cfg) in &config.stores {
        let store = connect_store(cfg)
            .await
            .with_context(|| format!("store {name:?}"))?;
        stores.insert(name.clone(), (cfg.clone(), store));
    }
    Ok(stores)
}

/// `swin-node migrate`: applies the schema to every store, failing on the first error.
pub async fn migrate_all(config: &Config) -> anyhow::Result<()> {
    for (name, (_, store)) in connect_stores(config).await? {
        store
            .migrate()
            .await
            .with_context(|| format!("migrate store {name:?}"))?;
    }
    Ok(())
}

/// A namespace and the engine task that syncs it.
#[derive(Debug)]
struct Running {
    config: NamespaceConfig,
    namespace: Arc<Namespace>,
    cancel: CancellationToken,
}

#[derive(Debug)]
pub struct Node {
    pub state: Arc<AppState>,
    stores: BTreeMap<String, (StoreConfig, Store)>,
    running: BTreeMap<String, Running>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    node_id: Arc<str>,
    config: Config,
}

impl Node {
    pub async fn start(config: Config) -> anyhow::Result<Node> {
        let stores = connect_stores(&config).await?;
        let mut node = Node {
            state: Arc::new(AppState::new(Namespaces::new(), config.body_limit)),
            stores,
            running: BTreeMap::new(),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            node_id: swin_sync::new_node_id().into(),
            config: config.clone(),
        };
        if config.migrate {
            // Usually the store is up and the schema is in place before the first warm-up
            // and sync. A migration is never cancelled half-way (that could leave its
            // advisory lock held on a pooled connection): past the timeout it goes on in
            // the background, retrying while the store is down.
            let pending: Vec<_> = node
                .stores
                .iter()
                .map(|(name, (_, store))| (name.clone(), node.spawn_migrate(name, store)))
                .collect();
            for (name, done) in pending {
                if tokio::time::timeout(config.store_timeout, done)
                    .await
                    .is_err()
                {
                    warn!(
                        store = name,
                        "schema not ready yet; migrating in the background"
                    );
                }
            }
        }
        node.apply_namespaces(&config.namespaces).await;
        node.spawn_purge();
        Ok(node)
    }

    /// Migrates a store; while it is unreachable the node still starts and serves from
    /// local memory, and this retries with backoff (syncs keep their diffs meanwhile).
    fn spawn_migrate(&self, name: &str, store: &Store) -> tokio::sync::oneshot::Receiver<()> {
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

    fn spawn_purge(&self) {
        for (name, (_, store)) in &self.stores {
            let (store, cancel, name) = (store.clone(), self.shutdown.clone(), name.clone());
            self.tracker.spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! { _ = cancel.cancelled() => return, _ = tick.tick() => {} }
                    match store
                        .purge(UnixMs::from_system_time(SystemTime::now()))
                        .await
                    {
                        Ok(n) if n > 0 => info!(store = name, rows = n, "purged expired windows"),
                        Ok(_) => {}
                        Err(e) => warn!(store = name, cause = %e, "purge failed"),
                    }
                }
            });
        }
    }

    /// Builds a namespace, loads its current totals from the store (so a node that
    /// joins answers with the cluster's counts from its first request), then starts its
    /// engine.
    async fn build(&self, cfg: &NamespaceConfig) -> Running {
        let retention = if cfg.mode == SyncMode::LocalOnly {
            Retention::LocalOnly
        } else {
            Retention::Synced
        };
        let counters = Arc::new(NamespaceCounters::new(
            &cfg.name,
            &cfg.window_sizes,
            CounterOptions {
                retention,
                max_counters: cfg.max_counters,
            },
        ));
        let store = cfg
            .store
            .as_ref()
            .and_then(|s| self.stores.get(s))
            .map(|(_, st)| st.clone());
        let sync = NamespaceSync::new(
            counters,
            cfg.mode,
            store,
            self.node_id.clone(),
            self.config.store_timeout,
        );
        let sync = Arc::new(if is_gcra(cfg) {
            sync.with_buckets()
        } else {
            sync
        });
        let cancel = self.shutdown.child_token();
        let engine = sync.clone();
        let token = cancel.clone();
        let now = UnixMs::from_system_time(SystemTime::now());
        match tokio::time::timeout(self.config.store_timeout, engine.warm_up(now)).await {
            Ok(Ok(n)) => info!(namespace = cfg.name, totals = n, "warmed up from the store"),
            Ok(Err(e)) => {
                warn!(namespace = cfg.name, cause = %e, "warm-up failed; totals arrive with the first syncs")
            }
            Err(_) => warn!(
                namespace = cfg.name,
                "warm-up timed out; totals arrive with the first syncs"
            ),
        }
        self.tracker.spawn(engine.run(token));
        Running {
            config: cfg.clone(),
            namespace: Arc::new(Namespace {
                sync,
                store_name: cfg.store.clone(),
                limits: cfg.limits.clone(),
                allow_decrements: cfg.allow_decrements,
            }),
            cancel,
        }
    }

    /// Brings the running namespaces in line with `wanted`: unchanged ones keep their
    /// counts, changed ones are rebuilt (their old engine pushes once more and stops),
    /// removed ones stop.
    async fn apply_namespaces(&mut self, wanted: &[NamespaceConfig]) {
        let mut next = BTreeMap::new();
        for cfg in wanted {
            match self.running.remove(&cfg.name) {
                Some(r) if r.config == *cfg => {
                    next.insert(cfg.name.clone(), r);
                }
                Some(r) if only_limits_changed(&r.config, cfg) => {
                    // same counters and engine, new limits: nothing counted is lost
                    info!(namespace = cfg.name, "limits changed");
                    let namespace = Arc::new(Namespace {
                        sync: r.namespace.sync.clone(),
                        store_name: r.namespace.store_name.clone(),
                        limits: cfg.limits.clone(),
                        allow_decrements: cfg.allow_decrements,
                    });
                    next.insert(
                        cfg.name.clone(),
                        Running {
                            config: cfg.clone(),
                            namespace,
                            cancel: r.cancel,
                        },
                    );
                }
                old => {
                    if let Some(old) = old {
                        info!(namespace = cfg.name, "namespace changed; rebuilding");
                        old.cancel.cancel();
                    } else {
                        info!(
                            namespace = cfg.name,
                            mode = cfg.mode.name(),
                            "namespace added"
                        );
                    }
                    next.insert(cfg.name.clone(), self.build(cfg).await);
                }
            }
        }
        for (name, old) in std::mem::take(&mut self.running) {
            info!(namespace = name, "namespace removed");
            old.cancel.cancel();
        }
        self.running = next;
        let map: Namespaces = self
            .running
            .iter()
            .map(|(k, r)| (k.clone(), r.namespace.clone()))
            .collect();
        self.state.namespaces.store(Arc::new(map));
    }

    /// Reloads from `path`: a bad file is logged and the running config stays.
    pub async fn reload(&mut self, path: &std::path::Path) {
        let config = match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                error!(cause = %e, "reload rejected; keeping the running config");
                return;
            }
        };
        if config.listen != self.config.listen {
            warn!(listen = %config.listen, "listen address changes need a restart");
        }
        for (name, cfg) in &config.stores {
            let same = self.stores.get(name).is_some_and(|(c, _)| c == cfg);
            if !same {
                match connect_store(cfg).await {
                    Ok(store) => {
                        if config.migrate {
                            // a reload does not wait for the schema
                            drop(self.spawn_migrate(name, &store));
                        }
                        self.stores.insert(name.clone(), (cfg.clone(), store));
                    }
                    Err(e) => {
                        error!(store = name, cause = %e, "reload rejected: cannot connect");
                        return;
                    }
                }
            }
        }
        // a namespace whose store changed is rebuilt: compare configs including the store's
        let changed_stores: Vec<String> = config
            .stores
            .iter()
            .filter(|(n, c)| self.config.stores.get(*n) != Some(c))
            .map(|(n, _)| n.clone())
            .collect();
        for r in self.running.values_mut() {
            if r.config
                .store
                .as_ref()
                .is_some_and(|s| changed_stores.contains(s))
            {
                r.config.max_counters = usize::MAX; // force a rebuild
            }
        }
        self.apply_namespaces(&config.namespaces).await;
        self.config = config;
        info!(namespaces = self.running.len(), "config reloaded");
    }

    /// Serves until SIGTERM or SIGINT; reloads `config_path` on SIGHUP.
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        config_path: Option<PathBuf>,
    ) -> anyhow::Result<()> {
        let router = app(self.state.clone());
        let stop = CancellationToken::new();
        let server_stop = stop.clone();
        let server = tokio::spawn(async move {
            // the peer address is the forward-auth key of last resort
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .with_graceful_shutdown(async move { server_stop.cancelled().await })
            .await
        });
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("install SIGHUP handler")?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("install SIGTERM handler")?;
        loop {
            tokio::select! {
                _ = hup.recv() => match &config_path {
                    Some(p) => self.reload(p).await,
                    None => warn!("SIGHUP ignored: running on the embedded config"),
                },
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        info!("shutting down: no new connections, finishing requests");
        stop.cancel();
        let grace = self.config.shutdown_grace;
        match tokio::time::timeout(grace, server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => error!(cause = %e, "server error"),
            Ok(Err(e)) => error!(cause = %e, "server task failed"),
            Err(_) => warn!(?grace, "requests still running after the grace period"),
        }
        info!("pushing the last diffs");
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                ?grace,
                "sync engines did not finish within the grace period"
            );
        }
        info!("stopped");
        Ok(())
    }
}

/// True when two configs of a namespace differ in their limits only, and not in kind
/// (window limits and GCRA keep different state).
fn only_limits_changed(old: &NamespaceConfig, new: &NamespaceConfig) -> bool {
    let mut same = new.clone();
    same.limits = old.limits.clone();
    same.allow_decrements = old.allow_decrements;
    same == *old && is_gcra(old) == is_gcra(new)
}

fn is_gcra(cfg: &NamespaceConfig) -> bool {
    cfg.limits
        .as_ref()
        .is_some_and(crate::limits::Limits::is_gcra)
}
