//! The gRPC listener's connections over TLS: accepted here, each handshake in a task of its
//! own (a client that stalls its handshake holds up no other), bounded by the header
//! timeout, and handed to tonic when done. A failed or timed-out handshake closes that
//! socket only.

use std::time::Duration;

use futures_util::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::tls::Acceptor;

/// The connections whose handshakes completed, until `stop`.
pub fn incoming(
    listener: TcpListener,
    tls: Acceptor,
    handshake: Duration,
    stop: CancellationToken,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, mut rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((stream, peer)) = crate::listening::accept(&listener, &stop).await {
            let (acceptor, tx) = (tls.current(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => {
                        let _ = tx.send(Ok(s)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, cause = %e, "gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                }
            });
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
