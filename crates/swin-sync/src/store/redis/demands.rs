//! Demands of Envoy's quota service on Redis (see `store::demands`): per bucket one hash,
//! `swin:{<len(namespace)>:<namespace>:<bucket>}:demands`, node → `<expires_at>|<demands>`.
//! The hash expires a minute after the latest lapse any node gave it; a read drops the
//! fields that lapsed a minute ago (nodes that went away).

use swin_core::UnixMs;

use super::calls::Call;
use super::RedisStore;
use crate::store::demands::{DemandStore, Demands};
use crate::StoreError;

/// How long a hash and its lapsed fields are kept past their lapse.
const KEPT_MS: i64 = 60_000;

impl RedisStore {
    fn demands_key(&self, namespace: &str, bucket: &str) -> String {
        format!(
            "{}:{{{}:{}:{}}}:demands",
            self.prefix,
            namespace.len(),
            namespace,
            bucket
        )
    }
}

impl DemandStore for RedisStore {
    async fn post_demands(&self, namespace: &str, entries: &[Demands]) -> Result<(), StoreError> {
        let mut calls = Vec::with_capacity(entries.len() * 3);
        for e in entries {
            let key = self.demands_key(namespace, &e.bucket);
            let mut set = redis::cmd("HSET");
            set.arg(&key)
                .arg(&e.node)
                .arg(format!("{}|{}", e.expires_at.0, e.text()));
            calls.push(Call::on(&key, set, true));
            // the hash lives a minute past the latest lapse (NX: it had none yet)
            for when in ["NX", "GT"] {
                let mut expire = redis::cmd("PEXPIREAT");
                expire
                    .arg(&key)
                    .arg(e.expires_at.0.saturating_add(KEPT_MS))
                    .arg(when);
                calls.push(Call::on(&key, expire, true));
            }
        }
        if !calls.is_empty() {
            self.run(calls).await?;
        }
        Ok(())
    }

    async fn read_demands(
        &self,
        namespace: &str,
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<Demands>, StoreError> {
        let keys: Vec<String> = buckets
            .iter()
            .map(|b| self.demands_key(namespace, b))
            .collect();
        let calls = keys
            .iter()
            .map(|k| {
                let mut get = redis::cmd("HGETALL");
                get.arg(k);
                Call::on(k, get, false)
            })
            .collect();
        let replies = self.run(calls).await?;
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for ((bucket, key), reply) in buckets.iter().zip(&keys).zip(replies) {
            let fields: Vec<(String, String)> = redis::from_owned_redis_value(reply)?;
            for (node, value) in fields {
                let Some((expires_at, demands)) = parse(&value) else {
                    continue;
                };
                if expires_at.0 > now.0 {
                    out.push(Demands {
                        bucket: (*bucket).to_owned(),
                        node,
                        demands,
                        expires_at,
                    });
                } else if expires_at.0 < now.0.saturating_sub(KEPT_MS) {
                    gone.push((key, node));
                }
            }
        }
        self.drop_lapsed(gone).await;
        Ok(out)
    }
}

impl RedisStore {
    /// Drops fields of nodes whose entries lapsed long ago; a failure leaves them to the
    /// next read (they no longer count either way).
    async fn drop_lapsed(&self, gone: Vec<(&String, String)>) {
        if gone.is_empty() {
            return;
        }
        let calls = gone
            .into_iter()
            .map(|(key, node)| {
                let mut del = redis::cmd("HDEL");
                del.arg(key).arg(node);
                Call::on(key, del, true)
            })
            .collect();
        if let Err(e) = self.run(calls).await {
            tracing::debug!(cause = %e, "lapsed demands stay until the next read");
        }
    }
}

fn parse(value: &str) -> Option<(UnixMs, Vec<f64>)> {
    let (at, demands) = value.split_once('|')?;
    Some((UnixMs(at.parse().ok()?), Demands::parse(demands)?))
}
