//! GCRA buckets on Redis: advances pushed by `push_tats.lua` (exactly once per node's
//! sequence number), TATs read back and loaded for warm-up.

use swin_core::{CompactString, Tat};

use super::calls::Eval;
use super::keys::glob_escape;
use super::{parse_ns, RedisStore, CALLS_PER_RUN};
use crate::store::{normalize_advances, TatPush};
use crate::StoreError;

impl RedisStore {
    pub(super) async fn push_bucket_tats(
        &self,
        namespace: &str,
        push: TatPush<'_>,
    ) -> Result<Vec<Tat>, StoreError> {
        let advances = normalize_advances(push.advances);
        let hashes: Vec<String> = advances
            .iter()
            .map(|a| self.bucket_key(namespace, &a.key))
            .collect();
        let names: Vec<&str> = hashes.iter().map(String::as_str).collect();
        let calls = self.calls_for(&names, true);
        let node_field = format!("n:{}", push.node_id);
        let seq = push.seq.map_or(-1i64, |s| s as i64);
        let mut sends = Vec::with_capacity(calls.len());
        for call in &calls {
            let mut inv = Eval::default();
            inv.arg(&node_field).arg(seq).arg(push.now_ns);
            for &i in call {
                inv.key(&hashes[i]);
            }
            for &i in call {
                inv.arg(advances[i].ns);
            }
            sends.push(inv.call(&self.scripts.push_tats, true));
        }
        let replies: Vec<Vec<String>> = self.replies(sends).await?;
        let mut out = Vec::with_capacity(advances.len());
        for (call, values) in calls.iter().zip(replies) {
            if values.len() != call.len() {
                return Err(StoreError::Protocol(format!(
                    "push_tats script returned {} values for {} buckets",
                    values.len(),
                    call.len()
                )));
            }
            for (&i, v) in call.iter().zip(values) {
                out.push(Tat {
                    key: advances[i].key.clone(),
                    tat_ns: parse_ns(&v)?,
                });
            }
        }
        Ok(out)
    }

    pub(super) async fn read_bucket_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        let replies = self
            .hget_each(
                keys.iter()
                    .map(|k| (self.bucket_key(namespace, k), "tat".to_owned())),
            )
            .await?;
        keys.iter()
            .zip(replies)
            .filter_map(|(k, r)| r.map(|v| (k, v)))
            .map(|(k, v)| {
                Ok(Tat {
                    key: k.clone(),
                    tat_ns: parse_ns(&v)?,
                })
            })
            .collect()
    }

    pub(super) async fn load_bucket_tats(
        &self,
        namespace: &str,
        now_ns: i64,
    ) -> Result<Vec<Tat>, StoreError> {
        let head = format!("{}:{{{}:{}:", self.prefix, namespace.len(), namespace);
        let pattern = format!("{}*}}:gcra", glob_escape(&head));
        let hashes = self.scan(&pattern).await?;
        let mut out = Vec::new();
        for chunk in hashes.chunks(CALLS_PER_RUN) {
            let replies = self
                .hget_each(chunk.iter().map(|h| (h.clone(), "tat".to_owned())))
                .await?;
            for (h, r) in chunk.iter().zip(replies) {
                let key = h.strip_prefix(&head).and_then(|r| r.strip_suffix("}:gcra"));
                if let (Some(key), Some(v)) = (key, r) {
                    let tat_ns = parse_ns(&v)?;
                    if tat_ns > now_ns {
                        out.push(Tat {
                            key: key.into(),
                            tat_ns,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}
