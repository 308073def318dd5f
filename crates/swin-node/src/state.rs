//! What every request of the daemon shares: the limiter (its namespaces swapped whole
//! on a reload, read without a lock), the metrics, and each door's limits and access.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::AuthConfig;
use swin::state::Namespaces;
use swin::Limiter;

use crate::metrics::Metrics;

#[derive(Debug)]
pub struct AppState {
    /// The limiter every door asks.
    pub limiter: Arc<Limiter>,
    /// The node's metrics: its doors' own, and where the pipeline records what it
    /// decides ([`swin::recorder::Recorder`]).
    pub metrics: Arc<Metrics>,
    pub body_limit: usize,
    /// To receive a request's whole body (408 after it).
    pub body_timeout: Duration,
    /// Items of one batch.
    pub max_batch: usize,
    /// The tokens `[auth]` accepts, swapped on reload; `None`: every route is open.
    pub auth: ArcSwapOption<AuthConfig>,
    /// Peers whose forwarding headers are believed, swapped on reload.
    pub trusted_proxies: ArcSwap<Vec<ipnet::IpNet>>,
    /// Where the spool lives (`data_dir`), for the metrics; `None` for a bare router.
    pub data_dir: Option<std::path::PathBuf>,
}

impl AppState {
    /// The state of a node serving `namespaces`, whose outcomes are recorded to its
    /// metrics.
    pub fn new(namespaces: Namespaces, body_limit: usize) -> Self {
        let metrics = Arc::new(Metrics::default());
        for ns in namespaces.values() {
            ns.record_to(metrics.clone());
        }
        AppState {
            limiter: Arc::new(Limiter::over(namespaces)),
            metrics,
            body_limit,
            body_timeout: Duration::from_secs_f64(crate::config::defaults::BODY_TIMEOUT_SECS),
            max_batch: crate::config::defaults::MAX_BATCH,
            auth: ArcSwapOption::empty(),
            trusted_proxies: ArcSwap::from_pointee(Vec::new()),
            data_dir: None,
        }
    }

    /// The state of a node asking `limiter` (namespaces recording nowhere yet record to
    /// `metrics`): the request limits and access of `config`.
    pub fn for_config(
        config: &crate::config::Config,
        limiter: Arc<Limiter>,
        metrics: Arc<Metrics>,
    ) -> Self {
        for ns in limiter.namespaces().values() {
            ns.record_to(metrics.clone());
        }
        let state = AppState {
            limiter,
            metrics,
            body_limit: config.body_limit,
            body_timeout: config.connections.body_timeout,
            max_batch: config.max_batch,
            auth: ArcSwapOption::empty(),
            trusted_proxies: ArcSwap::from_pointee(Vec::new()),
            data_dir: Some(config.limiter().data_dir().to_owned()),
        };
        state.set_access(config);
        state
    }

    /// Who may call what, from `config`: its tokens and its trusted proxies (at start
    /// and on every reload).
    pub fn set_access(&self, config: &crate::config::Config) {
        self.auth.store(config.auth.clone().map(Arc::new));
        self.trusted_proxies
            .store(Arc::new(config.trusted_proxies.clone()));
    }

    /// The namespace `name`, as served now (status reads).
    pub(crate) fn namespace(
        &self,
        name: &str,
    ) -> Result<Arc<swin::state::Namespace>, swin::error::Error> {
        self.limiter.namespace(name)
    }

    /// The namespaces served now (status pages and metrics).
    pub fn namespaces(&self) -> Arc<Namespaces> {
        self.limiter.namespaces()
    }
}
