//! One admission interface: may a hit of `cost` on a key pass under its limits, and
//! giving back what was admitted. A namespace picks its implementation once, when it is
//! built ([`for_namespace`]): windows or buckets (the namespace's algorithm), each
//! eventual (decided on this node's counts, which the sync loop keeps up with the
//! store, or through the store in synchronous mode) or strict (admitted only from quota
//! held or granted from the store). Callers never ask which one they have.
//!
//! The engine ([`NamespaceSync`]) keeps the counters and the sync loop; an eventual
//! implementation decides with them. A strict one also owns the quota this node holds
//! from the store (`holds.rs` for windows, `grants.rs` for buckets, their store calls in
//! `queue.rs`), which the engine's loop has it give back ([`crate::QuotaKeeper`]); one
//! type, `strict.rs`, admits from either.

mod buckets;
mod grants;
mod holds;
mod queue;
mod strict;
mod windows;

pub use self::grants::{horizon, BucketView, Grants, MAX_HORIZON, MIN_HORIZON};
pub use self::holds::{Holds, StrictView, IDLE_MS};
use self::strict::Strict;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use swin_core::{CoreError, Decision, Gcra, UnixMs, WindowLimit};

use crate::{NamespaceSync, StoreError, SyncMode};

/// What a hit is decided against: a key's window limits, or its GCRA bucket.
#[derive(Debug, Clone, Copy)]
pub enum Bounds<'a> {
    Windows(&'a [WindowLimit]),
    Bucket(&'a Gcra),
}

/// Whether a decision spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Decides only (a dry run): nothing is counted, held or granted.
    DryRun,
    /// Spends when allowed.
    IfAllowed,
    /// Spends allowed and denied hits alike (a namespace that counts denied hits).
    Always,
}

/// Why quota goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// A hit this node has just admitted and that is not wanted after all (a request
    /// decided all or nothing whose other hits were denied): taken back exactly, in the
    /// windows it was counted in (`at`: the time its take was given, which may lie in a
    /// window that has ended since).
    Undo { at: UnixMs },
    /// Hits admitted but not used (a refund): given back never below zero, on the
    /// cluster's count (read first where the node keeps more than its own), in the
    /// current window only.
    Refund,
    /// The unused part of a reservation settled by its commit: given back as a refund
    /// is, from the current window first and then, for what is left, from the previous
    /// one (a reservation's takes count in the window it was made in, which a stream
    /// that crosses a window's end has left by its commit), never below zero in either.
    Settle,
    /// The unused part of a reservation settled by its commit where its record says the
    /// reservation counted it: given back as a refund is (never below zero, on the
    /// cluster's count), in the windows of `at` (a take's time, in the current or the
    /// previous window).
    SettleAt { at: UnixMs },
}

/// A decision, and the limit it comes from (an index into [`Bounds::Windows`]; 0 for a
/// bucket).
#[derive(Debug, Clone)]
pub struct Admitted {
    pub decision: Decision,
    pub strictest: usize,
    /// Why a hit was refused other than by its counts: `store_unreachable` (strict,
    /// `on_store_failure = "deny"`, the store cannot be asked).
    pub reason: Option<&'static str>,
    /// Allowed only because the limits that would deny it are in shadow (the decision's
    /// figures are theirs).
    pub shadow_denied: bool,
}

/// What a give-back returned, and (for [`GiveBack::Refund`]) the key after it as a dry
/// run would see it.
#[derive(Debug, Clone)]
pub struct GivenBack {
    pub given: f64,
    pub after: Option<Admitted>,
}

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// A cost or count the limits cannot take (the caller's input).
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// The store had to answer and could not.
    #[error("{what}: {cause}")]
    Store {
        what: &'static str,
        cause: Arc<StoreError>,
    },
    #[error("no limits to decide against")]
    NoLimits,
}

/// What a strict namespace does while its store cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreFailure {
    /// Refuses every hit (`store_unreachable`).
    Deny,
    /// Decides on this node's counts, as eventual admission does, and pushes later.
    Local,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The one interface every door decides through.
pub trait Admission: Send + Sync + std::fmt::Debug {
    /// Decides a hit of `cost` on `key` under `quota` at `now` (the engine's clock) and
    /// spends it as `spend` says. The key and cost are valid, and the key was touched
    /// (see [`NamespaceSync::first_touch`]). An undo of it gives the same `now`
    /// ([`GiveBack::Undo`]).
    fn take<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        spend: Spend,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Admitted, AdmitError>>;

    /// Gives back `cost` of hits on `key` admitted under `quota`.
    fn give_back<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>>;

    /// Whether a hit goes to the store while its request waits (synchronous mode,
    /// strict admission): the hits of one request then share round trips, and the
    /// request is run to its end even when its caller goes away.
    fn waits_on_store(&self) -> bool;
}

/// A namespace's engine, made ready for its algorithm (`buckets`: GCRA) and admission
/// (`strict`: what it does when the store cannot be asked; `None`: eventual), and the
/// implementation it decides through. The only place the modes are told apart.
pub fn for_namespace(
    sync: NamespaceSync,
    buckets: bool,
    strict: Option<OnStoreFailure>,
) -> (Arc<NamespaceSync>, Arc<dyn Admission>) {
    let sync = if buckets { sync.with_buckets() } else { sync };
    let push = sync.push_id().clone();
    match (buckets, strict) {
        (false, None) => {
            let sync = Arc::new(sync);
            (sync.clone(), Arc::new(windows::Eventual::new(sync)))
        }
        (true, None) => {
            let sync = Arc::new(sync);
            (sync.clone(), Arc::new(buckets::Eventual::new(sync)))
        }
        (false, Some(f)) => {
            let quota = Arc::new(Holds::new(&push));
            let sync = Arc::new(sync.with_quota(quota.clone()));
            let local = Box::new(windows::Eventual::new(sync.clone()));
            (sync.clone(), Arc::new(Strict::new(sync, quota, local, f)))
        }
        (true, Some(f)) => {
            let quota = Arc::new(Grants::new(&push));
            let sync = Arc::new(sync.with_quota(quota.clone()));
            let local = Box::new(buckets::Eventual::new(sync.clone()));
            (sync.clone(), Arc::new(Strict::new(sync, quota, local, f)))
        }
    }
}

/// Awaits every future: all at once when `at_once` (their store calls then share round
/// trips), else one after another (work that never waits on the store gains nothing
/// from being polled together).
pub async fn together<F: Future>(
    at_once: bool,
    futures: impl ExactSizeIterator<Item = F>,
) -> Vec<F::Output> {
    if at_once {
        return futures_util::future::join_all(futures).await;
    }
    let mut out = Vec::with_capacity(futures.len());
    for f in futures {
        out.push(f.await);
    }
    out
}

/// The strictest of `decisions` ([`Decision::strictest`]) and its index.
/// The strictest decision of a key's window limits, one per limit of `set`, where limits
/// in shadow decide but never deny: a denial by a limit enforced wins as ever (its wait,
/// not a shadow's); a hit only limits in shadow deny is allowed, with their figures (its
/// `retry_after` when it would have passed), and marked `shadow_denied`.
fn strictest_of(set: &[WindowLimit], decisions: Vec<Decision>) -> Result<Admitted, AdmitError> {
    decide_strictest(decisions, |i| set[i].shadow)
}

/// [`strictest_of`] with every limit enforced (strict admission, which holds quota for
/// every limit of a hit and so takes none in shadow: see the config's checks).
fn strictest(decisions: Vec<Decision>) -> Result<Admitted, AdmitError> {
    decide_strictest(decisions, |_| false)
}

fn decide_strictest(
    decisions: Vec<Decision>,
    shadow: impl Fn(usize) -> bool,
) -> Result<Admitted, AdmitError> {
    let enforced_denies = decisions
        .iter()
        .enumerate()
        .any(|(i, d)| !shadow(i) && !d.allowed);
    // the key's debt: the most any enforced limit is past
    let debt = decisions
        .iter()
        .enumerate()
        .filter(|(i, _)| !shadow(*i))
        .map(|(_, d)| d.debt)
        .fold(0.0, f64::max);
    let all: Vec<(usize, Decision)> = decisions
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !enforced_denies || !shadow(*i))
        .collect();
    let (strictest, mut decision) = Decision::strictest(&all, |(_, d)| d)
        .cloned()
        .ok_or(AdmitError::NoLimits)?;
    let shadow_denied = !decision.allowed && !enforced_denies;
    // allowed; its wait stays, as when the hit would have passed
    decision.allowed |= shadow_denied;
    decision.debt = debt;
    Ok(Admitted {
        decision,
        strictest,
        reason: None,
        shadow_denied,
    })
}

/// Whether the engine sends every hit to the store while its request waits.
fn synchronous(sync: &NamespaceSync) -> bool {
    sync.mode() == SyncMode::Synchronous
}

fn store_error(what: &'static str) -> impl FnOnce(Arc<StoreError>) -> AdmitError {
    move |cause| AdmitError::Store { what, cause }
}

/// A decision at `now` on the engine's clock.
fn now() -> UnixMs {
    crate::now()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use swin_core::{WindowAlgorithm, WindowSize};

    use super::*;

    fn limit(secs: u64, shadow: bool) -> WindowLimit {
        WindowLimit::new(
            WindowSize::new(secs).expect("size"),
            10.0,
            WindowAlgorithm::Sliding,
        )
        .expect("limit")
        .shadowed(shadow)
    }

    fn d(allowed: bool, retry_secs: u64, remaining: f64) -> Decision {
        Decision {
            allowed,
            limit: 10.0,
            remaining,
            reset_after: Duration::from_secs(60),
            retry_after: Duration::from_secs(retry_secs),
            debt: 0.0,
        }
    }

    #[test]
    fn a_limit_in_shadow_decides_but_never_denies() {
        let set = [limit(60, false), limit(3600, true)];
        // only the shadow limit denies: allowed, with its figures, marked
        let a = strictest_of(&set, vec![d(true, 0, 4.0), d(false, 30, 0.0)]).expect("admitted");
        assert!(a.decision.allowed && a.shadow_denied);
        assert_eq!((a.strictest, a.decision.remaining), (1, 0.0));
        assert_eq!(a.decision.retry_after, Duration::from_secs(30));
        // the enforced limit denies: denied with its own wait, not the shadow's longer one
        let a = strictest_of(&set, vec![d(false, 5, 0.0), d(false, 30, 0.0)]).expect("admitted");
        assert!(!a.decision.allowed && !a.shadow_denied);
        assert_eq!(
            (a.strictest, a.decision.retry_after),
            (0, Duration::from_secs(5))
        );
        // neither denies: as without shadow
        let a = strictest_of(&set, vec![d(true, 0, 4.0), d(true, 0, 2.0)]).expect("admitted");
        assert!(a.decision.allowed && !a.shadow_denied);
        assert_eq!(a.strictest, 1);
    }
}
