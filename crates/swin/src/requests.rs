//! A request of several hits decided as one (HTTP batches, Envoy's descriptors): all
//! checked before any is spent, decided together — their synchronous increments share
//! round trips — and all or nothing; and a request whose hits go to the store while it
//! waits runs to its end even when its caller goes away.

use std::sync::Arc;

use crate::decisions::{
    check_effective, first_failure, take_touched, touch_all, validate, Verdict,
};
use crate::error::Error;
use crate::giving_back::give_back;
use crate::state::Namespace;

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

/// One hit of a batch.
#[derive(Debug)]
pub struct Hit<'a> {
    pub ns: Arc<Namespace>,
    pub namespace: &'a str,
    pub key: &'a str,
    pub cost: f64,
}

/// What a batch decided: each hit's verdict, in order, and whether any was denied (then
/// nothing of the batch was spent).
#[derive(Debug)]
pub struct BatchVerdict {
    pub verdicts: Vec<Verdict>,
    pub denied: bool,
}

/// Decides every hit of a batch (Boulder's BatchSpend). Every hit is checked before any
/// is spent, so a bad one leaves the batch untouched; when one is denied, or fails while
/// spending (a full table), what the others took is given back. Errors come with the
/// failing hit's index.
pub async fn decide_all(hits: &[Hit<'_>], dry_run: bool) -> Result<BatchVerdict, (usize, Error)> {
    for (i, h) in hits.iter().enumerate() {
        validate(&h.ns, h.namespace, h.key, h.cost).map_err(|e| (i, e))?;
    }
    // every key this node holds nothing for, read in one call per namespace
    let keys: Vec<(&Namespace, &str)> = hits.iter().map(|h| (&*h.ns, h.key)).collect();
    touch_all(&keys, !dry_run).await;
    // every hit checked against its key's limits (runtime ones read by the touch)
    // before any is spent
    for (i, h) in hits.iter().enumerate() {
        check_effective(&h.ns, h.namespace, h.key, h.cost).map_err(|e| (i, e))?;
    }
    // decided together: synchronous increments of the batch share round trips
    let results = futures_util::future::join_all(
        hits.iter()
            .map(|h| take_touched(&h.ns, h.namespace, h.key, h.cost, dry_run)),
    )
    .await;
    let (verdicts, failed) = first_failure(results);
    let denied = verdicts.iter().flatten().any(|v| !v.allowed());
    if failed.is_some() || denied {
        let at = failed.as_ref().map_or(0, |(i, _)| *i);
        give_back_all(hits, &verdicts, dry_run)
            .await
            .map_err(|e| (at, e))?;
    }
    if let Some(f) = failed {
        return Err(f);
    }
    // nothing of a denied batch was spent: an allowed hit answers what remained before it
    let verdicts = verdicts
        .into_iter()
        .flatten()
        .zip(hits)
        .map(|(v, h)| match denied && v.allowed() {
            true => v.given_back(h.cost),
            false => v,
        })
        .collect();
    Ok(BatchVerdict { verdicts, denied })
}

/// Gives back every allowed hit of `verdicts` (`None`: the hit failed, nothing taken).
async fn give_back_all(
    hits: &[Hit<'_>],
    verdicts: &[Option<Verdict>],
    dry_run: bool,
) -> Result<(), Error> {
    if dry_run {
        return Ok(());
    }
    let back = hits
        .iter()
        .zip(verdicts)
        .filter(|(_, v)| v.as_ref().is_some_and(Verdict::allowed))
        .map(|(h, _)| give_back(&h.ns, h.key, h.cost));
    futures_util::future::join_all(back)
        .await
        .into_iter()
        .collect()
}
