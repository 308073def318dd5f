//! What a round's read of the store tells: every node's entries for a bucket, kept until
//! the next read; a bucket whose other nodes changed since the last read (it grows
//! nothing until two reads agree); and this node's entries the store lost.

use std::collections::{HashMap, HashSet};

use swin_sync::store::Demands;
use tokio::time::Instant;

use super::{State, ROUND};

/// Whether the store lost this node's entries of `name` (a restart without its data):
/// one it surely holds (posted, not near its lapse) is missing from what was read. Then
/// nothing grows until every assignment the lost entries stood for may have lapsed: the
/// latest lapse of any node's entries as last read, and two rounds more (entries posted
/// since).
pub(super) fn lost_entries(
    state: &mut State,
    node: &str,
    name: &str,
    keys: &[String],
    read: &[Demands],
    now: Instant,
) {
    let mine: HashSet<&str> = read
        .iter()
        .filter(|d| d.node == node)
        .map(|d| d.bucket.as_str())
        .collect();
    let lost = keys.iter().any(|k| {
        let held = state.held.get(&(name.to_owned(), k.clone()));
        held.is_some_and(|until| *until > now) && !mine.contains(k.as_str())
    });
    if !lost {
        return;
    }
    let latest = state
        .remote
        .iter()
        .filter(|((n, _), _)| n == name)
        .flat_map(|(_, v)| v.iter().map(|d| d.expires_at.0))
        .max()
        .unwrap_or(0)
        .max(swin_sync::now().0);
    let until = swin_core::UnixMs(latest.saturating_add((ROUND * 2).as_millis() as i64));
    tracing::warn!(
        namespace = name,
        "the store lost this node's quota entries (a restart without its data): no share grows until what they stood for has lapsed"
    );
    state.lost.insert(name.to_owned(), until);
}

/// Every node's entries as read, kept per bucket until the next read; a bucket whose
/// other nodes (than `me`) are not those of its last read is marked moved (it grows
/// nothing this round).
pub(super) fn remember(
    state: &mut State,
    me: &str,
    name: &str,
    keys: &[String],
    read: Vec<Demands>,
) {
    let mut by_key: HashMap<(String, String), Vec<Demands>> = keys
        .iter()
        .map(|k| ((name.to_owned(), k.clone()), Vec::new()))
        .collect();
    for d in read {
        if let Some(v) = by_key.get_mut(&(name.to_owned(), d.bucket.clone())) {
            v.push(d);
        }
    }
    for (at, now) in &by_key {
        match state
            .remote
            .get(at)
            .is_some_and(|was| same_nodes(was, now, me))
        {
            true => state.moved.remove(at),
            false => state.moved.insert(at.clone()),
        };
    }
    state.remote.extend(by_key);
}

/// Whether two reads of a bucket show the same other nodes than `me`. A node divides
/// with the others it has read: one that appeared (back from an outage, or new) or went
/// since its last read may have grown from a read that did not show this node, so this
/// node grows nothing until two reads in a row agree — by then what the other grew is
/// posted and read.
fn same_nodes(was: &[Demands], now: &[Demands], me: &str) -> bool {
    let nodes = |v: &[Demands]| -> Vec<String> {
        let mut n: Vec<String> = v
            .iter()
            .filter(|d| d.node != me)
            .map(|d| d.node.clone())
            .collect();
        n.sort_unstable();
        n
    };
    nodes(was) == nodes(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_grows_only_from_two_reads_alike_in_their_nodes() {
        let entry = |node: &str| Demands {
            bucket: "b".into(),
            node: node.into(),
            demands: vec![10.0, 0.0],
            expires_at: swin_core::UnixMs(0),
        };
        let d = [entry("d")];
        let cd = [entry("c"), entry("d")];
        let dc = [entry("d"), entry("c")];
        assert!(same_nodes(&d, &d, "d"));
        assert!(same_nodes(&cd, &dc, "d"));
        // c came back: d reads it once and does not grow yet, nor after it went
        assert!(!same_nodes(&d, &cd, "d"));
        assert!(!same_nodes(&cd, &d, "d"));
        // d's own entry appearing (its first post) is no other node
        assert!(same_nodes(&[], &d, "d"));
        let mut state = State::default();
        let keys = ["b".to_owned()];
        let moved = |s: &State| s.moved.contains(&("ns".to_owned(), "b".to_owned()));
        remember(&mut state, "d", "ns", &keys, Vec::new());
        assert!(moved(&state), "a first read: nothing to agree with");
        remember(&mut state, "d", "ns", &keys, d.to_vec());
        assert!(!moved(&state));
        remember(&mut state, "d", "ns", &keys, cd.to_vec());
        assert!(moved(&state));
        remember(&mut state, "d", "ns", &keys, dc.to_vec());
        assert!(!moved(&state));
    }
}
