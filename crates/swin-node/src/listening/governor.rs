//! The connection governor both listeners share: the table of open connections, the
//! cap (`max_connections`), the reaper that enforces the timeouts, and the socket
//! wrapper through which it sees traffic and closes a connection. What counts as quiet,
//! expired or evictable is the connection's own ([`Watch`]: an HTTP/1 request's phases,
//! or an HTTP/2 socket's bytes, in `conns.rs`); the table, the cap and the reaper are
//! one code for both.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::config::ConnectionLimits;

/// How a connection's state answers the governor. Times are milliseconds after the
/// governor's epoch.
pub trait Watch: Send + Sync + 'static {
    /// The state of a connection accepted at `now`.
    fn accepted(now: u64) -> Self;
    /// Bytes arrived from the client; `now` reads the time (only when it is needed: this
    /// runs on every read).
    fn heard(&self, now: impl FnOnce() -> u64);
    /// Bytes went out to the client; `now` as for [`Watch::heard`].
    fn said(&self, now: impl FnOnce() -> u64);
    /// Whether its time is up at `now`.
    fn expired(&self, now: u64, limits: &ConnectionLimits) -> bool;
    /// At the cap, whether it may be closed to make room, and its rank if so (the
    /// lowest goes first).
    fn evictable(&self, now: u64) -> Option<(bool, u64)>;
    /// How it is closed.
    fn closer(&self) -> &Closer;
}

/// Closes a connection from outside: its serving task's token is cancelled and its
/// socket fails every read and write from then on.
#[derive(Debug, Default)]
pub struct Closer {
    token: CancellationToken,
    /// Set once (read without the token's lock when scanning thousands).
    closed: AtomicBool,
    /// Wakes the socket's reader or writer when it is closed.
    waker: AtomicWaker,
}

impl Closer {
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.token.cancel();
            self.waker.wake();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// A token cancelled when the connection is closed.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

/// The open connections of one listener. The map is locked when a connection opens or
/// closes, when the cap is reached, and once per reaper tick — not per request.
#[derive(Debug)]
pub struct Governor<C> {
    map: Mutex<HashMap<u64, Arc<C>>>,
    next: AtomicU64,
    epoch: Instant,
    limits: ConnectionLimits,
    /// How many are open, for the metrics.
    open: Arc<AtomicUsize>,
}

impl<C: Watch> Governor<C> {
    pub fn new(limits: ConnectionLimits, open: Arc<AtomicUsize>) -> Arc<Self> {
        Arc::new(Governor {
            map: Mutex::default(),
            next: AtomicU64::new(0),
            epoch: Instant::now(),
            limits,
            open,
        })
    }

    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    pub fn now_ms(&self) -> u64 {
        ms_since(self.epoch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<C>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Makes room for one more under `max_connections` by closing the connection that
    /// ranks first of those that may be closed; false when none may.
    pub fn make_room(&self) -> bool {
        let map = self.lock();
        if map.len() < self.limits.max_connections {
            return true;
        }
        let now = self.now_ms();
        let victim = map
            .values()
            .filter(|c| !c.closer().is_closed())
            .filter_map(|c| c.evictable(now).map(|rank| (rank, c)))
            .min_by_key(|(rank, _)| *rank);
        match victim {
            Some((_, c)) => {
                c.closer().close();
                true
            }
            None => false,
        }
    }

    /// Takes `socket` under the governor: counted until the returned socket is dropped.
    pub fn admit<S>(self: &Arc<Self>, socket: S) -> Governed<S, C> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(C::accepted(self.now_ms()));
        {
            let mut map = self.lock();
            map.insert(id, conn.clone());
            self.open.store(map.len(), Ordering::Relaxed);
        }
        Governed {
            inner: socket,
            conn,
            id,
            governor: self.clone(),
        }
    }

    fn forget(&self, id: u64) {
        let mut map = self.lock();
        map.remove(&id);
        self.open.store(map.len(), Ordering::Relaxed);
    }

    /// Closes the connections whose time is up.
    pub fn reap(&self) {
        let now = self.now_ms();
        for c in self.lock().values() {
            if c.expired(now, &self.limits) {
                c.closer().close();
            }
        }
    }

    /// Reaps until `stop`, a few times per shortest timeout.
    pub fn spawn_reaper(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let l = &self.limits;
        let shortest = l.header_timeout.min(l.idle_timeout).min(l.body_timeout);
        let every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            while stop.run_until_cancelled(tick.tick()).await.is_some() {
                this.reap();
            }
        })
    }
}

pub fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A socket under the governor: its traffic is noted on its connection, and once the
/// connection is closed every read and write fails.
#[derive(Debug)]
pub struct Governed<S, C: Watch> {
    inner: S,
    conn: Arc<C>,
    id: u64,
    governor: Arc<Governor<C>>,
}

impl<S, C: Watch> Governed<S, C> {
    /// The connection's state.
    pub fn conn(&self) -> &Arc<C> {
        &self.conn
    }

    fn closed(&self, cx: &mut Context<'_>) -> bool {
        let closer = self.conn.closer();
        closer.waker.register(cx.waker());
        closer.is_closed()
    }
}

fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "closed: silent, idle or evicted",
    )
}

impl<S, C: Watch> Drop for Governed<S, C> {
    fn drop(&mut self) {
        self.governor.forget(self.id);
    }
}

impl<S: AsyncRead + Unpin, C: Watch> AsyncRead for Governed<S, C> {
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
            self.conn.heard(|| self.governor.now_ms());
        }
        r
    }
}

impl<S: AsyncWrite + Unpin, C: Watch> AsyncWrite for Governed<S, C> {
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
            self.conn.said(|| self.governor.now_ms());
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.closed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.said(|| self.governor.now_ms());
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected, C: Watch> tonic::transport::server::Connected
    for Governed<S, C>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
