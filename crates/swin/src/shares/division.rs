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
/// other nodes have them (their asks as this node last posted them), and each share is
/// the smaller of the two. The other nodes divide what they read: a proxy whose ask grew
/// or came to show since this node's last post (a stream's second report) is still a
/// claim, or a smaller ask, to them, and they grow their own shares into the room it
/// would take — were this node to grow it from its fresher ask as well, the two nodes
/// would hand out the same room. A proxy whose ask is in no post that reached the store
/// (new, or posted as gone since) is not in the second division at all, as it is in
/// none of theirs, and keeps at most what it holds. A share thus grows only once the ask
/// it grows for is in the store.
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
            if let Some(e) = as_posted(e, b.posted) {
                seen.push((own.len(), e));
            }
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
    let turn = super::by_client::turn(swin_sync::now());
    let fresh = own_shares(node, &own, others, limit, turn);
    // as the others have them: a proxy in no post keeps at most what it holds
    let mut shares: Vec<u64> = fresh
        .iter()
        .zip(&own)
        .map(|(&f, e)| f.min(e.assigned.max(0.0).floor() as u64))
        .collect();
    let posted: Vec<Entry> = seen.iter().map(|(_, e)| *e).collect();
    for ((i, _), s) in seen
        .iter()
        .zip(own_shares(node, &posted, others, limit, turn))
    {
        shares[*i] = fresh[*i].min(s);
    }
    who.into_iter()
        .zip(shares)
        .filter(|((_, _, live), _)| *live)
        .map(|((id, ttl, _), share)| (id, Action::of_share(share, unit, ttl)))
        .collect()
}

/// A proxy's entry `e` with its ask as this node last posted it (`posted`): what the
/// other nodes divide. A live proxy whose ask is in no post is in no division of theirs:
/// `None`.
pub(super) fn as_posted(e: Entry, posted: Option<(f64, bool)>) -> Option<Entry> {
    match (e.asks, posted) {
        (None, _) => Some(e),
        (Some(_), Some((asks, shown))) => Some(Entry {
            asks: Some(asks),
            shown,
            ..e
        }),
        (Some(_), None) => None,
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
    let mut of_clients: HashMap<super::Sharer, usize> = HashMap::new();
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
    use crate::shares::{ProxyBucket, ProxyState, Sharer};

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
            client: Some(Sharer::token(client).tag()),
        }
    }

    /// The share `node` divides for its one proxy (200/s, its stream's second report in,
    /// posted while it was a claim) of a limit of 120, beside the other node's proxy as
    /// the store has it (a claim of 200 assigned nothing: its second report came after
    /// its post too) and a third node's proxy shown asking 40 and holding it.
    fn share_on(node: &str, other: &str) -> u64 {
        let now = Instant::now();
        let mut state = State::default();
        let b = bucket(now, 200.0, 2, None, Some((200.0, false)));
        proxy(&mut state, 1, node, b, now);
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

    /// A proxy's bucket on this node: `demand` asked, `reports` in, holding `sent`, its
    /// ask as last posted `posted`.
    fn bucket(
        at: Instant,
        demand: f64,
        reports: u32,
        sent: Option<u64>,
        posted: Option<(f64, bool)>,
    ) -> ProxyBucket {
        let ttl = Duration::from_secs(10);
        ProxyBucket {
            id: vec![("k".into(), "v".into())],
            demand,
            limit: 120.0,
            unit: Duration::from_secs(1),
            reported: at,
            reports,
            sent: sent.map(|s| (Action::of_share(s, Duration::from_secs(1), ttl), at)),
            divided: None,
            posted,
        }
    }

    fn proxy(state: &mut State, id: u64, client: &str, b: ProxyBucket, at: Instant) {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        state.proxies.insert(
            id,
            ProxyState {
                client: Sharer::token(client),
                namespace: Some("ns".into()),
                tx,
                open: true,
                last_report: Some(at),
                interval: Some(Duration::from_secs(1)),
                buckets: HashMap::from([("b".to_owned(), b)]),
            },
        );
    }

    fn shares(state: &State, ids: &[u64], at: Instant) -> Vec<u64> {
        division(state, "a", "ns", "b", ids, at)
            .into_iter()
            .map(|(_, a)| a.share().expect("a share"))
            .collect()
    }

    /// A second proxy joins a bucket this node posted already, beside one asking 10 and
    /// holding it; the other node's proxy shows 20 and holds 20 of 120. The other node
    /// has not seen the newcomer and grows its proxy into the room left (to 65); the
    /// newcomer keeps what it holds (nothing) until its ask is posted — it took 90 when
    /// it stood in the second division as a claim of nothing.
    #[test]
    fn a_proxy_joining_a_posted_bucket_keeps_what_it_holds_until_its_ask_is_posted() {
        let now = Instant::now();
        let mut st = State::default();
        let p1 = bucket(now, 10.0, 5, Some(10), Some((10.0, true)));
        proxy(&mut st, 1, "p1", p1, now);
        proxy(&mut st, 2, "p2", bucket(now, 120.0, 1, None, None), now);
        let q = asks(20.0, true, 20.0, "q");
        st.remote
            .insert(("ns".into(), "b".into()), vec![stored("b", q)]);
        let a = shares(&st, &[1, 2], now);
        let b = own_shares(
            "b",
            &[q],
            &[stored("a", asks(10.0, true, 10.0, "p1"))],
            120.0,
            0,
        );
        assert!(
            a.iter().sum::<u64>() + b[0] <= 120,
            "a {a:?}, b {b:?} on 120"
        );
        assert_eq!(
            a[1], 0,
            "the newcomer grew before its ask was posted: {a:?}"
        );
    }

    /// A proxy's bucket goes stale (its reports late) while it holds 40: the round posts
    /// it as gone, and the other node grows its own proxy into the room. Its report then
    /// comes: it grows no further than it holds until a post shows it asking again.
    #[test]
    fn a_bucket_posted_as_gone_grows_only_once_its_ask_is_posted_again() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(3);
        let mut st = State::default();
        let p = bucket(t0, 200.0, 5, Some(40), Some((200.0, true)));
        proxy(&mut st, 1, "p", p, t0);
        let by_key = HashMap::from([("b", vec![1])]);
        let asked = super::super::rounds::asked(&st, &["b".to_owned()], &by_key, later);
        assert_eq!(asked, vec![(1, "b".to_owned(), None)], "posted as gone");
        let b = st.proxies.get_mut(&1).and_then(|p| p.buckets.get_mut("b"));
        let b = b.expect("the bucket");
        b.posted = asked[0].2;
        // its report comes back
        b.reported = later;
        let q = asks(200.0, true, 40.0, "q");
        st.remote
            .insert(("ns".into(), "b".into()), vec![stored("b", q)]);
        let a = shares(&st, &[1], later);
        let gone = Entry {
            asks: None,
            ..asks(0.0, false, 40.0, "p")
        };
        let b = own_shares("b", &[q], &[stored("a", gone)], 120.0, 0);
        assert!(a[0] + b[0] <= 120, "a {a:?}, b {b:?} on 120");
        assert_eq!(
            a[0], 40,
            "it grew on the ask it had before it was posted as gone"
        );
    }

    #[test]
    fn a_proxy_in_no_post_is_in_no_division_of_the_others() {
        let e = asks(50.0, true, 3.0, "x");
        assert_eq!(as_posted(e, None), None);
        let seen = as_posted(e, Some((20.0, false))).expect("posted");
        assert_eq!(
            (seen.asks, seen.shown, seen.assigned),
            (Some(20.0), false, 3.0)
        );
        let gone = Entry { asks: None, ..e };
        assert_eq!(as_posted(gone, Some((20.0, true))), Some(gone));
    }
}
