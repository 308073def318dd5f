//! GCRA buckets, eventual and strict.
//!
//! Eventual: the bucket's TAT moves by compare-and-swap only when the spend is allowed
//! (on this node's buckets, or through the store in synchronous mode). Strict: spent
//! from units the store granted this node, asking for more when it must.

use std::sync::Arc;
use std::time::Duration;

use swin_core::{Decision, Gcra, UnixMs};

use super::grants::{horizon, BucketView, Grants};
use super::strict::Quota;
use super::{now, Admission, AdmitError, Admitted, Bounds, BoxFuture, GiveBack, GivenBack, Spend};
use crate::NamespaceSync;

fn bucket(bounds: Bounds<'_>) -> Result<&Gcra, AdmitError> {
    match bounds {
        Bounds::Bucket(g) => Ok(g),
        Bounds::Windows(_) => Err(AdmitError::NoLimits),
    }
}

fn admitted(decision: Decision) -> Admitted {
    Admitted {
        decision,
        strictest: 0,
        reason: None,
        shadow_denied: false,
    }
}

#[derive(Debug)]
pub(super) struct Eventual {
    sync: Arc<NamespaceSync>,
}

impl Eventual {
    pub(super) fn new(sync: Arc<NamespaceSync>) -> Self {
        Eventual { sync }
    }

    async fn decide(
        &self,
        g: &Gcra,
        key: &str,
        cost: i64,
        spend: Spend,
        now: UnixMs,
    ) -> Result<Admitted, AdmitError> {
        let d = match spend {
            Spend::DryRun => self.sync.dry_run(g, key, cost, now).await?,
            Spend::IfAllowed | Spend::Always => {
                self.sync
                    .spend(g, key, cost, now, spend == Spend::Always)
                    .await?
            }
        };
        Ok(admitted(d))
    }
}

impl Admission for Eventual {
    fn take<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        spend: Spend,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Admitted, AdmitError>> {
        Box::pin(async move {
            let g = bucket(bounds)?;
            // a forced spend (overrun as debt) may pass the burst
            let units = match spend {
                Spend::Always => g.forced_units(cost)?,
                _ => g.units(cost)?,
            };
            self.decide(g, key, units, spend, now).await
        })
    }

    /// Boulder's refund, never past a full bucket; an undo and a settlement are the same
    /// (a bucket has no windows: its TAT moves back, and a TAT before now is a full
    /// bucket whenever the undo comes).
    fn give_back<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        _why: GiveBack,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>> {
        Box::pin(async move {
            let g = bucket(bounds)?;
            let d = self
                .sync
                .refund_tokens(g, key, g.units(cost)?, now())
                .await?;
            Ok(GivenBack {
                given: if d.allowed { cost } else { 0.0 },
                after: Some(admitted(d)),
            })
        })
    }

    fn waits_on_store(&self) -> bool {
        super::synchronous(&self.sync)
    }
}

/// A strict GCRA admission's answer: admitted or not as the grant said; the
/// figures from the bucket as the store last showed it (every node's grants counted as
/// spent) with this node's unspent units added back.
fn granted_decision(
    g: &Gcra,
    v: &BucketView,
    now: UnixMs,
    cost: i64,
) -> Result<Decision, AdmitError> {
    let now_ns = now.0.saturating_mul(1_000_000);
    let mut d = g.dry_run(v.tat_ns, now_ns, cost)?.decision;
    if v.allowed {
        let room = g.dry_run(v.tat_ns, now_ns, 0)?.decision.remaining;
        d.allowed = true;
        d.retry_after = Duration::ZERO;
        d.remaining = room + v.unused as f64;
    } else if d.allowed {
        // the bucket has the units but a grant's share or horizon left them out: ask
        // again in a horizon
        d.allowed = false;
        d.remaining = 0.0;
        d.retry_after = horizon(g);
    }
    Ok(d)
}

/// Bucket grants: a hit is spent from units the store granted this node.
impl Quota for Grants {
    fn admit<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Option<Admitted>, AdmitError>> {
        Box::pin(async move {
            let g = bucket(bounds)?;
            let cost = g.units(cost)?;
            let Ok(v) = Grants::admit(self, sync, g, key, cost, now).await else {
                return Ok(None);
            };
            Ok(Some(admitted(granted_decision(g, &v, now, cost)?)))
        })
    }

    /// The units go back to this node, to spend again while its grant lasts.
    fn give_back<'a>(
        &'a self,
        _sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>> {
        Box::pin(async move {
            let g = bucket(bounds)?;
            let given = Grants::give_back(self, key, g.units(cost)?, now) as f64;
            // the key after it, as this node last saw it from the store (none: as a dry
            // run sees it, `Strict::give_back`)
            let after = match (why, self.seen(key, now)) {
                (GiveBack::Undo { .. }, _) | (_, None) => None,
                (_, Some(v)) => Some(admitted(granted_decision(g, &v, now, 0)?)),
            };
            Ok(GivenBack { given, after })
        })
    }

    fn use_up(&self, key: &str, bounds: Bounds<'_>, cost: f64, now: UnixMs) -> Option<Vec<f64>> {
        let g = bucket(bounds).ok()?;
        let units = g.forced_units(cost).ok()?;
        let from_granted = Grants::use_up(self, key, units, now, g.emission_ns());
        Some(vec![from_granted as f64])
    }

    /// From the bucket as this node last saw it from the store, its unspent units its
    /// own to spend (none while a debt it forced in is not yet in the store's answer);
    /// a key it never asked the store for is decided by the eventual implementation.
    fn dry_run(
        &self,
        _sync: &NamespaceSync,
        key: &str,
        bounds: Bounds<'_>,
        cost: f64,
        now: UnixMs,
    ) -> Option<Result<Admitted, AdmitError>> {
        let g = bucket(bounds).ok()?;
        let v = self.seen(key, now)?;
        let decide = || {
            let units = g.units(cost)?;
            let now_ns = now.0.saturating_mul(1_000_000);
            let mut d = g.dry_run(v.tat_ns, now_ns, units)?.decision;
            if v.allowed && v.unused >= units {
                let room = g.dry_run(v.tat_ns, now_ns, 0)?.decision.remaining;
                d.allowed = true;
                d.retry_after = Duration::ZERO;
                d.remaining = room + (v.unused - units) as f64;
            }
            Ok(admitted(d))
        };
        Some(decide())
    }

    fn unreachable(&self, bounds: Bounds<'_>, _now: UnixMs) -> Result<Admitted, AdmitError> {
        Ok(Admitted {
            decision: Decision {
                allowed: false,
                limit: bucket(bounds)?.burst() as f64,
                remaining: 0.0,
                reset_after: Duration::ZERO,
                retry_after: Duration::from_secs(1),
                debt: 0.0,
            },
            strictest: 0,
            reason: Some("store_unreachable"),
            shadow_denied: false,
        })
    }
}
