//! Namespaces: a name, its window sizes and one [`WindowTable`] per size; and
//! [`Counters`], the registry of namespaces a node holds.

use std::sync::Arc;

use crate::{BucketTable, CoreError, CounterOptions, UnixMs, WindowRate, WindowSize, WindowTable};

/// The counters of one namespace, one table per configured window size.
#[derive(Debug)]
pub struct NamespaceCounters {
    name: String,
    tables: Vec<WindowTable>,
    /// GCRA buckets (namespaces with `algorithm = "gcra"`; empty otherwise).
    buckets: BucketTable,
}

impl NamespaceCounters {
    /// `sizes` are deduplicated and sorted. `max_counters` in `options` applies per size.
    pub fn new(name: &str, sizes: &[WindowSize], options: CounterOptions) -> Self {
        let mut sizes = sizes.to_vec();
        sizes.sort();
        sizes.dedup();
        NamespaceCounters {
            name: name.to_owned(),
            buckets: BucketTable::new(name, options.max_counters),
            tables: sizes
                .into_iter()
                .map(|s| WindowTable::new(name, s, options))
                .collect(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
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

/// Every namespace of a node, looked up by name without taking a lock.
#[derive(Debug, Default)]
pub struct Counters {
    namespaces: papaya::HashMap<String, Arc<NamespaceCounters>, foldhash::fast::RandomState>,
}

impl Counters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a namespace; a name may be defined once (Kong's `new` errors on a duplicate).
    pub fn create(&self, ns: NamespaceCounters) -> Result<Arc<NamespaceCounters>, CoreError> {
        let ns = Arc::new(ns);
        let name = ns.name().to_owned();
        match self.namespaces.pin().try_insert(name.clone(), ns.clone()) {
            Ok(_) => Ok(ns),
            Err(_) => Err(CoreError::DuplicateNamespace(name)),
        }
    }

    /// Replaces or adds a namespace (reconfiguration), returning the one it replaced.
    pub fn replace(&self, ns: NamespaceCounters) -> Option<Arc<NamespaceCounters>> {
        let ns = Arc::new(ns);
        self.namespaces
            .pin()
            .insert(ns.name().to_owned(), ns)
            .cloned()
    }

    pub fn remove(&self, name: &str) -> Option<Arc<NamespaceCounters>> {
        self.namespaces.pin().remove(name).cloned()
    }

    pub fn get(&self, name: &str) -> Result<Arc<NamespaceCounters>, CoreError> {
        self.namespaces
            .pin()
            .get(name)
            .cloned()
            .ok_or_else(|| CoreError::UnknownNamespace(name.to_owned()))
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.namespaces.pin().keys().cloned().collect();
        v.sort();
        v
    }

    pub fn increment(
        &self,
        namespace: &str,
        key: &str,
        window_size: u32,
        value: f64,
        now: UnixMs,
    ) -> Result<WindowRate, CoreError> {
        let map = self.namespaces.pin();
        let ns = map
            .get(namespace)
            .ok_or_else(|| CoreError::UnknownNamespace(namespace.to_owned()))?;
        ns.increment(key, window_size, value, now)
    }
}
