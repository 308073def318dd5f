//! Serving connections so that no client starves the others: a header timeout (hyper's),
//! an idle timeout and a cap on open connections, enforced here. At the cap a new
//! connection closes the one that has been idle (no request in flight) the longest: a
//! flood of silent sockets cannot keep a real client out, and the node keeps serving the
//! connections that work. Only when every connection has a request in flight is a new one
//! refused. (`axum::serve` has none of these knobs.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// One open connection, as the cap and the idle timeout see it. A request changes only
/// its own connection's atomics: no lock every request takes.
#[derive(Debug)]
struct ConnState {
    /// Requests in flight.
    busy: AtomicUsize,
    /// Milliseconds after [`Conns::epoch`] it was accepted, or its last request ended.
    idle_since_ms: AtomicU64,
    /// Closes it at once.
    close: CancellationToken,
    /// `close` was cancelled (read without the token's lock when scanning thousands).
    closing: AtomicBool,
}

impl ConnState {
    fn close(&self) {
        if !self.closing.swap(true, Ordering::Relaxed) {
            self.close.cancel();
        }
    }
}

/// The open connections. The map is locked when a connection opens or closes, when
/// the cap is reached, and once per reaper tick — not per request.
#[derive(Debug)]
struct Conns {
    map: Mutex<HashMap<u64, Arc<ConnState>>>,
    next: AtomicU64,
    epoch: Instant,
}

impl Conns {
    fn new() -> Self {
        Conns {
            map: Mutex::default(),
            next: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
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
            .filter(|c| c.busy.load(Ordering::Relaxed) == 0 && !c.closing.load(Ordering::Relaxed))
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Relaxed));
        match idlest {
            Some(c) => {
                c.close();
                true
            }
            None => false,
        }
    }

    fn open(&self) -> (u64, Arc<ConnState>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            close: CancellationToken::new(),
            closing: AtomicBool::new(false),
        });
        self.lock().insert(id, conn.clone());
        (id, conn)
    }

    fn closed(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the connections idle for longer than `idle`.
    fn reap(&self, idle: Duration) {
        let cutoff = self
            .now_ms()
            .saturating_sub(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX));
        for c in self.lock().values() {
            if c.busy.load(Ordering::Relaxed) == 0
                && c.idle_since_ms.load(Ordering::Relaxed) < cutoff
            {
                c.close();
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
    conn: Arc<ConnState>,
}

impl InFlight {
    fn new(conns: &Arc<Conns>, conn: &Arc<ConnState>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
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
            tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let in_flight = InFlight::new(&conns, &state);
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
    let conns = Arc::new(Conns::new());
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
