//! Where the Redis store's calls go: one server, or the primaries of a Redis Cluster.
//!
//! Every call names its key's slot; [`Servers::run`] sends the calls of each server in
//! one pipeline, to all servers at once, and answers one value per call, in order.
//!
//! For a cluster this is a router of its own rather than redis-rs's cluster client.
//! That client (0.32, and its 1.x line likewise) sends a pipeline only when every command
//! in it is in one slot, so a push of 100,000 keys spread over 16,384 slots would be
//! some 16,000 pipelines instead of one per shard; it cannot put `WAIT` behind a shard's
//! writes on the connection that made them; and 0.32 does not follow READONLY after a
//! failover. Here each shard gets one pipeline per call of the store, sent concurrently,
//! over redis-rs's reconnecting multiplexed connection (its timeouts and retries set
//! explicitly, as for one server); the router adds only what a cluster needs:
//!
//! * the slot map, from `CLUSTER SLOTS` of any node it knows (seeds first), refreshed
//!   after a redirect or a lost connection;
//! * answers that say a call did not run — MOVED (sent again where it points), ASK
//!   (sent there after `ASKING`), TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN, READONLY
//!   (sent again after a short pause and a fresh map), NOSCRIPT (scripts loaded on that
//!   server, sent again) — are retried here, a few times;
//! * a lost connection or a timeout, where a call may or may not have run, is returned
//!   as the error it is: the engine retries the whole push under the same sequence
//!   number, and the records the scripts keep make that exactly once.
//!
//! With `wait_replicas = n`, each shard's pipeline of writes ends with `WAIT n`: the
//! call succeeds only when n replicas acknowledged every write before it. A push a
//! primary took but no replica saw fails, so the node keeps its diffs and pushes them
//! again (the replica promoted in its place skips what did reach it).
//!
//! What a call is (a script invocation or a command, and its slot) is in `calls.rs`.
//! The slot map itself (asking a cluster for it, and for it again) is in `slots.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, Value};

mod slots;

use super::calls::{Call, Scripts};
use crate::StoreError;

/// Sends of one call that were answered "did not run" before giving up on it.
const MAX_REDIRECTS: u32 = 6;

/// How long `WAIT` waits for the replicas before answering with the count it has.
const WAIT_TIMEOUT_MS: u64 = 1_000;

/// One server and the reconnecting connection to it (made on first use, so a node
/// starts while the server is down).
pub(super) struct Server {
    client: redis::Client,
    conn: tokio::sync::OnceCell<ConnectionManager>,
    /// The scripts are in this server's cache; cleared when it answers NOSCRIPT (it
    /// restarted, failed over, or its cache was flushed).
    scripts_loaded: AtomicBool,
}

impl Server {
    fn new(client: redis::Client) -> Server {
        Server {
            client,
            conn: Default::default(),
            scripts_loaded: AtomicBool::new(false),
        }
    }

    /// The connection: 2 s to connect, 5 s for an answer, one reconnection attempt per
    /// failed request (redis-rs's defaults retry with growing sleeps and never time a
    /// request out); the store's caller bounds the whole call besides.
    pub(super) async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        let manager = self
            .conn
            .get_or_try_init(|| {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(Duration::from_secs(5))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await?;
        Ok(manager.clone())
    }

    /// Sends a pipeline and answers every command's reply, errors included (the
    /// caller tells which did not run).
    async fn send(
        &self,
        scripts: &Scripts,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conn().await?;
        if !self.scripts_loaded.load(Ordering::Acquire) {
            // one round trip for all of them: a call cut short by the caller's timeout
            // would start the loads over, and one load per round trip to a distant
            // server could outlast that timeout every time
            let mut load = redis::pipe();
            for source in scripts.sources {
                load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
            }
            load.query_async::<()>(&mut conn).await?;
            self.scripts_loaded.store(true, Ordering::Release);
        }
        Ok(conn.req_packed_commands(pipe, 0, pipe.len()).await?)
    }
}

/// Slot → primary, as `CLUSTER SLOTS` answered.
struct Topology {
    primaries: Vec<Arc<Server>>,
    /// The primary's index in `primaries`, for each of the 16,384 slots (`u16::MAX`:
    /// no primary serves it).
    slots: Vec<u16>,
}

/// A Redis Cluster, as this store sees it.
pub(super) struct Cluster {
    /// Where to ask for the slot map when no known node answers.
    seeds: Vec<(String, u16)>,
    /// What every connection shares but its address: TLS, user, password.
    template: ConnectionInfo,
    root_cert: Option<Vec<u8>>,
    wait_replicas: u32,
    topology: std::sync::RwLock<Option<Arc<Topology>>>,
    /// Set when an answer showed the map out of date.
    stale: AtomicBool,
    refreshing: tokio::sync::Mutex<()>,
    servers: std::sync::Mutex<HashMap<(String, u16), Arc<Server>>>,
}

/// Where the store's calls go.
pub(super) enum Servers {
    One(Arc<Server>),
    Cluster(Arc<Cluster>),
}

/// Where one call is sent this time.
#[derive(Clone)]
enum Target {
    /// The primary of its slot.
    Slot,
    /// A server a MOVED named.
    Moved(Arc<Server>),
    /// A server an ASK named: `ASKING` goes first.
    Ask(Arc<Server>),
}

impl Servers {
    /// One server.
    pub(super) fn one(client: redis::Client) -> Servers {
        Servers::One(Arc::new(Server::new(client)))
    }

    /// A cluster reached through `seeds`; every connection, to a seed or to a node
    /// found from one, uses the first seed's scheme (TLS or not), user and password, and
    /// the CA in `root_cert`.
    pub(super) fn cluster(
        seeds: Vec<ConnectionInfo>,
        root_cert: Option<Vec<u8>>,
        wait_replicas: u32,
    ) -> Result<Servers, StoreError> {
        let template = seeds
            .first()
            .cloned()
            .ok_or_else(|| StoreError::Protocol("a cluster needs at least one URL".into()))?;
        let seeds = seeds
            .iter()
            .map(|s| match &s.addr {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Ok((host.clone(), *port))
                }
                ConnectionAddr::Unix(_) => Err(StoreError::Protocol(
                    "a cluster's nodes are reached over TCP, not a unix socket".into(),
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Servers::Cluster(Arc::new(Cluster {
            seeds,
            template,
            root_cert,
            wait_replicas,
            topology: Default::default(),
            stale: AtomicBool::new(true),
            refreshing: Default::default(),
            servers: Default::default(),
        })))
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Servers::Cluster(_))
    }

    /// Every server holding keys (a cluster's primaries), to walk the keyspace of each.
    pub(super) async fn primaries(&self) -> Result<Vec<Arc<Server>>, StoreError> {
        match self {
            Servers::One(s) => Ok(vec![s.clone()]),
            Servers::Cluster(c) => Ok(c.topology().await?.primaries.clone()),
        }
    }

    /// Sends the calls, each to the server of its slot, all servers at once, and
    /// answers their replies in order. An error reply the caller must see (anything
    /// but "did not run, try there") fails the whole run.
    pub(super) async fn run(
        &self,
        scripts: &Arc<Scripts>,
        calls: Vec<Call>,
    ) -> Result<Vec<Value>, StoreError> {
        let calls: Arc<Vec<Call>> = Arc::new(calls);
        let mut out: Vec<Option<Value>> = vec![None; calls.len()];
        let mut todo: Vec<(usize, Target)> = (0..calls.len()).map(|i| (i, Target::Slot)).collect();
        let mut sends = 0;
        while !todo.is_empty() {
            sends += 1;
            let groups = self.group(&calls, todo).await?;
            let wait = self.wait_replicas();
            let mut tasks = send_all(&groups, &calls, scripts, wait);
            let mut again = Vec::new();
            let mut pause = false;
            let mut last_error: Option<redis::RedisError> = None;
            while let Some(joined) = tasks.join_next().await {
                let (g, reply, waited) =
                    joined.map_err(|e| StoreError::Protocol(format!("redis task: {e}")))?;
                let (server, members) = &groups[g];
                let mut replies = match reply {
                    Ok(r) => r.into_iter(),
                    Err(e) => {
                        // a call may or may not have run: the caller retries the whole
                        // push under its sequence number; the map may be out of date
                        self.mark_stale();
                        return Err(e);
                    }
                };
                for (i, target) in members {
                    if matches!(target, Target::Ask(_)) {
                        replies.next(); // ASKING's OK
                    }
                    let reply = replies
                        .next()
                        .ok_or_else(|| StoreError::Protocol("a pipeline came back short".into()))?;
                    let Value::ServerError(e) = reply else {
                        out[*i] = Some(reply);
                        continue;
                    };
                    let e = redis::RedisError::from(e);
                    let (retry, wait_first) = self.retry_of(&e, *i, target, server);
                    pause |= wait_first;
                    match retry {
                        Some(r) => {
                            again.push(r);
                            last_error = Some(e);
                        }
                        None => return Err(e.into()),
                    }
                }
                if waited {
                    replicated(replies.next(), wait)?;
                }
            }
            if !again.is_empty() && sends > MAX_REDIRECTS {
                return Err(last_error
                    .map(StoreError::from)
                    .unwrap_or_else(|| StoreError::Protocol("redirected too often".into())));
            }
            if pause {
                tokio::time::sleep(Duration::from_millis(20 << sends.min(4))).await;
            }
            todo = again;
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| StoreError::Protocol("a call got no reply".into())))
            .collect()
    }

    /// Replicas a write must reach before it counts (a Redis Cluster's `wait_replicas`).
    fn wait_replicas(&self) -> u32 {
        match self {
            Servers::Cluster(c) => c.wait_replicas,
            Servers::One(_) => 0,
        }
    }

    /// Where call `i`, answered error `e` by `server`, goes again (none: the error is
    /// the caller's), and whether to pause before (a server loading or failing over).
    fn retry_of(
        &self,
        e: &redis::RedisError,
        i: usize,
        target: &Target,
        server: &Server,
    ) -> (Option<(usize, Target)>, bool) {
        match e.kind() {
            ErrorKind::Moved => (self.redirected(e).map(|s| (i, Target::Moved(s))), false),
            ErrorKind::Ask => (self.redirected(e).map(|s| (i, Target::Ask(s))), false),
            ErrorKind::NoScriptError => {
                server.scripts_loaded.store(false, Ordering::Release);
                (Some((i, target.clone())), false)
            }
            ErrorKind::BusyLoadingError => (Some((i, target.clone())), true),
            ErrorKind::TryAgain
            | ErrorKind::ClusterDown
            | ErrorKind::MasterDown
            | ErrorKind::ReadOnly
                if self.is_cluster() =>
            {
                self.mark_stale();
                (Some((i, Target::Slot)), true)
            }
            _ => (None, false),
        }
    }

    /// The server a MOVED or ASK names, and the map marked out of date; `None` on one
    /// server (it is no cluster node) or an address that does not parse.
    fn redirected(&self, e: &redis::RedisError) -> Option<Arc<Server>> {
        let Servers::Cluster(c) = self else {
            return None;
        };
        c.stale.store(true, Ordering::Release);
        let (addr, _slot) = e.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        c.server(host, port.parse().ok()?).ok()
    }

    fn mark_stale(&self) {
        if let Servers::Cluster(c) = self {
            c.stale.store(true, Ordering::Release);
        }
    }

    /// The calls grouped by the server each goes to.
    #[allow(clippy::type_complexity)]
    async fn group(
        &self,
        calls: &[Call],
        todo: Vec<(usize, Target)>,
    ) -> Result<Vec<Group>, StoreError> {
        let topology = match self {
            Servers::One(s) => return Ok(vec![(s.clone(), todo)]),
            Servers::Cluster(c) => c.topology().await?,
        };
        let mut groups: Vec<(Arc<Server>, Vec<(usize, Target)>)> = Vec::new();
        let mut by_server: HashMap<*const Server, usize> = HashMap::new();
        for (i, target) in todo {
            let server = match &target {
                Target::Moved(s) | Target::Ask(s) => s.clone(),
                Target::Slot => topology.primary(calls[i].slot).ok_or_else(|| {
                    self.mark_stale();
                    StoreError::from(redis::RedisError::from((
                        redis::ErrorKind::ClusterDown,
                        "no primary serves the slot",
                        calls[i].slot.to_string(),
                    )))
                })?,
            };
            let g = *by_server.entry(Arc::as_ptr(&server)).or_insert_with(|| {
                groups.push((server.clone(), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((i, target));
        }
        Ok(groups)
    }
}

/// The calls one server gets: the server, and each call's index and how it is sent.
type Group = (Arc<Server>, Vec<(usize, Target)>);

/// One server's replies: its group's index, the pipeline's replies, and whether it ends
/// with a WAIT.
type Sent = (usize, Result<Vec<Value>, StoreError>, bool);

/// Sends each group's calls to its server in one pipeline, all servers at once
/// (`ASKING` before a call sent where an ASK pointed; `WAIT` after writes when `wait`).
fn send_all(
    groups: &[Group],
    calls: &Arc<Vec<Call>>,
    scripts: &Arc<Scripts>,
    wait: u32,
) -> tokio::task::JoinSet<Sent> {
    let mut tasks = tokio::task::JoinSet::new();
    for (g, (server, members)) in groups.iter().enumerate() {
        let (server, members, calls, scripts) = (
            server.clone(),
            members.clone(),
            calls.clone(),
            scripts.clone(),
        );
        tasks.spawn(async move {
            let mut pipe = redis::pipe();
            for (i, target) in &members {
                if matches!(target, Target::Ask(_)) {
                    pipe.cmd("ASKING");
                }
                pipe.add_command(calls[*i].cmd.clone());
            }
            let waits = wait > 0 && members.iter().any(|(i, _)| calls[*i].write);
            if waits {
                pipe.cmd("WAIT").arg(wait).arg(WAIT_TIMEOUT_MS);
            }
            (g, server.send(&scripts, &pipe).await, waits)
        });
    }
    tasks
}

/// WAIT's reply: an error unless `wait` replicas acknowledged.
fn replicated(reply: Option<Value>, wait: u32) -> Result<(), StoreError> {
    let acked: i64 = reply
        .map(redis::from_owned_redis_value)
        .transpose()?
        .unwrap_or(0);
    if acked < i64::from(wait) {
        return Err(StoreError::Unreplicated {
            wanted: wait,
            acked: acked.max(0) as u32,
        });
    }
    Ok(())
}
