//! Accepting connections, as both listeners do: a failed accept (out of file descriptors,
//! a peer that gave up) is logged and retried after a pause, never the end of a listener.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

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
