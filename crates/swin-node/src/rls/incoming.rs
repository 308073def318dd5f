//! The gRPC listener's connections, under the limits the HTTP listener keeps (the
//! top-level `header_timeout`, `idle_timeout` and `max_connections`): a socket that has sent nothing within
//! `header_timeout` is closed, one with no traffic for `idle_timeout` is closed, and past
//! `max_connections` a new connection closes the one quiet the longest (quiet for at least
//! a second), or is refused when every one is busy. Over TLS each handshake runs in a task
//! of its own (a client that stalls its handshake holds up no other), bounded by the
//! header timeout. HTTP/2 multiplexes calls on a connection, so "quiet" is measured on
//! the socket: bytes read or written.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::config::ConnectionLimits;

/// A connection as the reaper sees it.
#[derive(Debug)]
struct Conn {
    /// Milliseconds since the registry began, of the last byte read or written.
    last_ms: AtomicU64,
    /// Whether the client has sent a byte.
    spoke: AtomicBool,
    closed: AtomicBool,
    /// Wakes the connection's reader or writer when it is closed from outside.
    waker: AtomicWaker,
}

impl Conn {
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// Every open gRPC connection.
#[derive(Debug)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    began: Instant,
    /// How many are open, for the metrics.
    open: Arc<AtomicUsize>,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for one more: closes the connection quiet the longest when full (if it has
    /// been quiet a second); false when every connection is busy.
    fn make_room(&self, max: usize) -> bool {
        let conns = self.lock();
        if conns.len() < max {
            return true;
        }
        let now = self.now_ms();
        let quietest = conns
            .values()
            .filter(|c| !c.closed.load(Ordering::Acquire))
            .min_by_key(|c| c.last_ms.load(Ordering::Relaxed));
        match quietest {
            Some(c) if now.saturating_sub(c.last_ms.load(Ordering::Relaxed)) >= 1_000 => {
                c.close();
                true
            }
            _ => false,
        }
    }

    fn open(self: &Arc<Self>, stream: TcpStream) -> Governed<TcpStream> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            last_ms: AtomicU64::new(self.now_ms()),
            spoke: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        {
            let mut conns = self.lock();
            conns.insert(id, conn.clone());
            self.open.store(conns.len(), Ordering::Relaxed);
        }
        Governed {
            inner: stream,
            conn,
            id,
            registry: self.clone(),
        }
    }

    /// Closes what has been silent past `header_timeout` or quiet past `idle_timeout`.
    fn reap(&self, limits: &ConnectionLimits) {
        let now = self.now_ms();
        for c in self.lock().values() {
            let quiet =
                Duration::from_millis(now.saturating_sub(c.last_ms.load(Ordering::Relaxed)));
            let allowed = if c.spoke.load(Ordering::Relaxed) {
                limits.idle_timeout
            } else {
                limits.header_timeout
            };
            if quiet > allowed {
                c.close();
            }
        }
    }
}

/// A socket the registry can close: reads and writes fail once it is closed.
#[derive(Debug)]
pub struct Governed<S> {
    inner: S,
    conn: Arc<Conn>,
    id: u64,
    registry: Arc<Registry>,
}

impl<S> Governed<S> {
    fn closed(&self, cx: &mut Context<'_>) -> bool {
        self.conn.waker.register(cx.waker());
        self.conn.closed.load(Ordering::Acquire)
    }

    fn touch(&self, spoke: bool) {
        self.conn
            .last_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
        if spoke {
            self.conn.spoke.store(true, Ordering::Relaxed);
        }
    }
}

fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "closed: silent, idle or evicted",
    )
}

impl<S> Drop for Governed<S> {
    fn drop(&mut self) {
        let mut conns = self.registry.lock();
        conns.remove(&self.id);
        self.registry.open.store(conns.len(), Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Governed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.closed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch(true);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Governed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.closed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch(false);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Governed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The connections to serve until `stop`: each accepted socket governed, then made
/// ready by `ready` (the TLS handshake; none for plain gRPC) in a task of its own.
pub fn incoming<S, F, Fut>(
    listener: TcpListener,
    limits: ConnectionLimits,
    stop: CancellationToken,
    ready: F,
    open: Arc<AtomicUsize>,
) -> impl Stream<Item = Result<S, std::io::Error>>
where
    S: Send + 'static,
    F: Fn(Governed<TcpStream>) -> Fut + Send + 'static,
    Fut: Future<Output = Option<S>> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel(64);
    let registry = Arc::new(Registry {
        conns: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0),
        began: Instant::now(),
        open,
    });
    let reaper = {
        let (registry, stop) = (registry.clone(), stop.clone());
        let every = (limits.header_timeout.min(limits.idle_timeout) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        async move {
            let mut tick = tokio::time::interval(every);
            while stop.run_until_cancelled(tick.tick()).await.is_some() {
                registry.reap(&limits);
            }
        }
    };
    tokio::spawn(reaper);
    tokio::spawn(async move {
        while let Some((stream, peer)) = crate::listening::accept(&listener, &stop).await {
            if !registry.make_room(limits.max_connections) {
                tracing::debug!(%peer, "every gRPC connection busy: refused");
                continue;
            }
            let (ready, tx) = (ready(registry.open(stream)), tx.clone());
            tokio::spawn(async move {
                if let Some(s) = ready.await {
                    let _ = tx.send(Ok(s)).await;
                }
            });
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The TLS handshake of a governed socket, within `handshake`.
pub async fn handshake(
    stream: Governed<TcpStream>,
    acceptor: Arc<tokio_rustls::TlsAcceptor>,
    handshake: Duration,
) -> Option<tokio_rustls::server::TlsStream<Governed<TcpStream>>> {
    match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(cause = %e, "gRPC TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("gRPC TLS handshake timed out");
            None
        }
    }
}
