//! An engine that stops: its last push (until the deadline the node set, see
//! [`NamespaceSync::stop_by`]) and what it hands back unconfirmed.

use std::time::Duration;

use swin_core::{Diff, UnixMs};
use tracing::{info, warn};

use super::rows::enqueue;
use super::{nanos, now, NamespaceSync};
use crate::store::{normalize, normalize_advances};
use crate::unconfirmed::{Chunk, Unconfirmed};

impl NamespaceSync {
    /// Everything this engine counted that its store has not confirmed, as chunks under
    /// this engine's identity: what failed pushes left, then whatever the tables and
    /// buckets still hold (drained now, with the next sequence numbers). Called once the
    /// engine has stopped and no request reaches its tables any more; whoever takes the
    /// chunks sends them (see [`Unconfirmed::push`]).
    pub async fn take_unconfirmed(&self, now: UnixMs) -> Unconfirmed {
        let mut guard = self.rounds.state.lock().await;
        let st = &mut *guard;
        if self.session.store.is_some() {
            let drained: Vec<Diff> = self
                .counters
                .tables()
                .iter()
                .flat_map(|t| t.drain(now))
                .collect();
            let drained = normalize(&drained);
            if !drained.is_empty() {
                enqueue(&mut st.seq, &mut st.pending, drained);
            }
            let advances = normalize_advances(&self.counters.buckets().drain(nanos(now)));
            if !advances.is_empty() {
                enqueue(&mut st.seq, &mut st.pending_tats, advances);
            }
        }
        let mut chunks: Vec<Chunk> = st
            .pending
            .drain(..)
            .map(|(seq, d)| Chunk::diffs(seq, &d))
            .chain(
                st.pending_tats
                    .drain(..)
                    .map(|(seq, a)| Chunk::advances(seq, nanos(now), &a)),
            )
            .collect();
        // what the synchronous path owes goes too, under its own identity (each
        // identity's chunks stay in their order)
        chunks.extend(self.take_owed());
        chunks.sort_by_key(|c| c.seq);
        self.set_pending(0, 0);
        Unconfirmed {
            namespace: self.name().to_owned(),
            push_id: self.node_id.to_string(),
            chunks: chunks.into(),
        }
    }

    /// The push on shutdown: a few quick attempts, or as many as fit before the
    /// deadline [`NamespaceSync::stop_by`] set; what still fails is logged with its size.
    pub async fn final_push(&self) {
        if self.session.store.is_none() {
            return;
        }
        let deadline = self.session.stop_by.get().copied();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let more = match deadline {
                Some(d) => tokio::time::Instant::now() < d,
                None => attempt <= 3,
            };
            if !more {
                break;
            }
            match self.sync_once(now()).await {
                Ok(report) => {
                    info!(
                        namespace = self.name(),
                        pushed = report.pushed,
                        "final push done"
                    );
                    return;
                }
                Err(e) => {
                    warn!(namespace = self.name(), attempt, cause = %e, "final push failed");
                    let mut pause = tokio::time::Instant::now() + Duration::from_millis(200);
                    if let Some(d) = deadline {
                        pause = pause.min(d);
                    }
                    tokio::time::sleep_until(pause).await;
                }
            }
        }
        let st = self.status();
        warn!(
            namespace = self.name(),
            diffs = st.pending_diffs,
            advances = st.pending_advances,
            "shutting down with diffs the store did not confirm"
        );
    }
}
