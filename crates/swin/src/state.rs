//! A namespace as requests use it: its counters and engine, its policy (limits, rules,
//! admission), its runtime limits, leases and idempotency records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use swin_core::{CounterOptions, NamespaceCounters, Retention};
use swin_sync::admission::{self, Admission};
use swin_sync::{NamespaceSync, Store, SyncMode};

use crate::config::NamespaceConfig;
use crate::policy::limits::KeyLimits;
use crate::runtime_limits::{Effective, RuntimeLimits};

/// A namespace as the API serves it.
#[derive(Debug)]
pub struct Namespace {
    /// Its counters and its engine (sync with the store).
    pub(crate) sync: Arc<NamespaceSync>,
    /// The `[stores]` entry it syncs with (none: local only).
    pub(crate) store_name: Option<String>,
    /// The limits `/hit` decides against; none when it only counts (or has descriptor rules only).
    pub(crate) limits: Option<crate::policy::limits::Limits>,
    /// Whether `/increment` takes negative values (`allow_decrements`); without it a
    /// client could lift its own limit.
    pub(crate) allow_decrements: bool,
    /// How `/hit` admits (`admission`, `on_store_failure`), as configured.
    pub(crate) admission_mode: crate::config::AdmissionMode,
    /// Decides every hit, on every door: picked once, here, from the namespace's
    /// algorithm and admission.
    pub(crate) admission: Arc<dyn Admission>,
    /// Envoy's descriptor rules (the gRPC rate limit service), when the namespace has some.
    pub(crate) rules: Option<Arc<crate::policy::rules::Rules>>,
    /// Envoy's answers carry the RateLimit headers.
    pub(crate) envoy_response_headers: bool,
    /// Envoy's answers carry dynamic metadata.
    pub(crate) envoy_dynamic_metadata: bool,
    /// The namespace's algorithm, which its runtime limits take the shape of.
    pub(crate) algorithm: crate::policy::algorithm::Algorithm,
    /// Limits set per key at run time, for the keys this node serves; shared by the
    /// namespace's versions while its counters are.
    pub(crate) runtime: Arc<RuntimeLimits>,
    /// The heaviest keys of the last minute on this node, shared the same way.
    pub(crate) heaviest: Arc<Heaviest>,
    /// `algorithm = "concurrency"`: leases in flight per key, not hits.
    pub(crate) concurrency: Option<crate::config::Concurrency>,
    /// Where the namespace's leases and reservations are kept (its store, or this node
    /// for a local-only namespace), shared by the namespace's versions.
    pub(crate) leases: crate::leases::LeaseBook,
    /// Where the namespace's idempotency records are kept (as its leases are), shared by
    /// the namespace's versions.
    pub(crate) records: crate::idempotency::RecordBook,
    /// How long its idempotency records answer, and how many it keeps at most.
    pub(crate) idempotency: crate::config::Idempotency,
    /// How many reservations may be open in it, and per client.
    pub(crate) reservation_caps: crate::config::ReservationCaps,
    /// What this node last saw of the counts those caps are checked against.
    pub(crate) cap_checks: Arc<crate::requests::reservations::CapChecks>,
    /// Where the namespace's reservations of a cost are recorded (its store, or this
    /// node), shared the same way.
    pub(crate) reservations: crate::leases::ReservationBook,
    /// Changes this node owes the store and resolves in the background, shared the
    /// same way.
    pub(crate) unresolved: Arc<crate::unresolved::Unresolved>,
    /// Where the pipeline records its outcomes ([`Namespace::record_to`]); none: nowhere.
    recorder: std::sync::OnceLock<Arc<dyn crate::recorder::Recorder>>,
}

impl Namespace {
    /// Whether its runtime limits are kept in its store (else on this node).
    pub fn keeps_limits_in_store(&self) -> bool {
        self.sync.keeps_limits_in_store()
    }

    /// Stored runtime limits read back as this namespace's limits; `None` when it cannot
    /// hold them (its window sizes or algorithm changed since they were set).
    pub fn runtime_limits_of(&self, stored: &swin_sync::store::StoredLimit) -> Option<KeyLimits> {
        let sizes: Vec<_> = self.sync.counters().window_sizes().collect();
        crate::runtime_limits::parse(stored, self.algorithm, &sizes)
    }
}

impl Namespace {
    /// Its counters and its engine (sync with the store).
    pub fn sync(&self) -> &Arc<NamespaceSync> {
        &self.sync
    }

    /// The `[stores]` entry it syncs with (none: local only).
    pub fn store_name(&self) -> Option<&str> {
        self.store_name.as_deref()
    }

    /// The limits `/hit` decides against; none when it only counts (or has descriptor rules only).
    pub fn limits(&self) -> Option<&crate::policy::limits::Limits> {
        self.limits.as_ref()
    }

    /// How `/hit` admits (`admission`, `on_store_failure`), as configured.
    pub fn admission_mode(&self) -> &crate::config::AdmissionMode {
        &self.admission_mode
    }

    /// Envoy's answers carry the RateLimit headers.
    pub fn envoy_response_headers(&self) -> bool {
        self.envoy_response_headers
    }

    /// Envoy's answers carry dynamic metadata.
    pub fn envoy_dynamic_metadata(&self) -> bool {
        self.envoy_dynamic_metadata
    }

    /// The namespace's algorithm, which its runtime limits take the shape of.
    pub fn algorithm(&self) -> &crate::policy::algorithm::Algorithm {
        &self.algorithm
    }

    /// The heaviest keys of the last minute on this node, shared the same way.
    pub(crate) fn heaviest(&self) -> &Arc<Heaviest> {
        &self.heaviest
    }

    /// `algorithm = "concurrency"`: leases in flight per key, not hits.
    pub fn concurrency(&self) -> Option<&crate::config::Concurrency> {
        self.concurrency.as_ref()
    }

    /// Where the namespace's leases and reservations are kept (its store, or this node
    /// for a local-only namespace), shared by the namespace's versions.
    pub fn leases(&self) -> &crate::leases::LeaseBook {
        &self.leases
    }

    /// Where the namespace's reservations of a cost are recorded (its store, or this
    /// node), shared the same way.
    pub fn reservations(&self) -> &crate::leases::ReservationBook {
        &self.reservations
    }
}

/// A namespace's heaviest keys of the last minute on this node, in fixed memory (see
/// [`swin_core::top`]): by hits decided (allowed or denied) and by hits denied.
#[derive(Debug, Default)]
pub(crate) struct Heaviest {
    /// Keys by hits decided.
    pub(crate) hits: swin_core::top::TopKeys,
    /// Keys by hits denied.
    pub(crate) denied: swin_core::top::TopKeys,
}

impl Heaviest {
    /// Keys by hits decided.
    pub fn hits(&self) -> &swin_core::top::TopKeys {
        &self.hits
    }

    /// Keys by hits denied.
    pub fn denied(&self) -> &swin_core::top::TopKeys {
        &self.denied
    }
}

/// How long a namespace's store calls may take, and how long a request waits for one.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// `store_timeout`: one store call.
    pub(crate) store: Duration,
    /// `answer_timeout`: a request's wait for the store; past it the request is answered
    /// as the namespace says for a failed store, and the call goes on.
    pub(crate) answer: Duration,
}

impl Timeouts {}

impl From<Duration> for Timeouts {
    /// `store` per call, and the default wait for a request.
    fn from(store: Duration) -> Self {
        Timeouts {
            store,
            answer: store.min(swin_sync::DEFAULT_ANSWER_WITHIN),
        }
    }
}

impl Namespace {
    /// The namespace `cfg` describes: its counter tables and its engine, not started.
    /// The one place a `Namespace` is made, for the node and for tests alike. `store` is
    /// the store `cfg.store` names (`None` for a local-only namespace); `push_id` tells
    /// this engine's pushes apart from every other's (`<node>.<generation>` in the node).
    pub fn build(
        cfg: &NamespaceConfig,
        store: Option<Store>,
        push_id: Arc<str>,
        timeouts: impl Into<Timeouts>,
    ) -> Namespace {
        let timeouts = timeouts.into();
        let retention = if cfg.mode == SyncMode::LocalOnly {
            Retention::LocalOnly
        } else {
            Retention::Synced
        };
        let counters = Arc::new(NamespaceCounters::new(
            &cfg.name,
            &cfg.window_sizes,
            CounterOptions {
                retention,
                max_counters: cfg.max_counters,
            },
        ));
        let sync = NamespaceSync::new(
            counters,
            cfg.mode,
            store,
            swin_sync::PushId::new(push_id),
            timeouts.store,
        )
        .answering_within(timeouts.answer);
        let gcra = cfg.algorithm == crate::policy::algorithm::Algorithm::Gcra;
        let strict = match cfg.admission {
            crate::config::AdmissionMode::Eventual => None,
            crate::config::AdmissionMode::Strict { on_store_failure } => Some(on_store_failure),
        };
        let (sync, admission) = admission::for_namespace(sync, gcra, strict);
        let leases = crate::leases::LeaseBook::for_namespace(&sync);
        let records = crate::idempotency::RecordBook::for_namespace(&sync);
        let reservations = crate::leases::ReservationBook::for_namespace(&sync);
        Namespace {
            admission,
            sync,
            store_name: cfg.store.clone(),
            limits: cfg.limits.clone(),
            allow_decrements: cfg.allow_decrements,
            admission_mode: cfg.admission,
            rules: cfg.rules.clone(),
            envoy_response_headers: cfg.envoy_response_headers,
            envoy_dynamic_metadata: cfg.envoy_dynamic_metadata,
            algorithm: cfg.algorithm,
            runtime: Arc::new(RuntimeLimits::for_algorithm(cfg.algorithm)),
            heaviest: Arc::default(),
            concurrency: cfg.concurrency,
            leases,
            records,
            idempotency: cfg.idempotency,
            reservation_caps: cfg.reservation_caps,
            cap_checks: Arc::default(),
            reservations,
            unresolved: Arc::default(),
            recorder: std::sync::OnceLock::new(),
        }
    }

    /// Has the pipeline record this namespace's outcomes to `recorder` (the first one
    /// set stays: a namespace is counted in one place).
    pub fn record_to(&self, recorder: Arc<dyn crate::recorder::Recorder>) {
        let _ = self.recorder.set(recorder);
    }

    /// Where this namespace's outcomes are recorded.
    pub fn recorder(&self) -> &dyn crate::recorder::Recorder {
        match self.recorder.get() {
            Some(r) => &**r,
            None => &crate::recorder::NoRecorder,
        }
    }

    /// Before a request answers about `keys`: the keys this node holds nothing for are
    /// read from the store, all in one call (see `swin_sync`'s first touch), and so are
    /// their runtime limits, beside it. The counts are not read where the request's own
    /// store call brings them back: a synchronous increment, a strict admission.
    pub async fn first_touch(&self, keys: &[&str], counting: bool) {
        if !self.sync.keeps_limits_in_store() {
            // local only: nothing to read (and the reads' futures, boxed below, are not
            // carried inside every request's future)
            return;
        }
        // the common case, every key held: no future to box (this runs on every request)
        let counts_held = counting && self.counts_in_the_store() || self.sync.holds_all(keys);
        if counts_held && self.runtime.holds_all(keys) {
            return;
        }
        Box::pin(self.touch_from_store(keys, counting)).await;
    }

    async fn touch_from_store(&self, keys: &[&str], counting: bool) {
        let limits = self.runtime.first_touch(&self.sync, keys);
        if counting && self.counts_in_the_store() {
            limits.await;
        } else {
            tokio::join!(self.sync.first_touch(keys), limits);
        }
    }

    /// What `key` is decided against: its runtime limits when it has some, else
    /// `config` (the namespace's limits for the key, or its descriptor rule's).
    pub fn effective<'a>(&self, key: &str, config: &'a KeyLimits) -> Effective<'a> {
        self.runtime.effective(key, config)
    }

    /// Whether a request's hits go to the store while it waits (synchronous increments,
    /// strict admission): such a request is run to its end even when its caller goes
    /// away, so that it leaves all of its counts or none.
    pub fn counts_in_the_store(&self) -> bool {
        self.admission.waits_on_store()
    }

    /// The same counters and engine under the limits `cfg` sets (a reload that changed
    /// only limits: nothing counted is lost).
    pub fn with_limits(&self, cfg: &NamespaceConfig) -> Namespace {
        Namespace {
            sync: self.sync.clone(),
            store_name: self.store_name.clone(),
            limits: cfg.limits.clone(),
            allow_decrements: cfg.allow_decrements,
            admission_mode: self.admission_mode,
            admission: self.admission.clone(),
            rules: cfg.rules.clone(),
            envoy_response_headers: cfg.envoy_response_headers,
            envoy_dynamic_metadata: cfg.envoy_dynamic_metadata,
            algorithm: cfg.algorithm,
            runtime: {
                if cfg.algorithm != self.algorithm {
                    // runtime limits take the algorithm's shape: read them again
                    self.runtime.set_algorithm(cfg.algorithm);
                    self.runtime.forget_all();
                }
                self.runtime.clone()
            },
            heaviest: self.heaviest.clone(),
            concurrency: cfg.concurrency,
            leases: self.leases.clone(),
            records: self.records.clone(),
            idempotency: cfg.idempotency,
            reservation_caps: cfg.reservation_caps,
            cap_checks: self.cap_checks.clone(),
            reservations: self.reservations.clone(),
            unresolved: self.unresolved.clone(),
            recorder: self.recorder.clone(),
        }
    }
}

/// The running namespaces, by name.
pub type Namespaces = BTreeMap<String, Arc<Namespace>>;

/// The namespace `name` of `namespaces`, or the error that names it unknown.
pub fn namespace_in(
    namespaces: &Namespaces,
    name: &str,
) -> Result<Arc<Namespace>, crate::error::Error> {
    namespaces
        .get(name)
        .cloned()
        .ok_or_else(|| crate::error::Error::unknown_namespace(name))
}
