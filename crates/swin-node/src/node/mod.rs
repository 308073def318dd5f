//! Running a node: connect stores, build namespaces and their sync engines, serve HTTP,
//! reload on SIGHUP, and shut down with a last push. The stores and their tasks are in
//! `stores`; stopping namespaces and the node, in `stopping`; what stopped engines left
//! unconfirmed, retried and spooled, in `leftovers`.

mod leftovers;
mod stopping;
mod stores;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use self::leftovers::{Leftovers, SpoolFiles};
use self::stopping::retire;
pub use self::stores::{migrate_all, open_store, open_stores};
use self::stores::{open_answering, Connected};
use crate::config::{Config, NamespaceConfig, StoreConfig};
use crate::http::router;
use crate::spool;
use crate::state::{AppState, Namespace, Namespaces};

/// A namespace, the store config it was built with, and the engine task that syncs it.
#[derive(Debug)]
struct Running {
    config: NamespaceConfig,
    store_config: Option<StoreConfig>,
    namespace: Arc<Namespace>,
    cancel: CancellationToken,
    engine: Option<tokio::task::JoinHandle<()>>,
}

/// The signals a node answers: SIGHUP reloads, SIGTERM and SIGINT stop it. Installed
/// before anything else (the listener is bound, and answers, before the node has started:
/// a signal that came during the start used to kill the process outright); one that
/// arrives before the node serves is acted on once it does.
#[derive(Debug)]
pub struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            hup: signal(SignalKind::hangup()).context("install SIGHUP handler")?,
            term: signal(SignalKind::terminate()).context("install SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("install SIGINT handler")?,
        })
    }
}

#[derive(Debug)]
pub struct Node {
    pub state: Arc<AppState>,
    stores: BTreeMap<String, Connected>,
    running: BTreeMap<String, Running>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// Stops the background retries of leftovers (first thing at shutdown).
    retries: CancellationToken,
    node_id: Arc<str>,
    /// Engines built so far: each pushes as `<node_id>.<generation>`.
    generation: u64,
    config: Config,
    leftovers: Leftovers,
    spool_files: SpoolFiles,
    /// HTTPS, when the config has `[tls]`; its files are read again on SIGHUP.
    tls: Option<crate::tls::Acceptor>,
}

impl Node {
    pub async fn start(config: Config) -> anyhow::Result<Node> {
        if !config.stores.is_empty() {
            // found out now, not at the stop that needs to spool
            spool::prepare(&config.data_dir).with_context(|| {
                format!(
                    "data_dir {}: the spool needs a directory this node can write",
                    config.data_dir.display()
                )
            })?;
        }
        swin_sync::clock::clock().set_max_offset(config.max_clock_offset);
        let connected = open_stores(&config).await?;
        let tls = match &config.tls {
            Some(cfg) => Some(crate::tls::Acceptor::load(cfg)?),
            None => None,
        };
        let mut node = Node {
            state: Arc::new(AppState::for_config(&config)),
            stores: BTreeMap::new(),
            running: BTreeMap::new(),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            retries: CancellationToken::new(),
            node_id: swin_sync::new_node_id().into(),
            generation: 0,
            config: config.clone(),
            leftovers: Default::default(),
            spool_files: Default::default(),
            tls,
        };
        if config.auth.is_none() && !config.listen.ip().is_loopback() {
            warn!(listen = %config.listen, "no [auth] section: anyone who reaches this address can reset keys, sync and read metrics; add [auth] tokens or listen on loopback");
        }
        for (name, (cfg, store)) in connected {
            node.add_store(name, cfg, store);
        }
        if config.migrate {
            // Usually the store is up and the schema is in place before the first warm-up
            // and sync. A migration is never cancelled half-way (that could leave its
            // advisory lock held on a pooled connection): past the timeout it goes on in
            // the background, retrying while the store is down.
            let pending: Vec<_> = node
                .stores
                .iter()
                .map(|(name, c)| (name.clone(), node.spawn_migrate(name, &c.store)))
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
        // what an earlier run spooled goes out before this one counts anything
        node.load_spool();
        node.retry_leftovers().await;
        node.apply_namespaces(&config.namespaces).await;
        node.spawn_leftover_retries();
        Ok(node)
    }

    /// Builds a namespace and its engine, without starting it.
    fn build(&mut self, cfg: &NamespaceConfig) -> Running {
        let connected = cfg.store.as_ref().and_then(|s| self.stores.get(s));
        self.generation += 1;
        let namespace = Namespace::build(
            cfg,
            connected.map(|c| c.store.clone()),
            format!("{}.{}", self.node_id, self.generation).into(),
            crate::state::Timeouts {
                store: self.config.store_timeout,
                answer: self.config.answer_timeout,
            },
        );
        Running {
            config: cfg.clone(),
            store_config: connected.map(|c| c.config.clone()),
            namespace: Arc::new(namespace),
            cancel: self.shutdown.child_token(),
            engine: None,
        }
    }

    /// Reaches the namespace's store (readiness, and the store's clock from the first
    /// request), reads where runtime limit changes start, then loads the namespace's
    /// current totals in the background (for a rebuilt namespace, once its old engine has
    /// pushed): the node serves meanwhile — each key it is asked about is read at its first
    /// touch — so a keyspace of any size holds up no start and no reload; `/readyz` lists
    /// the namespace as warming until the load ends.
    async fn warm_up(&self, r: &Running) {
        let sync = &r.namespace.sync;
        let name = r.config.name.clone();
        if let Err(e) = sync.reach().await {
            warn!(namespace = name, cause = %e, "the store does not answer yet");
        }
        // where this node's reading of runtime limit changes starts (before it serves,
        // so no change made while it starts goes unseen)
        if let Err(e) = r.namespace.runtime.catch_up(sync).await {
            warn!(namespace = name, cause = %e, "runtime limits wait for the store");
        }
        if sync.store().is_none() {
            return;
        }
        sync.set_warming(true);
        let (sync, cancel) = (sync.clone(), r.cancel.clone());
        self.tracker.spawn(async move {
            let started = std::time::Instant::now();
            tokio::select! {
                loaded = sync.warm_up(swin_sync::now()) => match loaded {
                    Ok(n) => info!(namespace = name, totals = n, seconds = started.elapsed().as_secs_f64(), "warmed up from the store"),
                    Err(e) => warn!(namespace = name, cause = %e, "warm-up failed; totals arrive with the first touches and syncs"),
                },
                _ = cancel.cancelled() => {}
            }
            sync.set_warming(false);
        });
    }

    fn start_engine(&self, r: &mut Running) {
        let engine = r.namespace.sync.clone();
        r.engine = Some(self.tracker.spawn(engine.run(r.cancel.clone())));
        // runtime limits: every sync period, or at once where hits wait on the store
        let ns = &r.namespace;
        let period = match ns.sync.mode() {
            _ if ns.counts_in_the_store() => crate::runtime_limits::QUICK_WATCH,
            swin_sync::SyncMode::Periodic(p) => p,
            swin_sync::SyncMode::Synchronous => crate::runtime_limits::QUICK_WATCH,
            swin_sync::SyncMode::LocalOnly => std::time::Duration::from_secs(1),
        };
        self.tracker.spawn(crate::runtime_limits::watch(
            ns.runtime.clone(),
            ns.sync.clone(),
            period,
            r.cancel.clone(),
        ));
    }

    /// Stops a namespace no longer served (see [`retire`]), waiting for its requests up to
    /// the shutdown grace.
    async fn retire(&self, old: Running) {
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        retire(old, deadline, self.leftovers.clone()).await;
    }

    /// Brings the running namespaces in line with `wanted`. Unchanged ones keep their
    /// counts and engine, as do ones whose limits alone changed. Changed ones are rebuilt
    /// and removed ones stop, in this order: the new map is served first, then each old
    /// namespace is retired once no request holds it (its engine's last push then holds
    /// every hit its tables took), then rebuilt namespaces load the totals that push
    /// made, and their engines start.
    async fn apply_namespaces(&mut self, wanted: &[NamespaceConfig]) {
        let mut next = BTreeMap::new();
        let mut retired = Vec::new();
        let mut rebuilt = Vec::new();
        for cfg in wanted {
            let store_config = cfg
                .store
                .as_ref()
                .and_then(|s| self.stores.get(s))
                .map(|c| c.config.clone());
            match self.running.remove(&cfg.name) {
                Some(r) if r.config == *cfg && r.store_config == store_config => {
                    next.insert(cfg.name.clone(), r);
                }
                Some(r)
                    if only_limits_changed(&r.config, cfg) && r.store_config == store_config =>
                {
                    // same counters and engine, new limits: nothing counted is lost
                    info!(namespace = cfg.name, "limits changed");
                    let namespace = Arc::new(r.namespace.with_limits(cfg));
                    next.insert(cfg.name.clone(), Running { namespace, ..r });
                }
                Some(old) => {
                    info!(namespace = cfg.name, "namespace changed; rebuilding");
                    let mut r = self.build(cfg);
                    // leases and reservations a node keeps itself (no store) are live
                    // across the rebuild: a new table would let a limit's worth more in
                    Arc::get_mut(&mut r.namespace)
                        .expect("built just now, shared with nobody")
                        .leases = old.namespace.leases.clone();
                    retired.push(old);
                    rebuilt.push(cfg.name.clone());
                    next.insert(cfg.name.clone(), r);
                }
                None => {
                    info!(
                        namespace = cfg.name,
                        mode = cfg.mode.name(),
                        "namespace added"
                    );
                    let mut r = self.build(cfg);
                    self.warm_up(&r).await;
                    self.start_engine(&mut r);
                    next.insert(cfg.name.clone(), r);
                }
            }
        }
        for (name, old) in std::mem::take(&mut self.running) {
            info!(namespace = name, "namespace removed");
            retired.push(old);
        }
        self.running = next;
        self.publish();
        for old in retired {
            self.retire(old).await;
        }
        // what the retired engines could not push goes out before the rebuilt ones load
        self.retry_leftovers().await;
        for name in rebuilt {
            if let Some(mut r) = self.running.remove(&name) {
                self.warm_up(&r).await;
                self.start_engine(&mut r);
                self.running.insert(name, r);
            }
        }
    }

    /// Serves the running namespaces.
    fn publish(&self) {
        let map: Namespaces = self
            .running
            .iter()
            .map(|(k, r)| (k.clone(), r.namespace.clone()))
            .collect();
        self.state.namespaces.store(Arc::new(map));
    }

    /// Reloads from `path`. A file that fails to load, or a store that cannot be set up,
    /// rejects the reload with nothing changed.
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
        match (&config.tls, &self.tls) {
            (Some(cfg), Some(running)) => match running.reload(cfg) {
                Ok(()) => info!("TLS certificate and key read again"),
                Err(e) => {
                    error!(cause = %e, "TLS files not reloaded; keeping the running certificate")
                }
            },
            (None, None) => {}
            _ => warn!("turning TLS on or off needs a restart"),
        }
        if config.connections != self.config.connections
            || config.body_limit != self.config.body_limit
            || config.max_batch != self.config.max_batch
        {
            warn!("connection limits, timeouts, body_limit and max_batch changes need a restart");
        }
        let mut fresh = Vec::new();
        for (name, cfg) in &config.stores {
            if self.stores.get(name).is_some_and(|c| c.config == *cfg) {
                continue;
            }
            // a store the new config would switch to must answer now: hits counted
            // for a store that never answers could only be spooled for it
            match open_answering(cfg, self.config.store_timeout).await {
                Ok(store) => fresh.push((name.clone(), cfg.clone(), store)),
                Err(e) => {
                    error!(store = name, cause = %format!("{e:#}"), "reload rejected: the store does not answer; keeping the running config");
                    return;
                }
            }
        }
        for (name, cfg, store) in fresh {
            if config.migrate {
                // a reload does not wait for the schema
                drop(self.spawn_migrate(&name, &store));
            }
            self.add_store(name, cfg, store);
        }
        let removed: Vec<String> = self
            .stores
            .keys()
            .filter(|n| !config.stores.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(old) = self.stores.remove(&name) {
                old.purge.cancel();
            }
        }
        if config.auth != self.config.auth {
            info!(
                tokens = config.auth.as_ref().map_or(0, |a| a.tokens.len()),
                "tokens reloaded"
            );
        }
        self.state.set_access(&config);
        swin_sync::clock::clock().set_max_offset(config.max_clock_offset);
        self.config = config.clone();
        self.apply_namespaces(&config.namespaces).await;
        info!(namespaces = self.running.len(), "config reloaded");
    }

    /// Serves until SIGTERM or SIGINT; reloads `config_path` on SIGHUP. On the way out,
    /// what the store does not confirm is spooled under `data_dir`; an error when even
    /// that fails (the process then exits non-zero).
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        config_path: Option<PathBuf>,
        mut signals: Signals,
    ) -> anyhow::Result<()> {
        let router = router(self.state.clone());
        let stop = CancellationToken::new();
        let addr = listener.local_addr().context("listener address")?;
        let grace = self.config.shutdown_grace;
        let server = tokio::spawn(crate::http::server::serve(
            listener,
            router,
            self.config.connections,
            self.tls.clone(),
            stop.clone(),
            grace,
            self.state.metrics.http_connections.clone(),
        ));
        let grpc = match self.config.grpc_listen {
            Some(a) => {
                let l = tokio::net::TcpListener::bind(a)
                    .await
                    .with_context(|| format!("grpc_listen {a}"))?;
                Some(tokio::spawn(crate::rls::serve(
                    l,
                    self.state.clone(),
                    self.tls.clone(),
                    self.config.connections,
                    stop.clone(),
                )))
            }
            None => None,
        };
        info!(listen = %addr, namespaces = self.running.len(), "swin-node ready");
        loop {
            tokio::select! {
                _ = signals.hup.recv() => match &config_path {
                    Some(p) => self.reload(p).await,
                    None => warn!("SIGHUP ignored: running on the embedded config"),
                },
                _ = signals.term.recv() => break,
                _ = signals.int.recv() => break,
            }
        }
        info!("shutting down: no new connections, finishing requests");
        stop.cancel();
        // the server waits up to the grace period for the requests in flight
        if let Err(e) = server.await {
            error!(cause = %e, "server task failed");
        }
        if let Some(g) = grpc {
            match g.await {
                Ok(Err(e)) => error!(cause = %e, "gRPC server failed"),
                Err(e) => error!(cause = %e, "gRPC server task failed"),
                Ok(Ok(())) => {}
            }
        }
        info!("pushing the last diffs");
        self.shutdown_engines().await
    }
}

/// True when two configs of a namespace differ in their limits only, and not in kind
/// (window limits and GCRA keep different state).
fn only_limits_changed(old: &NamespaceConfig, new: &NamespaceConfig) -> bool {
    // a strict namespace's quota was held or granted under its old limits: it goes back with
    // the old engine, and the new one grants under the new limits
    if old.admission != crate::config::Admission::Eventual {
        return false;
    }
    let mut same = new.clone();
    same.limits = old.limits.clone();
    same.rules = old.rules.clone();
    same.allow_decrements = old.allow_decrements;
    same == *old && is_gcra(old) == is_gcra(new)
}

fn is_gcra(cfg: &NamespaceConfig) -> bool {
    cfg.algorithm == crate::policy::algorithm::Algorithm::Gcra
}
