//! Sharing rounds: every [`ROUND`], each namespace's buckets post this node's entries
//! to the store and read every node's, the buckets are divided again, and each proxy is
//! told what changed (a share that went down, grew by more than 2 %, or is half-way to
//! its ttl) without waiting for its next report.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use swin_sync::admission::OnStoreFailure;
use swin_sync::store::Demands;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::Action;
use super::division::{bucket_entry, division, emptied, entries, tell};
use super::entry::Entry;
use super::reads::{lost_entries, remember};
use super::{within, BucketAction, Shares, State, ROUND};
use crate::config::AdmissionMode;
use crate::state::Namespace;

/// Buckets read, divided (under one hold of the lock) and posted together: a report
/// waits for no more than a chunk's division, and a round's store calls are one read and
/// one post per chunk.
const CHUNK: usize = 1_000;
/// What a told assignment leaves between its end and its entry's lapse in the store:
/// the store's clock as this node knows it, and the answer's way to the proxy.
const MARGIN: Duration = ROUND;

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

    /// Runs `work` on the state off the runtime's workers (a division of many buckets
    /// holds no worker that answers requests); inline when there is no runtime to
    /// leave.
    async fn off_workers<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Shares) -> T + Send + 'static,
    ) -> T {
        let me = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = move || {
            let _ = tx.send(work(&me));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread => {
                drop(h.spawn_blocking(job));
            }
            _ => job(),
        }
        rx.await.expect("a division ends with an answer")
    }

    /// One round, per namespace and chunk of its buckets (those whose asks reports show
    /// first, so a flood of claims waits behind them): read every node's entries, divide,
    /// post this node's entries with what its proxies will be assigned, then tell the
    /// proxies. Posting before telling means no proxy uses room the other nodes cannot
    /// see taken; a bucket's share grows only once this node's entry for it has been
    /// posted (a round after a start or an outage), so two nodes coming back never both
    /// see the room as theirs. What is told holds no longer than the bucket's entry surely
    /// lives in the store.
    pub async fn round(self: &Arc<Self>) {
        let now = Instant::now();
        let node = self.node.clone();
        let (serving, _) = self
            .off_workers(move |me| entries(&mut me.state(), &node, now))
            .await;
        for (name, posted) in serving {
            let Some(ns) = self.namespace(&name) else {
                continue;
            };
            let mut keys: Vec<(bool, String)> = posted
                .into_iter()
                .map(|d| (!d.demands.chunks_exact(2).any(|e| e[0] >= 0.0), d.bucket))
                .collect();
            keys.sort();
            let keys: Vec<String> = keys.into_iter().map(|(_, k)| k).collect();
            for chunk in keys.chunks(CHUNK) {
                self.round_of(&ns, &name, chunk.to_vec()).await;
            }
        }
    }

    /// The round of one chunk of `name`'s buckets.
    async fn round_of(self: &Arc<Self>, ns: &Namespace, name: &str, keys: Vec<String>) {
        let read = self.read(ns, &keys).await;
        let shared = ns.sync.store().is_some();
        let deny_on_failure = matches!(
            ns.admission_mode,
            AdmissionMode::Strict {
                on_store_failure: OnStoreFailure::Deny
            }
        );
        let (plans, before, posted, store_now, at) = {
            let name = name.to_owned();
            self.off_workers(move |me| {
                let now = Instant::now();
                let (plans, before, posted, store_now) =
                    me.plan(&name, &keys, read, deny_on_failure, shared, now);
                (plans, before, posted, store_now, now)
            })
            .await
        };
        let (posted, asks) = match posted {
            Some((posted, asks)) => (Some(posted), asks),
            None => (None, Vec::new()),
        };
        // a store that could not be read is not written to either: the round ends
        // sooner, and a deny goes out while what it replaces still holds
        let ok = match &posted {
            Some(posted) => self.post(ns, posted).await,
            None => false,
        };
        let told = {
            let mut state = self.state();
            match (&posted, ok) {
                (Some(posted), true) => {
                    // the other nodes have these asks now
                    for (id, key, ask) in asks {
                        let b = state
                            .proxies
                            .get_mut(&id)
                            .and_then(|p| p.buckets.get_mut(&key));
                        if let Some(b) = b {
                            b.posted = ask;
                        }
                    }
                    for d in posted {
                        let at_key = (name.to_owned(), d.bucket.clone());
                        // an emptied entry replaced the last: nothing is held any more
                        if d.demands.is_empty() {
                            state.held.remove(&at_key);
                            continue;
                        }
                        let life = (d.expires_at.0 - store_now.0).max(0) as u64;
                        let until = (at + Duration::from_millis(life))
                            .checked_sub(MARGIN)
                            .unwrap_or(at);
                        state.held.insert(at_key, until);
                    }
                }
                // the others cannot see these assignments: only what came down is told,
                // the rest is as it was
                (Some(_), false) => tracing::warn!(
                    namespace = name,
                    "demands not posted: only shares that come down are told"
                ),
                (None, _) => {}
            }
            settle(&mut state, name, plans, before, ok, Instant::now())
        };
        send(told);
    }

    /// Every node's entries for `keys`, in one store call.
    async fn read(&self, ns: &Namespace, keys: &[String]) -> Result<Vec<Demands>, ()> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        ns.sync
            .read_demands(&keys, swin_sync::now())
            .await
            .map_err(|e| {
                tracing::warn!(namespace = ns.sync.name(), cause = %e, "demands not read: assignments are left to lapse");
            })
    }

    /// Posts this node's entries in one store call; whether they were posted.
    async fn post(&self, ns: &Namespace, posted: &[Demands]) -> bool {
        ns.sync.post_demands(posted).await.is_ok()
    }

    /// The division of `keys` of `name` (off the workers, under one hold of the lock):
    /// the plans, what their buckets held before, this node's entries to post with each
    /// live proxy's ask in them (`None`: the store is out, post nothing) and the store's
    /// time they were made at.
    fn plan(
        &self,
        name: &str,
        keys: &[String],
        read: Result<Vec<Demands>, ()>,
        deny_on_failure: bool,
        shared: bool,
        now: Instant,
    ) -> (Vec<Plan>, Vec<Sent>, Option<Posting>, swin_core::UnixMs) {
        let mut state = self.state();
        let state = &mut *state;
        let mode = match read {
            Ok(read) => {
                if shared {
                    lost_entries(state, &self.node, name, keys, &read, now);
                }
                remember(state, &self.node, name, keys, read);
                match state.lost.get(name) {
                    Some(until) if swin_sync::now().0 < until.0 => Mode::Hold,
                    _ => Mode::Grow,
                }
            }
            Err(()) => Mode::Quiet {
                deny: deny_on_failure,
            },
        };
        let wanted: HashSet<&str> = keys.iter().map(String::as_str).collect();
        let mut by_key: HashMap<&str, Vec<u64>> = HashMap::new();
        for (&id, p) in &state.proxies {
            if p.namespace.as_deref() != Some(name) {
                continue;
            }
            for key in p.buckets.keys() {
                if let Some(k) = wanted.get(key.as_str()) {
                    by_key.entry(k).or_default().push(id);
                }
            }
        }
        let plans = self.divide_all(state, name, keys, &by_key, mode, now);
        let before = apply(state, &plans, now);
        let store_now = swin_sync::now();
        let posted = match mode {
            Mode::Quiet { .. } => None,
            _ => {
                let entries = keys
                    .iter()
                    .map(|k| {
                        let ids = by_key.get(k.as_str()).map_or(&[][..], Vec::as_slice);
                        bucket_entry(state, &self.node, k, ids, store_now, now)
                            .unwrap_or_else(|| emptied(&self.node, k, store_now))
                    })
                    .collect();
                Some((entries, asked(state, keys, &by_key, now)))
            }
        };
        (plans, before, posted, store_now)
    }

    /// What each of `keys`' proxies is to be told, by the division now and `mode`: a
    /// bucket whose entry this node has not posted yet grows nothing.
    fn divide_all(
        &self,
        state: &mut State,
        name: &str,
        keys: &[String],
        by_key: &HashMap<&str, Vec<u64>>,
        mode: Mode,
        now: Instant,
    ) -> Vec<Plan> {
        let mut plans = Vec::new();
        for key in keys {
            let Some(proxies) = by_key.get(key.as_str()) else {
                continue;
            };
            let at = (name.to_owned(), key.clone());
            let mode = match mode {
                Mode::Grow if !state.held.contains_key(&at) || state.moved.contains(&at) => {
                    Mode::Hold
                }
                m => m,
            };
            for (id, divided) in division(state, &self.node, name, key, proxies, now) {
                let Some(p) = state.proxies.get_mut(&id) else {
                    continue;
                };
                let ttl = p.ttl();
                let Some(b) = p.buckets.get_mut(key.as_str()) else {
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
                    key: key.clone(),
                    told,
                    change,
                });
            }
        }
        plans
    }
}

/// A proxy's ask in a bucket's posted entry: (proxy, bucket key, (ask, shown)), `None`
/// when the entry shows it gone or leaves it out.
type Asked = (u64, String, Option<(f64, bool)>);

/// What a round posts: this node's entries, and each live proxy's ask in them.
type Posting = (Vec<Demands>, Vec<Asked>);

/// Each proxy's ask in the entries posted for `keys`, as `bucket_entry` writes it.
pub(super) fn asked(
    state: &State,
    keys: &[String],
    by_key: &HashMap<&str, Vec<u64>>,
    now: Instant,
) -> Vec<Asked> {
    let mut out = Vec::new();
    for key in keys {
        for id in by_key.get(key.as_str()).map_or(&[][..], Vec::as_slice) {
            let Some(p) = state.proxies.get(id) else {
                continue;
            };
            let Some(b) = p.buckets.get(key) else {
                continue;
            };
            let ask = match b.entry(p.open, super::division::stale_after(p.interval), now) {
                Some(Entry {
                    asks: Some(d),
                    shown,
                    ..
                }) => Some((d.max(0.0), shown)),
                _ => None,
            };
            out.push((*id, key.clone(), ask));
        }
    }
    out
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

/// After the post: each plan told (posted: every one; not: those told anyway), its
/// action holding no longer than its bucket's entry surely lives in the store; a plan
/// not told leaves its bucket as it was. What each proxy's queue is to be sent.
fn settle(
    state: &mut State,
    name: &str,
    plans: Vec<Plan>,
    before: Vec<Sent>,
    posted: bool,
    now: Instant,
) -> Told {
    let mut told = Vec::new();
    for (p, was) in plans.into_iter().zip(before) {
        let until = state.held.get(&(name.to_owned(), p.key.clone())).copied();
        let action = match posted || p.told_anyway() {
            true => within(p.told.action, until, now),
            false => None,
        };
        let Some(proxy) = state.proxies.get_mut(&p.id) else {
            continue;
        };
        let Some(b) = proxy.buckets.get_mut(&p.key) else {
            continue;
        };
        match action {
            Some(action) => {
                b.sent = Some((action, now));
                told.push((
                    proxy.tx.clone(),
                    BucketAction {
                        bucket: p.told.bucket,
                        action,
                    },
                ));
            }
            None => b.sent = was,
        }
    }
    told
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
