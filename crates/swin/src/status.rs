//! The limiter's read side: what each namespace is and holds at one instant, whether
//! the node is ready, its clock against the store's, the heaviest keys of the last
//! minute, and the operations an operator asks for (a sync now, a key reset). Each read
//! is an owned snapshot: a caller (the daemon's admin routes, its metrics, a status
//! page) reads a namespace without holding its engine.

use serde::Serialize;

use crate::config::{AdmissionMode, OnStoreFailure};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::policy::algorithm::Algorithm;
use crate::state::Namespace;

/// A namespace as this node sees it at one instant, a document: `GET /v1/namespaces`
/// answers a list of them as they serialize (docs/api.md names each field), and the
/// daemon's metrics are its numbers.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct NamespaceStatus {
    /// Its name.
    name: String,
    /// Its window sizes, seconds.
    window_sizes: Vec<u32>,
    /// `periodic`, `synchronous` or `local`.
    sync_mode: &'static str,
    /// Seconds between syncs; 0 synchronous, -1 local-only.
    sync_rate: f64,
    /// The store it syncs with (a name of `[stores]`); none when local-only.
    store: Option<String>,
    /// `sliding_window`, `fixed_window`, `gcra` or `concurrency`; none when the
    /// namespace only counts.
    pub(crate) algorithm: Option<&'static str>,
    /// Concurrency only: leases in flight per key.
    limit: Option<u64>,
    /// Concurrency only: a lease's default life (s).
    lease_ttl: Option<f64>,
    /// Counters held in memory (key × window size).
    counters: usize,
    /// GCRA buckets held in memory.
    buckets: usize,
    /// Counters evicted to stay under `max_counters`.
    evictions: u64,
    /// Unix milliseconds of the last sync that reached the store.
    last_sync_ms: Option<i64>,
    /// Window diffs drained, not yet confirmed by the store.
    pending_diffs: usize,
    /// GCRA advances drained, not yet confirmed by the store.
    pending_advances: usize,
    /// The store cannot be reached.
    degraded: bool,
    /// A short reason (`store_unreachable`, …) while the store cannot be reached; the
    /// detail is in the log.
    degraded_reason: Option<&'static str>,
    /// `eventual` or `strict`; none when the namespace only counts.
    admission: Option<&'static str>,
    /// Strict only: `local` or `deny`.
    on_store_failure: Option<&'static str>,
    /// Store calls of strict admission: holds of window quota and grants of bucket
    /// quota, taken or given back.
    reservations: u64,
    /// Every limit in shadow (`shadow = true`): decided and counted, never denied.
    shadow: bool,
    /// How its syncs and first touches go, counted since it was built.
    syncs: SyncCounts,
}

/// A namespace's syncs and first touches, counted since it was built.
#[derive(Debug, Clone, Default, Serialize)]
struct SyncCounts {
    /// Syncs that reached the store.
    syncs: u64,
    /// Syncs that failed.
    failures: u64,
    /// Windows the store refused for good (logged with their key) and dropped.
    rejected_windows: u64,
    /// The syncs' durations summed, seconds.
    duration_sum_secs: f64,
    /// Per upper bound (seconds), the syncs that took at most it and more than the
    /// bound before (not cumulative).
    duration_buckets: Vec<(f64, u64)>,
    /// Keys this node held nothing for, read from the store before an answer.
    first_touch_loads: u64,
    /// Keys this node held nothing for, answered from local knowledge (the store did
    /// not answer in time).
    first_touch_fallbacks: u64,
    /// Admission is strict.
    strict: bool,
}

/// What `/readyz` answers, a document: `"status"` is `"ready"` or `"degraded"`; a
/// degraded node names its namespaces not ready (`"namespaces"`, each with its
/// `"reason"`); those that reached their store once, when that will do, under
/// `"degraded"`; and those still loading their totals under `"warming"` (they serve, each
/// key read at its first touch, so they are named, not held against readiness).
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    status: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    namespaces: Vec<Unready>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    degraded: Vec<Unready>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warming: Vec<String>,
}

impl Readiness {
    /// Every namespace is ready (its `"status"` is `"ready"`).
    pub fn is_ready(&self) -> bool {
        self.namespaces.is_empty()
    }
}

/// A namespace not ready, and why.
#[derive(Debug, Clone, Serialize)]
struct Unready {
    namespace: String,
    reason: String,
}

/// A sync asked for now, a document: the namespace, windows pushed, totals read back,
/// how long it took.
#[derive(Debug, Clone, Serialize)]
pub struct Synced {
    /// The namespace.
    namespace: String,
    /// Windows pushed (key × window).
    pushed: usize,
    /// Totals read back and applied.
    fetched: usize,
    /// How long the sync took, milliseconds.
    duration_ms: f64,
}

/// This node itself, a document: its clock against the store's, as last measured
/// (`offset_ms`, `beyond_bound`, `now_ms`), and the spool files waiting under `data_dir`
/// for their store (`spooled_files`: what a stop could not push, taken back when the
/// store answers).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NodeStatus {
    /// The store's clock minus this node's (ms); none until a store with a clock of
    /// its own answers.
    offset_ms: Option<i64>,
    /// Further from the store's than `max_clock_offset`.
    beyond_bound: bool,
    /// The time decisions are taken at now (Unix ms, the store's).
    now_ms: i64,
    /// Spool files waiting for their store.
    spooled_files: usize,
}

/// Which hits a top list weighs keys by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TopBy {
    /// Hits denied.
    Denied,
    /// Hits decided.
    Hits,
}

/// The heaviest keys of the last minute on this node, a document: the namespace, what
/// they are weighed `by`, the period (`window_secs`), the `keys` (each its `key`, `count`
/// and the most that count can be off by, `error`), every hit weighed in the period
/// (`total`), the most any key's count can be off by (`error_bound`), and its `scope`,
/// `"node"` (a caller wanting the cluster's asks every node and adds them up per key).
#[derive(Debug, Clone, Serialize)]
pub struct TopKeys {
    namespace: String,
    by: TopBy,
    window_secs: i64,
    keys: Vec<TopKey>,
    total: f64,
    error_bound: f64,
    scope: &'static str,
}

/// A key of a top list.
#[derive(Debug, Clone, Serialize)]
struct TopKey {
    key: String,
    count: f64,
    error: f64,
}

impl NamespaceStatus {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Limiter {
    /// The namespace `name` (what the tower layer's builder checks).
    #[cfg(feature = "tower")]
    pub(crate) fn namespace_status(&self, name: &str) -> Result<NamespaceStatus, Error> {
        Ok(status_of(&*self.namespace(name)?))
    }

    /// Every namespace served, by name.
    pub fn status(&self) -> Vec<NamespaceStatus> {
        let namespaces = self.namespaces();
        let mut list: Vec<NamespaceStatus> = namespaces.values().map(|n| status_of(n)).collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    /// Whether every store-backed namespace has reached its store recently enough to
    /// answer with the cluster's counts, or, when `reached_once_will_do`, once since it
    /// was built (through an outage after that it answers as its `on_store_failure`
    /// says: an orchestrator keeps routing to it).
    pub fn readiness(&self, reached_once_will_do: bool) -> Readiness {
        let now = swin_sync::now();
        let mut r = Readiness {
            status: "ready",
            namespaces: Vec::new(),
            degraded: Vec::new(),
            warming: Vec::new(),
        };
        let namespaces = self.namespaces();
        let mut sorted: Vec<&std::sync::Arc<Namespace>> = namespaces.values().collect();
        sorted.sort_by(|a, b| a.sync().name().cmp(b.sync().name()));
        for n in sorted {
            let sync = n.sync();
            if let Err(reason) = sync.readiness(now) {
                let reached_once = sync.status().last_success_ms.is_some();
                let unready = Unready {
                    namespace: sync.name().to_owned(),
                    reason,
                };
                match reached_once_will_do && reached_once {
                    true => r.degraded.push(unready),
                    false => r.namespaces.push(unready),
                }
            }
            if sync.warming() {
                r.warming.push(sync.name().to_owned());
            }
        }
        if !r.namespaces.is_empty() {
            r.status = "degraded";
        }
        r
    }

    /// Syncs `namespace` now: pushes what this node holds, reads the cluster's totals.
    pub async fn sync_now(&self, namespace: &str) -> Result<Synced, Error> {
        let ns = self.namespace(namespace)?;
        match ns.sync().sync_requested(swin_sync::now()).await {
            Ok(r) => Ok(Synced {
                namespace: namespace.to_owned(),
                pushed: r.pushed,
                fetched: r.fetched,
                duration_ms: r.duration_ms,
            }),
            Err(e) if e.may_have_run() => Err(Error::store_maybe(
                &e,
                &format!("sync of namespace {namespace:?}"),
                "the push goes again under the same number, which the store counts once (ask \
                 again, or read the namespace's pending_diffs)",
            )),
            Err(e) => Err(Error::store(
                &e,
                &format!("sync of namespace {namespace:?}"),
            )),
        }
    }

    /// Deletes `key`'s counts and bucket in the store, then on this node (other nodes
    /// drop theirs at their next sync); nothing is reset when the store cannot be
    /// reached, and when its answer may have been lost the error says the outcome is
    /// unknown (a reset sent again does the same).
    pub async fn reset(&self, namespace: &str, key: &str) -> Result<(), Error> {
        crate::policy::input::check_key(key)?;
        let ns = self.namespace(namespace)?;
        ns.sync()
            .reset(key)
            .await
            .map_err(|e| match e.may_have_run() {
                true => Error::store_maybe(
                    &e,
                    &format!("reset of key {key:?}"),
                    "this node kept its counts: send the reset again (a reset sent twice \
                     resets once)",
                ),
                false => Error::store(&e, "reset"),
            })
    }

    /// What `namespace` has taken and not given back, across the cluster as its store
    /// counts them (a local-only namespace: this node's): on a concurrency namespace
    /// (its status has a `limit`), slots of live leases; on another, reservations made
    /// and not yet committed or lapsed.
    pub async fn in_flight(&self, namespace: &str) -> Result<u64, Error> {
        let ns = self.namespace(namespace)?;
        match ns.concurrency {
            Some(_) => {
                let live = ns.leases().in_flight(swin_sync::now()).await;
                live.map_err(|e| unread(&e, "leases in flight"))
            }
            None => {
                let open = ns.reservations().open_count(swin_sync::now()).await;
                open.map_err(|e| unread(&e, "reservations open"))
            }
        }
    }

    /// The idempotency records this node keeps itself for `namespace` (one with no
    /// store; a store-backed one keeps them in its store: `(0, 0)`): how many, and the
    /// bytes they take. It walks the records under their table's lock: a diagnostic,
    /// not a read for every scrape.
    pub fn local_records(&self, namespace: &str) -> Result<(usize, usize), Error> {
        let ns = self.namespace(namespace)?;
        // a store-backed namespace's records are its store's: no memory of the node's
        Ok(ns
            .records
            .memory()
            .map_or((0, 0), |m| (m.records(), m.record_bytes())))
    }

    /// This node: its clock against the store's, and the spool files waiting.
    pub fn node_status(&self) -> NodeStatus {
        let clock = swin_sync::clock::clock();
        NodeStatus {
            offset_ms: clock.offset_ms(),
            beyond_bound: clock.beyond_bound(),
            now_ms: swin_sync::now().0,
            spooled_files: crate::spool::files(self.config().data_dir()).len(),
        }
    }

    /// The `count` heaviest keys of `namespace` in the last minute on this node.
    pub fn top_keys(&self, namespace: &str, by: TopBy, count: usize) -> Result<TopKeys, Error> {
        let ns = self.namespace(namespace)?;
        let sketch = match by {
            TopBy::Denied => ns.heaviest().denied(),
            TopBy::Hits => ns.heaviest().hits(),
        };
        let answer = sketch.top(count, swin_sync::now().secs());
        Ok(TopKeys {
            namespace: namespace.to_owned(),
            by,
            window_secs: swin_core::top::SLOTS as i64 * swin_core::top::SLOT_SECS,
            keys: answer
                .keys
                .iter()
                .map(|h| TopKey {
                    key: h.key.to_string(),
                    count: h.count,
                    error: h.error,
                })
                .collect(),
            total: answer.total,
            error_bound: answer.bound,
            scope: "node",
        })
    }
}

/// A read the store did not answer (not logged: a scrape asks again).
fn unread(e: &swin_sync::StoreError, what: &str) -> Error {
    Error::Store {
        reason: e.reason(),
        message: format!("{what}: the store could not be read"),
    }
}

fn status_of(ns: &Namespace) -> NamespaceStatus {
    let sync = ns.sync();
    let st = sync.status();
    let mode = sync.mode();
    let c = sync.counters();
    let (loads, fallbacks) = sync.first_touches();
    NamespaceStatus {
        name: sync.name().to_owned(),
        window_sizes: c.window_sizes().map(|s| s.secs()).collect(),
        sync_mode: mode.name(),
        sync_rate: match mode {
            swin_sync::SyncMode::Periodic(p) => p.as_secs_f64(),
            swin_sync::SyncMode::Synchronous => 0.0,
            swin_sync::SyncMode::LocalOnly => -1.0,
        },
        store: ns.store_name().map(str::to_owned),
        algorithm: match ns.algorithm() {
            Algorithm::Concurrency => Some("concurrency"),
            _ => ns.limits().as_ref().map(|l| l.algorithm().name()),
        },
        limit: ns.concurrency().as_ref().map(|c| c.limit()),
        lease_ttl: ns
            .concurrency()
            .as_ref()
            .map(|c| c.lease_ttl().as_secs_f64()),
        counters: c.len(),
        buckets: c.buckets().len(),
        evictions: c.evictions(),
        last_sync_ms: st.last_success_ms,
        pending_diffs: st.pending_diffs,
        pending_advances: st.pending_advances,
        degraded: st.degraded.is_some(),
        degraded_reason: st.degraded,
        admission: ns.limits().as_ref().map(|_| ns.admission_mode().name()),
        on_store_failure: match ns.admission_mode() {
            AdmissionMode::Strict { on_store_failure } => Some(match on_store_failure {
                OnStoreFailure::Local => "local",
                OnStoreFailure::Deny => "deny",
            }),
            AdmissionMode::Eventual => None,
        },
        reservations: sync.reservations(),
        shadow: ns.limits().as_ref().is_some_and(|l| l.shadow()),
        syncs: SyncCounts {
            syncs: st.syncs,
            failures: st.failures,
            rejected_windows: st.rejected_windows,
            duration_sum_secs: st.duration_sum_secs,
            duration_buckets: swin_sync::SYNC_BUCKETS_SECS
                .iter()
                .copied()
                .zip(st.duration_buckets.iter().copied())
                .collect(),
            first_touch_loads: loads,
            first_touch_fallbacks: fallbacks,
            strict: sync.is_strict(),
        },
    }
}
