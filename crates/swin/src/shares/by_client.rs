//! A bucket's room divided by client, then by stream: max-min fair among the clients by
//! what their streams ask together, then among each client's streams by what each asks.
//! A client opening more streams thus gets no more of a bucket, and a share below one
//! token goes whole to one taker at a time, in turn, so no bucket with room tells every
//! stream to deny.
//!
//! Every node computes the same division from the same entries (nodes by id, each node's
//! streams in order) and the same turn (the store's time over [`TURN`]): which of equal
//! takers gets a unit left by rounding down changes every turn, the same on every node.

use std::collections::HashMap;
use std::time::Duration;

use swin_core::{fair, UnixMs};

use super::entry::Entry;

/// How long one turn of the units left by rounding down lasts: four rounds, so that a
/// share handed on is told, posted and read by the other nodes well within its turn.
pub(super) const TURN: Duration = Duration::from_secs(2);

/// The turn at the store's time `at`.
pub(super) fn turn(at: UnixMs) -> u64 {
    u64::try_from(at.0).unwrap_or(0) / TURN.as_millis() as u64
}

/// Whole targets for the live entries, in their order: `room` divided among the
/// clients (an entry with no client, as a node that posts none has it, is a client of
/// its own), then each client's part among its streams. Asks that reports show come
/// first; claimed ones (a first report's, or a silent stream's) divide only what shown
/// ones leave.
pub(super) fn targets(live: &[Entry], room: f64, turn: u64) -> Vec<u64> {
    // (client, shown) → its streams, in order of first appearance
    let mut groups: Vec<(Entry, Vec<usize>)> = Vec::new();
    let mut at: HashMap<(u64, bool), usize> = HashMap::new();
    for (i, e) in live.iter().enumerate() {
        let ask = e.asks.unwrap_or(0.0).max(0.0);
        let known = e.client.map(|c| (c, e.shown));
        match known.and_then(|k| at.get(&k)) {
            Some(&g) => {
                let (sum, members) = &mut groups[g];
                sum.asks = Some(sum.asks.unwrap_or(0.0) + ask);
                members.push(i);
            }
            None => {
                if let Some(k) = known {
                    at.insert(k, groups.len());
                }
                let sum = Entry {
                    asks: Some(ask),
                    ..*e
                };
                groups.push((sum, vec![i]));
            }
        }
    }
    let sums: Vec<Entry> = groups.iter().map(|(sum, _)| *sum).collect();
    let parts = fair::whole_turning(&split(&sums, room), turn);
    let mut out = vec![0; live.len()];
    for ((_, members), part) in groups.iter().zip(parts) {
        let asks: Vec<f64> = members
            .iter()
            .map(|&i| live[i].asks.unwrap_or(0.0))
            .collect();
        let shares = fair::whole_turning(&fair::divide(&asks, part as f64), turn);
        for (&i, share) in members.iter().zip(shares) {
            out[i] = share;
        }
    }
    out
}

/// Shares of `room` for the takers: the shown asks divided max-min fair first, then what
/// they leave among the claimed ones (a claim never takes room from demand that reports
/// show). With no claimed ask, what the shown ones leave is spread among them (room to
/// grow before the next division).
fn split(takers: &[Entry], room: f64) -> Vec<f64> {
    let (shown, claimed): (Vec<usize>, Vec<usize>) =
        (0..takers.len()).partition(|&i| takers[i].shown);
    let ask = |i: &usize| takers[*i].asks.unwrap_or(0.0);
    let mut first = fair::divide(&shown.iter().map(ask).collect::<Vec<_>>(), room);
    let mut out = vec![0.0; takers.len()];
    if !claimed.is_empty() {
        // shown asks get what they ask (up to a fair split), no spread
        for (s, i) in first.iter_mut().zip(&shown) {
            *s = s.min(ask(i).max(0.0));
        }
        let given: f64 = first.iter().sum();
        let rest = fair::divide(
            &claimed.iter().map(ask).collect::<Vec<_>>(),
            (room - given).max(0.0),
        );
        for (s, i) in rest.into_iter().zip(&claimed) {
            out[*i] = s;
        }
    }
    for (s, i) in first.into_iter().zip(&shown) {
        out[*i] = s;
    }
    out
}

/// How much each taker grows, out of `room` no taker is assigned, by what each lacks of
/// its target: all of it when the room holds every lack; else the room in whole tokens,
/// in proportion, a token left by rounding down going to one taker at a time, in turn
/// (never every lack rounded down to nothing while there is room).
pub(super) fn growth(lacking: &[f64], room: f64, turn: u64) -> Vec<u64> {
    let lack: f64 = lacking.iter().sum();
    if lack <= room {
        return lacking.iter().map(|l| l.ceil() as u64).collect();
    }
    let share: Vec<f64> = lacking.iter().map(|l| l * room / lack).collect();
    fair::whole_turning(&share, turn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(d: f64, client: u64) -> Entry {
        Entry {
            asks: Some(d),
            shown: true,
            assigned: 0.0,
            client: Some(client),
        }
    }

    #[test]
    fn many_streams_of_one_client_get_what_one_stream_of_another_does() {
        let mut live = vec![asks(100.0, 1)];
        live.extend((0..64).map(|_| asks(120.0, 2)));
        let t = targets(&live, 100.0, 0);
        assert_eq!(t[0], 50);
        assert_eq!(t[1..].iter().sum::<u64>(), 50);
        assert!(t[1..].iter().all(|&s| s <= 1), "{t:?}");
        // an honest client asking less keeps what it asks
        live[0].asks = Some(30.0);
        assert_eq!(targets(&live, 100.0, 0)[0], 30);
    }

    #[test]
    fn a_share_below_a_token_goes_round_a_clients_streams_in_turn() {
        // four clients of 64 streams, 100 tokens: 25 a client, one each for 25 of its
        // streams a turn, other streams the next turn
        let live: Vec<Entry> = (0..256).map(|i| asks(120.0, i / 64)).collect();
        let mut ever = [false; 256];
        for turn in 0..2 {
            let t = targets(&live, 100.0, turn);
            for c in 0..4 {
                assert_eq!(t[c * 64..(c + 1) * 64].iter().sum::<u64>(), 25, "{t:?}");
            }
            ever.iter_mut().zip(&t).for_each(|(e, &s)| *e |= s > 0);
        }
        assert_eq!(ever.iter().filter(|&&e| e).count(), 2 * 4 * 25);
        // three tokens among four clients: one client waits, another each turn
        let waits: Vec<usize> = (0..4)
            .map(|turn| {
                let t = targets(&live, 3.0, turn);
                assert_eq!(t.iter().sum::<u64>(), 3);
                (0..4)
                    .find(|c| t[c * 64..(c + 1) * 64].iter().sum::<u64>() == 0)
                    .expect("one client waits")
            })
            .collect();
        assert!(waits.windows(2).all(|w| w[0] != w[1]), "{waits:?}");
    }

    #[test]
    fn claims_of_one_client_divide_what_shown_asks_leave() {
        let mut live = vec![asks(100.0, 1)];
        live.extend((0..300).map(|_| Entry {
            shown: false,
            ..asks(120.0, 2)
        }));
        let t = targets(&live, 120.0, 0);
        assert_eq!(t[0], 100);
        assert_eq!(t[1..].iter().sum::<u64>(), 20);
        // an entry with no client (a node posting none) is a client of its own
        let old = Entry {
            client: None,
            ..asks(100.0, 0)
        };
        assert_eq!(targets(&[old, old, asks(100.0, 1)], 90.0, 0), [30, 30, 30]);
    }

    #[test]
    fn room_smaller_than_the_lack_grows_whole_tokens_in_turn() {
        assert_eq!(growth(&[3.0, 4.0], 10.0, 0), [3, 4]);
        // 100 streams lacking one token each, 5 free: 5 grow, others the next turn
        let lacking = [1.0; 100];
        let now = growth(&lacking, 5.0, 0);
        let next = growth(&lacking, 5.0, 1);
        assert_eq!(now.iter().sum::<u64>(), 5);
        assert_eq!(next.iter().sum::<u64>(), 5);
        assert!(now.iter().zip(&next).all(|(a, b)| a + b <= 1));
        assert_eq!(growth(&[2.0, 2.0], 0.5, 0), [0, 0]);
    }
}
