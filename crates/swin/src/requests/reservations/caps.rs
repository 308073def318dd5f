//! When an opening checks the caps on open reservations (`reservations_max_open`,
//! `reservations_max_open_per_client`), and when a reserve is refused before it spends.
//!
//! Redis checks a cap by the size of a sorted set: every opening checks both. The SQL
//! stores count the open rows, which costs more as more are open; so there an opening
//! checks a cap unless the node saw its count within the last second, at least
//! [`CHEAP`] and, with the openings this node has in flight, under half the cap. Near a
//! cap (or under [`CHEAP`]) every opening checks it, and a client's checks on
//! PostgreSQL wait for each other: exact. A cap is passed only by what the whole cluster
//! opens within a second while its count is under half of it.
//!
//! A reserve refused by a cap spends its estimate first (a hit, all or nothing) and
//! gives it back: for a second after a cap refused a client (or the namespace), its
//! reserves on this node are refused before they spend, so that a client at its cap
//! cannot keep a key's limit taken from everyone else. A commit through this node
//! forgets those refusals (the place it frees is then checked for).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use swin_sync::store::{Opened, Opening};

use crate::config::ReservationCaps;

/// How long a count seen (or a refusal) stays good enough.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// Counts under this are checked on every opening: cheap to count.
const CHEAP: u64 = 1_000;
/// The most clients whose counts a node remembers (past it, it forgets them all and
/// their next openings check).
const MOST_CLIENTS: usize = 100_000;

/// A count the store answered and when, this node's openings in flight since, and
/// when a cap last refused.
#[derive(Debug, Default, Clone, Copy)]
struct Count {
    seen: Option<(u64, Instant)>,
    in_flight: u64,
    refused: Option<Instant>,
}

impl Count {
    /// Whether an opening at `now` (counted in flight) checks against `cap`.
    fn due(&self, cap: u64, now: Instant) -> bool {
        let Some((count, at)) = self.seen else {
            return true;
        };
        let ahead = count.saturating_add(self.in_flight);
        now.saturating_duration_since(at) >= FRESH_FOR
            || count < CHEAP
            || ahead.saturating_mul(2) >= cap
    }

    /// Whether a cap refused within the last second.
    fn full(&self, now: Instant) -> bool {
        self.refused
            .is_some_and(|at| now.saturating_duration_since(at) < FRESH_FOR)
    }

    /// What an opening counted (`answered`: the store's count before it, if checked).
    fn saw(&mut self, answered: Option<u64>, opened: bool, refused: bool, at: Instant) {
        let mine = u64::from(opened);
        self.seen = match (answered, self.seen) {
            (Some(n), _) => Some((n.saturating_add(mine), at)),
            (None, Some((n, when))) => Some((n.saturating_add(mine), when)),
            (None, None) => None,
        };
        if refused {
            self.refused = Some(at);
        }
    }
}

/// What this node saw of a namespace's counts (shared by its versions).
#[derive(Debug, Default)]
pub(crate) struct CapChecks {
    namespace: Mutex<Count>,
    clients: Mutex<HashMap<String, Count>>,
}

/// An opening under way: the caps it checks; in flight until dropped.
#[derive(Debug)]
pub(crate) struct Checking<'a> {
    checks: &'a CapChecks,
    client: &'a str,
    /// `reservations_max_open` when this opening checks it.
    pub(crate) max_open: Option<u64>,
    /// `reservations_max_open_per_client` when this opening checks it.
    pub(crate) max_open_per_client: Option<u64>,
}

impl CapChecks {
    fn namespace(&self) -> std::sync::MutexGuard<'_, Count> {
        self.namespace.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<String, Count>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Which cap, if any, refused `client` (`""`: none) within the last second: its
    /// reserve is refused before it spends.
    pub(crate) fn refused(&self, client: &str) -> Option<Opening> {
        let now = Instant::now();
        if self.namespace().full(now) {
            return Some(Opening::Full);
        }
        let clients = self.clients();
        let full = !client.is_empty() && clients.get(client).is_some_and(|c| c.full(now));
        full.then_some(Opening::ClientFull)
    }

    /// A reservation ended through this node: the refusals it remembers are forgotten.
    pub(crate) fn freed(&self) {
        self.namespace().refused = None;
        for c in self.clients().values_mut() {
            c.refused = None;
        }
    }

    /// An opening by `client` begins: the caps it checks (`every`: both, as on Redis).
    pub(crate) fn begin<'a>(
        &'a self,
        client: &'a str,
        caps: ReservationCaps,
        every: bool,
    ) -> Checking<'a> {
        self.begin_at(client, caps, every, Instant::now())
    }

    fn begin_at<'a>(
        &'a self,
        client: &'a str,
        caps: ReservationCaps,
        every: bool,
        now: Instant,
    ) -> Checking<'a> {
        let max_open = {
            let mut ns = self.namespace();
            ns.in_flight += 1;
            (every || ns.due(caps.max_open(), now)).then_some(caps.max_open())
        };
        let max_open_per_client = match client {
            "" => None,
            c => {
                let mut clients = self.clients();
                if clients.len() >= MOST_CLIENTS && !clients.contains_key(c) {
                    clients.retain(|_, n| n.in_flight > 0);
                }
                let n = clients.entry(c.to_owned()).or_default();
                n.in_flight += 1;
                let cap = caps.max_open_per_client();
                (every || n.due(cap, now)).then_some(cap)
            }
        };
        Checking {
            checks: self,
            client,
            max_open,
            max_open_per_client,
        }
    }
}

impl Checking<'_> {
    /// What the opening did and counted.
    pub(crate) fn saw(&self, opened: &Opened) {
        self.saw_at(opened, Instant::now());
    }

    fn saw_at(&self, opened: &Opened, at: Instant) {
        let open = opened.opening == Opening::Open;
        let full = opened.opening == Opening::Full;
        self.checks.namespace().saw(opened.open, open, full, at);
        if !self.client.is_empty() {
            let client_full = opened.opening == Opening::ClientFull;
            if let Some(c) = self.checks.clients().get_mut(self.client) {
                c.saw(opened.client_open, open, client_full, at);
            }
        }
    }
}

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        let mut ns = self.checks.namespace();
        ns.in_flight = ns.in_flight.saturating_sub(1);
        drop(ns);
        if !self.client.is_empty() {
            if let Some(c) = self.checks.clients().get_mut(self.client) {
                c.in_flight = c.in_flight.saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max_open: u64, max_open_per_client: u64) -> ReservationCaps {
        ReservationCaps {
            max_open,
            max_open_per_client,
        }
    }

    fn opened(opening: Opening, open: Option<u64>, client_open: Option<u64>) -> Opened {
        Opened {
            opening,
            open,
            client_open,
        }
    }

    #[test]
    fn small_counts_are_checked_always_large_ones_when_stale_or_past_half() {
        let c = CapChecks::default();
        let caps = caps(100_000, 10_000);
        let t0 = Instant::now();
        let first = c.begin_at("a", caps, false, t0);
        assert_eq!(
            (first.max_open, first.max_open_per_client),
            (Some(100_000), Some(10_000)),
            "never seen"
        );
        first.saw_at(&opened(Opening::Open, Some(1_500), Some(10)), t0);
        drop(first);
        let next = c.begin_at("a", caps, false, t0);
        assert_eq!(
            (next.max_open, next.max_open_per_client),
            (None, Some(10_000)),
            "the namespace's count is large and fresh; the client's small"
        );
        next.saw_at(&opened(Opening::Open, None, Some(11)), t0);
        drop(next);
        let every = c.begin_at("a", caps, true, t0);
        assert_eq!(every.max_open, Some(100_000), "as on Redis");
        drop(every);
        let later = c.begin_at("a", caps, false, t0 + FRESH_FOR);
        assert_eq!(later.max_open, Some(100_000), "stale");
    }

    #[test]
    fn openings_in_flight_count_toward_half_the_cap() {
        let c = CapChecks::default();
        let caps = caps(10_000, 4_000);
        let t0 = Instant::now();
        let seen = c.begin_at("a", caps, false, t0);
        seen.saw_at(&opened(Opening::Open, Some(1_990), Some(1_990)), t0);
        drop(seen);
        // 1,991 seen: under half of 4,000 until 9 more are in flight
        let burst: Vec<_> = (0..20).map(|_| c.begin_at("a", caps, false, t0)).collect();
        let unchecked = burst
            .iter()
            .filter(|b| b.max_open_per_client.is_none())
            .count();
        assert_eq!(unchecked, 8, "the rest check");
        drop(burst);
        let after = c.begin_at("a", caps, false, t0);
        assert!(after.max_open_per_client.is_none(), "none in flight again");
    }

    #[test]
    fn a_refusal_holds_for_a_second_or_until_a_commit_here() {
        let c = CapChecks::default();
        let caps = caps(100, 2);
        let t0 = Instant::now();
        let o = c.begin_at("a", caps, false, t0);
        o.saw_at(&opened(Opening::ClientFull, Some(5), Some(2)), t0);
        drop(o);
        assert_eq!(c.refused("a"), Some(Opening::ClientFull));
        assert_eq!(c.refused("b"), None, "another client");
        c.freed();
        assert_eq!(c.refused("a"), None, "a commit here frees a place");
        let o = c.begin_at("b", caps, false, t0);
        o.saw_at(&opened(Opening::Full, Some(100), None), t0);
        drop(o);
        assert_eq!(
            c.refused("z"),
            Some(Opening::Full),
            "the namespace, for anyone"
        );
    }
}
