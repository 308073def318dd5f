//! What a sharing round works with beside the store: how long a proxy's bucket asks,
//! the division of a bucket among its asks, when a proxy is told, and the entries a
//! node posts (see `rounds`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use swin_sync::store::Demands;
use tokio::time::Instant;

use super::assign::{own_shares, Action};
use super::entry::Entry;
use super::{State, ROUND};

/// A proxy's bucket not reported for this many of its intervals no longer asks.
const STALE_INTERVALS: u32 = 2;
/// A proxy's reporting interval until its second report tells it: Envoy's filter
/// reports every 5 s whatever its config says. Until then its ask is only a claim,
/// which takes no room from asks that reports show; its stream ending says at once that
/// it is gone.
const UNKNOWN_INTERVAL: Duration = Duration::from_secs(5);

/// How long a bucket of a proxy reporting every `interval` may go unreported and still
/// ask: it lapses within two intervals (a round's check included).
pub(super) fn stale_after(interval: Option<Duration>) -> Duration {
    (interval.unwrap_or(UNKNOWN_INTERVAL) * STALE_INTERVALS)
        .saturating_sub(ROUND)
        .max(ROUND * 2)
}

/// Each live local proxy's action for one bucket, by the latest division: (proxy,
/// action), in proxy order.
///
/// The division is made twice: with this node's proxies as they ask now, and as the
/// other nodes have them (their asks as this node last posted them, a proxy not posted
/// yet asking nothing), and each share is the smaller of the two. The other nodes divide
/// what they read: a proxy whose ask grew or came to show since this node's last post
/// (a stream's second report) is still a claim, or a smaller ask, to them, and they grow
/// their own shares into the room it would take — were this node to grow it from its
/// fresher ask as well, the two nodes would hand out the same room. A share thus grows
/// only once the ask it grows for is in the store.
pub(super) fn division(
    state: &State,
    node: &str,
    namespace: &str,
    key: &str,
    proxies: &[u64],
    now: Instant,
) -> Vec<(u64, Action)> {
    let mut own = Vec::new();
    let mut seen = Vec::new();
    let mut who = Vec::new();
    let mut shape = None;
    for &id in proxies {
        let Some(p) = state.proxies.get(&id) else {
            continue;
        };
        let Some(b) = p.buckets.get(key) else {
            continue;
        };
        if let Some(e) = p.entry(b, stale_after(p.interval), now) {
            own.push(e);
            seen.push(as_posted(e, b.posted));
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
    let turn = super::by_client::turn(swin_sync::now());
    let fresh = own_shares(node, &own, others, limit, turn);
    let as_seen = own_shares(node, &seen, others, limit, turn);
    let shares = fresh.into_iter().zip(as_seen).map(|(f, s)| f.min(s));
    who.into_iter()
        .zip(shares)
        .filter(|((_, _, live), _)| *live)
        .map(|((id, ttl, _), share)| (id, Action::of_share(share, unit, ttl)))
        .collect()
}

/// A proxy's entry `e` with its ask as this node last posted it (`posted`): what the
/// other nodes divide; a live proxy not posted yet asks nothing there.
pub(super) fn as_posted(e: Entry, posted: Option<(f64, bool)>) -> Entry {
    match (e.asks, posted) {
        (None, _) => e,
        (Some(_), Some((asks, shown))) => Entry {
            asks: Some(asks),
            shown,
            ..e
        },
        (Some(_), None) => Entry {
            asks: Some(0.0),
            shown: false,
            ..e
        },
    }
}

/// Whether a proxy told `sent` at `at` is to be told `new` now.
pub(super) fn tell(sent: Option<&(Action, Instant)>, new: &Action, now: Instant) -> bool {
    let Some((old, at)) = sent else {
        return true;
    };
    if now.duration_since(*at) >= old.ttl() / 2 {
        return true;
    }
    match (old.share(), new.share()) {
        _ if old.enforced_alike(new) => false,
        (Some(o), Some(n)) if n < o || o == 0 => true,
        (Some(o), Some(n)) => n - o > (o / 50).max(1),
        _ => true,
    }
}

/// This node's entry for one bucket (its proxies `ids`), lapsing a ttl and two rounds
/// after `store_now`; `None` when none of them asks or holds anything.
pub(super) fn bucket_entry(
    state: &State,
    node: &str,
    key: &str,
    ids: &[u64],
    store_now: swin_core::UnixMs,
    now: Instant,
) -> Option<Demands> {
    let mut demands = Vec::new();
    let mut ttl = Duration::ZERO;
    for id in ids {
        let Some(p) = state.proxies.get(id) else {
            continue;
        };
        let Some(e) = p
            .buckets
            .get(key)
            .and_then(|b| p.entry(b, stale_after(p.interval), now))
        else {
            continue;
        };
        demands.extend(e.posted());
        ttl = ttl.max(p.ttl());
    }
    (!demands.is_empty()).then(|| Demands {
        bucket: key.to_owned(),
        node: node.to_owned(),
        demands,
        expires_at: swin_core::UnixMs(
            store_now
                .0
                .saturating_add((ttl + ROUND * 2).as_millis() as i64),
        ),
    })
}

/// Gives back what a map holds beyond twice what it uses.
pub(super) fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 2 * map.len() + 64 {
        map.shrink_to_fit();
    }
}

/// This node's entry for a bucket it no longer serves: nothing asked, nothing assigned,
/// lapsing two rounds on.
pub(super) fn emptied(node: &str, key: &str, store_now: swin_core::UnixMs) -> Demands {
    Demands {
        bucket: key.to_owned(),
        node: node.to_owned(),
        demands: Vec::new(),
        expires_at: swin_core::UnixMs(store_now.0.saturating_add((ROUND * 2).as_millis() as i64)),
    }
}

/// This node's entries per namespace: (namespace, entries to post), and the store's
/// time they were made at; proxies and buckets gone for good are forgotten on the way.
pub(super) fn entries(
    state: &mut State,
    node: &str,
    now: Instant,
) -> (Vec<(String, Vec<Demands>)>, swin_core::UnixMs) {
    let store_now = swin_sync::now();
    state.held.retain(|_, until| *until > now);
    let mut live = 0;
    let mut of_clients: HashMap<super::Client, usize> = HashMap::new();
    let mut by_ns: BTreeMap<String, BTreeMap<String, Vec<u64>>> = BTreeMap::new();
    state.proxies.retain(|&id, p| {
        let stale = stale_after(p.interval);
        let open = p.open;
        p.buckets
            .retain(|_, b| b.entry(open, stale, now).is_some() || b.sent.is_none() && open);
        live += p.buckets.len();
        if !p.buckets.is_empty() {
            *of_clients.entry(p.client.clone()).or_default() += p.buckets.len();
        }
        if let Some(ns) = &p.namespace {
            for (key, b) in &p.buckets {
                if b.entry(open, stale, now).is_some() {
                    let ids = by_ns.entry(ns.clone()).or_default();
                    ids.entry(key.clone()).or_default().push(id);
                }
            }
        }
        open || !p.buckets.is_empty()
    });
    state.buckets = live;
    state.client_buckets = of_clients;
    // what the other nodes ask is kept for the buckets this node still serves only
    state
        .remote
        .retain(|(ns, key), _| by_ns.get(ns).is_some_and(|b| b.contains_key(key)));
    let remote = &state.remote;
    state.moved.retain(|at| remote.contains_key(at));
    // a flood's buckets gone, their room is given back
    shrink(&mut state.remote);
    shrink(&mut state.held);
    for p in state.proxies.values_mut() {
        shrink(&mut p.buckets);
    }
    // a bucket whose last proxy went (or whose last assignment lapsed) since this node
    // posted it: posted empty, so the others find its room at their next round, not when
    // the entry lapses
    for (ns, key) in state.held.keys() {
        by_ns
            .entry(ns.clone())
            .or_default()
            .entry(key.clone())
            .or_default();
    }
    let by_ns = by_ns
        .into_iter()
        .map(|(ns, buckets)| {
            let posted = buckets
                .iter()
                .map(|(key, ids)| {
                    bucket_entry(state, node, key, ids, store_now, now)
                        .unwrap_or_else(|| emptied(node, key, store_now))
                })
                .collect();
            (ns, posted)
        })
        .collect();
    (by_ns, store_now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shares::{Client, ProxyBucket, ProxyState};

    /// A bucket's entry on `node` as the store has it.
    fn stored(node: &str, e: Entry) -> Demands {
        Demands {
            bucket: "b".into(),
            node: node.into(),
            demands: e.posted(),
            expires_at: swin_core::UnixMs(i64::MAX),
        }
    }

    fn asks(d: f64, shown: bool, assigned: f64, client: &str) -> Entry {
        Entry {
            asks: Some(d),
            shown,
            assigned,
            client: Some(Client::token(client).tag()),
        }
    }

    /// The share `node` divides for its one proxy (200/s, its stream's second report in,
    /// posted while it was a claim) of a limit of 120, beside the other node's proxy as
    /// the store has it (a claim of 200 assigned nothing: its second report came after
    /// its post too) and a third node's proxy shown asking 40 and holding it.
    fn share_on(node: &str, other: &str) -> u64 {
        let now = Instant::now();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let bucket = ProxyBucket {
            id: vec![("k".into(), "v".into())],
            demand: 200.0,
            limit: 120.0,
            unit: Duration::from_secs(1),
            reported: now,
            reports: 2,
            sent: None,
            divided: None,
            posted: Some((200.0, false)),
        };
        let mut state = State::default();
        state.proxies.insert(
            1,
            ProxyState {
                client: Client::token(node),
                namespace: Some("ns".into()),
                tx,
                open: true,
                last_report: Some(now),
                interval: Some(Duration::from_secs(1)),
                buckets: HashMap::from([("b".to_owned(), bucket)]),
            },
        );
        state.remote.insert(
            ("ns".into(), "b".into()),
            vec![
                stored(other, asks(200.0, false, 0.0, other)),
                stored("c", asks(40.0, true, 40.0, "c")),
            ],
        );
        let out = division(&state, node, "ns", "b", &[1], now);
        out[0].1.share().expect("a share")
    }

    /// Two nodes whose proxies' asks came to show between their posts and their next
    /// division each see the other's as the claim it posted: dividing their own fresh
    /// asks, each took the whole room for itself (80 + 80 + 40 on a limit of 120). As the
    /// store has them, both are claims that split the room, and so do their shares.
    #[test]
    fn two_nodes_whose_asks_came_to_show_at_once_do_not_hand_out_the_same_room() {
        let (a, b) = (share_on("a", "b"), share_on("b", "a"));
        assert!(a + b + 40 <= 120, "a {a}, b {b}, c 40 on a limit of 120");
        assert_eq!((a, b), (40, 40));
    }

    #[test]
    fn a_proxy_not_posted_yet_asks_nothing_as_the_others_have_it() {
        let e = asks(50.0, true, 3.0, "x");
        assert_eq!(as_posted(e, None).asks, Some(0.0));
        assert_eq!(as_posted(e, None).assigned, 3.0);
        assert_eq!(as_posted(e, Some((20.0, false))).asks, Some(20.0));
        assert!(!as_posted(e, Some((20.0, false))).shown);
        let gone = Entry { asks: None, ..e };
        assert_eq!(as_posted(gone, Some((20.0, true))), gone);
    }
}
