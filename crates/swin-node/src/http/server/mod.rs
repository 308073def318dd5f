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
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::config::ConnectionLimits;

mod conns;

use self::conns::{ms_since, ConnState, Conns, UNSET};

/// Marks a connection busy while a request is in flight.
struct InFlight {
    conns: Arc<Conns>,
    conn: Arc<ConnState>,
}

impl InFlight {
    fn new(conns: &Arc<Conns>, conn: &Arc<ConnState>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        conn.head_since_ms.store(UNSET, Ordering::Relaxed);
        conn.served.store(true, Ordering::Relaxed);
        InFlight {
            conns: conns.clone(),
            conn: conn.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.conns.now_ms(), Ordering::Relaxed);
        self.conn.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that counts as unread on its connection until it has all arrived
/// (or the request is done with it).
struct Tracked<B> {
    inner: B,
    conn: Option<Arc<ConnState>>,
}

impl<B: axum::body::HttpBody> Tracked<B> {
    fn new(inner: B, conn: &Arc<ConnState>, epoch: Instant) -> Self {
        if inner.is_end_stream() {
            return Tracked { inner, conn: None };
        }
        conn.unread.fetch_add(1, Ordering::Relaxed);
        conn.body_since_ms
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

/// A connection's socket, noting when a request head starts to arrive on it.
struct Watched<I> {
    io: I,
    conn: Arc<ConnState>,
    epoch: Instant,
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before
            && self.conn.busy.load(Ordering::Relaxed) == 0
            && self.conn.head_since_ms.load(Ordering::Relaxed) == UNSET
        {
            let now = ms_since(self.epoch) + 1;
            self.conn.head_since_ms.store(now, Ordering::Relaxed);
        }
        polled
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// One accepted connection and what serving it needs.
struct Connection {
    conns: Arc<Conns>,
    id: u64,
    state: Arc<ConnState>,
    peer: std::net::SocketAddr,
    shutdown: CancellationToken,
    builder: Arc<Builder<TokioExecutor>>,
    app: Router,
}

impl Connection {
    /// Serves requests on `io` until the client leaves, the connection is closed (idle,
    /// or making room) or the node shuts down (requests in flight finish first).
    async fn serve<I>(self, io: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            conns,
            id,
            state,
            peer,
            shutdown,
            builder,
            app,
        } = self;
        let close = state.close.clone();
        let service = {
            let conns = conns.clone();
            let state = state.clone();
            tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let in_flight = InFlight::new(&conns, &state);
                let epoch = conns.epoch;
                let mut req = req.map(|b| axum::body::Body::new(Tracked::new(b, &state, epoch)));
                req.extensions_mut().insert(ConnectInfo(peer));
                async move {
                    let resp = tower::ServiceExt::oneshot(app, req).await;
                    drop(in_flight);
                    resp
                }
            })
        };
        let io = Watched {
            io,
            conn: state.clone(),
            epoch: conns.epoch,
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
        conns.closed(id);
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
    let conns = Arc::new(Conns::new(open));
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // the reaper, not hyper, times request heads (see the module's note)
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    let builder = Arc::new(builder);
    let reaper = spawn_reaper(conns.clone(), stop.clone(), limits);
    while let Some((stream, peer)) = crate::listening::accept(&listener, &stop).await {
        if !conns.make_room(limits.max_connections) {
            debug!(%peer, open = conns.len(), "every connection busy: refused");
            drop(stream);
            continue;
        }
        let (id, state) = conns.open();
        let conn = Connection {
            conns: conns.clone(),
            id,
            state,
            peer,
            shutdown: shutdown.clone(),
            builder: builder.clone(),
            app: router.clone(),
        };
        match &tls {
            None => drop(tasks.spawn(conn.serve(stream))),
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

/// Closes the connections past their timeouts, checking a few times per shortest one.
fn spawn_reaper(
    conns: Arc<Conns>,
    stop: CancellationToken,
    limits: ConnectionLimits,
) -> tokio::task::JoinHandle<()> {
    let shortest = limits
        .header_timeout
        .min(limits.idle_timeout)
        .min(limits.body_timeout);
    let every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            conns.reap(&limits);
        }
    })
}

/// Serves `conn` over TLS once its handshake is done; the handshake counts against the
/// header timeout.
async fn over_tls(
    conn: Connection,
    stream: tokio::net::TcpStream,
    acceptor: Arc<tokio_rustls::TlsAcceptor>,
    handshake: Duration,
) {
    let peer = conn.peer;
    match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => conn.serve(stream).await,
        Ok(Err(e)) => {
            debug!(%peer, cause = %e, "TLS handshake failed");
            conn.conns.closed(conn.id);
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            conn.conns.closed(conn.id);
        }
    }
}
