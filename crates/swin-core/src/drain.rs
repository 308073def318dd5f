//! A table's drain taken in slices (`WindowTable::drain_in_slices`), and how what it
//! took comes out: each window once, each key's windows together.

use compact_str::CompactString;

use crate::Diff;

/// A drain of one table in slices (see `WindowTable::drain_in_slices`). Dropped
/// unfinished, what it took is lost to the store: the caller finishes it or puts it back
/// (`WindowTable::restore` of [`DrainSlices::finish`]).
#[derive(Debug)]
pub struct DrainSlices {
    pub(crate) keys: Vec<CompactString>,
    pub(crate) next: usize,
    /// Diffs of windows that rolled out of their entries, taken when the drain began.
    pub(crate) overflow: Vec<Diff>,
    pub(crate) drained: Vec<Diff>,
}

impl DrainSlices {
    /// Keys left to drain.
    pub fn left(&self) -> usize {
        self.keys.len() - self.next
    }

    /// Everything taken so far, each window once and each key's windows together: a
    /// window that rolled out of its entry (the overflow list) goes beside the key's
    /// drained windows, and one also drained sums into one diff. (A sync pushes the
    /// batch in chunks and reads beside each chunk the windows of its keys it does not
    /// push: a key's windows apart in two chunks would be read in the first before the
    /// second pushed them.)
    pub fn finish(self) -> Vec<Diff> {
        let DrainSlices {
            overflow, drained, ..
        } = self;
        if overflow.is_empty() {
            return drained;
        }
        let mut by_key: std::collections::HashMap<CompactString, Vec<Diff>> =
            std::collections::HashMap::with_capacity(overflow.len());
        let add = |to: &mut Vec<Diff>, d: Diff| match to
            .iter_mut()
            .find(|x| x.window_start == d.window_start)
        {
            Some(x) => x.value += d.value,
            None => to.push(d),
        };
        for d in overflow {
            add(by_key.entry(d.key.clone()).or_default(), d);
        }
        let mut out: Vec<Diff> = Vec::with_capacity(drained.len() + by_key.len());
        let mut drained = drained.into_iter().peekable();
        // an entry's windows are drained one after the other: a key's run, its entry's
        // (current and previous) windows first, then the older ones that rolled over
        while let Some(first) = drained.next() {
            let key = first.key.clone();
            let mut run = vec![first];
            while let Some(d) = drained.next_if(|d| d.key == key) {
                run.push(d);
            }
            for d in by_key.remove(key.as_str()).unwrap_or_default() {
                add(&mut run, d);
            }
            out.extend(run);
        }
        out.extend(by_key.into_values().flatten());
        out
    }
}
