//! From demands to assignments: one bucket's limit divided among every proxy of the
//! cluster (this node's and the others', as the store has them), and a share turned
//! into the token bucket a proxy enforces.
//!
//! **Never more out than the limit.** Each proxy's entry carries what it asks for and
//! what it is assigned now (the share it was last told, until that lapses). A share that
//! goes down is told at once; a share that goes up grows only out of room no proxy is
//! assigned (the limit less every assignment the store shows), split among the proxies
//! that grow in
//! proportion to what each still lacks — every node computes the same split from the same
//! entries, so two nodes never hand out the same room. A proxy that joins thus starts at
//! nothing and grows as the others' shares come down (a round or two, ½ s each).
//!
//! **The bound.** A proxy holding a token bucket of `tokens_per_fill` per unit and
//! `max_tokens` admits at most `tokens_per_fill + max_tokens` in any window of one unit.
//! What all proxies hold adds up to at most the limit, so across the cluster a window
//! admits at most `limit + Σ max_tokens`, with `max_tokens = max(2, tokens_per_fill / 50)`
//! (two, so that a request a hair early finds a token): `limit × 1.02 + 2 × proxies` —
//! and one more `max_tokens` per proxy whose share went down in that window (a new
//! bucket starts full). A node reads the others' assignments one round late: one that went
//! up since is room it does not count as free, one that went down is room it finds a
//! round later — never room counted twice.

use std::time::Duration;

use swin_sync::store::Demands;

use super::by_client::{growth, targets};
pub use super::entry::Entry;

/// This node's proxies' new whole shares of `limit` (per unit), in `own`'s order (a
/// proxy that went away keeps 0: it only assigned), from `own` and every other node's
/// entries in `others` (this node's own posted entry among them is skipped), divided by
/// client (`shares::by_client`) at `turn`. Every node divides the same entries in the
/// same order (nodes by id), so their divisions agree once each has read the others'
/// latest.
pub fn own_shares(
    node: &str,
    own: &[Entry],
    others: &[Demands],
    limit: f64,
    turn: u64,
) -> Vec<u64> {
    let mut nodes: Vec<(&str, Vec<Entry>)> = others
        .iter()
        .filter(|d| d.node != node)
        .map(|d| (d.node.as_str(), Entry::read(&d.demands)))
        .collect();
    nodes.push((node, own.to_vec()));
    nodes.sort_by(|a, b| a.0.cmp(b.0));
    let all: Vec<(bool, Entry)> = nodes
        .iter()
        .flat_map(|(n, e)| e.iter().map(move |e| (*n == node, *e)))
        .collect();
    let gone: f64 = all
        .iter()
        .filter(|(_, e)| e.asks.is_none())
        .map(|(_, e)| e.assigned)
        .sum();
    let live: Vec<(bool, Entry)> = all.into_iter().filter(|(_, e)| e.asks.is_some()).collect();
    let entries: Vec<Entry> = live.iter().map(|(_, e)| *e).collect();
    let targets = targets(&entries, (limit - gone).max(0.0).floor(), turn);
    // room no proxy assigned: this node's shares that go down come down now; another
    // node's hold counts as it is until that node posts it lower
    let held: f64 = gone
        + live
            .iter()
            .zip(&targets)
            .map(|((mine, e), &t)| {
                if *mine {
                    e.assigned.min(t as f64)
                } else {
                    e.assigned
                }
            })
            .sum::<f64>();
    let room = (limit.floor() - held).max(0.0);
    let lacking: Vec<f64> = live
        .iter()
        .zip(&targets)
        .map(|((_, e), &t)| (t as f64 - e.assigned).max(0.0))
        .collect();
    let grow = growth(&lacking, room, turn);
    let mut out = live
        .iter()
        .zip(&targets)
        .zip(grow)
        .filter(|(((mine, _), _), _)| *mine);
    own.iter()
        .map(|e| {
            if e.asks.is_none() {
                return 0;
            }
            let Some((((_, e), &t), grow)) = out.next() else {
                return 0;
            };
            (e.assigned.min(t as f64).floor() as u64 + grow).min(t)
        })
        .collect()
}

/// What a proxy is told to enforce for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A token bucket: `tokens_per_fill` every `fill_interval` (the rule's unit), up to
    /// `max_tokens`, until `ttl` has passed.
    Assign {
        /// Tokens added each fill.
        tokens_per_fill: u32,
        /// How often (the rule's unit, whole seconds).
        fill_interval: Duration,
        /// The bucket's size (a new bucket starts full).
        max_tokens: u32,
        /// How long the assignment assigned.
        ttl: Duration,
    },
    /// Every request passes (a rule with no limit, or in shadow), until `ttl`.
    AllowAll {
        /// How long it assigned.
        ttl: Duration,
    },
    /// No request passes (a rule that blocks, or a share of nothing), until `ttl`.
    DenyAll {
        /// How long it assigned.
        ttl: Duration,
    },
    /// No rule covers the bucket: the proxy drops it and falls back to its own config.
    Abandon,
}

impl Action {
    /// The assignment of a whole share per `unit` for `ttl`.
    pub(crate) fn of_share(share: u64, unit: Duration, ttl: Duration) -> Action {
        if share == 0 {
            return Action::DenyAll { ttl };
        }
        let tokens = u32::try_from(share).unwrap_or(u32::MAX);
        Action::Assign {
            tokens_per_fill: tokens,
            fill_interval: unit,
            max_tokens: (tokens / 50).max(2),
            ttl,
        }
    }

    /// Requests per unit it lets through (`None`: every request).
    pub fn share(&self) -> Option<u64> {
        match self {
            Action::Assign {
                tokens_per_fill, ..
            } => Some(u64::from(*tokens_per_fill)),
            Action::AllowAll { .. } => None,
            Action::DenyAll { .. } | Action::Abandon => Some(0),
        }
    }

    /// How long it holds (an abandon: not at all).
    pub fn ttl(&self) -> Duration {
        match self {
            Action::Assign { ttl, .. } | Action::AllowAll { ttl } | Action::DenyAll { ttl } => *ttl,
            Action::Abandon => Duration::ZERO,
        }
    }

    /// The same action, holding for `ttl`.
    pub(crate) fn with_ttl(self, ttl: Duration) -> Action {
        match self {
            Action::Assign {
                tokens_per_fill,
                fill_interval,
                max_tokens,
                ..
            } => Action::Assign {
                tokens_per_fill,
                fill_interval,
                max_tokens,
                ttl,
            },
            Action::AllowAll { .. } => Action::AllowAll { ttl },
            Action::DenyAll { .. } => Action::DenyAll { ttl },
            Action::Abandon => Action::Abandon,
        }
    }

    /// The same action with its ttl left out: two actions a proxy enforces alike.
    pub(crate) fn enforced_alike(&self, other: &Action) -> bool {
        self.with_ttl(Duration::ZERO) == other.with_ttl(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swin_core::UnixMs;

    fn posted(node: &str, d: &[f64]) -> Demands {
        Demands {
            bucket: "b".into(),
            node: node.into(),
            demands: d.to_vec(),
            expires_at: UnixMs(0),
        }
    }

    fn asks(d: f64, assigned: f64) -> Entry {
        Entry {
            asks: Some(d),
            shown: true,
            assigned,
            client: None,
        }
    }

    fn claims(d: f64, assigned: f64) -> Entry {
        Entry {
            asks: Some(d),
            shown: false,
            assigned,
            client: None,
        }
    }

    fn pairs(entries: &[Entry]) -> Vec<f64> {
        entries.iter().flat_map(|e| e.posted()).collect()
    }

    #[test]
    fn proxies_on_three_nodes_divide_one_limit_max_min_fair() {
        // nobody is assigned anything yet: each takes its max-min fair share
        let a = [asks(10.0, 0.0)];
        let b = [asks(50.0, 0.0)];
        let c = [asks(200.0, 0.0)];
        let view = |n: &str, e: &[Entry]| posted(n, &pairs(e));
        let from_b = [view("a", &a), view("c", &c)];
        assert_eq!(own_shares("b", &b, &from_b, 120.0, 0), [50]);
        let from_a = [view("b", &b), view("c", &c)];
        assert_eq!(own_shares("a", &a, &from_a, 120.0, 0), [10]);
        let from_c = [view("a", &a), view("b", &b)];
        assert_eq!(own_shares("c", &c, &from_c, 120.0, 0), [60]);
    }

    #[test]
    fn a_share_grows_only_out_of_room_nobody_is_assigned() {
        // a is assigned 60 and will come down to 40; b's newcomer lacks 40 but finds
        // only the 20 nobody is assigned until a posts its lower assignment
        let a = [asks(200.0, 60.0)];
        let b = [asks(200.0, 60.0), asks(200.0, 0.0)];
        let from_b = [posted("a", &pairs(&a))];
        assert_eq!(own_shares("b", &b, &from_b, 120.0, 0), [40, 20]);
        // a comes down to 40 at once
        let from_a = [posted("b", &pairs(&[asks(200.0, 40.0), asks(200.0, 20.0)]))];
        assert_eq!(own_shares("a", &a, &from_a, 120.0, 0), [40]);
        // once a posts 40, the newcomer grows to its 40
        let from_b = [posted("a", &pairs(&[asks(200.0, 40.0)]))];
        let b = [asks(200.0, 40.0), asks(200.0, 20.0)];
        assert_eq!(own_shares("b", &b, &from_b, 120.0, 0), [40, 40]);
    }

    #[test]
    fn two_nodes_growing_at_once_split_the_room() {
        // 60 free, two newcomers on two nodes each lacking 60: 30 each, never 60 each
        let a = [asks(200.0, 30.0), asks(200.0, 0.0)];
        let b = [asks(200.0, 30.0), asks(200.0, 0.0)];
        let mine_a = own_shares("a", &a, &[posted("b", &pairs(&b))], 120.0, 0);
        let mine_b = own_shares("b", &b, &[posted("a", &pairs(&a))], 120.0, 0);
        let total: u64 = mine_a.iter().chain(&mine_b).sum();
        assert!(total <= 120, "{mine_a:?} {mine_b:?}");
        assert_eq!(mine_a, [30, 30]);
    }

    #[test]
    fn a_proxy_gone_keeps_its_share_until_it_lapses() {
        let others = [posted("a", &[-1.0, 30.0, 500.0, 0.0])];
        let own = [
            asks(500.0, 0.0),
            Entry {
                asks: None,
                shown: false,
                assigned: 20.0,
                client: None,
            },
        ];
        // 120 - 30 - 20 = 70 between two hungry proxies
        assert_eq!(own_shares("b", &own, &others, 120.0, 0), [35, 0]);
    }

    #[test]
    fn this_nodes_own_posted_entry_is_not_counted_twice() {
        let others = [posted("b", &[100.0, 0.0]), posted("a", &[100.0, 0.0])];
        assert_eq!(
            own_shares("b", &[asks(100.0, 0.0)], &others, 100.0, 0),
            [50]
        );
    }

    #[test]
    fn whole_shares_add_up_to_no_more_than_the_limit() {
        let others = [posted("a", &[1e9, 0.0, 1e9, 0.0]), posted("c", &[1e9, 0.0])];
        let own = [asks(1e9, 0.0), asks(1e9, 0.0)];
        let mine: u64 = own_shares("b", &own, &others, 101.0, 0).iter().sum();
        assert!(mine <= 41, "{mine}");
        assert_eq!(
            Action::of_share(0, Duration::from_secs(1), Duration::from_secs(2)).share(),
            Some(0)
        );
        let a = Action::of_share(60, Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(
            a,
            Action::Assign {
                tokens_per_fill: 60,
                fill_interval: Duration::from_secs(1),
                max_tokens: 2,
                ttl: Duration::from_secs(2)
            }
        );
        let later = Action::of_share(60, Duration::from_secs(1), Duration::from_secs(9));
        assert!(a.enforced_alike(&later));
    }

    #[test]
    fn claims_take_only_the_room_shown_demand_leaves() {
        // 300 streams on another node each claiming the limit once: the honest proxy,
        // whose reports show 100, keeps its 100; the claims split the 20 left
        let claimers: Vec<f64> = (0..300).flat_map(|_| claims(120.0, 0.0).posted()).collect();
        let others = [posted("a", &claimers)];
        assert_eq!(
            own_shares("b", &[asks(100.0, 100.0)], &others, 120.0, 0),
            [100]
        );
        let mine: u64 = own_shares(
            "a",
            &Entry::read(&claimers),
            &[posted("b", &[100.0, 100.0])],
            120.0,
            0,
        )
        .iter()
        .sum();
        assert!(mine <= 20, "{mine}");
        // a claim alone still gets the limit (a first report asks for it all)
        assert_eq!(own_shares("a", &[claims(120.0, 0.0)], &[], 120.0, 0), [120]);
    }
}
