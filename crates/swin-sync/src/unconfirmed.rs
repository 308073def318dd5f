//! Pushes a store has not confirmed, kept with the identity and sequence number they
//! were first sent under. Whoever sends them later — the node retrying in the background
//! after a reload, or the next start replaying them from the spool — gets each applied at
//! most once: the store recognises `(push_id, namespace, seq)` if the first attempt did
//! reach it and only its reply was lost.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use swin_core::{Advance, Diff};

use crate::store::{Push, Store, TatPush};
use crate::StoreError;

/// The rows of one chunk: window diffs `(key, window_size, window_start, value)`, or GCRA
/// TAT advances `(key, ns)` applied at `now_ns`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rows {
    Diffs(Vec<(String, u32, i64, f64)>),
    Advances {
        now_ns: i64,
        advances: Vec<(String, i64)>,
    },
}

/// One push as it was (or would have been) first sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub seq: u64,
    pub rows: Rows,
    /// The identity it went under, when not its [`Unconfirmed`]'s (a synchronous round
    /// trip's: `<push id>~s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_id: Option<String>,
}

impl Chunk {
    /// The same chunk, sent under the identity `push_id`.
    pub fn of(mut self, push_id: &str) -> Self {
        self.push_id = Some(push_id.to_owned());
        self
    }

    pub fn diffs(seq: u64, diffs: &[Diff]) -> Self {
        Chunk {
            seq,
            rows: Rows::Diffs(
                diffs
                    .iter()
                    .map(|d| (d.key.to_string(), d.window_size, d.window_start, d.value))
                    .collect(),
            ),
            push_id: None,
        }
    }

    pub fn advances(seq: u64, now_ns: i64, advances: &[Advance]) -> Self {
        Chunk {
            seq,
            rows: Rows::Advances {
                now_ns,
                advances: advances.iter().map(|a| (a.key.to_string(), a.ns)).collect(),
            },
            push_id: None,
        }
    }
}

/// What one engine left unconfirmed: its push identity and its chunks in push order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unconfirmed {
    pub namespace: String,
    pub push_id: String,
    pub chunks: VecDeque<Chunk>,
}

impl Unconfirmed {
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Windows (key × window) and buckets held.
    pub fn rows(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| match &c.rows {
                Rows::Diffs(d) => d.len(),
                Rows::Advances { advances, .. } => advances.len(),
            })
            .sum()
    }

    /// The hits the window diffs add up to.
    pub fn hits(&self) -> f64 {
        self.chunks
            .iter()
            .map(|c| match &c.rows {
                Rows::Diffs(d) => d.iter().map(|r| r.3).sum(),
                Rows::Advances { .. } => 0.0,
            })
            .sum()
    }

    /// Sends the chunks in order, each under its identity and sequence number, and drops
    /// each one the store confirms. Stops at the first failure: a later chunk of one
    /// identity must never overtake an earlier one (Redis keeps the last sequence number
    /// applied, so the earlier one would then be skipped). Windows the store refuses for
    /// good are logged and dropped, as a sync does.
    pub async fn push(&mut self, store: &Store, timeout: Duration) -> Result<usize, StoreError> {
        let mut pushed = 0;
        while let Some(chunk) = self.chunks.front() {
            let push_id = crate::PushId::new(chunk.push_id.as_deref().unwrap_or(&self.push_id));
            let call = async {
                match &chunk.rows {
                    Rows::Diffs(rows) => {
                        let diffs: Vec<Diff> = rows
                            .iter()
                            .map(|(key, window_size, window_start, value)| Diff {
                                key: key.as_str().into(),
                                window_size: *window_size,
                                window_start: *window_start,
                                value: *value,
                            })
                            .collect();
                        let push = Push {
                            node_id: &push_id,
                            seq: Some(chunk.seq),
                            diffs: &diffs,
                        };
                        let reply = store.push(&self.namespace, push).await?;
                        for r in &reply.rejected {
                            tracing::error!(namespace = self.namespace, key = %r.diff.key, reason = %r.reason, "the store refused a window for good; its hits are dropped");
                        }
                        Ok(())
                    }
                    Rows::Advances { now_ns, advances } => {
                        let advances: Vec<Advance> = advances
                            .iter()
                            .map(|(key, ns)| Advance {
                                key: key.as_str().into(),
                                ns: *ns,
                            })
                            .collect();
                        let push = TatPush {
                            node_id: &push_id,
                            seq: Some(chunk.seq),
                            now_ns: *now_ns,
                            advances: &advances,
                        };
                        store.push_tats(&self.namespace, push).await.map(drop)
                    }
                }
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(StoreError::Timeout(timeout)),
            }
            self.chunks.pop_front();
            pushed += 1;
        }
        Ok(pushed)
    }
}
