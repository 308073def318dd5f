//! The one pipeline every request of hits runs through: a `/hit`, an HTTP batch,
//! Envoy's descriptors and a reservation's charge each build [`Take`]s and run these
//! stages, in this order, and nothing else decides a hit:
//!
//! 1. **check** what can be checked before the store is read: the key, a cost some
//!    limit could take, that the namespace has limits ([`Take::of_key`]);
//! 2. **first touch**, once per namespace for all of the request's keys ([`touch`]):
//!    counts and runtime limits this node does not hold yet are read;
//! 3. **effective limits**: the key's runtime limits replace the config's, and the cost
//!    is checked against them ([`Take::resolve`]);
//! 4. **take together** ([`take_all`]): synchronous increments and strict holds of one
//!    request share round trips; shadow is applied here, in each ask's [`Ask::take`],
//!    and only here;
//! 5. **undo** what was taken when any take was refused or failed ([`undo_admitted`]):
//!    all or nothing.
//!
//! An acquire of slots (a concurrency namespace's ask: [`Acquiring`], from HTTP's
//! `/acquire` or Envoy's descriptors) runs the same stages: checked when it is made,
//! taken together with its request's others (shadow applied in its [`Ask::take`]),
//! undone when its request is refused. It has no first touch (its store is asked on
//! every acquire) and no runtime limits. A request that waits on the store runs to its
//! end in a task of its own ([`to_the_end`]).

mod hits;
mod leases;

use std::future::Future;

use crate::error::Error;
use crate::state::Namespace;

pub use self::hits::Take;
pub use self::leases::{acquire, release, release_for_envoy, renew, Acquiring};

/// Runs a request's decision to its end in a task of its own when `whole` (its hits go
/// to the store while it waits: see [`Namespace::counts_in_the_store`]), so that a caller
/// who goes away before the answer leaves all of its counts or none, never some.
pub async fn to_the_end<T: Send + 'static>(
    whole: bool,
    decide: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    if !whole {
        return decide.await;
    }
    // the task keeps the request's span (traces: its store calls stay its children)
    let decide = tracing::Instrument::in_current_span(decide);
    tokio::spawn(decide).await.map_err(|e| {
        tracing::error!(cause = %e, "a decision's task failed");
        Error::Internal
    })?
}

/// What the stages ask of an ask — a hit ([`Take`]) or an acquire of slots
/// ([`Acquiring`]) — once it is checked: to be taken, and undone when its request is
/// refused as a whole.
pub trait Ask: Sync {
    /// What taking it answers.
    type Taken: Send + Sync;

    /// Stage 4 for this ask alone (`dry_run`: decide, spend nothing; acquires are never
    /// asked so).
    fn take(&self, dry_run: bool) -> impl Future<Output = Result<Self::Taken, Error>> + Send;

    /// Whether what it took was admitted (so undone if its request is refused).
    fn admitted(taken: &Self::Taken) -> bool;

    /// Stage 5 for this ask: puts back exactly what it took.
    fn undo(&self, taken: &Self::Taken) -> impl Future<Output = Result<(), Error>> + Send;
}

/// Stage 2: the first touch of every key of a request, one read per namespace for all
/// of its keys (see [`Namespace::first_touch`]); `counting` when the request counts
/// (not a dry run).
pub async fn touch<'a>(hits: &[(&'a Namespace, &'a str)], counting: bool) {
    let mut touched: Vec<&Namespace> = Vec::new();
    for &(ns, _) in hits {
        if touched.iter().any(|n| std::ptr::eq(*n, ns)) {
            continue;
        }
        let keys: Vec<&str> = hits
            .iter()
            .filter(|(o, _)| std::ptr::eq(*o, ns))
            .map(|&(_, k)| k)
            .collect();
        ns.first_touch(&keys, counting).await;
        touched.push(ns);
    }
}

/// Stage 2 for the takes of a request (see [`touch`]).
pub async fn touch_takes<'a, 'r: 'a>(
    takes: impl IntoIterator<Item = &'a Take<'r>>,
    counting: bool,
) {
    let keys: Vec<(&Namespace, &str)> = takes.into_iter().map(|t| (t.ns, &*t.key)).collect();
    match keys.as_slice() {
        // one key: no list of namespaces to walk
        [(ns, key)] => ns.first_touch(&[key], counting).await,
        keys => touch(keys, counting).await,
    }
}

/// Stage 4: takes every ask of a request together (see [`Ask::take`]), so that
/// synchronous increments, strict holds and acquires share round trips; each result in
/// order.
pub async fn take_all<'a, A: Ask + 'a>(
    asks: impl IntoIterator<Item = &'a A>,
    dry_run: bool,
) -> Vec<Result<A::Taken, Error>> {
    futures_util::future::join_all(asks.into_iter().map(|a| a.take(dry_run))).await
}

/// Stage 5: undoes every ask that was admitted (`None`: it failed, nothing taken), as
/// one request refused as a whole; nothing in a dry run.
pub async fn undo_admitted<'a, A: Ask + 'a>(
    taken: impl IntoIterator<Item = (&'a A, Option<&'a A::Taken>)>,
    dry_run: bool,
) -> Result<(), Error> {
    if dry_run {
        return Ok(());
    }
    let back = taken.into_iter().filter_map(|(a, t)| match t {
        Some(t) if A::admitted(t) => Some(a.undo(t)),
        _ => None,
    });
    futures_util::future::join_all(back)
        .await
        .into_iter()
        .collect()
}
