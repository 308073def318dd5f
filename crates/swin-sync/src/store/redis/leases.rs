//! Concurrency leases on Redis (see `store::leases`): one hash per key beside its
//! counters, `swin:{<len(namespace)>:<namespace>:<key>}:leases` (lease → `count:lapse`),
//! changed only by `lease_acquire.lua`, `lease_change.lua` and `lease_release_slots.lua`, so each acquire counts
//! and adds in one atomic step; the hash expires a minute after its last lease's lapse.

use swin_core::UnixMs;

use super::calls::Eval;
use super::RedisStore;
use crate::store::leases::{Acquire, Acquired, Leases};
use crate::StoreError;

impl RedisStore {
    fn lease_key(&self, namespace: &str, key: &str) -> String {
        format!(
            "{}:{{{}:{}:{}}}:leases",
            self.prefix,
            namespace.len(),
            namespace,
            key
        )
    }

    async fn lease_change(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
    ) -> Result<bool, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, key))
            .arg(lease)
            .arg(now.0)
            .arg(renew_to.map_or(String::new(), |t| t.0.to_string()));
        let r: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.lease_change, true)])
            .await?;
        Ok(r.first() == Some(&1))
    }
}

impl Leases for RedisStore {
    async fn acquire(&self, namespace: &str, a: Acquire<'_>) -> Result<Acquired, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, a.key))
            .arg(a.lease)
            .arg(a.count)
            .arg(a.limit)
            .arg(a.expires_at.0)
            .arg(a.now.0);
        let r: Vec<Vec<i64>> = self
            .replies(vec![inv.call(&self.scripts.lease_acquire, true)])
            .await?;
        let r = r.into_iter().next().unwrap_or_default();
        let [granted, in_flight, earliest] = r[..] else {
            return Err(StoreError::Protocol(format!("an acquire answered {r:?}")));
        };
        Ok(Acquired {
            granted: granted == 1,
            in_flight: u64::try_from(in_flight).unwrap_or(0),
            earliest_lapse: (earliest >= 0).then_some(UnixMs(earliest)),
        })
    }

    async fn release(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        self.lease_change(namespace, key, lease, now, None).await
    }

    async fn release_slots(
        &self,
        namespace: &str,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
    ) -> Result<u32, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, key))
            .arg(prefix)
            .arg(now.0)
            .arg(count);
        let r: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.lease_release_slots, true)])
            .await?;
        Ok(r.first().map_or(0, |n| u32::try_from(*n).unwrap_or(0)))
    }

    async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        // every lease hash of the namespace (glob characters in names matched literally)
        let pattern = format!(
            "{}:{{{}:{}:*}}:leases",
            glob_literal(&self.prefix),
            namespace.len(),
            glob_literal(namespace)
        );
        let hashes = self.scan(&pattern).await?;
        let calls = hashes
            .iter()
            .map(|h| {
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(h);
                super::calls::Call::on(h, cmd, false)
            })
            .collect();
        let mut slots = 0u64;
        for v in self.run(calls).await? {
            let fields: Vec<(String, String)> = redis::from_owned_redis_value(v)?;
            // `count:lapse`, as the scripts write them; lapsed ones no longer count
            for (_, value) in fields {
                let Some((count, lapse)) = value.split_once(':') else {
                    continue;
                };
                if let (Ok(count), Ok(lapse)) = (count.parse::<u64>(), lapse.parse::<i64>()) {
                    if lapse > now.0 {
                        slots += count;
                    }
                }
            }
        }
        Ok(slots)
    }

    async fn renew(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        expires_at: UnixMs,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        self.lease_change(namespace, key, lease, now, Some(expires_at))
            .await
    }
}

/// `text` as a SCAN pattern that matches it and nothing else.
fn glob_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
