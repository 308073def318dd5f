//! Giving back, through the namespace's admission: a hit allowed and then not wanted (a
//! batch or an Envoy request denied as a whole) is taken back exactly
//! ([`Take::undo`](crate::pipeline::Take::undo)); a refund gives back hits admitted but
//! not used, never below zero ([`refund`]).

use swin_core::check_cost;

use crate::decisions::{limits_of, HitAnswer};
use crate::error::Error;
use crate::pipeline::Take;
use crate::policy::input::check_key;
use crate::state::Namespace;

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
    let limits = limits_of(ns, namespace)?;
    let t = Take::under(ns, key, cost, ns.effective(key, limits.for_key(key)), false);
    let (given, after) = t.refund().await?;
    Ok(HitAnswer {
        allowed: given > 0.0,
        retry_after: 0.0,
        reason: None,
        refunded: Some(given),
        ..after.answer()
    })
}
