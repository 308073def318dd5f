//! Sharing rounds: every [`ROUND`], each namespace's buckets post this node's entries
//! to the store and read every node's, the buckets are divided again, and each proxy is
//! told what changed (a share that went down, grew by more than 2 %, or is half-way to
//! its ttl) without waiting for its next report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use swin_sync::admission::OnStoreFailure;
use swin_sync::store::Demands;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::{own_shares, Action};
use super::{BucketAction, Shares, State, ROUND};
use crate::config::AdmissionMode;

/// A proxy's bucket not reported for this many of its intervals no longer asks.
const STALE_INTERVALS: u32 = 3;

/// Each live local proxy's action for one bucket, by the latest division: (proxy,
/// action), in proxy order.
pub(super) fn division(
    state: &mut State,
    node: &str,
    namespace: &str,
    key: &str,
    now: Instant,
) -> Vec<(u64, Action)> {
    let mut own = Vec::new();
    let mut who = Vec::new();
    let mut shape = None;
    for (&id, p) in &state.proxies {
        if p.namespace.as_deref() != Some(namespace) {
            continue;
        }
        let Some(b) = p.buckets.get(key) else {
            continue;
        };
        let stale = p.interval.unwrap_or(Duration::from_secs(1)) * STALE_INTERVALS;
        if let Some(e) = b.entry(p.open, stale.max(ROUND * 2), now) {
            own.push(e);
            who.push((id, p.ttl(), e.asks.is_some()));
            shape = Some((b.limit, b.unit));
        }
    }
    let Some((limit, unit)) = shape else {
        return Vec::new();
    };
    let others = state
        .remote
        .get(&(namespace.to_owned(), key.to_owned()))
        .map_or(&[][..], Vec::as_slice);
    let shares = own_shares(node, &own, others, limit);
    who.into_iter()
        .zip(shares)
        .filter(|((_, _, live), _)| *live)
        .map(|((id, ttl, _), share)| (id, Action::of_share(share, unit, ttl)))
        .collect()
}

/// Whether a proxy told `sent` at `at` is to be told `new` now.
fn tell(sent: Option<&(Action, Instant)>, new: &Action, now: Instant) -> bool {
    let Some((old, at)) = sent else {
        return true;
    };
    if now.duration_since(*at) >= old.ttl() / 2 {
        return true;
    }
    match (old.share(), new.share()) {
        _ if old.enforced_alike(new) => false,
        (Some(o), Some(n)) if n < o => true,
        (Some(o), Some(n)) => n - o > (o / 50).max(1),
        _ => true,
    }
}

/// This node's entries per namespace: (namespace, entries to post); proxies gone for
/// good are forgotten on the way.
fn entries(state: &mut State, node: &str, now: Instant) -> Vec<(String, Vec<Demands>)> {
    let store_now = swin_sync::now();
    let mut by_ns: BTreeMap<String, BTreeMap<String, (Vec<f64>, Duration)>> = BTreeMap::new();
    state.proxies.retain(|_, p| {
        let stale = (p.interval.unwrap_or(Duration::from_secs(1)) * STALE_INTERVALS).max(ROUND * 2);
        let ttl = p.ttl();
        let open = p.open;
        p.buckets
            .retain(|_, b| b.entry(open, stale, now).is_some() || b.sent.is_none() && open);
        let Some(ns) = &p.namespace else {
            return open;
        };
        for (key, b) in &p.buckets {
            if let Some(e) = b.entry(open, stale, now) {
                let slot = by_ns
                    .entry(ns.clone())
                    .or_default()
                    .entry(key.clone())
                    .or_default();
                slot.0.extend(e.posted());
                slot.1 = slot.1.max(ttl);
            }
        }
        open || !p.buckets.is_empty()
    });
    by_ns
        .into_iter()
        .map(|(ns, buckets)| {
            let posted = buckets
                .into_iter()
                .map(|(bucket, (demands, ttl))| Demands {
                    bucket,
                    node: node.to_owned(),
                    demands,
                    expires_at: swin_core::UnixMs(
                        store_now
                            .0
                            .saturating_add((ttl + ROUND * 2).as_millis() as i64),
                    ),
                })
                .collect();
            (ns, posted)
        })
        .collect()
}

impl Shares {
    /// Runs sharing rounds until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut every = tokio::time::interval(ROUND);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => self.round().await,
            }
        }
    }

    /// One round, per namespace: read every node's entries, divide, post this node's
    /// entries with what its proxies now hold, then tell the proxies. Posting before
    /// telling means no proxy uses room the other nodes cannot see taken.
    pub async fn round(&self) {
        let now = Instant::now();
        let serving = entries(&mut self.state(), &self.node, now);
        for (name, posted) in serving {
            let Some(ns) = self.namespace(&name) else {
                continue;
            };
            let keys: Vec<&str> = posted.iter().map(|d| d.bucket.as_str()).collect();
            let read = ns.sync.read_demands(&keys, swin_sync::now()).await;
            let deny_on_failure = matches!(
                ns.admission_mode,
                AdmissionMode::Strict {
                    on_store_failure: OnStoreFailure::Deny
                }
            );
            let (told, posted) = {
                let mut state = self.state();
                let grow = match read {
                    Ok(read) => {
                        state.failing.remove(&name);
                        remember(&mut state, &name, &keys, read);
                        true
                    }
                    Err(e) => {
                        tracing::warn!(namespace = name, cause = %e, "demands not read: no share grows until the store answers");
                        state.failing.entry(name.clone()).or_insert(now);
                        false
                    }
                };
                // with the store out for a ttl, a strict namespace that denies then denies
                let failing = state
                    .failing
                    .get(&name)
                    .copied()
                    .filter(|_| deny_on_failure);
                let told = self.divide_all(&mut state, &name, &keys, failing, grow, now);
                let posted = entries(&mut state, &self.node, now)
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| p)
                    .unwrap_or_default();
                (told, posted)
            };
            match ns.sync.post_demands(&posted).await {
                Ok(()) => send(told),
                Err(e) => {
                    // the others cannot see what grew: only what came down is told
                    tracing::warn!(namespace = name, cause = %e, "demands not posted: shares that would grow wait");
                    send(shrinking(told));
                }
            }
        }
    }

    /// Divides each of `keys` again and collects what each proxy is to be told; with
    /// the store out for longer than a proxy's ttl (`failing`), deny.
    fn divide_all(
        &self,
        state: &mut State,
        name: &str,
        keys: &[&str],
        failing: Option<Instant>,
        grow: bool,
        now: Instant,
    ) -> Told {
        let mut told: BTreeMap<u64, Vec<(BucketAction, bool)>> = BTreeMap::new();
        for key in keys {
            for (id, mut action) in division(state, &self.node, name, key, now) {
                let Some(p) = state.proxies.get_mut(&id) else {
                    continue;
                };
                if failing.is_some_and(|since| now.duration_since(since) >= p.ttl()) {
                    action = Action::DenyAll { ttl: p.ttl() };
                }
                let Some(b) = p.buckets.get_mut(*key) else {
                    continue;
                };
                if !grow {
                    // the store is out: nothing grows, what is held is told again
                    match b.no_more_than_held(action, now) {
                        Some(a) => action = a,
                        None => continue,
                    }
                }
                if tell(b.sent.as_ref(), &action, now) {
                    let held = b.sent.as_ref().and_then(|(a, _)| a.share()).unwrap_or(0);
                    let grew = action.share().is_none_or(|s| s > held);
                    b.sent = Some((action, now));
                    let a = BucketAction {
                        bucket: b.id.clone(),
                        action,
                    };
                    told.entry(id).or_default().push((a, grew));
                }
            }
        }
        told.into_iter()
            .filter_map(|(id, actions)| Some((state.proxies.get(&id)?.tx.clone(), actions)))
            .collect()
    }
}

/// Every node's entries as read, kept per bucket until the next read.
fn remember(state: &mut State, name: &str, keys: &[&str], read: Vec<Demands>) {
    let mut by_key: HashMap<(String, String), Vec<Demands>> = keys
        .iter()
        .map(|k| ((name.to_owned(), (*k).to_owned()), Vec::new()))
        .collect();
    for d in read {
        if let Some(v) = by_key.get_mut(&(name.to_owned(), d.bucket.clone())) {
            v.push(d);
        }
    }
    state.remote.extend(by_key);
}

/// Of what proxies are to be told, the shares that do not grow.
fn shrinking(told: Told) -> Told {
    told.into_iter()
        .map(|(tx, actions)| (tx, actions.into_iter().filter(|(_, grew)| !grew).collect()))
        .collect()
}

/// What each proxy's queue is to be sent, each action with whether its share grew.
type Told = Vec<(
    tokio::sync::mpsc::Sender<Vec<BucketAction>>,
    Vec<(BucketAction, bool)>,
)>;

/// Sends each proxy its actions; a proxy whose queue is full gets them at a later round
/// (they were recorded as sent: the half-ttl refresh tells it again).
fn send(told: Told) {
    for (tx, actions) in told.into_iter().filter(|(_, a)| !a.is_empty()) {
        let actions: Vec<BucketAction> = actions.into_iter().map(|(a, _)| a).collect();
        if tx.try_send(actions).is_err() {
            tracing::debug!("a proxy's queue is full or closed: told at a later round");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_told_when_its_share_falls_or_grows_enough_or_half_its_ttl_passed() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        let a = |n| Action::of_share(n, Duration::from_secs(1), ttl);
        let sent = (a(100), t0);
        assert!(!tell(Some(&sent), &a(100), t0));
        assert!(tell(Some(&sent), &a(99), t0));
        assert!(!tell(Some(&sent), &a(102), t0));
        assert!(tell(Some(&sent), &a(103), t0));
        assert!(tell(Some(&sent), &a(100), t0 + Duration::from_secs(1)));
        assert!(tell(None, &a(1), t0));
        assert!(tell(Some(&sent), &Action::AllowAll { ttl }, t0));
    }
}
