//! What a periodic sync pushes, window diffs and GCRA TAT advances alike: each kind's
//! queue, its drain and its store call (see `periodic.rs` for the sync around them).

use std::sync::{Arc, Mutex};

use swin_core::{Advance, Diff, UnixMs};
use tracing::debug;

use super::taken::{take_advances, take_slice, AdvancesTaken, Slot, Taken};
use super::{nanos, off_runtime, NamespaceSync};
use crate::store::{Push, Store, TatPush};
use crate::StoreError;

/// Windows pushed per store call (see `READ_CHUNK` in `periodic.rs`: a chunk is how
/// long a sync can hold requests back on the store's connection).
pub(super) const PUSH_CHUNK: usize = 500;

#[derive(Debug, Default)]
pub(super) struct PushState {
    pub(super) seq: u64,
    /// Drained batches not yet confirmed, each with its sequence number, in push order.
    pub(super) pending: std::collections::VecDeque<(u64, Vec<Diff>)>,
    /// GCRA advances drained but not confirmed, with their own sequence number.
    pub(super) pending_tats: std::collections::VecDeque<(u64, Vec<Advance>)>,
}

/// What a sync pushes: window diffs or GCRA TAT advances, each with its queue in
/// [`PushState`], its drain and its store call.
pub(super) trait Rows: Clone + Send + Sync + 'static {
    fn queue(st: &mut PushState) -> &mut std::collections::VecDeque<(u64, Vec<Self>)>;

    /// Takes what the local tables hold for the store, each window or bucket once, off the
    /// runtime (a large table in slices). Not sorted: a store sorts each push it is
    /// handed into its lock order. An error: the runtime is shutting down, and whatever
    /// the drain took is back in the tables.
    async fn drain(sync: &NamespaceSync, now: UnixMs) -> Result<Vec<Self>, StoreError>;

    /// Pushes one chunk and applies what the store answers. Returns the rows it read
    /// beside the push (see [`reads_beside`]), which the sync need not read again.
    /// `next`: the chunk queued after this one (a key split between the two is read in
    /// neither before its last rows are pushed).
    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        rows: &[Self],
        next: &[Self],
        now: UnixMs,
    ) -> Result<Vec<Self>, StoreError>;
}

impl Rows for Diff {
    fn queue(st: &mut PushState) -> &mut std::collections::VecDeque<(u64, Vec<Self>)> {
        &mut st.pending
    }

    async fn drain(sync: &NamespaceSync, now: UnixMs) -> Result<Vec<Self>, StoreError> {
        let mut taken = Taken {
            counters: sync.counters.clone(),
            done: Vec::new(),
            open: None,
        };
        for table in 0..sync.counters.tables().len() {
            let slot = Arc::new(Mutex::new(Slot::Waiting));
            taken.open = Some((table, slot.clone()));
            loop {
                let (counters, slot) = (sync.counters.clone(), slot.clone());
                let more = off_runtime(move || take_slice(&counters.tables()[table], &slot, now));
                // a call that did not run: what the drain took goes back (see Taken)
                if !more.await? {
                    break;
                }
            }
            taken.close();
        }
        Ok(taken.all())
    }

    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        diffs: &[Self],
        next: &[Self],
        now: UnixMs,
    ) -> Result<Vec<Self>, StoreError> {
        let reads = if store.capabilities().pipelines {
            reads_beside(diffs, next, now)
        } else {
            Vec::new()
        };
        let all = if reads.is_empty() {
            std::borrow::Cow::Borrowed(diffs)
        } else {
            std::borrow::Cow::Owned([diffs, &reads].concat())
        };
        let push = Push {
            node_id: &sync.node_id,
            seq: Some(seq),
            diffs: &all,
        };
        let since = sync.fresh.since();
        let reply = sync.call(store.push(sync.name(), push)).await?;
        let totals = sync.settle(&all, reply);
        let applied = sync.apply_off_runtime(totals, now, since).await;
        confirmed(sync, applied);
        Ok(reads)
    }
}

/// Advances are applied as `tat = max(tat, now) + Σ`.
impl Rows for Advance {
    fn queue(st: &mut PushState) -> &mut std::collections::VecDeque<(u64, Vec<Self>)> {
        &mut st.pending_tats
    }

    async fn drain(sync: &NamespaceSync, now: UnixMs) -> Result<Vec<Self>, StoreError> {
        let taken = AdvancesTaken::new(sync.counters.clone());
        let slot = taken.slot.clone();
        let counters = sync.counters.clone();
        // a call that did not run, or whose sync went away: what it took goes back
        off_runtime(move || take_advances(&counters, &slot, now)).await?;
        Ok(taken.all())
    }

    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        advances: &[Self],
        _next: &[Self],
        now: UnixMs,
    ) -> Result<Vec<Self>, StoreError> {
        let push = TatPush {
            node_id: &sync.node_id,
            seq: Some(seq),
            now_ns: nanos(now),
            advances,
        };
        let tats = sync.call(store.push_tats(sync.name(), push)).await?;
        let applied = sync.apply_tats_off_runtime(tats).await;
        confirmed(sync, applied);
        Ok(Vec::new())
    }
}

/// The windows a sync reads of each key `diffs` push — its current and previous at
/// `now` — that `diffs` lack, as diffs of 0: on a store that pipelines they go in the
/// push and are read, not written (Redis's script reads them in the same HMGET as the
/// key's pushed windows; PostgreSQL's statement selects them, taking no row lock), where
/// a read after the push was one more call per chunk. SQLite reads them apart.
fn reads_beside(diffs: &[Diff], next: &[Diff], now: UnixMs) -> Vec<Diff> {
    // a window pushed here or in the next chunk is not read: its total comes back with
    // its push (read earlier, it would overwrite this node's drained diff in its view
    // with a count that lacks it until that push answers)
    let pushed: std::collections::HashSet<(&str, u32, i64)> = diffs
        .iter()
        .chain(next)
        .map(|d| (d.key.as_str(), d.window_size, d.window_start))
        .collect();
    let mut keys: std::collections::HashSet<(&str, u32)> = std::collections::HashSet::new();
    let mut reads = Vec::new();
    for d in diffs {
        let Ok(size) = swin_core::WindowSize::new(u64::from(d.window_size)) else {
            continue;
        };
        if !keys.insert((d.key.as_str(), d.window_size)) {
            continue;
        }
        for start in [size.start_of(now), size.previous_start_of(now)] {
            if !pushed.contains(&(d.key.as_str(), d.window_size, start)) {
                reads.push(Diff {
                    key: d.key.clone(),
                    window_size: d.window_size,
                    window_start: start,
                    value: 0.0,
                });
            }
        }
    }
    reads
}

/// A push the store confirmed is done, whether or not its totals were applied: a runtime
/// shutting down before they were leaves this node's view a sync behind, and the chunk
/// must not go again (nor into what the engine hands over unconfirmed).
fn confirmed(sync: &NamespaceSync, applied: Result<(), StoreError>) {
    if let Err(e) = applied {
        debug!(namespace = sync.name(), cause = %e, "a confirmed push's totals were not applied");
    }
}

/// Queues a drained batch for pushing: chunks of at most PUSH_CHUNK, each with the next
/// sequence number of the namespace (shared by counters and buckets).
pub(super) fn enqueue<T: Clone>(
    seq: &mut u64,
    pending: &mut std::collections::VecDeque<(u64, Vec<T>)>,
    drained: Vec<T>,
) {
    for chunk in drained.chunks(PUSH_CHUNK) {
        *seq += 1;
        pending.push_back((*seq, chunk.to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};

    use crate::engine::taken::DRAIN_SLICE;
    use crate::store::{CounterStore, SqliteStore, WindowKey};
    use crate::{NamespaceSync, Store, SyncMode};

    const NOW: UnixMs = UnixMs(1_700_000_000_000);

    fn counters(keys: usize) -> Arc<NamespaceCounters> {
        let size = WindowSize::new(60).expect("size");
        let c = Arc::new(NamespaceCounters::new(
            "api",
            &[size],
            CounterOptions::default(),
        ));
        let t = c.table(60).expect("table");
        for i in 0..keys {
            t.increment(&format!("k{i}"), (i % 7 + 1) as f64, NOW)
                .expect("counted");
        }
        c
    }

    fn expected(keys: usize) -> f64 {
        (0..keys).map(|i| (i % 7 + 1) as f64).sum()
    }

    /// A table past twice the slice drains in slices, and every hit reaches the store,
    /// each window once, nothing left behind in the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_table_drains_in_slices_and_every_hit_reaches_the_store() {
        let keys = 2 * DRAIN_SLICE + 777;
        let c = counters(keys);
        let store = SqliteStore::connect("sqlite::memory:")
            .await
            .expect("store");
        store.migrate().await.expect("schema");
        let engine = NamespaceSync::new(
            c.clone(),
            SyncMode::Periodic(Duration::from_secs(1)),
            Some(Store::Sqlite(store.clone())),
            "n1".into(),
            Duration::from_secs(1),
        );
        let report = engine.sync_once(NOW).await.expect("synced");
        assert_eq!(report.pushed, keys);
        let wanted: Vec<WindowKey> = (0..keys)
            .map(|i| WindowKey {
                key: format!("k{i}").into(),
                window_size: 60,
                window_start: 1_700_000_000 - 1_700_000_000 % 60,
            })
            .collect();
        let totals = store.read("api", &wanted).await.expect("read");
        assert_eq!(totals.len(), keys);
        assert_eq!(totals.iter().map(|t| t.count).sum::<f64>(), expected(keys));
        assert!(c.table(60).expect("table").drain(NOW).is_empty());
    }

    /// A key whose windows a chunk boundary splits is not read beside the first chunk:
    /// its window in the next chunk comes back with that push (read before it, the
    /// store's count, which lacks this node's drained diff, would replace the node's
    /// view of it until the next chunk answered).
    #[test]
    fn a_window_the_next_chunk_pushes_is_not_read_beside_this_one() {
        let size = WindowSize::new(60).expect("size");
        let (cur, prev) = (size.start_of(NOW), size.previous_start_of(NOW));
        let d = |key: &str, start: i64| swin_core::Diff {
            key: key.into(),
            window_size: 60,
            window_start: start,
            value: 1.0,
        };
        let chunk = [d("a", cur), d("k", prev)];
        let next = [d("k", cur), d("z", cur)];
        let mut reads: Vec<(String, i64)> = super::reads_beside(&chunk, &next, NOW)
            .into_iter()
            .map(|r| (r.key.to_string(), r.window_start))
            .collect();
        reads.sort();
        assert_eq!(reads, vec![("a".to_string(), prev)]);
    }

    /// The same through the sync's own drain: its future polled until the call off the
    /// runtime has run, then dropped (the sync went away), leaves every advance in the
    /// buckets for the next drain.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sync_dropped_after_its_buckets_drain_ran_leaves_every_advance() {
        let c = counters(0);
        let gcra = swin_core::Gcra::new(10, 10, Duration::from_secs(60)).expect("gcra");
        let now_ns = super::nanos(NOW);
        for key in ["a", "b", "c"] {
            c.buckets()
                .spend(&gcra, key, now_ns, 2, false)
                .expect("spent");
        }
        let engine = NamespaceSync::new(
            c.clone(),
            SyncMode::Periodic(Duration::from_secs(1)),
            None,
            "n1".into(),
            Duration::from_secs(1),
        );
        let mut drain = Box::pin(<swin_core::Advance as super::Rows>::drain(&engine, NOW));
        // polled once: the call is on the blocking pool
        tokio::select! {
            biased;
            _ = &mut drain => panic!("the drain answered before its call ran"),
            _ = async {} => {}
        }
        // the call has run (it takes nothing but the buckets' walk) ...
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ... and the sync goes away before reading what it took
        drop(drain);
        let left = c.buckets().drain(now_ns);
        assert_eq!(
            left.len(),
            3,
            "advances lost with the dropped drain: {left:?}"
        );
        assert!(left.iter().all(|a| a.ns > 0), "{left:?}");
    }
}
