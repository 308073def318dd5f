//! Counting: increments of a key in one window size or in every size of its
//! namespace, and batches of them, each all or nothing.

use swin_core::{UnixMs, WindowRate};

use crate::error::Error;
use crate::state::Namespace;

/// Counts one hit of `key` in one window size, or in every size of the namespace. All
/// or nothing: when a window refuses it, the windows counted before are given back.
pub async fn increment_key(
    ns: &Namespace,
    key: &str,
    value: f64,
    window_size: Option<u32>,
    now: UnixMs,
) -> Result<Vec<WindowRate>, Error> {
    if let Some(s) = window_size {
        // one window: nothing before it to give back (and no list of sizes to build)
        return Ok(vec![ns.sync.increment(key, s, value, now).await?]);
    }
    let sizes = sizes_of(ns, None);
    let mut windows = Vec::with_capacity(sizes.len());
    for (i, &s) in sizes.iter().enumerate() {
        match ns.sync.increment(key, s, value, now).await {
            Ok(r) => windows.push(r),
            Err(e) => {
                give_back(ns, key, value, &sizes[..i], now).await;
                return Err(e.into());
            }
        }
    }
    Ok(windows)
}

/// One increment of a batch, checked.
#[derive(Debug)]
pub struct Item<'a> {
    pub ns: &'a Namespace,
    pub key: &'a str,
    pub value: f64,
    pub window_size: Option<u32>,
}

/// Counts every item, in order. All or nothing: when one fails, what the items before
/// it counted is given back (a client that retries the batch counts it once), and the
/// error comes with the failing item's index.
pub async fn increment_all(
    items: &[Item<'_>],
    now: UnixMs,
) -> Result<Vec<Vec<WindowRate>>, (usize, Error)> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match increment_key(item.ns, item.key, item.value, item.window_size, now).await {
            Ok(w) => out.push(w),
            Err(e) => {
                for done in &items[..i] {
                    let sizes = sizes_of(done.ns, done.window_size);
                    give_back(done.ns, done.key, done.value, &sizes, now).await;
                }
                return Err((i, e));
            }
        }
    }
    Ok(out)
}

fn sizes_of(ns: &Namespace, window_size: Option<u32>) -> Vec<u32> {
    match window_size {
        Some(s) => vec![s],
        None => ns
            .sync
            .counters()
            .window_sizes()
            .map(|s| s.secs())
            .collect(),
    }
}

/// Takes `value` back out of the windows of `sizes` (an increment that cannot stand).
async fn give_back(ns: &Namespace, key: &str, value: f64, sizes: &[u32], now: UnixMs) {
    for &s in sizes {
        if let Err(e) = ns.sync.increment(key, s, -value, now).await {
            // the key holds the value just counted, so its entry cannot be refused
            tracing::error!(namespace = ns.sync.name(), key, cause = %e, "could not give back an increment");
        }
    }
}
