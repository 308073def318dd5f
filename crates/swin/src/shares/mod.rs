//! Shares of a global limit for Envoy's rate limit quota service: proxies decide
//! locally, each under a share of the limit that swin divides among them by demand,
//! across every node of the cluster.
//!
//! A proxy opens one stream (`Shares::open`) and reports, per bucket, the requests it
//! allowed and denied since its last report (`Limiter::quota_report`). A report's domain names
//! a namespace; a bucket (a map of strings) is matched by the namespace's descriptor
//! rules as one descriptor whose entries are the bucket's pairs, sorted by key, and its
//! rule's limit is the limit its proxies share (a runtime limit set on the bucket's
//! counter key replaces it, as for every other ask). Each proxy's demand (allowed +
//! denied per unit of the rule) is shared through the namespace's store every sharing
//! round (`Shares::run`), so that every node divides a bucket's limit among every
//! proxy of the cluster, max-min fair (`assign.rs`); a proxy is told its share as a token
//! bucket at once and again whenever it goes down, grows by more than 2 %, or half of
//! its ttl has passed — without waiting for its next report. The allowed requests are
//! counted on the bucket's counter key like hits, so the store and `/rate` show them.
//!
//! A proxy that goes away keeps enforcing its last assignment until its ttl: its share
//! stays taken off the limit until then (`assign::Entry`). A bucket's first report on a
//! stream only claims; its later reports show its demand, and claims divide only what
//! shown demand leaves, so streams that report once and fall silent (or close) are no
//! votes. Nothing told holds past this node's entry for the bucket in the store, as of the
//! last post that succeeded: while the store cannot be asked, or answers late, the
//! assignments shrink and lapse before the entries do, so no other node takes their room
//! while they hold; the proxies then follow their `expired_assignment_behavior`; in a
//! strict namespace with `on_store_failure = "deny"` they are told to deny instead, when
//! their last assignment is half-way to its lapse (no gap between the two). A bucket grows
//! no share until this node has posted its entry for it once, nor while the store has lost
//! this node's entries (a restart without its data) and what they stood for may hold.
//! Caps (`[quota]` in the config) bound the streams of one client and the live buckets of a
//! stream, of a client and of the node.

pub(crate) mod assign;
mod buckets;
mod by_client;
mod client;
mod division;
mod entry;
mod reads;
mod report;
mod rounds;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use self::assign::Action;
use self::assign::Entry;
pub(crate) use self::client::Sharer;
pub use self::report::{BucketAction, Reports, Usage};
pub(crate) use self::stream::Stream;
use crate::error::Error;
use crate::state::{Namespace, Namespaces};

/// Buckets one report may carry.
pub(crate) const MAX_BUCKETS_PER_REPORT: usize = 10_000;
/// Pairs one bucket id may carry.
pub(crate) const MAX_PAIRS_PER_BUCKET: usize = 64;
pub(crate) use crate::config::QuotaLimits;

/// How often demands are shared and divisions made again.
pub(crate) const ROUND: Duration = Duration::from_millis(500);
/// Assignments that a proxy's answers keep in its queue before newer ones wait for
/// the next round.
const QUEUED: usize = 16;

/// A bucket: its pairs, sorted by key.
pub(crate) type BucketId = Vec<(String, String)>;

/// The quota service of one node: its proxies, and what the other nodes' proxies ask
/// for as the store last said.
#[derive(Debug)]
pub(crate) struct Shares {
    /// This node's name in the store's entries.
    node: String,
    namespaces: Arc<ArcSwap<Namespaces>>,
    limits: QuotaLimits,
    state: Mutex<State>,
    next: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    proxies: BTreeMap<u64, ProxyState>,
    /// (namespace, bucket key) → every node's entries as last read.
    remote: HashMap<(String, String), Vec<swin_sync::store::Demands>>,
    /// (namespace, bucket key) → until when this node's entry is surely in the store (its
    /// last post, begun at that instant less the entry's life, less a margin): nothing
    /// told for the bucket holds past it.
    held: HashMap<(String, String), Instant>,
    /// Namespace → the store's time until which nothing grows: the store lost this
    /// node's entries (a restart without its data), and the other nodes' assignments
    /// it lost may hold until then.
    lost: HashMap<String, swin_core::UnixMs>,
    /// Client → its open streams.
    clients: HashMap<Sharer, usize>,
    /// Client → its live buckets, across its streams.
    client_buckets: HashMap<Sharer, usize>,
    /// Buckets whose last read showed other nodes than the read before: none of their
    /// shares grows until two reads agree.
    moved: std::collections::HashSet<(String, String)>,
    /// Live buckets across the streams.
    buckets: usize,
}

#[derive(Debug)]
struct ProxyState {
    /// Who opened it.
    client: Sharer,
    namespace: Option<String>,
    tx: mpsc::Sender<Vec<BucketAction>>,
    open: bool,
    last_report: Option<Instant>,
    interval: Option<Duration>,
    /// Bucket key → the proxy's bucket.
    buckets: HashMap<String, ProxyBucket>,
}

impl ProxyState {
    /// Its entry for `b` (one of its buckets) in the division, with its client.
    fn entry(&self, b: &ProxyBucket, stale_after: Duration, now: Instant) -> Option<Entry> {
        let e = b.entry(self.open, stale_after, now)?;
        Some(Entry {
            client: Some(self.client.tag()),
            ..e
        })
    }

    /// How long its assignments hold: two reporting intervals less a second, 2 s to a
    /// minute.
    fn ttl(&self) -> Duration {
        let interval = self.interval.unwrap_or(Duration::from_secs(1));
        // a second under two intervals: when the proxy goes away its share is free for
        // the others within two of its intervals, a round included
        (interval * 2)
            .saturating_sub(Duration::from_secs(1))
            .clamp(Duration::from_secs(2), Duration::from_secs(60))
    }
}

#[derive(Debug, Clone)]
struct ProxyBucket {
    id: BucketId,
    /// Requests per unit it asks for.
    demand: f64,
    limit: f64,
    unit: Duration,
    reported: Instant,
    /// Reports of it on this stream: its ask is shown from the second on.
    reports: u32,
    sent: Option<(Action, Instant)>,
    /// What the last sharing round divided for it (a report is answered from it: a
    /// report never divides, so a thousand proxies' reports cost no division each).
    divided: Option<Action>,
    /// Its ask as the other nodes have it: what this node's last post that reached the
    /// store said it asks, and whether shown; `None` until one did. Its share grows only
    /// as far as the division of that ask allows too (`division::division`).
    posted: Option<(f64, bool)>,
}

impl ProxyBucket {
    /// `divided`, unless it grows the share the proxy assigned: then what it assigned, for
    /// `divided`'s ttl; nothing when it holds nothing.
    fn no_more_than_held(&self, divided: Action, now: Instant) -> Option<Action> {
        let (held, _) = self.sent.filter(|(a, at)| *at + a.ttl() > now)?;
        let share = |a: &Action| a.share().unwrap_or(u64::MAX);
        match share(&divided) > share(&held) {
            true => Some(held.with_ttl(divided.ttl())),
            false => Some(divided),
        }
    }

    /// Its entry in the division: asking (open, reporting) and holding what it was
    /// last told until that lapses; only holding when it went away; `None` once it
    /// neither asks nor assigned.
    fn entry(&self, open: bool, stale_after: Duration, now: Instant) -> Option<Entry> {
        let live = open && now.duration_since(self.reported) <= stale_after;
        let assigned = match &self.sent {
            Some((a, at)) if *at + a.ttl() > now => a.share().map_or(self.limit, |s| s as f64),
            _ => 0.0,
        };
        match live {
            true => Some(Entry {
                asks: Some(self.demand),
                shown: self.reports >= 2,
                assigned,
                client: None,
            }),
            false if assigned > 0.0 => Some(Entry {
                asks: None,
                shown: false,
                assigned,
                client: None,
            }),
            false => None,
        }
    }
}

/// A proxy's stream. Dropping it ends the proxy's part in every division once its last
/// assignment lapses.
#[derive(Debug)]
pub struct Proxy {
    shares: Arc<Shares>,
    id: u64,
}

impl Shares {
    /// The quota service over `namespaces` (the limiter's, as they are at each call).
    pub fn new(namespaces: Arc<ArcSwap<Namespaces>>, limits: QuotaLimits) -> Arc<Shares> {
        Arc::new(Shares {
            node: swin_sync::new_node_id(),
            namespaces,
            limits,
            state: Mutex::new(State::default()),
            next: AtomicU64::new(1),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a proxy's stream for `client`: the proxy, and where its assignments arrive
    /// between its reports. A client holding `streams_per_client` streams already is
    /// refused ([`Error::Exhausted`]).
    pub fn open(
        self: &Arc<Self>,
        client: &Sharer,
    ) -> Result<(Proxy, mpsc::Receiver<Vec<BucketAction>>), Error> {
        let (tx, rx) = mpsc::channel(QUEUED);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state();
        let open = state.clients.entry(client.clone()).or_default();
        if *open >= self.limits.streams_per_client {
            return Err(Error::Exhausted(format!(
                "{client} holds {open} quota streams open on this node; at most {} \
                 (quota.streams_per_client)",
                self.limits.streams_per_client
            )));
        }
        *open += 1;
        state.proxies.insert(
            id,
            ProxyState {
                client: client.clone(),
                namespace: None,
                tx,
                open: true,
                last_report: None,
                interval: None,
                buckets: HashMap::new(),
            },
        );
        drop(state);
        let proxy = Proxy {
            shares: self.clone(),
            id,
        };
        Ok((proxy, rx))
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.namespaces.load().get(name).cloned()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let mut state = self.shares.state();
        let Some(p) = state.proxies.get_mut(&self.id) else {
            return;
        };
        p.open = false;
        let client = p.client.clone();
        if let Some(n) = state.clients.get_mut(&client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.clients.remove(&client);
            }
        }
    }
}

/// A report's bucket that its rule divides.
struct Shared {
    bucket: BucketId,
    usage: Usage,
    limit: f64,
    unit: Duration,
    key: String,
}

/// `action` holding no longer than this node's entry for its bucket surely lives in the
/// store (`until`): its ttl cut to whole seconds (Envoy keeps no more) that end before
/// `until`; `None` when not one is left. A deny takes no room: it holds as it is.
pub(crate) fn within(action: Action, until: Option<Instant>, now: Instant) -> Option<Action> {
    if matches!(action, Action::DenyAll { .. }) {
        return Some(action);
    }
    let left = until?.checked_duration_since(now)?;
    let secs = action.ttl().min(left).as_secs();
    (secs >= 1).then(|| action.with_ttl(Duration::from_secs(secs)))
}

impl Shared {
    /// The rate the proxy asks for, per the rule's unit, from its report (or, without a
    /// measure of its own, over the stream's `interval`). A first report tells nothing
    /// of a rate: the proxy may ask for the whole limit (a claim: it takes only room that
    /// shown asks leave).
    fn demand(&self, interval: Option<Duration>) -> f64 {
        let elapsed = self
            .usage
            .elapsed
            .filter(|e| !e.is_zero())
            .or(interval)
            .filter(|e| !e.is_zero());
        elapsed.map_or(self.limit, |e| {
            (self.usage.allowed.saturating_add(self.usage.denied)) as f64 / e.as_secs_f64()
                * self.unit.as_secs_f64()
        })
    }
}
