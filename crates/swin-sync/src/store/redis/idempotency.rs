//! Idempotency records on Redis (see `store::idempotency`): per record a string that
//! expires by itself, `swin:{<len(ns)>:<ns>}:idem:<key>`, per namespace a sorted set of
//! the records' keys by lapse time, `swin:{<len(ns)>:<ns>}:idem`, which the cap counts,
//! and per client another, `swin:{<len(ns)>:<ns>}:idemc:<client>`, which its share
//! counts. All carry the namespace's hash tag, so one script claims a record, counts the
//! namespace's and the client's and adds it in one atomic step, on one server or a
//! cluster (a namespace's records share one slot: the cap bounds what they take on its
//! shard).

use redis::Value;
use swin_core::UnixMs;

use super::calls::Eval;
use super::RedisStore;
use crate::store::idempotency::{Claim, Claimed, Fingerprint, IdempotencyStore, Record};
use crate::StoreError;

impl RedisStore {
    fn idempotency_index(&self, namespace: &str) -> String {
        format!("{}:{{{}:{}}}:idem", self.prefix, namespace.len(), namespace)
    }

    /// A client's index: the namespace's, `c:` and the client (the end script names it
    /// so too).
    fn idempotency_client_index(&self, namespace: &str, client: &str) -> String {
        format!("{}c:{client}", self.idempotency_index(namespace))
    }

    fn idempotency_record(&self, namespace: &str, key: &str) -> String {
        format!("{}:{key}", self.idempotency_index(namespace))
    }

    /// Keeps (`Some(answer)`) or releases (`None`) the claim `token`.
    async fn end_claim(
        &self,
        namespace: &str,
        key: &str,
        token: i64,
        answer: Option<&[u8]>,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.idempotency_record(namespace, key))
            .key(&self.idempotency_index(namespace))
            .arg(key)
            .arg(token.to_string())
            .arg(if answer.is_some() { "keep" } else { "release" })
            .arg(answer.unwrap_or_default())
            .arg(now.0);
        let r: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.idempotency_end, true)])
            .await?;
        Ok(r.first() == Some(&1))
    }
}

impl IdempotencyStore for RedisStore {
    async fn claim_idempotency(
        &self,
        namespace: &str,
        c: Claim<'_>,
    ) -> Result<Claimed, StoreError> {
        let mut inv = Eval::default();
        inv.key(&self.idempotency_record(namespace, c.key))
            .key(&self.idempotency_index(namespace));
        if let Some(share) = c.client {
            inv.key(&self.idempotency_client_index(namespace, share.client));
        }
        inv.arg(c.key)
            .arg(&c.fingerprint.0[..])
            .arg(c.token.to_string())
            .arg(c.held_until.0)
            .arg(c.expires_at.0)
            .arg(c.now.0)
            .arg(c.max_records)
            .arg(c.client.map_or("", |s| s.client))
            .arg(c.client.map_or(0, |s| s.max_records));
        let reply = self
            .run(vec![inv.call(&self.scripts.idempotency_claim, true)])
            .await?
            .into_iter()
            .next();
        claimed(reply)
    }

    async fn keep_answer(
        &self,
        namespace: &str,
        key: &str,
        token: i64,
        answer: &[u8],
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        self.end_claim(namespace, key, token, Some(answer), now)
            .await
    }

    async fn release_claim(
        &self,
        namespace: &str,
        key: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        self.end_claim(namespace, key, token, None, UnixMs(0)).await
    }

    async fn idempotency_records(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let index = self.idempotency_index(namespace);
        let mut cmd = redis::cmd("ZCOUNT");
        cmd.arg(&index).arg(format!("({}", now.0)).arg("+inf");
        let n: Vec<u64> = self
            .replies(vec![super::calls::Call::on(&index, cmd, false)])
            .await?;
        Ok(n.first().copied().unwrap_or(0))
    }

    async fn purge_idempotency(&self, _now: UnixMs) -> Result<u64, StoreError> {
        // records expire by themselves; each claim trims its namespace's index
        Ok(0)
    }
}

/// The claim script's answer (see `idempotency_claim.lua`).
fn claimed(reply: Option<Value>) -> Result<Claimed, StoreError> {
    let bad = |what: &str| StoreError::Protocol(format!("an idempotency claim answered {what}"));
    let Some(Value::Array(items)) = reply else {
        return Err(bad("no list"));
    };
    let bytes = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(b.clone()),
        _ => None,
    };
    let fingerprint = || {
        bytes(items.get(1))
            .and_then(|b| Fingerprint::from_slice(&b))
            .ok_or_else(|| bad("a fingerprint that is not 32 bytes"))
    };
    match items.first() {
        Some(Value::Int(0)) => Ok(Claimed::Mine),
        Some(Value::Int(1)) => Ok(Claimed::Found(Record::InFlight {
            fingerprint: fingerprint()?,
        })),
        Some(Value::Int(2)) => Ok(Claimed::Found(Record::Answered {
            fingerprint: fingerprint()?,
            // an empty answer comes back as an empty string
            answer: bytes(items.get(2)).unwrap_or_default(),
        })),
        Some(Value::Int(3)) => Ok(Claimed::Full),
        Some(Value::Int(4)) => Ok(Claimed::ClientFull),
        other => Err(bad(&format!("{other:?}"))),
    }
}
