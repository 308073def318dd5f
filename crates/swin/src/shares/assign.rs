//! From demands to assignments: one bucket's limit divided among every proxy of the
//! cluster (this node's and the others', as the store has them), and a share turned
//! into the token bucket a proxy enforces.
//!
//! **The bound.** A proxy holding a token bucket of `tokens_per_fill` per unit and
//! `max_tokens` admits at most `tokens_per_fill + max_tokens` in any window of one unit.
//! The shares of live proxies add up to the limit less what proxies that went away may
//! still admit ([`Entry::Held`]), and each is rounded down ([`swin_core::fair::whole`]),
//! so across the cluster a window admits at most `limit + Σ max_tokens`, with
//! `max_tokens = max(2, tokens_per_fill / 50)` (two, so that a request a hair early
//! finds a token): `limit × 1.02 + 2 × proxies` — and one more
//! `max_tokens` per proxy whose share went down in that window (a new bucket starts
//! full). Nodes see each other's demands one sharing round late (at most a reporting
//! interval), so for that long after a proxy joins or a demand moves, a division may
//! still count the old demands.

use std::time::Duration;

use swin_core::fair;
use swin_sync::store::Demands;

/// One of this node's proxies in a bucket, as its division sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Entry {
    /// A live proxy asking for this many requests per unit.
    Asks(f64),
    /// A proxy that went away still holding an assignment of this many per unit until
    /// it lapses: taken off the limit, not divided.
    Held(f64),
}

impl Entry {
    /// As the store keeps it: a demand, or a share held as a negative number.
    pub fn posted(self) -> f64 {
        match self {
            Entry::Asks(d) => d.max(0.0),
            Entry::Held(s) => -s.max(0.0),
        }
    }

    fn from_posted(d: f64) -> Entry {
        if d < 0.0 {
            Entry::Held(-d)
        } else {
            Entry::Asks(d)
        }
    }
}

/// This node's proxies' whole shares of `limit` (per unit), in `own`'s order (a held
/// entry's share is 0: it keeps what it holds), dividing among `own` and every other
/// node's live entries in `others` (this node's own entry among them is skipped).
/// Every node divides the same entries in the same order (nodes by id), so their
/// divisions agree once each has read the others' latest.
pub fn own_shares(node: &str, own: &[Entry], others: &[Demands], limit: f64) -> Vec<u64> {
    let mut nodes: Vec<(&str, Vec<Entry>)> = others
        .iter()
        .filter(|d| d.node != node)
        .map(|d| {
            let entries = d.demands.iter().map(|&x| Entry::from_posted(x)).collect();
            (d.node.as_str(), entries)
        })
        .collect();
    nodes.push((node, own.to_vec()));
    nodes.sort_by(|a, b| a.0.cmp(b.0));
    let held: f64 = nodes
        .iter()
        .flat_map(|(_, e)| e)
        .map(|e| match e {
            Entry::Held(s) => s.max(0.0),
            Entry::Asks(_) => 0.0,
        })
        .sum();
    // every live demand, in node order, and where this node's begin
    let mut demands = Vec::new();
    let mut mine = Vec::with_capacity(own.len());
    for (n, entries) in &nodes {
        for e in entries {
            match (e, *n == node) {
                (Entry::Asks(d), true) => {
                    mine.push(Some(demands.len()));
                    demands.push(*d);
                }
                (Entry::Asks(d), false) => demands.push(*d),
                (Entry::Held(_), true) => mine.push(None),
                (Entry::Held(_), false) => {}
            }
        }
    }
    let shares = fair::whole(&fair::divide(&demands, (limit - held).max(0.0).floor()));
    mine.into_iter()
        .map(|at| at.map_or(0, |i| shares[i]))
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
        /// How long the assignment holds.
        ttl: Duration,
    },
    /// Every request passes (a rule with no limit, or in shadow), until `ttl`.
    AllowAll {
        /// How long it holds.
        ttl: Duration,
    },
    /// No request passes (a rule that blocks, or a share of nothing), until `ttl`.
    DenyAll {
        /// How long it holds.
        ttl: Duration,
    },
    /// No rule covers the bucket: the proxy drops it and falls back to its own config.
    Abandon,
}

impl Action {
    /// The assignment of a whole share per `unit` for `ttl`.
    pub fn of_share(share: u64, unit: Duration, ttl: Duration) -> Action {
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

    /// The same action with its ttl left out: two actions a proxy enforces alike.
    pub fn enforced_alike(&self, other: &Action) -> bool {
        let zero = |a: &Action| match *a {
            Action::Assign {
                tokens_per_fill,
                fill_interval,
                max_tokens,
                ..
            } => Action::Assign {
                tokens_per_fill,
                fill_interval,
                max_tokens,
                ttl: Duration::ZERO,
            },
            Action::AllowAll { .. } => Action::AllowAll {
                ttl: Duration::ZERO,
            },
            Action::DenyAll { .. } => Action::DenyAll {
                ttl: Duration::ZERO,
            },
            Action::Abandon => Action::Abandon,
        };
        zero(self) == zero(other)
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

    #[test]
    fn proxies_on_three_nodes_divide_one_limit_max_min_fair() {
        let others = [posted("a", &[10.0]), posted("c", &[200.0])];
        assert_eq!(own_shares("b", &[Entry::Asks(50.0)], &others, 120.0), [50]);
        // node a's view of the same demands gives it its 10, node c its 60
        let from_a = [posted("b", &[50.0]), posted("c", &[200.0])];
        assert_eq!(own_shares("a", &[Entry::Asks(10.0)], &from_a, 120.0), [10]);
        let from_c = [posted("a", &[10.0]), posted("b", &[50.0])];
        assert_eq!(own_shares("c", &[Entry::Asks(200.0)], &from_c, 120.0), [60]);
    }

    #[test]
    fn a_held_share_is_taken_off_the_limit_until_it_lapses() {
        let others = [posted("a", &[-30.0, 500.0])];
        let own = [Entry::Asks(500.0), Entry::Held(20.0)];
        // 120 - 30 - 20 = 70 between two hungry proxies
        assert_eq!(own_shares("b", &own, &others, 120.0), [35, 0]);
    }

    #[test]
    fn this_nodes_own_posted_entry_is_not_counted_twice() {
        let others = [posted("b", &[100.0]), posted("a", &[100.0])];
        assert_eq!(own_shares("b", &[Entry::Asks(100.0)], &others, 100.0), [50]);
    }

    #[test]
    fn whole_shares_add_up_to_no_more_than_the_limit() {
        let others = [posted("a", &[1e9, 1e9]), posted("c", &[1e9])];
        let own = [Entry::Asks(1e9), Entry::Asks(1e9)];
        let mine: u64 = own_shares("b", &own, &others, 101.0).iter().sum();
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
}
