//! Serving connections so that no client starves the others, with the timeouts and
//! the cap on open connections enforced here (`axum::serve` has none of these knobs,
//! and hyper's header timeout starts at a connection's first byte and again right
//! after each response, so a silent socket outlived it and an idle keep-alive
//! connection did not get its `idle_timeout`):
//! - a new connection must send a whole request head within `header_timeout`, and so
//!   must a kept-alive one from its next request's first byte; a kept-alive
//!   connection may sit idle for `idle_timeout`; a body must arrive within
//!   `body_timeout` (the extractor answers 408, the reaper closes what is left);
//! - at the cap a new connection closes one that is doing nothing for anybody: the one
//!   idle the longest, else the one stuck the longest in a request it has not finished
//!   sending (head or body). Only when every connection has a whole request being
//!   answered is a new one refused.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::config::ConnectionLimits;
use crate::listening::conns::{HttpConn, UNSET};
use crate::listening::governor::{ms_since, Governed, Governor, Watch};

/// Marks a connection busy while a request is in flight.
struct InFlight {
    governor: Arc<Governor<HttpConn>>,
    conn: Arc<HttpConn>,
}

impl InFlight {
    fn new(governor: &Arc<Governor<HttpConn>>, conn: &Arc<HttpConn>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        conn.head_since.store(UNSET, Ordering::Relaxed);
        conn.served.store(true, Ordering::Relaxed);
        InFlight {
            governor: governor.clone(),
            conn: conn.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since
            .store(self.governor.now_ms(), Ordering::Relaxed);
        self.conn.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that counts as unread on its connection until it has all arrived
/// (or the request is done with it).
struct Tracked<B> {
    inner: B,
    conn: Option<Arc<HttpConn>>,
}

impl<B: axum::body::HttpBody> Tracked<B> {
    fn new(inner: B, conn: &Arc<HttpConn>, epoch: Instant) -> Self {
        if inner.is_end_stream() {
            return Tracked { inner, conn: None };
        }
        conn.unread.fetch_add(1, Ordering::Relaxed);
        conn.body_since
            .store(ms_since(epoch) + 1, Ordering::Relaxed);
        Tracked {
            inner,
            conn: Some(conn.clone()),
        }
    }

    fn arrived(&mut self) {
        if let Some(c) = self.conn.take() {
            c.unread.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.unread.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<B: axum::body::HttpBody + Unpin> axum::body::HttpBody for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.arrived(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.arrived(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One accepted connection and what serving it needs.
struct Connection {
    governor: Arc<Governor<HttpConn>>,
    peer: std::net::SocketAddr,
    shutdown: CancellationToken,
    builder: Arc<Builder<TokioExecutor>>,
    app: Router,
}

impl Connection {
    /// Serves requests on `io` until the client leaves, the connection is closed (idle,
    /// or making room) or the node shuts down (requests in flight finish first).
    async fn serve<I>(self, io: I, state: Arc<HttpConn>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            governor,
            peer,
            shutdown,
            builder,
            app,
        } = self;
        let close = state.closer().token();
        let service = {
            let governor = governor.clone();
            tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let in_flight = InFlight::new(&governor, &state);
                let epoch = governor.epoch();
                let mut req = req.map(|b| axum::body::Body::new(Tracked::new(b, &state, epoch)));
                req.extensions_mut().insert(ConnectInfo(peer));
                async move {
                    let resp = tower::ServiceExt::oneshot(app, req).await;
                    drop(in_flight);
                    resp
                }
            })
        };
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::pin!(conn);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(%peer, cause = %e, "connection ended");
                }
            }
            _ = close.cancelled() => {
                debug!(%peer, "closed: idle, or making room");
            }
            _ = shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
            }
        }
    }
}

/// Serves `router` on `listener` until `stop`, then lets the connections finish their
/// requests (at most `grace`).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<crate::tls::Acceptor>,
    stop: CancellationToken,
    grace: Duration,
    open: Arc<AtomicUsize>,
) {
    let governor = Governor::<HttpConn>::new(limits, open);
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // the reaper, not hyper, times request heads (see the module's note)
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    let builder = Arc::new(builder);
    let reaper = governor.spawn_reaper(stop.clone());
    while let Some((stream, peer)) = crate::listening::accept(&listener, &stop).await {
        if !governor.make_room() {
            debug!(%peer, open = governor.len(), "every connection busy: refused");
            drop(stream);
            continue;
        }
        let stream = governor.admit(stream);
        let conn = Connection {
            governor: governor.clone(),
            peer,
            shutdown: shutdown.clone(),
            builder: builder.clone(),
            app: router.clone(),
        };
        match &tls {
            None => {
                let state = stream.conn().clone();
                drop(tasks.spawn(conn.serve(stream, state)))
            }
            Some(tls) => {
                drop(tasks.spawn(over_tls(conn, stream, tls.current(), limits.header_timeout)))
            }
        }
    }
    drop(listener);
    reaper.abort();
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
        warn!(?grace, "requests still running after the grace period");
    }
}

/// Serves `conn` over TLS once its handshake is done; the handshake counts against the
/// header timeout.
async fn over_tls(
    conn: Connection,
    stream: Governed<TcpStream, HttpConn>,
    acceptor: Arc<tokio_rustls::TlsAcceptor>,
    within: Duration,
) {
    let state = stream.conn().clone();
    if let Some(stream) = crate::listening::handshake(stream, acceptor, within, "http").await {
        conn.serve(stream, state).await;
    }
}
