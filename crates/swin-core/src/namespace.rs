//! A namespace's counters: a name, its window sizes and one [`WindowTable`] per size,
//! and its GCRA buckets.

use crate::{BucketTable, CoreError, CounterOptions, UnixMs, WindowRate, WindowSize, WindowTable};

/// The counters of one namespace, one table per configured window size.
#[derive(Debug)]
pub struct NamespaceCounters {
    name: String,
    tables: Vec<WindowTable>,
    /// GCRA buckets (namespaces with `algorithm = "gcra"`; empty otherwise).
    buckets: BucketTable,
    /// Counters per table at most.
    max_counters: usize,
}

impl NamespaceCounters {
    /// `sizes` are deduplicated and sorted. `max_counters` in `options` applies per size.
    pub fn new(name: &str, sizes: &[WindowSize], options: CounterOptions) -> Self {
        let mut sizes = sizes.to_vec();
        sizes.sort();
        sizes.dedup();
        NamespaceCounters {
            name: name.to_owned(),
            max_counters: options.max_counters,
            buckets: BucketTable::new(name, options.max_counters, options.retention),
            tables: sizes
                .into_iter()
                .map(|s| WindowTable::new(name, s, options))
                .collect(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counters per window size (and buckets) at most.
    pub fn max_counters(&self) -> usize {
        self.max_counters
    }

    pub fn window_sizes(&self) -> impl Iterator<Item = WindowSize> + '_ {
        self.tables.iter().map(|t| t.size())
    }

    pub fn buckets(&self) -> &BucketTable {
        &self.buckets
    }

    pub fn tables(&self) -> &[WindowTable] {
        &self.tables
    }

    pub fn table(&self, window_size: u32) -> Result<&WindowTable, CoreError> {
        self.tables
            .iter()
            .find(|t| t.size().secs() == window_size)
            .ok_or_else(|| CoreError::UnknownWindowSize {
                namespace: self.name.clone(),
                window_size,
            })
    }

    /// Kong's `increment(key, window_size, value)`: the sliding rate after the hit.
    pub fn increment(
        &self,
        key: &str,
        window_size: u32,
        value: f64,
        now: UnixMs,
    ) -> Result<WindowRate, CoreError> {
        self.table(window_size)?.increment(key, value, now)
    }

    /// Kong's `sliding_window(key, window_size, cur_diff)`: the rate, nothing counted.
    pub fn rate(
        &self,
        key: &str,
        window_size: u32,
        now: UnixMs,
        current_diff: Option<f64>,
    ) -> Result<WindowRate, CoreError> {
        Ok(self.table(window_size)?.rate(key, now, current_diff))
    }

    /// Entries held over every window size.
    pub fn len(&self) -> usize {
        self.tables.iter().map(WindowTable::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(WindowTable::is_empty)
    }

    pub fn evictions(&self) -> u64 {
        self.tables.iter().map(WindowTable::evictions).sum()
    }
}
