//! Window limits (sliding or fixed), eventual and strict.
//!
//! Eventual: the hit is counted first, in every window at once, and decided on the
//! counts before it; a denied hit is then taken back out (unless every hit spends).
//! Strict: admitted from quota this node holds, holding more from the store when it
//! must; the figures come from the window as the store last showed it.

use std::sync::Arc;
use std::time::Duration;

use swin_core::{Decision, UnixMs, WindowLimit, WindowRate};

use super::holds::{Holds, StrictView};
use super::strict::Quota;
use super::{
    now, store_error, strictest, strictest_of, together, Admission, AdmitError, Admitted, Bounds,
    BoxFuture, GiveBack, GivenBack, Spend,
};
use crate::{NamespaceSync, SyncMode};

fn limits(bounds: Bounds<'_>) -> Result<&[WindowLimit], AdmitError> {
    match bounds {
        Bounds::Windows(set) if !set.is_empty() => Ok(set),
        _ => Err(AdmitError::NoLimits),
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
        key: &str,
        set: &[WindowLimit],
        cost: f64,
        spend: Spend,
        now: UnixMs,
    ) -> Result<Admitted, AdmitError> {
        let sync = &self.sync;
        let counters = sync.counters();
        // counted now, every window at once (synchronous increments of the key share a
        // round trip); the decision is on the counts before this hit. A dry run where
        // hits wait on the store reads the key's count there, as a hit would see it (a
        // store that does not answer in time leaves the node's view, as for a hit).
        let counted = if spend == Spend::DryRun {
            if self.waits_on_store() {
                let read = tokio::time::timeout(sync.answer_within(), sync.load_key(key, now));
                let failed = match read.await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("no answer in time".to_owned()),
                };
                if let Some(cause) = failed {
                    tracing::debug!(
                        namespace = sync.name(),
                        cause,
                        "a dry run is decided on this node's view"
                    );
                }
            }
            Vec::new()
        } else {
            together(
                self.waits_on_store(),
                set.iter()
                    .map(|l| sync.increment(key, l.window.secs(), cost, now)),
            )
            .await
        };
        if counted.iter().any(Result::is_err) {
            let back = set
                .iter()
                .zip(&counted)
                .filter(|(_, r)| r.is_ok())
                .map(|(l, _)| sync.undo_increment(key, l.window.secs(), cost, now));
            futures_util::future::join_all(back).await;
        }
        let counted: Vec<WindowRate> = counted.into_iter().collect::<Result<_, _>>()?;
        let mut decisions = Vec::with_capacity(set.len());
        for (i, l) in set.iter().enumerate() {
            let (current, previous) = match counted.get(i) {
                Some(r) => (r.current - cost, r.previous),
                None => {
                    let r = counters.table(l.window.secs())?.rate(key, now, None);
                    (r.current, r.previous)
                }
            };
            decisions.push(l.decide(current, previous, now, cost)?);
        }
        let admitted = strictest_of(set, decisions)?;
        if !admitted.decision.allowed && spend == Spend::IfAllowed {
            let back = set
                .iter()
                .map(|l| sync.undo_increment(key, l.window.secs(), cost, now));
            for r in futures_util::future::join_all(back).await {
                r?;
            }
        }
        Ok(admitted)
    }

    fn waits_on_store(&self) -> bool {
        super::synchronous(&self.sync)
    }

    /// A refund: never below zero, on the cluster's count of the key, not only this
    /// node's (a refund may come to a node that did not admit the hits, or never held
    /// the key); a store that cannot be read is an error, never a refund of nothing
    /// that says it succeeded. A reservation's settlement: from the windows of its
    /// take's time (`SettleAt`), or from the current window and then, for what it cannot
    /// take back, the previous one (`Settle`).
    async fn refund(
        &self,
        key: &str,
        set: &[WindowLimit],
        cost: f64,
        now: UnixMs,
        why: GiveBack,
    ) -> Result<GivenBack, AdmitError> {
        let (first, previous_too) = match why {
            GiveBack::SettleAt { at } => (at, false),
            GiveBack::Settle => (now, true),
            _ => (now, false),
        };
        let sync = &self.sync;
        if sync.mode() != SyncMode::LocalOnly {
            sync.load_key(key, now)
                .await
                .map_err(|e| store_error("refund: read the key's count")(Arc::new(e)))?;
        }
        let counters = sync.counters();
        let mut given = 0.0f64;
        let mut decisions = Vec::with_capacity(set.len());
        for l in set {
            let size = l.window.secs();
            let table = counters.table(size)?;
            let r = table.rate(key, first, None);
            let back = cost.min(r.current.max(0.0));
            if back > 0.0 {
                sync.refund_hits(key, size, back, first).await?;
            }
            let earlier = match previous_too {
                true => (cost - back).min(r.previous.max(0.0)),
                false => 0.0,
            };
            if earlier > 0.0 {
                // a time in the previous window: its count is lowered, never below zero
                let then = UnixMs(now.0 - i64::from(size) * 1000);
                sync.refund_hits(key, size, earlier, then).await?;
            }
            given = given.max(back + earlier);
            let r = table.rate(key, now, None);
            decisions.push(l.decide(r.current, r.previous, now, 0.0)?);
        }
        Ok(GivenBack {
            given,
            after: Some(strictest_of(set, decisions)?),
        })
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
        Box::pin(async move { self.decide(key, limits(bounds)?, cost, spend, now).await })
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>> {
        Box::pin(async move {
            let set = limits(bounds)?;
            let at = match why {
                GiveBack::Refund | GiveBack::Settle | GiveBack::SettleAt { .. } => {
                    return self.refund(key, set, cost, now(), why).await
                }
                // in the windows the take counted in, not those of the undo's time
                GiveBack::Undo { at } => at,
            };
            for l in set {
                self.sync
                    .undo_increment(key, l.window.secs(), cost, at)
                    .await?;
            }
            Ok(GivenBack {
                given: cost,
                after: None,
            })
        })
    }

    fn waits_on_store(&self) -> bool {
        self.waits_on_store()
    }
}

/// A strict admission's answer: admitted or not as the quota said; the figures from the
/// window as the store last showed it. The counts before this hit are the window's count
/// less what this node holds unused (and less this hit, when admitted). (A hit that
/// spends whatever it is answered is counted past the quota by the strict admission.)
fn verdict(
    set: &[WindowLimit],
    views: &[StrictView],
    cost: f64,
    now: UnixMs,
) -> Result<Admitted, AdmitError> {
    let mut decisions = Vec::with_capacity(set.len());
    for (l, v) in set.iter().zip(views) {
        let spent = if v.allowed { cost } else { 0.0 };
        let before = (v.current - v.unused - spent).max(0.0);
        let mut d = l.decide(before, v.previous, now, cost)?;
        if v.allowed {
            // what the window leaves, never the quota held past it (a refund in debt
            // leaves this node holding more than the window has room for)
            d.allowed = true;
            d.retry_after = Duration::ZERO;
        } else if d.allowed {
            // the counts leave room, but other nodes hold it: it comes back to the
            // store when they do not use it
            d.allowed = false;
            d.remaining = 0.0;
            d.retry_after = Duration::from_millis(super::IDLE_MS as u64);
        }
        decisions.push(d);
    }
    strictest(decisions)
}

/// Window holds: a hit is admitted when every limit of the key holds its cost.
impl Quota for Holds {
    fn admit<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Option<Admitted>, AdmitError>> {
        Box::pin(async move {
            let set = limits(bounds)?;
            match Holds::admit(self, sync, key, set, cost, now).await {
                Ok(views) => Ok(Some(verdict(set, &views, cost, now)?)),
                Err(_) => Ok(None),
            }
        })
    }

    fn give_back<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>> {
        Box::pin(async move {
            let set = limits(bounds)?;
            let given = match why {
                // in the window the take held it in, not that of the undo's time
                GiveBack::Undo { at } => {
                    let given = Holds::give_back(self, key, set, cost, at, false);
                    return Ok(GivenBack { given, after: None });
                }
                GiveBack::Refund => Holds::give_back(self, key, set, cost, now, false),
                GiveBack::Settle => Holds::give_back(self, key, set, cost, now, true),
                GiveBack::SettleAt { at } => Holds::give_back(self, key, set, cost, at, false),
            };
            if given == 0.0 {
                // nothing went back (this node may hold nothing of the key): the key as
                // a dry run sees it (`Strict::give_back`)
                return Ok(GivenBack { given, after: None });
            }
            // the key after it: a hit of 0 is answered from what this node holds (and
            // rolls the key's slot to the current window)
            let key_after = || async {
                match Holds::admit(self, sync, key, set, 0.0, now).await {
                    Ok(views) => verdict(set, &views, 0.0, now),
                    Err(_) => self.unreachable(bounds, now),
                }
            };
            let mut after = key_after().await?;
            // a commit's give-back in a window that has ended goes to the store now, and
            // the answer counts that window as the store then has it
            let ended = match why {
                GiveBack::Settle => true,
                GiveBack::SettleAt { at } => set
                    .iter()
                    .any(|l| l.window.start_of(at) != l.window.start_of(now)),
                _ => false,
            };
            if ended && given > 0.0 {
                self.return_ended(sync, key, set).await;
                after = key_after().await?;
            }
            Ok(GivenBack {
                given,
                after: Some(after),
            })
        })
    }

    /// Decided as [`verdict`] decides a hit, on the window as the store last showed
    /// it to this node (its holds' view, else its counts), this node's unused quota not
    /// counted as used: a dry run answers what a hit would.
    fn dry_run(
        &self,
        sync: &NamespaceSync,
        key: &str,
        bounds: Bounds<'_>,
        cost: f64,
        now: UnixMs,
    ) -> Option<Result<Admitted, AdmitError>> {
        let decide = || {
            let set = limits(bounds)?;
            let mut decisions = Vec::with_capacity(set.len());
            for l in set {
                let (size, start) = (l.window.secs(), l.window.start_of(now));
                let v = match self.seen(key, size, start) {
                    Some(v) => v,
                    None => {
                        let r = sync.counters().table(size)?.rate(key, now, None);
                        StrictView {
                            allowed: false,
                            current: r.current,
                            previous: r.previous,
                            unused: 0.0,
                        }
                    }
                };
                let mut d = l.decide((v.current - v.unused).max(0.0), v.previous, now, cost)?;
                // admitted from what this node holds unused, as a hit would be, unless
                // the window is past the limit (a debt, or a lowered limit)
                if v.unused >= cost && d.allowed {
                    d.retry_after = Duration::ZERO;
                    d.remaining = d.remaining.max(v.unused.floor());
                }
                decisions.push(d);
            }
            strictest(decisions)
        };
        Some(decide())
    }

    fn use_up(&self, key: &str, bounds: Bounds<'_>, cost: f64, now: UnixMs) -> Option<Vec<f64>> {
        let set = limits(bounds).ok()?;
        Some(Holds::use_up(self, key, set, cost, now))
    }

    /// Refused, with the figures of the key's first window.
    fn unreachable(&self, bounds: Bounds<'_>, now: UnixMs) -> Result<Admitted, AdmitError> {
        let l = &limits(bounds)?[0];
        let start_ms = l.window.start_of(now) * 1000;
        let to_end = (start_ms + i64::from(l.window.secs()) * 1000 - now.0).max(0);
        Ok(Admitted {
            decision: Decision {
                allowed: false,
                limit: l.limit,
                remaining: 0.0,
                reset_after: Duration::from_millis(to_end as u64),
                retry_after: Duration::from_secs(1),
                debt: 0.0,
            },
            strictest: 0,
            reason: Some("store_unreachable"),
            shadow_denied: false,
        })
    }
}
