//! Strict admission of GCRA buckets: a node spends only units the store granted it with
//! [`crate::Store::grant`] (see `swin_core::settle_grant`). [`Grants`] owns them.
//!
//! Per key a slot keeps the last grant, how much of it is spent and until when it may be
//! spent (its horizon). A hit that fits in the unspent part, inside the horizon, is
//! admitted from memory; otherwise one grant request for the key goes to the store
//! (`need` = the hit, `want` = the hit and a block that doubles while grants come whole
//! and halves when they do not or when a grant runs out unspent) and the hits behind it
//! wait for its answer. Requests of many keys go to the store together.
//!
//! A grant's unspent units are never given back: the store placed them at the horizon's
//! end, and lowering a TAT that others were granted after is not safe. They lapse with the
//! horizon (at most [`MAX_HORIZON`]); a node that dies holding a grant loses it the same
//! way. A request whose answer is lost is asked again with the same number while its
//! horizon lasts, so the store answers it as it did the first time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use swin_core::{CompactString, Gcra, GrantRequest, Tat, UnixMs};
use tracing::warn;

use super::queue::{queue_for_store, Queue, StoreCalls};
use crate::engine::{nanos, QuotaKeeper};
use crate::store::{Grant, Granted};
use crate::sync::{AtomicI64, Mutex, MutexGuard};
use crate::{NamespaceSync, StoreError};

#[cfg(all(test, swin_loom))]
mod loom_models;

/// The longest a grant may be spent for.
pub const MAX_HORIZON: Duration = Duration::from_secs(1);

/// The shortest: enough for the store's answer to arrive with time to spend it.
pub const MIN_HORIZON: Duration = Duration::from_millis(5);

/// Grants that lapse before one hit could spend them, after which the hit is refused.
const MAX_LAPSED: u32 = 3;

/// The node's clock (`UnixMs`) lags the real one by up to this much.
const CLOCK_GRAIN_NS: i64 = 1_000_000;

/// How long a grant may be spent for: an eighth of the time the bucket takes to refill
/// its burst, between [`MIN_HORIZON`] and [`MAX_HORIZON`]. A bucket granted from when
/// full loses up to `horizon / emission interval` units (the store places every unit of
/// a grant at the horizon's end): at most an eighth of its burst, rounded up.
pub fn horizon(g: &Gcra) -> Duration {
    let refill = g
        .emission_interval()
        .saturating_mul(g.burst().clamp(1, u32::MAX as i64) as u32);
    (refill / 8).clamp(MIN_HORIZON, MAX_HORIZON)
}

/// What a strict GCRA admission answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketView {
    pub allowed: bool,
    /// The bucket's TAT at the store's last answer, every holder's grants in it.
    pub tat_ns: Option<i64>,
    /// Units this node holds and has not spent.
    pub unused: i64,
}

#[derive(Debug, Default)]
struct BucketState {
    seq: i64,
    granted: i64,
    spent: i64,
    /// The grant may be spent until then (Unix ns, the node's clock).
    until_ns: i64,
    /// Units asked for beyond the hit (0: not asked yet).
    block: i64,
    tat_ns: Option<i64>,
    /// A grant request is at the store; hits wait for its answer.
    inflight: bool,
    /// A request whose answer was lost: asked again, with its number, while its horizon
    /// lasts.
    pending: Option<GrantRequest>,
    /// Pruned from the map: a hit that still holds it takes the key's new slot.
    dead: bool,
    /// A debt was forced past the grant since the store last granted units: the bucket
    /// is past its burst, so nothing given back is spent again from this grant.
    forced: bool,
}

impl BucketState {
    fn unused(&self, now_ns: i64) -> i64 {
        if now_ns <= self.until_ns {
            (self.granted - self.spent).max(0)
        } else {
            0
        }
    }

    fn view(&self, allowed: bool, now_ns: i64) -> BucketView {
        BucketView {
            allowed: allowed && !self.forced,
            tat_ns: self.tat_ns,
            unused: self.unused(now_ns),
        }
    }
}

#[derive(Debug, Default)]
struct BucketSlot {
    state: Mutex<BucketState>,
    changed: tokio::sync::Notify,
}

/// The bucket quota a strict namespace was granted, per key, and its store calls.
#[derive(Debug)]
pub struct Grants {
    calls: Arc<StoreCalls>,
    slots: Mutex<HashMap<CompactString, Arc<BucketSlot>>>,
    queue: Arc<std::sync::Mutex<Queue<Grant, Granted>>>,
    /// Request numbers, for every key of this run: a key's slot pruned and made again
    /// never reuses a number the store would answer with an old grant.
    numbers: AtomicI64,
}

impl QuotaKeeper for Grants {
    /// Nothing goes back (see the module header): keys whose grants lapsed are forgotten.
    fn return_unused<'a>(
        &'a self,
        _sync: &'a Arc<NamespaceSync>,
        now: UnixMs,
        _all: bool,
    ) -> futures_util::future::BoxFuture<'a, bool> {
        self.prune(nanos(now));
        Box::pin(std::future::ready(true))
    }

    fn tracked(&self) -> usize {
        self.tracked()
    }

    fn round_trips(&self) -> u64 {
        self.calls.round_trips()
    }
}

impl Grants {
    pub fn new(push: &crate::PushId) -> Self {
        Grants {
            calls: Arc::new(StoreCalls::new(push)),
            slots: Mutex::default(),
            queue: Arc::default(),
            numbers: AtomicI64::new(0),
        }
    }

    /// The holder name of this run (its grants in the store).
    pub fn holder(&self) -> &crate::Holder {
        &self.calls.holder
    }

    fn slot(&self, key: &str) -> Arc<BucketSlot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .entry(key.into())
            .or_insert_with(|| Arc::new(BucketSlot::default()))
            .clone()
    }

    fn tracked(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets keys whose grants lapsed with nothing in flight or to ask again.
    fn prune(&self, now_ns: i64) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|_, slot| {
            let mut s = lock(slot);
            let keep = s.inflight
                || s.pending.is_some_and(|p| now_ns <= p.now_ns + p.horizon_ns)
                || now_ns <= s.until_ns;
            s.dead = !keep;
            keep
        });
    }
}

fn lock(slot: &BucketSlot) -> MutexGuard<'_, BucketState> {
    slot.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The block a key asks for beyond its hit at first: a thousandth of the burst, between
/// 1 and 1,024.
fn first_block(burst: i64) -> i64 {
    (burst / 1000).clamp(1, 1024)
}

impl Grants {
    /// Strict admission of a spend of `cost` units on `key`'s bucket: from units this
    /// node was granted, asking for more when it must. An error means the store could
    /// not be asked: nothing was spent, and the caller decides on its own.
    pub async fn admit(
        &self,
        sync: &Arc<NamespaceSync>,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
    ) -> Result<BucketView, Arc<StoreError>> {
        let started = Instant::now();
        let now_ns = nanos(now);
        // the node's clock as the hit is admitted: later than `now` by what it waited
        let at = || now_ns.saturating_add(started.elapsed().as_nanos() as i64);
        let mut slot = self.slot(key);
        let mut refetch = false;
        // a store slower than the horizon lets every grant lapse before it can be spent:
        // after a few, the hit is refused rather than asking on
        let mut lapsed = 0;
        loop {
            let request = loop {
                if std::mem::take(&mut refetch) {
                    slot = self.slot(key);
                }
                let notified = slot.changed.notified();
                tokio::pin!(notified);
                {
                    let mut s = lock(&slot);
                    match self.spend_held(&mut s, gcra, cost, at()) {
                        Local::Answered(v) => return Ok(v),
                        Local::Ask(request) => break request,
                        Local::Wait => {
                            notified.as_mut().enable();
                        }
                        Local::Pruned => {
                            refetch = true;
                            continue;
                        }
                    }
                }
                notified.await;
            };
            let answer = self.grant_batched(sync, key, request).await;
            let (s, granted, took) = answered(&slot, &request, answer, gcra)?;
            if let Some(tat) = granted.tat_ns {
                let tats = [Tat {
                    key: key.into(),
                    tat_ns: tat,
                }];
                // the bucket as the store showed it, for reads
                sync.counters().buckets().apply(&tats, true);
            }
            if !took {
                return Ok(s.view(false, at()));
            }
            if at() + CLOCK_GRAIN_NS > s.until_ns {
                lapsed += 1;
                if lapsed == MAX_LAPSED {
                    warn!(
                        namespace = sync.name(),
                        "grants lapsed before their answers came"
                    );
                    return Ok(s.view(false, at()));
                }
            }
            // the hit is admitted at the top, inside the horizon (or asks again)
        }
    }

    /// Spends `cost` from the units this node holds when it can; else the request for
    /// more (this hit's, or a request that failed inside its horizon, asked again), or
    /// wait for the one out; or take the key's new slot when this one was pruned.
    fn spend_held(&self, s: &mut BucketState, gcra: &Gcra, cost: i64, t: i64) -> Local {
        if s.dead {
            return Local::Pruned;
        }
        // `now` has whole milliseconds: the real clock may be one ahead
        if cost == 0 || s.unused(t + CLOCK_GRAIN_NS) >= cost {
            s.spent += cost;
            return Local::Answered(s.view(true, t));
        }
        if s.inflight {
            return Local::Wait;
        }
        s.inflight = true;
        match s.pending {
            Some(p) if t <= p.now_ns + p.horizon_ns => return Local::Ask(p),
            _ => {}
        }
        if s.block == 0 {
            s.block = first_block(gcra.burst());
        } else if s.granted > s.spent && s.until_ns < t {
            // a grant lapsed unspent: smaller blocks
            s.block = (s.block / 2).max(1);
        }
        s.seq = 1 + self
            .numbers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Local::Ask(GrantRequest {
            seq: s.seq,
            now_ns: t,
            horizon_ns: horizon(gcra).as_nanos() as i64,
            emission_ns: gcra.emission_ns(),
            burst: gcra.burst(),
            need: cost,
            want: cost.saturating_add(s.block).min(gcra.burst()),
        })
    }

    /// Gives back `cost` units spent on `key` (a refund): this node may spend them again
    /// while its grant lasts, unless a debt was forced past it since (the bucket is past
    /// its burst: nothing goes back). Returns how many went back.
    pub fn give_back(&self, key: &str, cost: i64, now: UnixMs) -> i64 {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = slots.get(key) else {
            return 0;
        };
        let mut s = lock(slot);
        if nanos(now) > s.until_ns || s.forced {
            return 0;
        }
        let back = cost.min(s.spent).max(0);
        s.spent -= back;
        back
    }

    /// Spends up to `cost` units of `key` from what this node was granted and has not
    /// spent (a commit's overrun forced in as debt): answers how many; the rest is the
    /// caller's to count. Nothing unused is left, so the key's next hit asks the store.
    /// The rest moves this node's view of the bucket (its TAT, at `emission_ns` a unit),
    /// so that its answers count the debt until the store next shows it.
    pub fn use_up(&self, key: &str, cost: i64, now: UnixMs, emission_ns: i64) -> i64 {
        let slot = self.slot(key);
        let mut s = lock(&slot);
        let now_ns = nanos(now);
        let from_granted = match s.inflight {
            true => 0,
            false => cost.min(s.unused(now_ns)).max(0),
        };
        s.spent += from_granted;
        let forced = cost - from_granted;
        if forced > 0 {
            s.forced = true;
            let tat = s.tat_ns.unwrap_or(now_ns).max(now_ns);
            s.tat_ns = Some(tat.saturating_add(forced.saturating_mul(emission_ns)));
        }
        from_granted
    }

    /// The key's bucket as this node last saw it in strict admission.
    pub fn view(&self, key: &str, now: UnixMs) -> BucketView {
        let slot = self.slot(key);
        let s = lock(&slot);
        s.view(true, nanos(now))
    }

    /// The key's bucket as this node last saw it from the store; `None` when it has not
    /// asked the store for the key, or forced a debt in since (the node's counts of the
    /// bucket have it, read from the store first).
    pub fn seen(&self, key: &str, now: UnixMs) -> Option<BucketView> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s = lock(slots.get(key)?);
        match s.forced {
            true => None,
            false => s.tat_ns.map(|_| s.view(true, nanos(now))),
        }
    }

    async fn grant_batched(
        &self,
        sync: &Arc<NamespaceSync>,
        key: &str,
        request: GrantRequest,
    ) -> Result<Granted, Arc<StoreError>> {
        let grant = Grant {
            key: key.into(),
            request,
        };
        let calls = self.calls.clone();
        queue_for_store(sync, &self.queue, grant, move |sync, store, grants| {
            let calls = calls.clone();
            async move { calls.grants(&sync, &store, &grants).await }
        })
        .await
    }
}

/// What a bucket's units can do for a spend without the store.
enum Local {
    /// Decided from the units held.
    Answered(BucketView),
    /// Ask the store (this spend's request is the one out).
    Ask(GrantRequest),
    /// Another spend's request is out: wait for its answer.
    Wait,
    /// The slot was pruned from the map: the spend takes the key's new one.
    Pruned,
}

/// The store's answer to `request` taken into its slot, whose lock it holds on for the
/// caller: the answer, and whether it granted anything; or, when the answer was lost,
/// the request kept to ask again.
fn answered<'a>(
    slot: &'a BucketSlot,
    request: &GrantRequest,
    answer: Result<Granted, Arc<StoreError>>,
    gcra: &Gcra,
) -> Result<(MutexGuard<'a, BucketState>, Granted, bool), Arc<StoreError>> {
    let mut s = lock(slot);
    s.inflight = false;
    slot.changed.notify_waiters();
    match answer {
        Ok(granted) => {
            let took = take_grant(&mut s, request, &granted, gcra);
            Ok((s, granted, took))
        }
        Err(e) => {
            s.pending = Some(*request);
            Err(e)
        }
    }
}

/// Takes a grant the store answered `request` with; false when it granted nothing.
fn take_grant(s: &mut BucketState, request: &GrantRequest, granted: &Granted, gcra: &Gcra) -> bool {
    s.pending = None;
    s.tat_ns = granted.tat_ns;
    if granted.granted == 0 {
        return false;
    }
    s.forced = false;
    s.granted = granted.granted;
    s.spent = 0;
    s.until_ns = request.now_ns + request.horizon_ns;
    s.block = if granted.granted >= request.want {
        s.block.saturating_mul(2).min(gcra.burst())
    } else {
        (s.block / 2).max(1)
    };
    true
}
