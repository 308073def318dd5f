//! The limiter: connect stores, build namespaces and their sync engines, bring them in
//! line with a new config, and stop with a last push. The stores and their tasks are in
//! `stores`; stopping namespaces and the limiter, in `stopping`; what stopped engines
//! left unconfirmed, retried and spooled, in `leftovers`.

mod idempotent;
mod key_limits;
mod leftovers;
mod lifecycle;
mod namespaces;
mod requests;
mod reservations;
mod stopping;
mod stores;

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use self::key_limits::KeyLimitsView;
use self::leftovers::{Leftovers, SpoolFiles};
use self::lifecycle::Failure;
pub use self::lifecycle::{LimiterError, LimiterErrorKind};
use self::stopping::retire;
use self::stores::open_stores;
pub use self::stores::{migrate_all, open_store};
use self::stores::{open_answering, Connected};
use crate::config::{Config, NamespaceConfig, StoreConfig};
use crate::error::Error;
use crate::spool;
use crate::state::namespace_in;
use crate::state::{Namespace, Namespaces, Timeouts};

/// A namespace, the store config it was built with, and the engine task that syncs it.
#[derive(Debug)]
struct Running {
    config: NamespaceConfig,
    store_config: Option<StoreConfig>,
    namespace: Arc<Namespace>,
    cancel: CancellationToken,
    engine: Option<tokio::task::JoinHandle<()>>,
}

/// What runs the namespaces: the stores, each namespace and its engine task, and what
/// stopped engines left; changed only under the [`Limiter`]'s lock.
#[derive(Debug)]
struct Control {
    /// The namespaces served, swapped whole when the config changes.
    serving: Arc<ArcSwap<Namespaces>>,
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
    /// What an earlier run spooled that its node owed the store (commits, extends,
    /// undos, settlements, give-backs), resolved once the namespaces serve.
    owed: Vec<crate::unresolved::Owed>,
    /// Where every namespace's outcomes are recorded.
    recorder: Arc<dyn crate::recorder::Recorder>,
    /// Namespaces a reload retired (removed, or rebuilt on another store) with what
    /// they owed their store then: their tasks go on resolving it, and a stop spools
    /// what is left, as it does a running namespace's.
    orphans: Vec<stopping::Orphan>,
}

impl Control {
    /// Connects the stores of `config` (migrating them when `migrate` is set), reads
    /// what an earlier run spooled under `data_dir`, and builds and starts its
    /// namespaces. A store that does not answer yet does not hold up the start: its
    /// namespaces count in memory and sync once it answers.
    async fn start(
        config: Config,
        recorder: Arc<dyn crate::recorder::Recorder>,
    ) -> Result<Control, LimiterError> {
        if !config.stores.is_empty() {
            // found out now, not at the stop that needs to spool
            spool::prepare(&config.data_dir).map_err(|source| Failure::DataDir {
                path: config.data_dir.clone(),
                source,
            })?;
        }
        swin_sync::clock::clock().set_max_offset(config.max_clock_offset);
        let connected = open_stores(&config).await?;
        let mut node = Control {
            serving: Arc::default(),
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
            owed: Vec::new(),
            recorder,
            orphans: Vec::new(),
        };
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
        node.resume_owed();
        node.spawn_leftover_retries();
        Ok(node)
    }

    /// Builds a namespace and its engine, without starting it. A namespace rebuilt on
    /// the store of the one it replaces takes over what that one owes the store
    /// (`replaced`'s unresolved changes: resolved by their tasks as before, spooled by
    /// the stop as this one's).
    fn build(&mut self, cfg: &NamespaceConfig, replaced: Option<&Running>) -> Running {
        let connected = cfg.store.as_ref().and_then(|s| self.stores.get(s));
        self.generation += 1;
        let mut namespace = Namespace::build(
            cfg,
            connected.map(|c| c.store.clone()),
            format!("{}.{}", self.node_id, self.generation).into(),
            Timeouts {
                store: self.config.store_timeout,
                answer: self.config.answer_timeout,
            },
        );
        namespace.record_to(self.recorder.clone());
        let store_config = connected.map(|c| c.config.clone());
        if let Some(old) = replaced {
            if old.config.store == cfg.store && old.store_config == store_config {
                namespace.unresolved = old.namespace.unresolved.clone();
            }
        }
        Running {
            config: cfg.clone(),
            store_config,
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
    /// A namespace `rebuilt` by a reload has its engine running already (it keeps the
    /// keys it holds current, and its runtime limits' watch reads their changes): its load
    /// fills only the keys it does not hold.
    async fn warm_up(&self, r: &Running, rebuilt: bool) {
        let sync = &r.namespace.sync;
        let name = r.config.name.clone();
        if let Err(e) = sync.reach().await {
            warn!(namespace = name, cause = %e, "the store does not answer yet");
        }
        // where this node's reading of runtime limit changes starts (before it serves,
        // so no change made while it starts goes unseen)
        if !rebuilt {
            if let Err(e) = r.namespace.runtime.catch_up(sync).await {
                warn!(namespace = name, cause = %e, "runtime limits wait for the store");
            }
        }
        if sync.store().is_none() {
            return;
        }
        sync.set_warming(true);
        let (sync, cancel) = (sync.clone(), r.cancel.clone());
        self.tracker.spawn(async move {
            let started = std::time::Instant::now();
            let now = swin_sync::now();
            let load = async {
                match rebuilt {
                    true => sync.fill(now).await,
                    false => sync.warm_up(now).await,
                }
            };
            tokio::select! {
                loaded = load => match loaded {
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
        // what a rebuilt namespace still owes goes on in its next version (shared), and
        // a removed one's in the tasks resolving it
        retire(old, deadline, self.leftovers.clone(), None).await;
    }
}

/// Cluster-wide limits, in process: the namespaces a config describes, each counting
/// in local memory and syncing with its store, and the stores themselves.
///
/// The daemon (`swin-node`) is this limiter behind its doors; a Rust program can use it
/// the same way, with no daemon:
///
/// ```no_run
/// # async fn run() -> anyhow::Result<()> {
/// let config = swin::config::Config::from_toml(r#"
/// data_dir = "/var/lib/my-program/swin"
///
/// [stores.main]
/// kind = "sqlite"
/// url = "sqlite:///var/lib/my-program/swin/counts.db"
///
/// [[namespaces]]
/// name = "api"
/// store = "main"
/// window_sizes = [60]
/// sync_rate = 0.1
/// limits = [{ window_size = 60, limit = 100 }]
/// "#)?;
/// let limiter = swin::Limiter::start(config).await?;
/// let verdict = limiter.hit("api", "user:42", 1.0).await?;
/// if !verdict.allowed() {
///     // 429: try again later
/// }
/// limiter.stop().await?; // a last push; what the store does not take is spooled
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Limiter {
    /// The namespaces served, swapped whole when the config changes.
    serving: Arc<ArcSwap<Namespaces>>,
    /// The config it runs.
    config: Arc<ArcSwap<Config>>,
    /// Envoy's quota service: shares of each bucket's limit among the proxies.
    shares: Arc<crate::shares::Shares>,
    /// What runs the namespaces; changed by a task of its own, so that a caller who
    /// drops a reconfigure or a stop midway cuts nothing short.
    control: Arc<tokio::sync::Mutex<Lifecycle>>,
}

impl Limiter {
    /// Connects the stores of `config` (migrating them when `migrate` is set), reads
    /// what an earlier run spooled under `data_dir`, and builds and starts its
    /// namespaces. A store that does not answer yet does not hold up the start: its
    /// namespaces count in memory and sync once it answers.
    pub async fn start(config: Config) -> Result<Limiter, LimiterError> {
        Limiter::start_recording(config, Arc::new(crate::recorder::NoRecorder)).await
    }

    /// [`Limiter::start`], with every namespace's outcomes (decisions, leases,
    /// reservations, increments, runtime limit changes) recorded to `recorder`.
    pub async fn start_recording(
        config: Config,
        recorder: Arc<dyn crate::recorder::Recorder>,
    ) -> Result<Limiter, LimiterError> {
        let control = Control::start(config.clone(), recorder).await?;
        let serving = control.serving.clone();
        // Envoy's quota service divides each bucket's limit in rounds, until the stop
        let shares = crate::shares::Shares::new(serving.clone(), config.quota);
        control
            .tracker
            .spawn(shares.clone().run(control.shutdown.child_token()));
        Ok(Limiter {
            shares,
            serving,
            config: Arc::new(ArcSwap::from_pointee(config)),
            control: Arc::new(tokio::sync::Mutex::new(Lifecycle::Running(Box::new(
                control,
            )))),
        })
    }

    /// Brings the limiter in line with `config`: stores added or changed are connected
    /// (each must answer within `store_timeout`, else nothing changes and the error says
    /// which), removed ones let go, and namespaces added, rebuilt, given new limits or
    /// retired as [`Limiter::start`] describes for each. Unchanged namespaces keep their
    /// counts. A running limiter keeps its `data_dir` (what it spooled, what it will spool
    /// at its stop): a change of it is logged and takes a restart.
    pub async fn reconfigure(&self, mut config: Config) -> Result<(), LimiterError> {
        let (control, running) = (self.control.clone(), self.config.clone());
        to_the_end(async move {
            let mut control = control.lock_owned().await;
            let Lifecycle::Running(control) = &mut *control else {
                return Err(Failure::Stopped.into());
            };
            if config.data_dir != control.config.data_dir {
                warn!(
                    running = %control.config.data_dir.display(),
                    asked = %config.data_dir.display(),
                    "a data_dir change needs a restart: the spool stays where it is"
                );
                config.data_dir = control.config.data_dir.clone();
            }
            control.reconfigure(config.clone()).await?;
            running.store(Arc::new(config));
            Ok(())
        })
        .await
    }

    /// Stops every engine at once (each pushes until a common deadline), tries what is
    /// left until then, and spools whatever the store still did not confirm — all within
    /// `shutdown_grace`, the last part of it kept for the spool. An error when a count
    /// could be neither confirmed nor spooled (the process then exits non-zero). A
    /// second stop waits for the first, then does nothing — but answers the first's
    /// error when the first's caller stopped waiting before it came.
    pub async fn stop(&self) -> Result<(), LimiterError> {
        let control = self.control.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut state = control.lock_owned().await;
            let out = match std::mem::replace(&mut *state, Lifecycle::Stopped(None)) {
                Lifecycle::Running(c) => (*c).stop().await,
                Lifecycle::Stopped(kept) => kept.map_or(Ok(()), Err),
            };
            // under the lock: a stop after this one sees what this one did not hand over
            if let Err(Err(e)) = tx.send(out) {
                *state = Lifecycle::Stopped(Some(e));
            }
        });
        match rx.await {
            Ok(out) => out,
            Err(_) => match task.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // cancelled only as the runtime shuts down, which drops this caller too
                _ => std::future::pending().await,
            },
        }
    }

    /// The config it runs now.
    pub(crate) fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The namespaces served now: read without a lock, each change
    /// [`Limiter::reconfigure`] makes seen at once.
    pub(crate) fn namespaces(&self) -> Arc<Namespaces> {
        self.serving.load_full()
    }

    /// The namespace `name`, as served now.
    pub(crate) fn namespace(&self, name: &str) -> Result<Arc<Namespace>, Error> {
        namespace_in(&self.serving.load(), name)
    }

    /// Nothing when it serves a namespace `name` now, else the error naming it
    /// ([`Error::UnknownNamespace`]).
    pub fn serves(&self, name: &str) -> Result<(), Error> {
        match self.serving.load().contains_key(name) {
            true => Ok(()),
            false => Err(Error::unknown_namespace(name)),
        }
    }
}

/// What runs the namespaces, or what the stop left.
#[derive(Debug)]
enum Lifecycle {
    Running(Box<Control>),
    /// Stopped, with the stop's error when its caller stopped waiting before it came.
    Stopped(Option<LimiterError>),
}

/// Runs `change` to its end on a task of its own: a caller that stops waiting (a timeout,
/// a `select!`) does not cut it short midway, with namespaces taken out of what runs or a
/// stop's last push undone. A panic in it is the caller's.
async fn to_the_end<T: Send + 'static>(
    change: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match tokio::spawn(change).await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // cancelled only as the runtime shuts down, which drops this caller too
        Err(_) => std::future::pending().await,
    }
}
