//! A relay between a node and its store that loses replies on demand: each connection
//! is forwarded byte for byte, and once armed, the next request whose bytes hold every
//! one of a set of patterns (a script's argument, a statement's text) reaches the store
//! — the store applies it — while its reply never reaches the node: the relay drops what
//! the store answers and cuts the connection, as a network that fails at the wrong
//! moment does. A transaction's change is applied by its `COMMIT`, so the reply lost
//! can also be the one to the next request holding other patterns on the same
//! connection ([`Relay::lose_reply_after`]: a statement, then its transaction's
//! `COMMIT`). It speaks no protocol, so it serves Redis and PostgreSQL alike; it can
//! also refuse every connection for a while (`cut`), and hold the store's replies back
//! for a while before passing them on (`delay_replies`: the store applied the request
//! at once, its answer comes late).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay listening on a port of its own (see the module's note). Dropping it stops
/// the relay and cuts its connections.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

/// Patterns every one of which a request's bytes hold.
type Patterns = Vec<Vec<u8>>;

/// One request to lose the reply of: the patterns of the request, or of a request
/// before it on its connection and then its own.
#[derive(Debug)]
struct Armed {
    first: Patterns,
    then: Option<Patterns>,
    /// How many requests it is armed for (the same patterns armed again count here, so
    /// that each request is matched against each distinct arming once).
    times: usize,
}

fn holds(request: &[u8], patterns: &Patterns) -> bool {
    patterns
        .iter()
        .all(|p| request.windows(p.len()).any(|w| w == p.as_slice()))
}

#[derive(Debug, Default)]
struct State {
    /// Requests still to lose the reply of.
    armed: Mutex<Vec<Armed>>,
    /// Replies lost so far.
    lost: AtomicUsize,
    /// While set, new connections are refused and open ones cut.
    cut: AtomicBool,
    /// Bumped by every cut: a connection opened before it ends.
    epoch: AtomicUsize,
    /// Milliseconds each reply is held before it is passed on.
    delay_ms: AtomicU64,
    /// Set: the next reply lost also cuts the relay (until `heal`).
    cut_on_loss: AtomicBool,
    /// Requests whose reply is held back a while (patterns, milliseconds), each once.
    slow: Mutex<Vec<(Patterns, u64)>>,
}

impl State {
    /// What `request` arms (it then is no longer armed for other connections): `None`,
    /// nothing; `Some(None)`, its own reply is lost; `Some(Some(then))`, the reply to the
    /// next request on its connection that holds `then`.
    fn takes(&self, request: &[u8]) -> Option<Option<Patterns>> {
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        let i = armed.iter().position(|a| holds(request, &a.first))?;
        if armed[i].times > 1 {
            armed[i].times -= 1;
            return Some(armed[i].then.clone());
        }
        Some(armed.remove(i).then)
    }

    /// How long the reply to `request` is held back, if it was armed to be.
    fn slows(&self, request: &[u8]) -> Option<u64> {
        let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        let i = slow.iter().position(|(p, _)| holds(request, p))?;
        Some(slow.remove(i).1)
    }
}

/// A listener on a free local port: another process may take the port `free_port`
/// found between its check and this bind (it did, once, in CI), so a port taken is
/// passed over for another.
async fn bind_free() -> TcpListener {
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(("127.0.0.1", crate::free_port())).await {
            Ok(l) => return l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => panic!("bind the relay: {e}"),
        }
    }
    panic!("bind the relay: every port tried was taken ({last:?})")
}

impl Relay {
    /// A relay to `upstream` (a store's `host:port`) on a free local port.
    pub async fn start(upstream: SocketAddr) -> Relay {
        let listener = bind_free().await;
        let addr = listener.local_addr().expect("the relay's address");
        let state = Arc::new(State::default());
        let s = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if s.cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, upstream, s.clone()));
            }
        });
        Relay {
            addr,
            upstream,
            state,
            task,
        }
    }

    /// A relay to the store at `url` (`redis://host:port…`, `postgres://…@host:port/…`).
    pub async fn to_url(url: &str) -> Relay {
        Relay::start(host_port(url)).await
    }

    /// Where the node connects: the relay's own address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` replaced by the relay's.
    pub fn url_for(&self, url: &str) -> String {
        let upstream = self.upstream.to_string();
        let host = upstream.replace("127.0.0.1", "localhost");
        url.replacen(&upstream, &self.addr.to_string(), 1).replacen(
            &host,
            &self.addr.to_string(),
            1,
        )
    }

    /// The next request holding every one of `patterns` is applied by the store and its
    /// reply lost (armed once per call; several calls arm several requests).
    pub fn lose_reply_to(&self, patterns: &[&[u8]]) {
        self.arm(patterns, None);
    }

    /// The first request holding every one of `first` goes through; the reply to the
    /// next request on its connection holding every one of `then` (its transaction's
    /// `COMMIT`) is lost, that request applied.
    pub fn lose_reply_after(&self, first: &[&[u8]], then: &[&[u8]]) {
        self.arm(first, Some(then));
    }

    fn arm(&self, first: &[&[u8]], then: Option<&[&[u8]]>) {
        let owned = |ps: &[&[u8]]| -> Patterns { ps.iter().map(|p| p.to_vec()).collect() };
        let (first, then) = (owned(first), then.map(owned));
        let mut armed = self.state.armed.lock().unwrap_or_else(|p| p.into_inner());
        match armed.last_mut() {
            Some(last) if last.first == first && last.then == then => last.times += 1,
            _ => armed.push(Armed {
                first,
                then,
                times: 1,
            }),
        }
    }

    /// Disarms what [`Relay::lose_reply_to`] armed and no request matched yet.
    pub fn disarm(&self) {
        self.state
            .armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// How many replies were lost so far.
    pub fn lost(&self) -> usize {
        self.state.lost.load(Ordering::SeqCst)
    }

    /// Whether requests armed are still waiting for a match.
    pub fn armed(&self) -> usize {
        let armed = self.state.armed.lock().unwrap_or_else(|p| p.into_inner());
        armed.iter().map(|a| a.times).sum()
    }

    /// Cuts every open connection and refuses new ones until [`Relay::heal`].
    /// Holds each of the store's replies back `delay` before passing it on (zero: as
    /// they come); the requests reach the store at once.
    pub fn delay_replies(&self, delay: std::time::Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// The store's reply to the next request holding every one of `patterns` is held
    /// back `delay` (the store applied it at once; its answer comes late). Replies after
    /// it on that connection wait behind it, as on a slow link.
    pub fn delay_reply_to(&self, patterns: &[&[u8]], delay: std::time::Duration) {
        let owned = patterns.iter().map(|p| p.to_vec()).collect();
        let mut slow = self.state.slow.lock().unwrap_or_else(|p| p.into_inner());
        slow.push((owned, delay.as_millis() as u64));
    }

    /// With `on`, the next reply lost also cuts the relay — connections refused, open
    /// ones cut — until [`Relay::heal`]: the store applied a change and then went away
    /// for the node, longer than it waits for an answer.
    pub fn cut_on_next_loss(&self, on: bool) {
        self.state.cut_on_loss.store(on, Ordering::SeqCst);
    }

    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// `host:port` of a store URL (`localhost` taken as 127.0.0.1).
fn host_port(url: &str) -> SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hp = rest.split(['/', '?']).next().unwrap_or(rest);
    let hp = hp.replace("localhost", "127.0.0.1");
    hp.parse()
        .unwrap_or_else(|e| panic!("{url:?}: no host:port to relay to ({e})"))
}

/// What `request` was armed for: its reply lost (`doomed`), or held back (`late`, ms),
/// or a later request's on its connection (`primed`).
fn mark(
    st: &State,
    request: &[u8],
    primed: &mut Option<Patterns>,
    doomed: &AtomicBool,
    late: &AtomicU64,
) {
    if let Some(ms) = st.slows(request) {
        late.store(ms, Ordering::SeqCst);
    }
    if primed.as_ref().is_some_and(|p| holds(request, p)) {
        doomed.store(true, Ordering::SeqCst);
    } else if let Some(then) = st.takes(request) {
        match then {
            None => doomed.store(true, Ordering::SeqCst),
            Some(p) => *primed = Some(p),
        }
    }
}

/// One connection: the client's bytes to the store; the store's back, unless the last
/// request was one to lose the reply of.
async fn relay(client: TcpStream, upstream: SocketAddr, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let epoch = state.epoch.load(Ordering::SeqCst);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let doomed = Arc::new(AtomicBool::new(false));
    let d = doomed.clone();
    // milliseconds the next reply of this connection is held back (a request armed)
    let late = Arc::new(AtomicU64::new(0));
    let l = late.clone();
    let st = state.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        // patterns a request of this connection armed for a later one
        let mut primed: Option<Patterns> = None;
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let request = &buf[..n];
            if std::env::var("RELAY_DEBUG").is_ok() {
                eprintln!("relay> {:?}", String::from_utf8_lossy(request));
            }
            mark(&st, request, &mut primed, &d, &l);
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let st = state.clone();
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if doomed.load(Ordering::SeqCst) {
                // the store applied the request; the node never hears of it
                if st.cut_on_loss.swap(false, Ordering::SeqCst) {
                    st.cut.store(true, Ordering::SeqCst);
                    st.epoch.fetch_add(1, Ordering::SeqCst);
                }
                st.lost.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let delay = st.delay_ms.load(Ordering::SeqCst) + late.swap(0, Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let cut = async {
        while state.epoch.load(Ordering::SeqCst) == epoch {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut => {}
    }
}
