//! A batch as a store writes it: duplicates summed, sorted in the lock order (by key,
//! then window), so a statement touches a row once and every node takes row locks in
//! the same order, which rules out deadlocks.

use std::collections::BTreeMap;

use swin_core::{Advance, Diff};

/// Sums advances per key, in key order (the lock order, as for diffs).
pub(crate) fn normalize_advances(advances: &[Advance]) -> Vec<Advance> {
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    for a in advances {
        let s = sums.entry(a.key.as_str()).or_default();
        *s = s.saturating_add(a.ns);
    }
    sums.into_iter()
        .map(|(key, ns)| Advance {
            key: key.into(),
            ns,
        })
        .collect()
}

/// Sums duplicate windows and sorts by key, size and start: a statement may touch a row
/// once, and every node taking row locks in the same order is what rules out deadlocks.
pub(crate) fn normalize(diffs: &[Diff]) -> Vec<Diff> {
    let mut sums: BTreeMap<(&str, u32, i64), f64> = BTreeMap::new();
    for d in diffs {
        *sums
            .entry((d.key.as_str(), d.window_size, d.window_start))
            .or_default() += d.value;
    }
    sums.into_iter()
        .map(|((key, window_size, window_start), value)| Diff {
            key: key.into(),
            window_size,
            window_start,
            value,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_sums_duplicates_in_order() {
        let d = |k: &str, s, v| Diff {
            key: k.into(),
            window_size: 60,
            window_start: s,
            value: v,
        };
        let out = normalize(&[
            d("b", 0, 1.0),
            d("a", 60, 2.0),
            d("b", 0, 3.0),
            d("a", 0, 1.0),
        ]);
        assert_eq!(out, vec![d("a", 0, 1.0), d("a", 60, 2.0), d("b", 0, 4.0)]);
    }
}
