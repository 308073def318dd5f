//! Runtime limits on Redis (see `store::limits`). Per namespace, under one hash tag (so
//! one script call touches them all, also on a cluster):
//!
//! ```text
//! swin:limits:{<len(namespace)>:<namespace>}        hash: key -> {"limits":…,"expires_at":…,"set_by":…,"set_at":…}
//! swin:limit-keys:{<len(namespace)>:<namespace>}    sorted set, score 0: the keys, listed in key order
//! swin:limit-expiry:{<len(namespace)>:<namespace>}  sorted set: keys by lapse time (Unix ms)
//! swin:limit-log:{<len(namespace)>:<namespace>}     stream of changes (field k: the key), ~100,000 kept
//! ```
//!
//! None of them starts with a counter hash's head (`swin:{`), so scans of counters never
//! meet them.

use serde::{Deserialize, Serialize};
use swin_core::UnixMs;

use super::calls::{Call, Eval};
use super::RedisStore;
use crate::store::limits::{
    LimitChanges, LimitStore, StoredLimit, CHANGES_PER_CALL, LOG_KEPT_ENTRIES,
};
use crate::StoreError;

/// A key's entry in the limits hash.
#[derive(Serialize, Deserialize)]
struct Entry {
    limits: Box<serde_json::value::RawValue>,
    expires_at: Option<i64>,
    set_by: String,
    set_at: i64,
}

/// Keys per HMGET.
const KEYS_PER_READ: usize = 1_000;

impl RedisStore {
    fn limit_names(&self, namespace: &str) -> [String; 4] {
        ["limits", "limit-keys", "limit-expiry", "limit-log"]
            .map(|what| format!("{}:{what}:{{{}:{namespace}}}", self.prefix, namespace.len()))
    }

    fn hmget(&self, hash: &str, keys: &[&str]) -> Call {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(hash).arg(keys);
        Call::on(hash, cmd, false)
    }
}

fn entry(key: String, raw: &str) -> Result<StoredLimit, StoreError> {
    let e: Entry = serde_json::from_str(raw)
        .map_err(|e| StoreError::Protocol(format!("runtime limits of {key:?}: {e}")))?;
    Ok(StoredLimit {
        key,
        limits: e.limits.get().to_owned(),
        expires_at: e.expires_at.map(UnixMs),
        set_by: e.set_by,
        set_at: UnixMs(e.set_at),
    })
}

impl LimitStore for RedisStore {
    async fn put_limit(
        &self,
        namespace: &str,
        limit: &StoredLimit,
        not_after: UnixMs,
    ) -> Result<(), StoreError> {
        let limits = serde_json::value::RawValue::from_string(limit.limits.clone())
            .map_err(|e| StoreError::Protocol(format!("limits are not JSON: {e}")))?;
        let value = serde_json::to_string(&Entry {
            limits,
            expires_at: limit.expires_at.map(|t| t.0),
            set_by: limit.set_by.clone(),
            set_at: limit.set_at.0,
        })
        .map_err(|e| StoreError::Protocol(e.to_string()))?;
        let mut inv = Eval::default();
        for name in self.limit_names(namespace) {
            inv.key(&name);
        }
        inv.arg(&limit.key)
            .arg(value)
            .arg(limit.expires_at.map_or(String::new(), |t| t.0.to_string()))
            .arg(limit.set_at.0)
            .arg(LOG_KEPT_ENTRIES)
            .arg(not_after.0);
        let reply: Vec<String> = self
            .replies(vec![inv.call(&self.scripts.limit_put, true)])
            .await?;
        if reply.first().map(String::as_str) == Some("late") {
            return Err(StoreError::TooLate);
        }
        Ok(())
    }

    async fn delete_limit(
        &self,
        namespace: &str,
        key: &str,
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        let mut inv = Eval::default();
        for name in self.limit_names(namespace) {
            inv.key(&name);
        }
        inv.arg(key).arg(LOG_KEPT_ENTRIES).arg(not_after.0);
        let gone: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.limit_delete, true)])
            .await?;
        match gone.first() {
            Some(-1) => Err(StoreError::TooLate),
            other => Ok(other == Some(&1)),
        }
    }

    async fn read_limits(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let [hash, ..] = self.limit_names(namespace);
        let calls = keys
            .chunks(KEYS_PER_READ)
            .map(|chunk| self.hmget(&hash, chunk))
            .collect();
        let replies: Vec<Vec<Option<String>>> = self.replies(calls).await?;
        let mut out = Vec::new();
        for (k, v) in keys.iter().zip(replies.into_iter().flatten()) {
            if let Some(v) = v {
                out.push(entry((*k).to_owned(), &v)?);
            }
        }
        Ok(out)
    }

    async fn list_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
        now: UnixMs,
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let [hash, index, ..] = self.limit_names(namespace);
        let mut from = after.map_or("-".to_owned(), |a| format!("({a}"));
        let mut out = Vec::new();
        // lapsed limits not cleared yet are skipped: ask again until `count` or the end
        while out.len() < count {
            let want = (count - out.len()).min(KEYS_PER_READ);
            let mut cmd = redis::cmd("ZRANGEBYLEX");
            cmd.arg(&index)
                .arg(&from)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(want);
            let keys: Vec<Vec<String>> = self.replies(vec![Call::on(&index, cmd, false)]).await?;
            let keys = keys.into_iter().next().unwrap_or_default();
            let Some(last) = keys.last() else {
                break;
            };
            from = format!("({last}");
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let values: Vec<Vec<Option<String>>> =
                self.replies(vec![self.hmget(&hash, &refs)]).await?;
            for (k, v) in keys.iter().zip(values.into_iter().flatten()) {
                if let Some(v) = v {
                    let l = entry(k.clone(), &v)?;
                    if l.live_at(now) {
                        out.push(l);
                    }
                }
            }
            if keys.len() < want {
                break;
            }
        }
        Ok(out)
    }

    async fn limit_changes(
        &self,
        namespace: &str,
        since: Option<&str>,
    ) -> Result<LimitChanges, StoreError> {
        let [.., log] = self.limit_names(namespace);
        let mut inv = Eval::default();
        inv.key(&log).arg(since.unwrap_or("")).arg(CHANGES_PER_CALL);
        let replies: Vec<Vec<redis::Value>> = self
            .replies(vec![inv.call(&self.scripts.limit_changes, false)])
            .await?;
        let mut reply = replies.into_iter().next().unwrap_or_default().into_iter();
        let (Some(complete), Some(cursor)) = (reply.next(), reply.next()) else {
            return Err(StoreError::Protocol(
                "a short answer to limit_changes".into(),
            ));
        };
        Ok(LimitChanges {
            complete: redis::from_owned_redis_value::<i64>(complete)? == 1,
            cursor: redis::from_owned_redis_value(cursor)?,
            keys: reply
                .map(redis::from_owned_redis_value)
                .collect::<Result<_, _>>()?,
        })
    }
}
