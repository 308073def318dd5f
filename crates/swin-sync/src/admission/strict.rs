//! Strict admission, for windows and buckets alike: a hit is admitted only from quota
//! this node holds from the store (window holds, bucket grants: a [`Quota`]), asking the
//! store for more when it must. While the store cannot be asked, the namespace refuses
//! (`on_store_failure = "deny"`) or decides as eventual admission does (`"local"`); dry
//! runs are decided as a hit would be, on the quota held (window holds: the quota this
//! node holds unused is not counted as used), or by the eventual implementation.

use std::sync::Arc;

use swin_core::UnixMs;

use super::{
    now, Admission, AdmitError, Admitted, Bounds, BoxFuture, GiveBack, GivenBack, OnStoreFailure,
    Spend,
};
use crate::{NamespaceSync, QuotaKeeper};

/// The quota a strict namespace admits from, and how its limits answer from it: window
/// holds (`windows.rs`) or bucket grants (`buckets.rs`). The engine's loop returns what
/// it holds unused ([`QuotaKeeper`]).
pub(super) trait Quota: QuotaKeeper {
    /// Admits a hit of `cost` on `key` from the quota this node holds, asking the store
    /// for more when it must, with the figures as the store last showed them; a hit
    /// denied spends nothing (one that spends whatever it is answered is counted past
    /// the quota by [`Strict`]). `Ok(None)`: the store cannot be asked.
    fn admit<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Option<Admitted>, AdmitError>>;

    /// Gives `cost` back to this node's quota, to admit again; for a refund, with the key
    /// after it as a hit of nothing would see it (at `now`; an undo, in the window of its
    /// take).
    fn give_back<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>>;

    /// Counts `cost` on `key` whatever the limits say, past what any hold or grant
    /// could take (a commit's overrun as debt): from the quota this node holds unused
    /// first, the rest counted as eventual admission counts; answers the rest per limit
    /// (`None`: all of it is the rest, in every limit).
    fn use_up(
        &self,
        _key: &str,
        _bounds: Bounds<'_>,
        _cost: f64,
        _now: UnixMs,
    ) -> Option<Vec<f64>> {
        None
    }

    /// A hit refused because the store cannot be asked (`store_unreachable`).
    fn unreachable(&self, bounds: Bounds<'_>, now: UnixMs) -> Result<Admitted, AdmitError>;

    /// A dry run: what a hit of `cost` would be answered, from what this node holds,
    /// spending and asking nothing; `None`: the eventual implementation decides it.
    fn dry_run(
        &self,
        _sync: &NamespaceSync,
        _key: &str,
        _bounds: Bounds<'_>,
        _cost: f64,
        _now: UnixMs,
    ) -> Option<Result<Admitted, AdmitError>> {
        None
    }
}

/// Strict admission of a namespace: its quota, and the eventual implementation of its
/// algorithm that decides dry runs and, with `on_store_failure = "local"`, every hit
/// while the store cannot be asked.
#[derive(Debug)]
pub(super) struct Strict {
    sync: Arc<NamespaceSync>,
    quota: Arc<dyn Quota>,
    local: Box<dyn Admission>,
    on_store_failure: OnStoreFailure,
}

impl Strict {
    pub(super) fn new(
        sync: Arc<NamespaceSync>,
        quota: Arc<dyn Quota>,
        local: Box<dyn Admission>,
        on_store_failure: OnStoreFailure,
    ) -> Self {
        Strict {
            sync,
            quota,
            local,
            on_store_failure,
        }
    }
}

impl Admission for Strict {
    fn take<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        spend: Spend,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Admitted, AdmitError>> {
        Box::pin(async move {
            if spend == Spend::DryRun {
                if let Some(a) = self.quota.dry_run(&self.sync, key, bounds, cost, now) {
                    return a;
                }
            } else if spend == Spend::Always && past_any_quota(bounds, cost) {
                return self.force(key, bounds, cost, now).await;
            } else if spend == Spend::Always {
                // counted whatever the limits say: admitted from quota held when it can
                // be, else counted past it (this node's unused quota first)
                let admitted = self.quota.admit(&self.sync, key, bounds, cost, now).await?;
                return match admitted {
                    Some(a) if a.decision.allowed => Ok(a),
                    Some(a) => match bounds {
                        Bounds::Windows(_) => {
                            self.count_past(key, bounds, cost, now).await?;
                            Ok(a)
                        }
                        Bounds::Bucket(_) => self.force(key, bounds, cost, now).await,
                    },
                    None => {
                        let local = self.local.take(key, bounds, cost, spend, now).await?;
                        match self.on_store_failure {
                            OnStoreFailure::Deny => self.quota.unreachable(bounds, now),
                            OnStoreFailure::Local => Ok(local),
                        }
                    }
                };
            } else {
                match self.quota.admit(&self.sync, key, bounds, cost, now).await? {
                    Some(admitted) => return Ok(admitted),
                    None if self.on_store_failure == OnStoreFailure::Deny => {
                        return self.quota.unreachable(bounds, now)
                    }
                    // "local": decided on this node's counts, counted locally and pushed
                    // later, as eventual admission does
                    None => {}
                }
            }
            self.local.take(key, bounds, cost, spend, now).await
        })
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        bounds: Bounds<'a>,
        cost: f64,
        why: GiveBack,
    ) -> BoxFuture<'a, Result<GivenBack, AdmitError>> {
        Box::pin(async move {
            let now = now();
            let mut back = self
                .quota
                .give_back(&self.sync, key, bounds, cost, why, now)
                .await?;
            if back.after.is_none() && !matches!(why, GiveBack::Undo { .. }) {
                // the quota has no view of the key after it: as a dry run sees it, the
                // key (its windows, its bucket) read from the store first (within
                // `answer_timeout`), as a refund on an eventual node does
                self.load(key, bounds, now).await;
                back.after = Some(
                    match self.quota.dry_run(&self.sync, key, bounds, 0.0, now) {
                        Some(a) => a?,
                        None => {
                            self.local
                                .take(key, bounds, 0.0, Spend::DryRun, now)
                                .await?
                        }
                    },
                );
            }
            Ok(back)
        })
    }

    fn waits_on_store(&self) -> bool {
        true
    }
}

impl Strict {
    /// More than any quota could hold, counted whatever the limits say (a commit's
    /// overrun forced in as debt): what this node holds unused first, the rest counted
    /// as eventual admission counts, and pushed at once, so that the key's next ask of
    /// the store finds it counted.
    async fn force(
        &self,
        key: &str,
        bounds: Bounds<'_>,
        cost: f64,
        now: UnixMs,
    ) -> Result<Admitted, AdmitError> {
        if let Bounds::Windows(_) = bounds {
            self.count_past(key, bounds, cost, now).await?;
            return self.local.take(key, bounds, 0.0, Spend::DryRun, now).await;
        }
        // the bucket as the store has it (other nodes' grants in it), for the debt's
        // answer: this node may never have spent on the key
        self.load(key, bounds, now).await;
        let admitted = match self.quota.use_up(key, bounds, cost, now) {
            Some(from_granted) => {
                let rest = cost - from_granted.first().copied().unwrap_or(0.0);
                self.local
                    .take(key, bounds, rest, Spend::Always, now)
                    .await?
            }
            None => {
                self.local
                    .take(key, bounds, cost, Spend::Always, now)
                    .await?
            }
        };
        self.push_now(now).await;
        Ok(admitted)
    }

    /// Counts `cost` on a key of window limits past what this node's quota admits:
    /// what it holds unused first (its answers then count the rest, see
    /// [`Quota::use_up`]), the rest as eventual admission counts, pushed at once.
    async fn count_past(
        &self,
        key: &str,
        bounds: Bounds<'_>,
        cost: f64,
        now: UnixMs,
    ) -> Result<(), AdmitError> {
        let set = match bounds {
            Bounds::Windows(set) => set,
            Bounds::Bucket(_) => return Err(AdmitError::NoLimits),
        };
        let from_held = self
            .quota
            .use_up(key, bounds, cost, now)
            .unwrap_or_else(|| vec![0.0; set.len()]);
        for (l, held) in set.iter().zip(from_held) {
            if cost > held {
                self.sync
                    .increment(key, l.window.secs(), cost - held, now)
                    .await?;
            }
        }
        self.push_now(now).await;
        Ok(())
    }

    /// Reads the key from the store into this node's counts (its windows, or its
    /// bucket), within `answer_timeout`; a store that does not answer leaves the node's
    /// view.
    async fn load(&self, key: &str, bounds: Bounds<'_>, now: UnixMs) {
        let read = match bounds {
            Bounds::Windows(_) => self.sync.load_key(key, now).await,
            Bounds::Bucket(_) => self.sync.load_bucket(key).await,
        };
        if let Err(e) = read {
            tracing::debug!(namespace = self.sync.name(), cause = %e, "answered on this node's view of the key");
        }
    }

    /// Pushes what this node counted past its quota, so that the key's next ask of the
    /// store finds it counted.
    async fn push_now(&self, now: UnixMs) {
        if let Err(e) = self.sync.sync_requested(now).await {
            tracing::debug!(namespace = self.sync.name(), cause = %e, "a debt is pushed by the next sync");
        }
    }
}

/// Whether `cost` is more than a hold or grant of `bounds` could ever take.
fn past_any_quota(bounds: Bounds<'_>, cost: f64) -> bool {
    match bounds {
        Bounds::Windows(set) => set.iter().any(|l| cost > l.limit),
        Bounds::Bucket(g) => cost > g.burst() as f64,
    }
}
