//! The listeners' connections, one code for both (HTTP and gRPC): accepting (a failed
//! accept — out of file descriptors, a peer that gave up — is logged and retried after a
//! pause, never the end of a listener), the governor that enforces `max_connections` and
//! the timeouts ([`governor`], with what each protocol's connections count as quiet in
//! [`conns`]), and the TLS handshake, each in a task of its own (a client that stalls
//! its handshake holds up no other) within the header timeout.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::ConnectionLimits;

pub mod conns;
pub mod governor;

use self::conns::GrpcConn;
use self::governor::{Governed, Governor};

/// The next connection, with `TCP_NODELAY` set (Nagle's algorithm held single answers
/// back 40 ms behind a delayed ACK); `None` once `stop` is cancelled.
pub async fn accept(
    listener: &TcpListener,
    stop: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((stream, peer));
                }
                Err(e) => {
                    tracing::warn!(listener = ?listener.local_addr().ok(), cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// `stream`'s TLS handshake, within `within`; `None` (logged) when it fails or stalls.
pub async fn handshake<S>(
    stream: S,
    acceptor: Arc<tokio_rustls::TlsAcceptor>,
    within: Duration,
    door: &'static str,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(door, cause = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(door, "TLS handshake timed out");
            None
        }
    }
}

/// The gRPC listener's connections to serve until `stop`, as a stream for tonic: each
/// accepted socket governed, then made ready by `ready` (the TLS handshake; none for
/// plain gRPC) in a task of its own.
pub fn incoming<S, F, Fut>(
    listener: TcpListener,
    limits: ConnectionLimits,
    stop: CancellationToken,
    ready: F,
    open: Arc<AtomicUsize>,
) -> impl Stream<Item = Result<S, std::io::Error>>
where
    S: Send + 'static,
    F: Fn(Governed<TcpStream, GrpcConn>) -> Fut + Send + 'static,
    Fut: Future<Output = Option<S>> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel(64);
    let governor = Governor::<GrpcConn>::new(limits, open);
    governor.spawn_reaper(stop.clone());
    tokio::spawn(async move {
        while let Some((stream, peer)) = accept(&listener, &stop).await {
            if !governor.make_room() {
                tracing::debug!(%peer, "every gRPC connection busy: refused");
                continue;
            }
            let (ready, tx) = (ready(governor.admit(stream)), tx.clone());
            tokio::spawn(async move {
                if let Some(s) = ready.await {
                    let _ = tx.send(Ok(s)).await;
                }
            });
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
