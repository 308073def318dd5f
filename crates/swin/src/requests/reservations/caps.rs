//! When an opening checks the caps on open reservations (`reservations_max_open`,
//! `reservations_max_open_per_client`). The SQL stores count the open rows to check a
//! cap, which costs more as more are open; so a node has its openings check a cap when
//! it has not seen that count for a second, or saw it past half the cap — and every
//! opening near a cap checks it. A cap is then passed only by the openings the whole
//! cluster makes within a second while the count is under half of it: none, for caps
//! the stores can reach at their rates.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use swin_sync::store::{Opened, Opening};

use crate::config::ReservationCaps;

/// How long a count seen stays good enough while it is under half its cap.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// The most clients whose counts a node remembers (past it, it forgets them all and
/// their next openings check).
const MOST_CLIENTS: usize = 100_000;

/// A count the store answered, and when.
#[derive(Debug, Clone, Copy)]
struct Seen {
    count: u64,
    at: Instant,
}

/// What this node last saw of a namespace's counts (shared by its versions).
#[derive(Debug, Default)]
pub(crate) struct CapChecks {
    namespace: Mutex<Option<Seen>>,
    clients: Mutex<HashMap<String, Seen>>,
}

/// Whether a count last `seen` must be checked again against `cap` at `now`.
fn due(seen: Option<Seen>, cap: u64, now: Instant) -> bool {
    seen.is_none_or(|s| {
        now.saturating_duration_since(s.at) >= FRESH_FOR || s.count.saturating_mul(2) >= cap
    })
}

impl CapChecks {
    /// The caps an opening by `client` (`""`: none) checks: each `Some` when due.
    pub(crate) fn due(&self, client: &str, caps: ReservationCaps) -> (Option<u64>, Option<u64>) {
        self.due_at(client, caps, Instant::now())
    }

    fn due_at(
        &self,
        client: &str,
        caps: ReservationCaps,
        now: Instant,
    ) -> (Option<u64>, Option<u64>) {
        let ns = *self.namespace.lock().unwrap_or_else(|p| p.into_inner());
        let max_open = due(ns, caps.max_open(), now).then_some(caps.max_open());
        let per_client = caps.max_open_per_client();
        let mine = match client {
            "" => None,
            c => {
                let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
                due(clients.get(c).copied(), per_client, now).then_some(per_client)
            }
        };
        (max_open, mine)
    }

    /// What an opening by `client` counted (with itself, when it opened); an opening
    /// that counted nothing adds itself to the counts last seen.
    pub(crate) fn saw(&self, client: &str, opened: &Opened) {
        self.saw_at(client, opened, Instant::now());
    }

    fn saw_at(&self, client: &str, opened: &Opened, at: Instant) {
        let mine = u64::from(opened.opening == Opening::Open);
        // a count answered now; else this node's own opening on top of the last one
        let next = |seen: Option<Seen>, answered: Option<u64>| match answered {
            Some(n) => Some(Seen {
                count: n.saturating_add(mine),
                at,
            }),
            None => seen.map(|s| Seen {
                count: s.count.saturating_add(mine),
                at: s.at,
            }),
        };
        {
            let mut ns = self.namespace.lock().unwrap_or_else(|p| p.into_inner());
            *ns = next(*ns, opened.open);
        }
        if client.is_empty() {
            return;
        }
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = next(clients.get(client).copied(), opened.client_open) {
            if clients.len() >= MOST_CLIENTS && !clients.contains_key(client) {
                clients.clear();
            }
            clients.insert(client.to_owned(), seen);
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
    fn a_cap_is_checked_when_unseen_stale_or_past_half() {
        let c = CapChecks::default();
        let caps = caps(100, 10);
        let t0 = Instant::now();
        let later = t0 + FRESH_FOR;
        let due = |client, at| c.due_at(client, caps, at);
        assert_eq!(due("a", t0), (Some(100), Some(10)), "never seen");
        assert_eq!(due("", t0), (Some(100), None), "no client, no share");
        c.saw_at("a", &opened(Opening::Open, Some(10), Some(2)), t0);
        assert_eq!(due("a", t0), (None, None), "seen, under half");
        c.saw_at("a", &opened(Opening::Open, None, None), t0);
        assert_eq!(due("a", t0), (None, None), "4 of 10 with its own");
        assert_eq!(due("b", t0), (None, Some(10)), "another client");
        c.saw_at("a", &opened(Opening::Open, None, None), t0);
        assert_eq!(due("a", t0), (None, Some(10)), "a at 5 of 10, its own");
        c.saw_at("a", &opened(Opening::Open, Some(48), Some(4)), t0);
        assert_eq!(due("a", t0), (None, Some(10)), "a at 5 of 10");
        c.saw_at("a", &opened(Opening::Open, Some(49), None), t0);
        assert_eq!(due("b", t0), (Some(100), Some(10)), "the namespace at 50");
        c.saw_at("b", &opened(Opening::Full, Some(100), None), later);
        assert_eq!(due("b", later), (Some(100), Some(10)), "full: checked");
        c.saw_at("a", &opened(Opening::Open, Some(3), Some(0)), later);
        assert_eq!(due("a", later), (None, None));
        assert_eq!(due("a", later + FRESH_FOR), (Some(100), Some(10)), "stale");
    }
}
