//! Giving back, through the namespace's admission: a hit allowed and then not wanted (a
//! batch or an Envoy request denied as a whole) is taken back exactly; a refund gives
//! back hits admitted but not used, never below zero.

use swin_core::check_cost;
use swin_sync::admission::GiveBack;

use crate::decisions::{bounds, limits_of, verdict, HitAnswer};
use crate::error::Error;
use crate::policy::input::check_key;
use crate::policy::limits::KeyLimits;
use crate::state::Namespace;

/// Takes back an allowed hit (a batch that was denied as a whole).
pub async fn undo(ns: &Namespace, key: &str, cost: f64) -> Result<(), Error> {
    match ns
        .limits
        .as_ref()
        .map(|l| ns.effective(key, l.for_key(key)))
    {
        Some(limits) => undo_under(ns, key, &limits, cost).await,
        None => Ok(()),
    }
}

/// Takes back a hit allowed under `limits` (the key's own, or a descriptor rule's).
pub async fn undo_under(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    cost: f64,
) -> Result<(), Error> {
    ns.admission
        .give_back(key, bounds(limits), cost, GiveBack::Undo)
        .await?;
    Ok(())
}

/// Gives back up to `cost` of hits admitted under `limits` and not used (a refund, see
/// [`refund`]); answers the key after it, as a dry run would see it.
pub async fn refund_under(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    cost: f64,
) -> Result<swin_core::Decision, Error> {
    let back = ns
        .admission
        .give_back(key, bounds(limits), cost, GiveBack::Refund)
        .await?;
    back.after.map(|a| a.decision).ok_or(Error::Internal)
}

/// Gives back `cost` of hits admitted but not used, in every window the key's limits
/// count in, never below zero (GCRA: Boulder's refund, never past a full bucket).
/// `allowed` says whether anything was given back; the rest describes the key after it,
/// as a dry run would.
pub async fn refund(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
) -> Result<HitAnswer, Error> {
    check_key(key)?;
    check_cost(cost)?;
    let limits = ns.effective(key, limits_of(ns, namespace)?.for_key(key));
    let limits = &*limits;
    let back = ns
        .admission
        .give_back(key, bounds(limits), cost, GiveBack::Refund)
        .await?;
    let Some(after) = back.after else {
        return Err(Error::Internal);
    };
    Ok(HitAnswer {
        allowed: back.given > 0.0,
        retry_after: 0.0,
        reason: None,
        refunded: Some(back.given),
        ..verdict(limits, after).answer()
    })
}
