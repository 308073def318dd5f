//! Shares of a global limit for Envoy's rate limit quota service: proxies decide
//! locally, each under a share of the limit that swin divides among them by demand,
//! across every node of the cluster.
//!
//! A proxy opens one stream ([`Shares::open`]) and reports, per bucket, the requests it
//! allowed and denied since its last report ([`Proxy::report`]). A report's domain names
//! a namespace; a bucket (a map of strings) is matched by the namespace's descriptor
//! rules as one descriptor whose entries are the bucket's pairs, sorted by key, and its
//! rule's limit is the limit its proxies share (a runtime limit set on the bucket's
//! counter key replaces it, as for every other ask). Each proxy's demand (allowed +
//! denied per unit of the rule) is shared through the namespace's store every sharing
//! round ([`Shares::run`]), so that every node divides a bucket's limit among every
//! proxy of the cluster, max-min fair ([`assign`]); a proxy is told its share as a token
//! bucket at once and again whenever it goes down, grows by more than 2 %, or half of
//! its ttl has passed — without waiting for its next report. The allowed requests are
//! counted on the bucket's counter key like hits, so the store and `/rate` show them.
//!
//! A proxy that goes away keeps enforcing its last assignment until its ttl: its share
//! stays taken off the limit until then ([`assign::Entry`]). While the store cannot be
//! asked nothing is told: the assignments lapse at their ttl — before this node's
//! entries lapse in the store, so no other node takes their room while they hold — and
//! the proxies follow their `expired_assignment_behavior`; in a strict namespace with
//! `on_store_failure = "deny"` they are told to deny instead, when their last
//! assignment is half-way to its lapse (no gap between the two). After a start or an outage a node grows no share until it has posted its
//! entries once.

pub mod assign;
mod buckets;
mod rounds;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use self::assign::Action;
use self::assign::Entry;
use self::buckets::{checked, ruled, touch, Ruled};
use crate::error::Error;
use crate::state::{Namespace, Namespaces};

/// Buckets one report may carry.
pub const MAX_BUCKETS_PER_REPORT: usize = 10_000;
/// Pairs one bucket id may carry.
pub const MAX_PAIRS_PER_BUCKET: usize = 64;
/// How often demands are shared and divisions made again.
pub const ROUND: Duration = Duration::from_millis(500);
/// Assignments that a proxy's answers keep in its queue before newer ones wait for
/// the next round.
const QUEUED: usize = 16;

/// A bucket: its pairs, sorted by key.
pub type BucketId = Vec<(String, String)>;

/// One report of a proxy: its domain (a namespace) and each bucket's usage.
#[derive(Debug, Clone, Default)]
pub struct Reports {
    /// The namespace.
    pub domain: String,
    /// Each bucket's usage since the last report.
    pub usages: Vec<Usage>,
}

/// One bucket's usage since the proxy's last report of it.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// The bucket (any order; sorted here).
    pub bucket: BucketId,
    /// The time the usage covers, as the proxy measured it (`None` or zero: unknown).
    pub elapsed: Option<Duration>,
    /// Requests the proxy let through.
    pub allowed: u64,
    /// Requests the proxy refused.
    pub denied: u64,
}

/// What a proxy is told for one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAction {
    /// The bucket.
    pub bucket: BucketId,
    /// What it enforces.
    pub action: Action,
}

/// The quota service of one node: its proxies, and what the other nodes' proxies ask
/// for as the store last said.
#[derive(Debug)]
pub struct Shares {
    /// This node's name in the store's entries.
    node: String,
    namespaces: Arc<ArcSwap<Namespaces>>,
    state: Mutex<State>,
    next: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    proxies: BTreeMap<u64, ProxyState>,
    /// (namespace, bucket key) → every node's entries as last read.
    remote: HashMap<(String, String), Vec<swin_sync::store::Demands>>,
    /// Namespaces whose entries the last round posted.
    posted: std::collections::HashSet<String>,
}

#[derive(Debug)]
struct ProxyState {
    namespace: Option<String>,
    tx: mpsc::Sender<Vec<BucketAction>>,
    open: bool,
    last_report: Option<Instant>,
    interval: Option<Duration>,
    /// Bucket key → the proxy's bucket.
    buckets: HashMap<String, ProxyBucket>,
}

impl ProxyState {
    /// How long its assignments hold: two reporting intervals, 2 s to a minute.
    fn ttl(&self) -> Duration {
        let interval = self.interval.unwrap_or(Duration::from_secs(1));
        (interval * 2).clamp(Duration::from_secs(2), Duration::from_secs(60))
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
    sent: Option<(Action, Instant)>,
    /// What the last sharing round divided for it (a report is answered from it: a
    /// report never divides, so a thousand proxies' reports cost no division each).
    divided: Option<Action>,
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
                assigned,
            }),
            false if assigned > 0.0 => Some(Entry {
                asks: None,
                assigned,
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
    pub fn new(namespaces: Arc<ArcSwap<Namespaces>>) -> Arc<Shares> {
        Arc::new(Shares {
            node: swin_sync::new_node_id(),
            namespaces,
            state: Mutex::new(State::default()),
            next: AtomicU64::new(1),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a proxy's stream: the proxy, and where its assignments arrive between its
    /// reports.
    pub fn open(self: &Arc<Self>) -> (Proxy, mpsc::Receiver<Vec<BucketAction>>) {
        let (tx, rx) = mpsc::channel(QUEUED);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.state().proxies.insert(
            id,
            ProxyState {
                namespace: None,
                tx,
                open: true,
                last_report: None,
                interval: None,
                buckets: HashMap::new(),
            },
        );
        let proxy = Proxy {
            shares: self.clone(),
            id,
        };
        (proxy, rx)
    }

    /// Proxies with an open stream on this node.
    pub fn proxies(&self) -> usize {
        self.state().proxies.values().filter(|p| p.open).count()
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.namespaces.load().get(name).cloned()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(p) = self.shares.state().proxies.get_mut(&self.id) {
            p.open = false;
        }
    }
}

impl Proxy {
    /// Takes a report: records each bucket's demand, counts what was allowed, and
    /// answers each bucket's assignment now. An error (no domain, too many buckets)
    /// ends the stream; a bad bucket or one no rule covers is abandoned, the others
    /// answered as usual.
    pub async fn report(&self, reports: Reports) -> Result<Vec<BucketAction>, Error> {
        if reports.domain.is_empty() {
            return Err(Error::BadRequest(
                "domain: a report names its namespace; got none".into(),
            ));
        }
        if reports.usages.len() > MAX_BUCKETS_PER_REPORT {
            return Err(Error::BadRequest(format!(
                "bucket_quota_usages: {} buckets in one report; at most {MAX_BUCKETS_PER_REPORT}",
                reports.usages.len()
            )));
        }
        let ns = self.bind(&reports.domain);
        if let Some(ns) = &ns {
            touch(ns, &reports.usages).await;
        }
        let mut out = Vec::with_capacity(reports.usages.len());
        let mut counts = Vec::new();
        for usage in reports.usages {
            let bucket = match checked(&usage.bucket) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(why) => {
                    tracing::debug!(why, "a bucket abandoned");
                    out.push(BucketAction {
                        bucket: usage.bucket,
                        action: Action::Abandon,
                    });
                    continue;
                }
            };
            let Some(ns) = &ns else {
                out.push(BucketAction {
                    bucket,
                    action: Action::Abandon,
                });
                continue;
            };
            let (action, counted) = self.take_usage(ns, bucket.clone(), &usage);
            counts.extend(counted.map(|k| (k, usage.allowed)));
            if let Some(action) = action {
                out.push(BucketAction { bucket, action });
            }
        }
        if let Some(ns) = &ns {
            count_allowed(ns, counts).await;
        }
        Ok(out)
    }

    /// The namespace this stream reports on: the first report's domain; another
    /// domain later (or an unknown one) gets its buckets abandoned.
    fn bind(&self, domain: &str) -> Option<Arc<Namespace>> {
        let mut state = self.shares.state();
        let p = state.proxies.get_mut(&self.id)?;
        let now = Instant::now();
        if let Some(last) = p.last_report.replace(now) {
            p.interval = Some(now.duration_since(last));
        }
        match &p.namespace {
            Some(n) if n != domain => {
                tracing::warn!(stream = %n, domain, "a report names another domain than its stream's first: its buckets are abandoned");
                return None;
            }
            Some(_) => {}
            None => p.namespace = Some(domain.to_owned()),
        }
        drop(state);
        self.shares.namespace(domain)
    }

    /// Records one bucket's usage; its action now, and the key its allowed requests are
    /// counted on.
    fn take_usage(
        &self,
        ns: &Namespace,
        bucket: BucketId,
        usage: &Usage,
    ) -> (Option<Action>, Option<String>) {
        let (limit, unit, key) = match ruled(ns, &bucket) {
            Ruled::Shared { limit, unit, key } => (limit, unit, key),
            Ruled::Allow(key) => return (Some(Action::AllowAll { ttl: self.ttl() }), key),
            Ruled::Deny => return (Some(Action::DenyAll { ttl: self.ttl() }), None),
            Ruled::Abandon => return (Some(Action::Abandon), None),
        };
        let now = Instant::now();
        let mut state = self.shares.state();
        let Some(p) = state.proxies.get_mut(&self.id) else {
            return (Some(Action::Abandon), None);
        };
        let elapsed = usage
            .elapsed
            .filter(|e| !e.is_zero())
            .or(p.interval)
            .filter(|e| !e.is_zero());
        // a first report tells nothing of a rate: the proxy may ask for the whole limit
        let demand = elapsed.map_or(limit, |e| {
            (usage.allowed.saturating_add(usage.denied)) as f64 / e.as_secs_f64()
                * unit.as_secs_f64()
        });
        let b = p.buckets.entry(key.clone()).or_insert_with(|| ProxyBucket {
            id: bucket,
            demand,
            limit,
            unit,
            reported: now,
            sent: None,
            divided: None,
        });
        (b.demand, b.limit, b.unit, b.reported) = (demand, limit, unit, now);
        // what this node's proxies hold is told again only while the store shows it
        // (the last round posted it): in an outage assignments are left to lapse
        let posting = state.posted.contains(ns.sync.name());
        let Some(b) = state
            .proxies
            .get_mut(&self.id)
            .and_then(|p| p.buckets.get_mut(&key))
        else {
            return (None, Some(key));
        };
        // a share grows only in a sharing round, after this node's assignments are posted;
        // here it stays or comes down (a proxy holding nothing waits for the round)
        let action = b
            .divided
            .filter(|_| posting)
            .and_then(|d| b.no_more_than_held(d, now));
        if let Some(a) = action {
            b.sent = Some((a, now));
        }
        (action, Some(key))
    }

    fn ttl(&self) -> Duration {
        self.shares
            .state()
            .proxies
            .get(&self.id)
            .map_or(Duration::from_secs(2), ProxyState::ttl)
    }
}

/// Counts each bucket's allowed requests on its key, as hits are counted.
async fn count_allowed(ns: &Namespace, counts: Vec<(String, u64)>) {
    let now = swin_sync::now();
    for (key, allowed) in counts.into_iter().filter(|(_, n)| *n > 0) {
        if let Err(e) = crate::counting::count_key(ns, &key, allowed as f64, None, now).await {
            tracing::warn!(key, cause = %e, "a proxy's allowed requests were not counted");
        }
    }
}
