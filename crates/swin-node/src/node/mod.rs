//! Running a node: the limiter (stores, namespaces, engines) behind the HTTP and gRPC
//! listeners, reloaded from its file on SIGHUP, stopped with a last push on SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use swin::Limiter;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use swin::limiter::{migrate_all, open_store};

use crate::config::Config;
use crate::http::router;
use crate::state::AppState;

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

/// A running daemon: its config, its limiter, what every request shares, and its TLS.
#[derive(Debug)]
pub struct Daemon {
    pub state: Arc<AppState>,
    /// The config it runs (the one last reloaded).
    config: Config,
    limiter: Arc<Limiter>,
    /// HTTPS, when the config has `[tls]`; its files are read again on SIGHUP.
    tls: Option<crate::tls::Acceptor>,
}

impl Daemon {
    pub async fn start(config: Config) -> anyhow::Result<Daemon> {
        let tls = match &config.tls {
            Some(cfg) => Some(crate::tls::Acceptor::load(cfg)?),
            None => None,
        };
        if config.auth.is_none() && !config.listen.ip().is_loopback() {
            warn!(listen = %config.listen, "no [auth] section: anyone who reaches this address can reset keys, sync and read metrics; add [auth] tokens or listen on loopback");
        }
        let state = Arc::new(AppState::start(&config).await?);
        Ok(Daemon {
            limiter: state.limiter.clone(),
            state,
            config,
            tls,
        })
    }

    fn config(&self) -> &Config {
        &self.config
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
        let running = self.config();
        if config.listen != running.listen {
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
        if config.connections != running.connections
            || config.body_limit != running.body_limit
            || config.max_batch != running.max_batch
        {
            warn!("connection limits, timeouts, body_limit and max_batch changes need a restart");
        }
        let tokens_changed = config.auth != running.auth;
        if let Err(e) = self.limiter.reconfigure(config.limiter().clone()).await {
            error!(cause = %format!("{e:#}"), "reload rejected; keeping the running config");
            return;
        }
        if tokens_changed {
            info!(
                tokens = config.auth.as_ref().map_or(0, |a| a.tokens.len()),
                "tokens reloaded"
            );
        }
        self.state.set_access(&config);
        self.config = config;
        info!(namespaces = self.limiter.status().len(), "config reloaded");
    }

    /// Stops the limiter: a last push, and what the stores do not confirm is spooled.
    pub async fn shutdown_engines(self) -> anyhow::Result<()> {
        Ok(self.limiter.stop().await?)
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
        let grace = self.config().limiter().shutdown_grace();
        let server = tokio::spawn(crate::http::server::serve(
            listener,
            router,
            self.config().connections,
            self.tls.clone(),
            stop.clone(),
            grace,
            self.state.metrics.http_connections.clone(),
        ));
        let grpc = match self.config().grpc_listen {
            Some(a) => {
                let l = tokio::net::TcpListener::bind(a)
                    .await
                    .with_context(|| format!("grpc_listen {a}"))?;
                Some(tokio::spawn(crate::rls::serve(
                    l,
                    self.state.clone(),
                    self.tls.clone(),
                    self.config().connections,
                    stop.clone(),
                )))
            }
            None => None,
        };
        info!(listen = %addr, namespaces = self.limiter.status().len(), "swin-node ready");
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
        Ok(self.limiter.stop().await?)
    }
}
