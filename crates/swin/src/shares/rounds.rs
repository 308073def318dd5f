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
/// A proxy's reporting interval until its second report tells it (Envoy's filter does
/// not say it): long, so that a proxy reporting every few seconds is not taken for gone
/// before its second report; its stream ending says at once that it is.
const UNKNOWN_INTERVAL: Duration = Duration::from_secs(20);

/// How long a bucket of a proxy reporting every `interval` may go unreported and still
/// ask.
fn stale_after(interval: Option<Duration>) -> Duration {
    (interval.unwrap_or(UNKNOWN_INTERVAL) * STALE_INTERVALS).max(ROUND * 2)
}

/// Each live local proxy's action for one bucket, by the latest division: (proxy,
/// action), in proxy order.
pub(super) fn division(
    state: &State,
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
        if let Some(e) = b.entry(p.open, stale_after(p.interval), now) {
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
        let stale = stale_after(p.interval);
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
    /// entries with what its proxies will be assigned, then tell the proxies. Posting before
    /// telling means no proxy uses room the other nodes cannot see taken; a share grows
    /// only once this node's entries have been posted (a round after a start or an
    /// outage), so two nodes coming back never both see the room as theirs.
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
            let (plans, before, posted, quiet) = {
                let mut state = self.state();
                let mode = match read {
                    Ok(read) => {
                        remember(&mut state, &name, &keys, read);
                        match state.posted.contains(&name) {
                            true => Mode::Grow,
                            false => Mode::Hold,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(namespace = name, cause = %e, "demands not read: assignments are left to lapse");
                        Mode::Quiet {
                            deny: deny_on_failure,
                        }
                    }
                };
                let plans = self.divide_all(&mut state, &name, &keys, mode, now);
                let before = apply(&mut state, &plans, now);
                let posted = entries(&mut state, &self.node, now)
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| p)
                    .unwrap_or_default();
                let quiet = matches!(mode, Mode::Quiet { .. });
                (plans, before, posted, quiet)
            };
            // a store that could not be read is not written to either: the round ends
            // sooner, and a deny goes out while what it replaces still holds
            let ok = !quiet && ns.sync.post_demands(&posted).await.is_ok();
            let mut state = self.state();
            if ok {
                state.posted.insert(name);
            } else {
                // the others cannot see these assignments: only what came down is told, the
                // rest is as it was
                tracing::warn!(
                    namespace = name,
                    "demands not posted: only shares that come down are told"
                );
                state.posted.remove(&name);
                revert(&mut state, &plans, before);
            }
            let told = plans
                .into_iter()
                .filter(|p| ok || p.told_anyway())
                .filter_map(|p| Some((state.proxies.get(&p.id)?.tx.clone(), p.told)))
                .collect();
            drop(state);
            send(told);
        }
    }

    /// What each of `keys`' proxies is to be told, by the division now and `mode`.
    fn divide_all(
        &self,
        state: &mut State,
        name: &str,
        keys: &[&str],
        mode: Mode,
        now: Instant,
    ) -> Vec<Plan> {
        let mut plans = Vec::new();
        for key in keys {
            for (id, divided) in division(state, &self.node, name, key, now) {
                let Some(p) = state.proxies.get_mut(&id) else {
                    continue;
                };
                let ttl = p.ttl();
                let Some(b) = p.buckets.get_mut(*key) else {
                    continue;
                };
                if !matches!(mode, Mode::Quiet { .. }) {
                    b.divided = Some(divided);
                }
                let action = match mode {
                    Mode::Grow => divided,
                    // not posted yet: nothing grows, what is held is told again
                    Mode::Hold => match b.no_more_than_held(divided, now) {
                        Some(a) => a,
                        None => continue,
                    },
                    // the store is out: assignments lapse at their ttl; a strict
                    // namespace that denies tells its proxies to deny when what they
                    // were last told is half-way to its lapse (when it would have been
                    // told again), and from then on
                    Mode::Quiet { deny: true } if lapses_within(b.sent.as_ref(), ttl / 2, now) => {
                        Action::DenyAll { ttl }
                    }
                    Mode::Quiet { .. } => continue,
                };
                if !tell(b.sent.as_ref(), &action, now) {
                    continue;
                }
                let held = b.sent.as_ref().and_then(|(a, _)| a.share()).unwrap_or(0);
                let change = match action.share() {
                    None => Change::Grew,
                    Some(s) if s > held => Change::Grew,
                    Some(s) if s < held => Change::Fell,
                    Some(_) => Change::Same,
                };
                let told = BucketAction {
                    bucket: b.id.clone(),
                    action,
                };
                plans.push(Plan {
                    id,
                    key: (*key).to_owned(),
                    told,
                    change,
                });
            }
        }
        plans
    }
}

/// How a round may change shares.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Divide and grow: the store answered, and this node's entries were posted.
    Grow,
    /// The store answered but this node has not posted yet: nothing grows.
    Hold,
    /// The store is out: nothing is told (deny, past a ttl of it, where told to).
    Quiet { deny: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Grew,
    Same,
    Fell,
}

/// One proxy's bucket to be told something.
struct Plan {
    id: u64,
    key: String,
    told: BucketAction,
    change: Change,
}

type Sent = Option<(Action, Instant)>;

/// Records each plan as sent; answers what each bucket held before.
fn apply(state: &mut State, plans: &[Plan], now: Instant) -> Vec<Sent> {
    plans
        .iter()
        .map(|p| {
            let b = state
                .proxies
                .get_mut(&p.id)
                .and_then(|x| x.buckets.get_mut(&p.key))?;
            b.sent.replace((p.told.action, now))
        })
        .collect()
}

impl Plan {
    /// Told even when this node's entries could not be posted: a share that came down,
    /// or a deny (nothing the others could count as taken).
    fn told_anyway(&self) -> bool {
        self.change == Change::Fell || self.told.action.share() == Some(0)
    }
}

/// Whether what a proxy was last told lapses within `within` of `now` (or it was told
/// nothing).
fn lapses_within(sent: Option<&(Action, Instant)>, within: Duration, now: Instant) -> bool {
    sent.is_none_or(|(a, at)| *at + a.ttl() <= now + within)
}

/// Undoes [`apply`] for the plans that were not told.
fn revert(state: &mut State, plans: &[Plan], before: Vec<Sent>) {
    for (p, was) in plans.iter().zip(before) {
        if p.told_anyway() {
            continue;
        }
        if let Some(b) = state
            .proxies
            .get_mut(&p.id)
            .and_then(|x| x.buckets.get_mut(&p.key))
        {
            b.sent = was;
        }
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

/// What each proxy's queue is to be sent.
type Told = Vec<(tokio::sync::mpsc::Sender<Vec<BucketAction>>, BucketAction)>;

/// Sends each proxy its actions; a proxy whose queue is full gets them at a later round
/// (they were recorded as sent: the half-ttl refresh tells it again).
fn send(told: Told) {
    let mut by_proxy: Vec<(
        tokio::sync::mpsc::Sender<Vec<BucketAction>>,
        Vec<BucketAction>,
    )> = Vec::new();
    for (tx, a) in told {
        match by_proxy.iter_mut().find(|(t, _)| t.same_channel(&tx)) {
            Some((_, v)) => v.push(a),
            None => by_proxy.push((tx, vec![a])),
        }
    }
    for (tx, actions) in by_proxy {
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
