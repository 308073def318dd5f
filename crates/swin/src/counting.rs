//! Counting: increments of a key in one window size or in every size of its
//! namespace, and batches of them, each all or nothing.

use swin_core::{UnixMs, WindowRate};

use crate::decisions::{first_failure, together};
use crate::error::Error;
use crate::pipeline::touch as touch_all;
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
    let rates = count_key(ns, key, value, window_size, now).await?;
    ns.recorder().increments(ns.sync.name(), 1);
    Ok(rates)
}

/// [`increment_key`], not recorded as an increment (counts a door reports, such as the
/// quota service's).
pub(crate) async fn count_key(
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
    // every window at once: synchronous increments of one key share a round trip
    let counted = together(
        ns.counts_in_the_store(),
        sizes.iter().map(|&s| ns.sync.increment(key, s, value, now)),
    )
    .await;
    if counted.iter().any(Result::is_err) {
        let done: Vec<u32> = sizes
            .iter()
            .zip(&counted)
            .filter(|(_, r)| r.is_ok())
            .map(|(&s, _)| s)
            .collect();
        undo(ns, key, value, &done, now).await;
    }
    Ok(counted.into_iter().collect::<Result<_, _>>()?)
}

/// One increment of a batch, checked.
#[derive(Debug)]
pub struct Item<'a> {
    /// Its namespace.
    pub ns: &'a Namespace,
    /// The key.
    pub key: &'a str,
    /// The value to add (negative only where the namespace allows decrements).
    pub value: f64,
    /// One window size, or (`None`) every size of the namespace.
    pub window_size: Option<u32>,
}

/// Counts every item (all at once, in order). All or nothing: when one fails, what the
/// others counted is given back (a client that retries the batch counts it once), and the
/// error comes with the failing item's index.
pub async fn increment_all(
    items: &[Item<'_>],
    now: UnixMs,
) -> Result<Vec<Vec<WindowRate>>, (usize, Error)> {
    // every key this node holds nothing for, read in one call per namespace
    let keys: Vec<(&Namespace, &str)> = items.iter().map(|i| (i.ns, i.key)).collect();
    touch_all(&keys, true).await;
    // counted together: synchronous increments of the batch share round trips
    let counted = futures_util::future::join_all(
        items
            .iter()
            .map(|item| increment_key(item.ns, item.key, item.value, item.window_size, now)),
    )
    .await;
    let (out, failed) = first_failure(counted);
    let Some(failed) = failed else {
        return Ok(out.into_iter().flatten().collect());
    };
    for (done, w) in items.iter().zip(&out) {
        if w.is_some() {
            let sizes = sizes_of(done.ns, done.window_size);
            undo(done.ns, done.key, done.value, &sizes, now).await;
        }
    }
    Err(failed)
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
async fn undo(ns: &Namespace, key: &str, value: f64, sizes: &[u32], now: UnixMs) {
    for &s in sizes {
        if let Err(e) = ns.sync.increment(key, s, -value, now).await {
            // the key holds the value just counted, so its entry cannot be refused
            tracing::error!(namespace = ns.sync.name(), key, cause = %e, "could not give back an increment");
        }
    }
}

/// One increment of a batch, as a door read it.
#[derive(Debug, Clone, Copy)]
pub struct AskedIncrement<'a> {
    /// The namespace named.
    pub namespace: &'a str,
    /// The key.
    pub key: &'a str,
    /// The value (1 when the door was given none).
    pub value: Option<f64>,
    /// One window size, or (`None`) every size of the namespace.
    pub window_size: Option<u32>,
}

/// What a batch of increments counted: each item's windows, in order, and how many
/// items each namespace counted (for the metrics).
#[derive(Debug)]
pub struct CountedBatch {
    /// Each item's windows after it, in order.
    pub windows: Vec<Vec<WindowRate>>,
    /// How many items each namespace counted.
    pub per_namespace: Vec<(std::sync::Arc<Namespace>, u64)>,
}

/// Counts a batch of at most `max` increments over the namespaces `namespaces`, all or
/// nothing: every item is checked before anything is counted (an error names the item:
/// `increments[i]: …`), and when one fails, what the others counted is given back.
pub async fn count_batch(
    namespaces: &crate::state::Namespaces,
    asked: &[AskedIncrement<'_>],
    max: usize,
    now: UnixMs,
) -> Result<CountedBatch, Error> {
    if asked.len() > max {
        return Err(Error::BadRequest(format!(
            "increments must hold at most {max} items (max_batch), got {}",
            asked.len()
        )));
    }
    // namespaces resolved once per distinct name, not once per item
    let mut used: Vec<(std::sync::Arc<Namespace>, u64)> = Vec::new();
    let mut which = Vec::with_capacity(asked.len());
    let mut values = Vec::with_capacity(asked.len());
    for (i, a) in asked.iter().enumerate() {
        let at = |e: Error| e.at(&format!("increments[{i}]"));
        crate::policy::input::check_key(a.key).map_err(at)?;
        let idx = match used.iter().position(|(n, _)| n.sync.name() == a.namespace) {
            Some(idx) => idx,
            None => {
                used.push((crate::state::namespace_in(namespaces, a.namespace)?, 0));
                used.len() - 1
            }
        };
        let ns = &used[idx].0;
        let value =
            crate::policy::input::check_increment(a.value, ns.allow_decrements, ns.sync.name())
                .map_err(at)?;
        if let Some(s) = a.window_size {
            ns.sync.counters().table(s)?;
        }
        values.push(value);
        which.push(idx);
    }
    let items: Vec<Item> = asked
        .iter()
        .zip(&which)
        .zip(&values)
        .map(|((a, &idx), &value)| Item {
            ns: &used[idx].0,
            key: a.key,
            value,
            window_size: a.window_size,
        })
        .collect();
    let windows = increment_all(&items, now)
        .await
        .map_err(|(i, e)| e.at(&format!("increments[{i}]")))?;
    for &idx in &which {
        used[idx].1 += 1;
    }
    for (ns, n) in &used {
        ns.recorder().increments(ns.sync.name(), *n);
    }
    Ok(CountedBatch {
        windows,
        per_namespace: used,
    })
}
