//! Redis store.
//!
//! Layout: one hash per (namespace, key, window size):
//!
//! ```text
//! swin:{<len(namespace)>:<namespace>:<key>}:<window_size>
//!     <window_start>  -> count        (a double, written with %.17g)
//!     n:<node_id>     -> last push seq applied from that node
//!     h:<window_start>:<holder> -> quota a holder holds in that window (strict
//!                        admission; part of the window's count)
//! ```
//!
//! The hash tag `{…}` covers namespace and key, so a namespace's keys spread over every
//! Redis Cluster slot instead of piling onto one hash (Kong keeps one hash per window and
//! namespace). The length prefix keeps `("a:b", "c")` and `("a", "b:c")` apart. A push
//! refreshes the hash's TTL to three windows and drops the window before the previous
//! one, so a key nobody pushes expires by itself.
//!
//! A push groups the batch's hashes by cluster slot (CRC16 of the hash tag, as Redis
//! computes it) and sends one script call per group of at most 64 hashes of one slot, so a
//! script never crosses slots and its overhead is shared by several keys.
//!
//! GCRA buckets (namespaces with `algorithm = "gcra"`) are one hash per key beside them:
//!
//! ```text
//! swin:{<len(namespace)>:<namespace>:<key>}:gcra
//!     tat             -> theoretical arrival time, Unix nanoseconds (integer)
//!     n:<node_id>     -> last push seq applied from that node
//!     r:<holder>      -> "<seq>:<granted>", a holder's last grant (strict
//!                        admission)
//! ```
//!
//! advanced by a script as `tat = max(tat, now) + advance` (HINCRBY, so the 64-bit
//! integer is exact; Lua's numbers are doubles), expiring an hour after the bucket is
//! full again.
//!
//! Exactly-once: a counter push adds a hash's diffs only when the batch's sequence number
//! is above the node's last one recorded in that hash (`n:<node_id>`), and records it in
//! the same atomic step. The engine retries a failed batch unchanged: hashes the first
//! attempt reached skip it, the others apply it, however the retry groups them into calls
//! (on one server, 64 hashes of any slots a call). A TAT push records its seq in its
//! group's first hash, and its groups (by slot, a pure function of the sorted batch) come
//! out the same on a retry.
//!
//! Beside this file: `buckets.rs` (GCRA TATs), `quota.rs` (strict admission's holds and
//! grants), `limits.rs` (runtime limits, with their own layout), `leases.rs`
//! (concurrency leases, a hash per key beside its counters), `servers.rs` (one
//! server or a cluster), `calls.rs` (scripts and commands), `keys.rs` (names and slots).
//!
//! The store itself is here; its `Counters` methods (pushes, reads, loads, purges,
//! resets) are in `counters.rs`.

use std::sync::Arc;

use redis::Value;
use swin_core::{CompactString, Tat, Total, UnixMs};

mod buckets;
mod calls;
mod counters;
mod demands;
mod idempotency;
mod keys;
mod leases;
mod limits;
mod quota;
mod reservations;
mod servers;

use self::calls::{Call, Eval, Scripts};
use self::keys::{glob_escape, parse_hash_key, slot_calls};
use self::servers::Servers;
use super::{
    normalize, Capabilities, CounterStore, Push, Pushed, Rejected, StoreKind, TatPush, WindowKey,
};
use crate::StoreError;

const PUSH_LUA: &str = include_str!("push.lua");

const PUSH_TATS_LUA: &str = include_str!("push_tats.lua");

/// A reset: every field of the key's hashes but the per-node push records (`n:…`), so a
/// retried push that was applied before the reset is still recognised and not applied
/// again. The hashes then expire as they would have.
const RESET_LUA: &str = include_str!("reset.lua");

/// Strict admission's holds (see `hold.lua`).
const HOLD_LUA: &str = include_str!("hold.lua");

/// Strict admission of GCRA buckets: a holder's numbered grant (see the script).
const GRANT_LUA: &str = include_str!("grant.lua");

/// Hashes per script call: enough to share the call's overhead, small enough that one
/// call never blocks Redis for long.
pub(super) const HASHES_PER_CALL: usize = 64;

/// Calls per run when walking the keyspace (deleting, loading): bounded pipelines.
const CALLS_PER_RUN: usize = 1_000;

/// A Redis store: one server, or a Redis Cluster (see `servers.rs` for the routing).
#[derive(Clone)]
pub struct RedisStore {
    servers: Arc<Servers>,
    prefix: String,
    scripts: Arc<Scripts>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("kind", &self.kind())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// `prefix` starts every key (default `swin`); tests use their own. Only the URL is
    /// checked here: the connection is made on first use.
    pub fn new(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::with_access(url, prefix, &super::Access::default())
    }

    /// As [`RedisStore::new`], with a password (for the URL's user, or `default`) and a
    /// CA for a `rediss://` URL beside the URL.
    pub fn with_access(
        url: &str,
        prefix: &str,
        access: &super::Access,
    ) -> Result<Self, StoreError> {
        let info = connection_info(url, access)?;
        let client = match root_cert(access)? {
            Some(root_cert) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            )?,
            None => redis::Client::open(info)?,
        };
        Ok(Self::over(Servers::one(client), prefix))
    }

    /// A Redis Cluster reached through the seed nodes at `urls` (the rest are found
    /// from them); `wait_replicas` > 0 confirms a write only once that many replicas
    /// acknowledged it (`WAIT`). Nothing is connected here.
    pub fn cluster(
        urls: &[String],
        prefix: &str,
        access: &super::Access,
        wait_replicas: u32,
    ) -> Result<Self, StoreError> {
        let seeds = urls
            .iter()
            .map(|u| connection_info(u, access))
            .collect::<Result<Vec<_>, _>>()?;
        if seeds.iter().any(|s| s.redis.db != 0) {
            return Err(StoreError::Protocol(
                "a Redis Cluster has database 0 only: drop the URL's /<db>".into(),
            ));
        }
        let servers = Servers::cluster(seeds, root_cert(access)?, wait_replicas)?;
        Ok(Self::over(servers, prefix))
    }

    fn over(servers: Servers, prefix: &str) -> Self {
        RedisStore {
            servers: Arc::new(servers),
            prefix: prefix.to_owned(),
            scripts: Arc::new(Scripts::new([
                PUSH_LUA,
                PUSH_TATS_LUA,
                RESET_LUA,
                HOLD_LUA,
                GRANT_LUA,
                include_str!("limit_put.lua"),
                include_str!("limit_delete.lua"),
                include_str!("limit_changes.lua"),
                include_str!("lease_acquire.lua"),
                include_str!("lease_change.lua"),
                include_str!("lease_release_slots.lua"),
                include_str!("idempotency_claim.lua"),
                include_str!("idempotency_end.lua"),
                include_str!("reservation.lua"),
            ])),
        }
    }

    /// The prefix every key of this store starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether a script call may only touch keys of one slot: always on a cluster; on
    /// one server, only where a call must come out the same on a retry (`by_slot`).
    fn calls_for(&self, names: &[&str], by_slot: bool) -> Vec<Vec<usize>> {
        slot_calls(names, by_slot || self.servers.is_cluster())
    }

    async fn run(&self, calls: Vec<Call>) -> Result<Vec<Value>, StoreError> {
        self.servers.run(&self.scripts, calls).await
    }

    fn hash_key(&self, namespace: &str, key: &str, window_size: u32) -> String {
        format!(
            "{}:{{{}:{}:{}}}:{}",
            self.prefix,
            namespace.len(),
            namespace,
            key,
            window_size
        )
    }

    fn bucket_key(&self, namespace: &str, key: &str) -> String {
        format!(
            "{}:{{{}:{}:{}}}:gcra",
            self.prefix,
            namespace.len(),
            namespace,
            key
        )
    }

    /// Every key matching `pattern`, walking each primary's keyspace with SCAN (never
    /// KEYS). A key moving between shards meanwhile may be seen on both: listed once.
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for server in self.servers.primaries().await? {
            let mut conn = server.conn().await?;
            let mut cursor: u64 = 0;
            loop {
                let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                keys.extend(found.into_iter().filter(|k| seen.insert(k.clone())));
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(keys)
    }

    /// HGET of `field` on each hash, each sent to its shard.
    async fn hget_each(
        &self,
        hashes: impl Iterator<Item = (String, String)>,
    ) -> Result<Vec<Option<String>>, StoreError> {
        let calls = hashes
            .map(|(h, field)| {
                let mut cmd = redis::cmd("HGET");
                cmd.arg(&h).arg(field);
                Call::on(&h, cmd, false)
            })
            .collect();
        self.run(calls)
            .await?
            .into_iter()
            .map(|v| Ok(redis::from_owned_redis_value(v)?))
            .collect()
    }

    /// Runs the calls and converts each reply.
    async fn replies<T: redis::FromRedisValue>(
        &self,
        calls: Vec<Call>,
    ) -> Result<Vec<T>, StoreError> {
        self.run(calls)
            .await?
            .into_iter()
            .map(|v| Ok(redis::from_owned_redis_value(v)?))
            .collect()
    }

    /// The counts of a window hash's fields (HGETALL) in windows starting at or after
    /// `oldest`; push records and holds are not windows.
    fn live_windows(
        key: &str,
        size: u32,
        oldest: i64,
        fields: Vec<(String, String)>,
        out: &mut Vec<Total>,
    ) -> Result<(), StoreError> {
        for (f, v) in fields {
            let Ok(start) = f.parse::<i64>() else {
                continue;
            };
            if start >= oldest {
                out.push(Total {
                    key: key.into(),
                    window_size: size,
                    window_start: start,
                    count: parse(&v)?,
                });
            }
        }
        Ok(())
    }

    /// Deletes every key under this store's prefix (tests clean up with it).
    pub async fn delete_prefix(&self) -> Result<u64, StoreError> {
        let keys = self
            .scan(&format!("{}:*", glob_escape(&self.prefix)))
            .await?;
        let mut deleted = 0;
        for chunk in keys.chunks(CALLS_PER_RUN) {
            let calls = chunk
                .iter()
                .map(|k| {
                    let mut cmd = redis::cmd("DEL");
                    cmd.arg(k);
                    Call::on(k, cmd, true)
                })
                .collect();
            for v in self.run(calls).await? {
                deleted += redis::from_owned_redis_value::<u64>(v)?;
            }
        }
        Ok(deleted)
    }
}

/// The URL's connection settings, with the password from `access` when it has one.
fn connection_info(url: &str, access: &super::Access) -> Result<redis::ConnectionInfo, StoreError> {
    use redis::IntoConnectionInfo;
    let mut info = url.into_connection_info()?;
    if let Some(password) = &access.password {
        info.redis.password = Some(password.clone());
    }
    Ok(info)
}

fn root_cert(access: &super::Access) -> Result<Option<Vec<u8>>, StoreError> {
    access
        .ca_file
        .as_ref()
        .map(|ca| {
            std::fs::read(ca)
                .map_err(|e| StoreError::Protocol(format!("ca_file {}: {e}", ca.display())))
        })
        .transpose()
}

fn parse(count: &str) -> Result<f64, StoreError> {
    count
        .parse::<f64>()
        .map_err(|_| StoreError::Protocol(format!("count {count:?} is not a number")))
}

fn parse_ns(v: &str) -> Result<i64, StoreError> {
    v.parse::<i64>()
        .map_err(|_| StoreError::Protocol(format!("TAT {v:?} is not an integer")))
}
