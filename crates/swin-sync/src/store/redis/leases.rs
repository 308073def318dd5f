//! Concurrency leases on Redis (see `store::leases`): one hash per key beside its
//! counters, `swin:{<len(namespace)>:<namespace>:<key>}:leases` (lease → `count:lapse`),
//! changed only by `lease_acquire.lua`, `lease_change.lua` and `lease_release_slots.lua`, so each acquire counts
//! and adds in one atomic step; the hash expires a minute after its last lease's lapse.
//! A release marks the lease's end in a key of its own under the same hash tag,
//! `swin:{<len(namespace)>:<namespace>:<key>}:lease-end:<lease>` (the release's operation
//! id), which expires by itself after [`LEASE_END_KEPT_MS`].
//!
//! Per namespace an index, `swin:lease-index:{<len(namespace)>:<namespace>}` (a sorted
//! set: key → the latest lapse any of its leases was given), names the keys that may hold
//! live leases, so that counting a namespace's slots in flight reads those hashes only,
//! never the keyspace (a million counter hashes made every scrape a second's SCAN). An
//! acquire or renewal raises its key's score in the same round trip as its script (a
//! cluster keeps the index on another shard, so not in the script itself); a count drops
//! the keys whose every lease has lapsed.

use swin_core::UnixMs;

use super::calls::{Call, Eval};
use super::RedisStore;
use crate::store::leases::{Acquire, Acquired, LeaseStore, Released, LEASE_END_KEPT_MS};
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

    /// The mark of `lease`'s end (beside its key's lease hash: the same hash tag).
    fn lease_end_key(&self, namespace: &str, key: &str, lease: &str) -> String {
        format!(
            "{}:{{{}:{}:{}}}:lease-end:{}",
            self.prefix,
            namespace.len(),
            namespace,
            key,
            lease
        )
    }

    fn lease_index(&self, namespace: &str) -> String {
        format!(
            "{}:lease-index:{{{}:{}}}",
            self.prefix,
            namespace.len(),
            namespace
        )
    }

    /// Raises `key`'s score in the namespace's lease index to `lapse` (never lowers it).
    fn index_call(&self, namespace: &str, key: &str, lapse: UnixMs) -> Call {
        let index = self.lease_index(namespace);
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&index).arg("GT").arg(lapse.0).arg(key);
        Call::on(&index, cmd, true)
    }

    /// Runs `lease_change.lua`: a release (`renew_to` none, as the operation `op`) or a
    /// renewal; its answer code (see the script).
    // each argument is a part of the one atomic operation the store applies
    #[allow(clippy::too_many_arguments)]
    async fn lease_change(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        op: &str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
        not_after: UnixMs,
    ) -> Result<i64, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, key))
            .key(&self.lease_end_key(namespace, key, lease))
            .arg(lease)
            .arg(now.0)
            .arg(renew_to.map_or(String::new(), |t| t.0.to_string()))
            .arg(not_after.0)
            .arg(op)
            .arg(LEASE_END_KEPT_MS);
        let mut calls = vec![inv.call(&self.scripts.lease_change, true)];
        if let Some(to) = renew_to {
            calls.push(self.index_call(namespace, key, to));
        }
        let replies = self.run(calls).await?;
        let changed: i64 = match replies.into_iter().next() {
            Some(v) => redis::from_owned_redis_value(v)?,
            None => 0,
        };
        if changed == -1 {
            return Err(StoreError::TooLate);
        }
        Ok(changed)
    }
}

impl LeaseStore for RedisStore {
    async fn acquire(
        &self,
        namespace: &str,
        a: Acquire<'_>,
        not_after: UnixMs,
    ) -> Result<Acquired, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, a.key))
            .key(&self.lease_end_key(namespace, a.key, a.lease))
            .arg(a.lease)
            .arg(a.count)
            .arg(a.limit)
            .arg(a.expires_at.0)
            .arg(a.now.0)
            .arg(not_after.0);
        let calls = vec![
            inv.call(&self.scripts.lease_acquire, true),
            self.index_call(namespace, a.key, a.expires_at),
        ];
        let replies = self.run(calls).await?;
        let r: Vec<i64> = match replies.into_iter().next() {
            Some(v) => redis::from_owned_redis_value(v)?,
            None => Vec::new(),
        };
        if r.first() == Some(&-1) {
            return Err(StoreError::TooLate);
        }
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
        op: &str,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Released, StoreError> {
        let code = self
            .lease_change(namespace, key, lease, op, now, None, not_after)
            .await?;
        Ok(match code {
            1 => Released::Now,
            2 => Released::Before,
            _ => Released::NotLive,
        })
    }

    async fn release_slots(
        &self,
        namespace: &str,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<u32, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.lease_key(namespace, key))
            .arg(prefix)
            .arg(now.0)
            .arg(count)
            .arg(not_after.0);
        let r: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.lease_release_slots, true)])
            .await?;
        if r.first() == Some(&-1) {
            return Err(StoreError::TooLate);
        }
        Ok(r.first().map_or(0, |n| u32::try_from(*n).unwrap_or(0)))
    }

    async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        // the keys whose leases may be live, from the index (those whose every lease has
        // lapsed are dropped from it first)
        let index = self.lease_index(namespace);
        let mut drop_lapsed = redis::cmd("ZREMRANGEBYSCORE");
        drop_lapsed
            .arg(&index)
            .arg("-inf")
            .arg(format!("({}", now.0));
        self.run(vec![Call::on(&index, drop_lapsed, true)]).await?;
        let mut live = redis::cmd("ZRANGEBYSCORE");
        live.arg(&index).arg(now.0).arg("+inf");
        let keys: Vec<Vec<String>> = self.replies(vec![Call::on(&index, live, false)]).await?;
        let hashes: Vec<String> = keys
            .into_iter()
            .flatten()
            .map(|k| self.lease_key(namespace, &k))
            .collect();
        let calls = hashes
            .iter()
            .map(|h| {
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(h);
                Call::on(h, cmd, false)
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
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        let code = self
            .lease_change(namespace, key, lease, "", now, Some(expires_at), not_after)
            .await?;
        Ok(code == 1)
    }
}
