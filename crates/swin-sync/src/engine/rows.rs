//! What a periodic sync pushes, window diffs and GCRA TAT advances alike: each kind's
//! queue, its drain and its store call (see `periodic.rs` for the sync around them).

use swin_core::{Advance, Diff, UnixMs};
use tracing::debug;

use super::{nanos, off_runtime, NamespaceSync};
use crate::store::{normalize, normalize_advances, Push, Store, TatPush};
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

    /// Takes what the local tables hold for the store, normalized (summed per window or
    /// bucket, in lock order), off the runtime. An error: the runtime is shutting down
    /// and drained nothing.
    async fn drain(sync: &NamespaceSync, now: UnixMs) -> Result<Vec<Self>, StoreError>;

    /// Pushes one chunk and applies what the store answers. Returns the rows it read
    /// beside the push (see [`reads_beside`]), which the sync need not read again.
    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        rows: &[Self],
        now: UnixMs,
    ) -> Result<Vec<Self>, StoreError>;
}

impl Rows for Diff {
    fn queue(st: &mut PushState) -> &mut std::collections::VecDeque<(u64, Vec<Self>)> {
        &mut st.pending
    }

    async fn drain(sync: &NamespaceSync, now: UnixMs) -> Result<Vec<Self>, StoreError> {
        let counters = sync.counters.clone();
        off_runtime(move || {
            let all: Vec<Diff> = counters
                .tables()
                .iter()
                .flat_map(|t| t.drain(now))
                .collect();
            normalize(&all)
        })
        .await
    }

    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        diffs: &[Self],
        now: UnixMs,
    ) -> Result<Vec<Self>, StoreError> {
        let reads = if store.capabilities().pipelines {
            reads_beside(diffs, now)
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
        let since = sync.fresh.next();
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
        let counters = sync.counters.clone();
        off_runtime(move || normalize_advances(&counters.buckets().drain(nanos(now)))).await
    }

    async fn push(
        sync: &NamespaceSync,
        store: &Store,
        seq: u64,
        advances: &[Self],
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
/// `now` — that `diffs` lack, as diffs of 0: on a store that pipelines (Redis) they go
/// in the push, whose script reads them in the same HMGET as the key's pushed windows
/// and writes nothing for them, where a read after the push was one more command per
/// key. SQL stores read them apart (a 0 added would take the rows' locks).
fn reads_beside(diffs: &[Diff], now: UnixMs) -> Vec<Diff> {
    let pushed: std::collections::HashSet<(&str, u32, i64)> = diffs
        .iter()
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
