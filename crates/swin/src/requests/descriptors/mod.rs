//! Envoy's descriptors as one request (a `ShouldRateLimit` call): each descriptor finds
//! its rule — its own limit for this request (envoyproxy/ratelimit's override), else the
//! namespace's descriptor tree, less the rules another matched rule replaces — and is
//! decided on its counter key ([`keys::counter_key`](crate::policy::keys::counter_key)):
//! as hits on a namespace of hits (`hits`), as slots of leases on a concurrency
//! namespace (`slots`). All or nothing either way. The answer has no gRPC type in it;
//! the door renders it.

mod answer;
mod hits;
mod slots;

pub use self::answer::Answer;
pub(crate) use self::answer::Shown;

use std::sync::Arc;

use swin_core::Decision;

use crate::config::Concurrency;
use crate::decisions::Verdict;
use crate::error::Error;
use crate::leases::AcquireAnswer;
use crate::pipeline::{Plan, Ran, Request};
use crate::policy::headers;
use crate::policy::rules::Rule;
use crate::state::Namespace;

/// Envoy's descriptors on a namespace as one request (a `ShouldRateLimit` call). An
/// error is a store the request needed and could not use (then nothing of it is counted
/// or taken).
#[derive(Debug)]
pub(crate) struct Descriptors {
    ns: Arc<Namespace>,
    parts: Parts,
}

/// What each descriptor does, found before the request runs.
enum Parts {
    Hits(Vec<(Option<Arc<Rule>>, hits::Part)>),
    Slots(Concurrency, Vec<(Option<Arc<Rule>>, slots::Part)>),
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Parts::Hits(p) => write!(f, "Hits({})", p.len()),
            Parts::Slots(_, p) => write!(f, "Slots({})", p.len()),
        }
    }
}

impl Descriptors {
    /// The request of `asks` on `ns`: each descriptor's rule found.
    pub(crate) fn new(ns: Arc<Namespace>, asks: &[Descriptor<'_>]) -> Descriptors {
        let parts = match ns.concurrency {
            Some(c) => Parts::Slots(c, slots::parts(&ns, &c, asks)),
            None => Parts::Hits(hits::parts(&ns, asks)),
        };
        Descriptors { ns, parts }
    }
}

impl Request for Descriptors {
    type Answer = Decided;
    type Acted = ();

    /// Whether it waits on the store for what it counts or takes (hits that go to the
    /// store, leases kept there): then it runs to its end, so that a caller who goes away
    /// (Envoy's timeout is 20 ms by default) leaves all of it or nothing.
    fn waits_on_store(&self) -> bool {
        match &self.ns.concurrency {
            Some(_) => self.ns.leases.is_shared(),
            None => self.ns.counts_in_the_store(),
        }
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        Ok(match &self.parts {
            Parts::Hits(p) => hits::plan(&self.ns, p),
            Parts::Slots(c, p) => slots::plan(&self.ns, c, p),
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, plan: Plan<'_>, ran: Ran<()>) -> Result<Decided, Error> {
        let mut d = match &self.parts {
            Parts::Hits(p) => hits::answer(p, plan, ran),
            Parts::Slots(_, p) => slots::answer(p, plan, ran),
        }?;
        d.envoy_headers = self.ns.envoy_response_headers();
        d.envoy_metadata = self.ns.envoy_dynamic_metadata();
        Ok(d)
    }
}

/// One descriptor of a request, borrowing its entries from the caller's request (a
/// request of descriptors keeps only what it found for each: its rule and counter key).
#[derive(Debug, Clone)]
pub struct Descriptor<'a> {
    entries: Vec<(&'a str, &'a str)>,
    hits: u64,
    negative: bool,
    limit: Option<(u32, i32)>,
}

impl<'a> Descriptor<'a> {
    /// A descriptor of `entries` (key, value), in order, asking for `hits` (Envoy's
    /// `hits_addend`; `negative`: `is_negative_hits`, the hits go back), under its own
    /// `limit` for this request if it carries one (requests per unit, in Envoy's unit,
    /// a unit of time).
    pub fn new(
        entries: Vec<(&'a str, &'a str)>,
        hits: u64,
        negative: bool,
        limit: Option<(u32, i32)>,
    ) -> Descriptor<'a> {
        Descriptor {
            entries,
            hits,
            negative,
            limit,
        }
    }

    fn pairs(&self) -> &[(&'a str, &'a str)] {
        &self.entries
    }
}

/// Each descriptor's own limit is in a unit of time Envoy names (SECOND 1 … WEEK 7).
pub(crate) fn check_units(asks: &[Descriptor<'_>]) -> Result<(), Error> {
    for (i, a) in asks.iter().enumerate() {
        if let Some((_, unit)) = a.limit {
            if crate::policy::rules::unit_secs(unit).is_none() {
                return Err(Error::BadRequest(format!(
                    "descriptors[{i}].limit.unit: {unit} is not a unit of time (SECOND 1, MINUTE 2, HOUR 3, DAY 4, MONTH 5, YEAR 6, WEEK 7)"
                )));
            }
        }
    }
    Ok(())
}

/// What a request of descriptors decided.
#[derive(Debug, Clone)]
pub struct Decided {
    /// One answer per descriptor, in order.
    pub(crate) answers: Vec<Answer>,
    /// Whether any descriptor (not in shadow) is over its limit.
    pub(crate) over: bool,
    /// The strictest descriptor, for the RateLimit headers.
    pub(crate) strictest: Option<Strictest>,
    /// The namespace's `envoy_response_headers`.
    pub(crate) envoy_headers: bool,
    /// The namespace's `envoy_dynamic_metadata`.
    pub(crate) envoy_metadata: bool,
}

impl Decided {
    /// One answer per descriptor, in order.
    pub fn answers(&self) -> &[Answer] {
        &self.answers
    }

    /// Whether any descriptor (not in shadow) is over its limit.
    pub fn over(&self) -> bool {
        self.over
    }

    /// Whether Envoy's answer carries the RateLimit headers (the namespace's
    /// `envoy_response_headers`) and its dynamic metadata (`envoy_dynamic_metadata`).
    pub fn envoy_answers(&self) -> (bool, bool) {
        (self.envoy_headers, self.envoy_metadata)
    }

    /// The headers of the strictest descriptor, by name (none when nothing was counted):
    /// a hit's as [`Verdict::headers`](crate::requests::Verdict::headers) says, with
    /// Retry-After only when it denies (a rule in shadow lets an over-limit hit pass,
    /// and `swin-shadow-denied` says so); slots' as
    /// [`AcquireAnswer::headers`](crate::requests::AcquireAnswer::headers), Retry-After
    /// when the request is over.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match &self.strictest {
            Some(Strictest::Hits(v, denied)) => {
                crate::decisions::headers_of(v, &v.policies, *denied, None)
            }
            Some(Strictest::Slots(a, over)) => {
                headers::of_slots(a.limit, a.acquired.in_flight, *over, a.retry_after_secs())
            }
            None => Vec::new(),
        }
    }
}

/// The strictest descriptor of a request.
#[derive(Debug, Clone)]
pub(crate) enum Strictest {
    /// Of hits: its verdict, and whether it denies.
    Hits(Verdict, bool),
    /// Of slots: its acquire, and whether the request is over.
    Slots(AcquireAnswer, bool),
}

/// Over the limit whatever happens: nothing to count, nothing to wait for.
pub(crate) fn blocked() -> Decision {
    Decision {
        allowed: false,
        limit: 0.0,
        remaining: 0.0,
        reset_after: std::time::Duration::ZERO,
        retry_after: std::time::Duration::ZERO,
        debt: 0.0,
    }
}
