//! TCP proxies between a node and its store: one that delays every chunk (added
//! latency), one that can hold every byte (a store that stops answering).

use std::time::Duration;

/// A TCP proxy that holds every chunk for `delay` before passing it on, both ways: a
/// store connection with that much added latency.
#[derive(Debug)]
pub struct DelayProxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    pub async fn start(target: String, delay: Duration) -> DelayProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    // the delay is added once per round trip: on the way to the store
                    tokio::join!(pipe(ri, wo, delay), pipe(ro, wi, Duration::ZERO));
                });
            }
        });
        DelayProxy { port, task }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards bytes from `from` to `to`, each chunk `delay` after it arrived (latency,
/// not a throughput cap: chunks in flight are not delayed one after another).
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// A TCP proxy to a store that can be held: while held, no byte passes either way and
/// the sockets stay open (a node cut off from its store, its calls hanging until their
/// timeout); released, what was held goes on in order.
#[derive(Debug)]
pub struct HoldProxy {
    pub port: u16,
    held: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl HoldProxy {
    pub async fn start(target: String) -> HoldProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (held, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let target = target.clone();
                let watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::join!(held_pipe(ri, wo, watch.clone()), held_pipe(ro, wi, watch));
                });
            }
        });
        HoldProxy { port, held, task }
    }

    /// Holds every byte from now on.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets bytes pass again, the held ones first.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// `url` (a store's, `scheme://[user@]host:port/…`) through this proxy.
    pub fn url_for(&self, url: &str) -> String {
        let start = url.find("://").map_or(0, |i| i + 3);
        let start = url[start..].find('@').map_or(start, |i| start + i + 1);
        let end = url[start..].find('/').map_or(url.len(), |i| start + i);
        format!("{}127.0.0.1:{}{}", &url[..start], self.port, &url[end..])
    }

    /// The host and port `url` points at (the proxy's target).
    pub fn target_of(url: &str) -> String {
        let start = url.find("://").map_or(0, |i| i + 3);
        let start = url[start..].find('@').map_or(start, |i| start + i + 1);
        let end = url[start..].find('/').map_or(url.len(), |i| start + i);
        url[start..end].to_owned()
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards bytes from `from` to `to`, waiting while `held`.
async fn held_pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if held.wait_for(|h| !*h).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
