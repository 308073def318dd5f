//! Synchronous increments the store may have applied without saying so (a reply lost, a
//! timeout after the send): each round trip goes with a sequence number of its own
//! identity (`<push id>~s`, so that the synchronous path and the periodic one never
//! overtake each other's numbers), and a round trip whose outcome stays unknown is owed:
//! kept with its number and sent again, exactly as it was, until the store confirms it
//! (the store applies each number once). Until then no later round trip goes (a later
//! number must never overtake an earlier one: Redis keeps the last number per hash), so
//! later increments are counted here and pushed by a sync. What is still owed at a stop
//! is spooled with its number and identity, and applied once by the next start.

use std::collections::VecDeque;

use swin_core::Diff;
use tracing::warn;

use super::NamespaceSync;
use crate::store::{Push, Store};
use crate::{Chunk, StoreError};

/// The synchronous path's sequence numbers and what it owes.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// The last number given.
    seq: u64,
    /// Round trips the store did not confirm, oldest first: each number and its diffs.
    chunks: VecDeque<(u64, Vec<Diff>)>,
}

impl NamespaceSync {
    /// The identity synchronous round trips go under.
    pub(super) fn sync_push_id(&self) -> crate::PushId {
        crate::PushId::new(format!("{}~s", self.node_id))
    }

    /// The next synchronous round trip's number.
    pub(super) fn next_sync_seq(&self) -> u64 {
        let mut o = self.owed_lock();
        o.seq += 1;
        o.seq
    }

    /// Keeps a round trip whose outcome is unknown, to send again (its diffs of 0, reads
    /// that ride along, left out).
    pub(super) fn owe(&self, seq: u64, diffs: &[Diff]) {
        let kept: Vec<Diff> = diffs.iter().filter(|d| d.value != 0.0).cloned().collect();
        if !kept.is_empty() {
            self.owed_lock().chunks.push_back((seq, kept));
        }
    }

    /// Sends what is owed, oldest first, until the store confirms all of it (true) or a
    /// send fails (false: nothing later may go before it).
    pub(super) async fn pay_owed(&self, store: &Store) -> bool {
        let push_id = self.sync_push_id();
        loop {
            let Some((seq, diffs)) = self.owed_lock().chunks.front().cloned() else {
                return true;
            };
            let push = Push {
                node_id: &push_id,
                seq: Some(seq),
                diffs: &diffs,
            };
            let sent = self.fresh.next();
            match self.call(store.push(self.name(), push)).await {
                Ok(pushed) => {
                    for r in &pushed.rejected {
                        warn!(namespace = self.name(), key = %r.diff.key, reason = %r.reason, "the store refused a window for good; its hits are dropped");
                    }
                    self.apply_answered(&pushed.totals, crate::now(), super::Create::No, sent);
                    let mut o = self.owed_lock();
                    if o.chunks.front().is_some_and(|(s, _)| *s == seq) {
                        o.chunks.pop_front();
                    }
                }
                Err(e) => {
                    warn!(namespace = self.name(), cause = %e, seq, "owed synchronous increments not confirmed yet");
                    return false;
                }
            }
        }
    }

    /// What is owed, as chunks of the synchronous identity, taken (a stop).
    pub(super) fn take_owed(&self) -> Vec<Chunk> {
        let id = self.sync_push_id().to_string();
        self.owed_lock()
            .chunks
            .drain(..)
            .map(|(seq, d)| Chunk::diffs(seq, &d).of(&id))
            .collect()
    }

    /// The diffs of the round trips owed.
    pub(super) fn owed_diffs(&self) -> Vec<Diff> {
        let o = self.owed_lock();
        o.chunks
            .iter()
            .flat_map(|(_, d)| d.iter().cloned())
            .collect()
    }

    /// Whether round trips are owed.
    pub(super) fn owes(&self) -> bool {
        !self.owed_lock().chunks.is_empty()
    }

    fn owed_lock(&self) -> std::sync::MutexGuard<'_, Owed> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a failed call leaves its outcome unknown (it may have been applied).
pub(super) fn unknown(e: &StoreError) -> bool {
    e.may_have_run()
}
