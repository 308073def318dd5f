//! What every request of the daemon shares: the limiter (its namespaces swapped whole
//! on a reload, read without a lock), the metrics, and each door's limits and access.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::AuthConfig;
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
}

impl AppState {
    /// The state of a node started from `config`: its limiter, recording what it decides
    /// to the node's metrics, and the request limits and access of `config`.
    pub async fn start(
        config: &crate::config::Config,
    ) -> Result<Self, swin::limiter::LimiterError> {
        let metrics = Arc::new(Metrics::default());
        let limiter =
            Arc::new(Limiter::start_recording(config.limiter().clone(), metrics.clone()).await?);
        let state = AppState {
            limiter,
            metrics,
            body_limit: config.body_limit,
            body_timeout: config.connections.body_timeout,
            max_batch: config.max_batch,
            auth: ArcSwapOption::empty(),
            trusted_proxies: ArcSwap::from_pointee(Vec::new()),
        };
        state.set_access(config);
        Ok(state)
    }

    /// Who may call what, from `config`: its tokens and its trusted proxies (at start
    /// and on every reload).
    pub fn set_access(&self, config: &crate::config::Config) {
        self.auth.store(config.auth.clone().map(Arc::new));
        self.trusted_proxies
            .store(Arc::new(config.trusted_proxies.clone()));
    }

    /// Nothing when it serves a namespace `name` now, else the error naming it.
    pub(crate) fn served(&self, name: &str) -> Result<(), swin::error::Error> {
        self.limiter.serves(name)
    }
}
