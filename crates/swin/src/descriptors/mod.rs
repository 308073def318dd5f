//! Envoy's descriptors as one request (a `ShouldRateLimit` call): each descriptor finds
//! its rule — its own limit for this request (envoyproxy/ratelimit's override), else the
//! namespace's descriptor tree, less the rules another matched rule replaces — and is
//! decided on its counter key ([`keys::counter_key`](crate::policy::keys::counter_key)):
//! as hits on a namespace of hits (`hits`), as slots of leases on a concurrency
//! namespace (`slots`). All or nothing either way. The answer has no gRPC type in it;
//! the door renders it.

mod hits;
mod slots;

use std::sync::Arc;
use std::time::Duration;

use swin_core::Decision;

use crate::decisions::Verdict;
use crate::error::Error;
use crate::leases::AcquireAnswer;
use crate::policy::rules::Rule;
use crate::runtime_limits::RuntimeLimit;
use crate::state::Namespace;

/// Whether a request of descriptors on `ns` waits on the store for what it counts or
/// takes (hits that go to the store, leases kept there): the door then runs it to its
/// end in a task of its own, so that a caller who goes away (Envoy's timeout is 20 ms
/// by default) leaves all of it or nothing.
pub fn runs_to_the_end(ns: &Namespace) -> bool {
    match &ns.concurrency {
        Some(_) => matches!(ns.leases, crate::leases::LeaseBook::Store(_)),
        None => ns.counts_in_the_store(),
    }
}

/// Decides the descriptors `asks` on namespace `ns` as one request. An error is a store
/// the request needed and could not use (then nothing of it is counted or taken).
pub async fn decide(ns: &Namespace, asks: &[Descriptor<'_>]) -> Result<Decided, Error> {
    let decided = match &ns.concurrency {
        Some(c) => slots::decide(ns, c, asks).await,
        None => hits::decide(ns, asks).await,
    }?;
    let (recorder, name) = (ns.recorder(), ns.sync.name());
    for c in &decided.counted {
        recorder.decision(name, &c.policy, c.allowed, c.shadow_denied);
    }
    for what in &decided.leases {
        recorder.lease(name, what);
    }
    Ok(decided)
}

/// One descriptor of a request, as the door read it.
#[derive(Debug, Clone)]
pub struct Descriptor<'a> {
    /// Its entries, in order: (key, value).
    pub entries: Vec<(&'a str, &'a str)>,
    /// Its hits (the request's `hits_addend` unless its own says).
    pub hits: u64,
    /// Envoy's `is_negative_hits`: the hits go back.
    pub negative: bool,
    /// Its own limit for this request: requests per unit, in Envoy's unit (checked by
    /// the door: a unit of time).
    pub limit: Option<(u32, i32)>,
}

/// What one descriptor answers.
#[derive(Debug, Clone)]
pub enum Shown {
    /// No rule applies: OK, no limit.
    NoRule,
    /// Its rule sets no limit of hits: OK, the largest remaining.
    Unlimited,
    /// Decided under its rule: the decision it shows and whether it denies the request;
    /// `runtime` when a runtime limit on its key replaced the rule's limits.
    Decided {
        /// What it shows (remaining, reset).
        decision: Decision,
        /// Whether it denies the request.
        denied: bool,
        /// The runtime limit that replaced the rule's, if one did.
        runtime: Option<Arc<RuntimeLimit>>,
    },
    /// Slots of a concurrency key: whether it is OK, its limit in flight, the slots
    /// left, and until a slot is sure to be free (or the lease lapses).
    Slots {
        /// Whether a slot was free.
        ok: bool,
        /// Slots in flight allowed.
        limit: u64,
        /// Slots left.
        remaining: u64,
        /// Until a slot is sure to be free.
        until: Duration,
    },
}

/// A descriptor's answer and the rule that applied to it (for the dynamic metadata).
#[derive(Debug, Clone)]
pub struct Answer {
    /// The rule that applied (none: no rule matched).
    pub rule: Option<Arc<Rule>>,
    /// What it shows.
    pub shown: Shown,
}

/// A hit a descriptor took, as the metrics count it.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The rule's name, or (unnamed) the limit that decided.
    pub policy: Arc<str>,
    /// Whether the hit was admitted.
    pub allowed: bool,
    /// Admitted only because its limit is in shadow.
    pub shadow_denied: bool,
}

/// What a request of descriptors decided.
#[derive(Debug, Clone)]
pub struct Decided {
    /// One answer per descriptor, in order.
    pub answers: Vec<Answer>,
    /// Whether any descriptor (not in shadow) is over its limit.
    pub over: bool,
    /// The strictest descriptor, for the RateLimit headers.
    pub strictest: Option<Strictest>,
    /// Each hit or acquire decided, for the metrics.
    pub counted: Vec<Counted>,
    /// What each lease call did (`released`, `acquired`, `denied`), for the metrics.
    pub leases: Vec<&'static str>,
}

/// The strictest descriptor of a request.
#[derive(Debug, Clone)]
pub enum Strictest {
    /// Of hits: its verdict, and whether it denies.
    Hits(Verdict, bool),
    /// Of slots: its acquire, and whether the request is over.
    Slots(AcquireAnswer, bool),
}

/// Over the limit whatever happens: nothing to count, nothing to wait for.
pub fn blocked() -> Decision {
    Decision {
        allowed: false,
        limit: 0.0,
        remaining: 0.0,
        reset_after: std::time::Duration::ZERO,
        retry_after: std::time::Duration::ZERO,
    }
}
