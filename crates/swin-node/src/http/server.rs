//! Serving connections so that no client starves the others: a header timeout (hyper's),
//! an idle timeout and a cap on open connections, enforced here. At the cap a new
//! connection closes the one that has been idle (no request in flight) the longest: a
//! flood of silent sockets cannot keep a real client out, and the node keeps serving the
//! connections that work. Only when every connection has a request in flight is a new one
//! refused. (`axum::serve` has none of these knobs.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// One open connection, as the cap and the idle timeout see it.
#[derive(Debug)]
struct Conn {
    /// Requests in flight.
    busy: usize,
    /// Accepted, or the end of its last request.
    idle_since: Instant,
    /// Closes it at once.
    close: CancellationToken,
}

/// The open connections.
#[derive(Debug, Default)]
struct Conns {
    map: Mutex<HashMap<u64, Conn>>,
    next: AtomicU64,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes room for one more under `max`: closes the connection idle the longest.
    /// False when every connection has a request in flight.
    fn make_room(&self, max: usize) -> bool {
        let map = self.lock();
        if map.len() < max {
            return true;
        }
        let idlest = map
            .values()
            .filter(|c| c.busy == 0 && !c.close.is_cancelled())
            .min_by_key(|c| c.idle_since);
        match idlest {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    fn open(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        let conn = Conn {
            busy: 0,
            idle_since: Instant::now(),
            close: close.clone(),
        };
        self.lock().insert(id, conn);
        (id, close)
    }

    fn begin(&self, id: u64) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.busy += 1;
        }
    }

    fn end(&self, id: u64) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.busy = c.busy.saturating_sub(1);
            c.idle_since = Instant::now();
        }
    }

    fn closed(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the connections idle for longer than `idle`.
    fn reap(&self, idle: Duration) {
        let now = Instant::now();
        for c in self.lock().values() {
            if c.busy == 0 && now.duration_since(c.idle_since) > idle {
                c.close.cancel();
            }
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Marks a connection busy while a request is in flight.
struct InFlight {
    conns: Arc<Conns>,
    id: u64,
}

impl InFlight {
    fn new(conns: &Arc<Conns>, id: u64) -> Self {
        conns.begin(id);
        InFlight {
            conns: conns.clone(),
            id,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conns.end(self.id);
    }
}

/// One accepted connection and what serving it needs.
struct Connection {
    conns: Arc<Conns>,
    id: u64,
    peer: std::net::SocketAddr,
    close: CancellationToken,
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
            peer,
            close,
            shutdown,
            builder,
            app,
        } = self;
        let service = {
            let conns = conns.clone();
            tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let in_flight = InFlight::new(&conns, id);
                let mut req = req.map(axum::body::Body::new);
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
) {
    let conns = Arc::new(Conns::default());
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let builder = Arc::new(builder);
    let reaper = {
        let (conns, stop) = (conns.clone(), stop.clone());
        let every =
            (limits.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            while stop.run_until_cancelled(tick.tick()).await.is_some() {
                conns.reap(limits.idle_timeout);
            }
        })
    };
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // out of file descriptors, or the peer gave up: keep accepting
                    warn!(cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if !conns.make_room(limits.max_connections) {
            debug!(%peer, open = conns.len(), "every connection busy: refused");
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let (id, close) = conns.open();
        let conn = Connection {
            conns: conns.clone(),
            id,
            peer,
            close,
            shutdown: shutdown.clone(),
            builder: builder.clone(),
            app: router.clone(),
        };
        match &tls {
            None => drop(tasks.spawn(conn.serve(stream))),
            Some(tls) => {
                let acceptor = tls.current();
                let handshake = limits.header_timeout;
                tasks.spawn(async move {
                    // the handshake counts against the header timeout
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
                });
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
