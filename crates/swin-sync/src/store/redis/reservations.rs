//! Reservations of a cost on Redis (see `store::reservations`): one hash per
//! reservation, `swin:cost-reservation:{<len(namespace)>:<namespace>}:<id>` (`keys`,
//! `total`, `lapse`, `client`…), and per namespace an index of the open ones
//! (`swin:cost-reservations:{<len(namespace)>:<namespace>}`, id → lapse, in the same
//! slot) and one per client (that name with `c:<client>` after it), whose sizes the
//! caps are checked against, changed only by `reservation.lua`, so that a commit ends a reservation in one
//! atomic step (exactly once, by one operation id) and an extend raises it only while
//! it is live, once per operation id; a hash expires a minute after its lapse (an ended
//! one's is moved to at least [`ENDED_KEPT_MS`] on), and an opening drops lapsed ids
//! from the index.

use redis::Value;
use swin_core::UnixMs;

use super::calls::{Call, Eval};
use super::RedisStore;
use crate::store::reservations::{
    counted_from, counted_text, extend_identity, extends_from, is_client, is_op, keys_from,
    keys_text, Ended, OpenReservation, Opened, Opening, ReservationRecord, ReservationStore,
    ENDED_KEPT_MS, MAX_COUNTED_TEXT, OPS_TEXT,
};
use crate::StoreError;

impl RedisStore {
    fn reservation_key(&self, namespace: &str, id: &str) -> String {
        format!(
            "{}:cost-reservation:{{{}:{}}}:{}",
            self.prefix,
            namespace.len(),
            namespace,
            id
        )
    }

    fn reservation_index(&self, namespace: &str) -> String {
        format!(
            "{}:cost-reservations:{{{}:{}}}",
            self.prefix,
            namespace.len(),
            namespace
        )
    }

    /// Runs one operation of `reservation.lua` on the reservation's hash (and, for an
    /// opening with a client, that client's index).
    async fn reservation_op(
        &self,
        namespace: &str,
        id: &str,
        args: &[String],
        client: &str,
    ) -> Result<Value, StoreError> {
        let mut inv = Eval::default();
        let index = self.reservation_index(namespace);
        inv.key(&self.reservation_key(namespace, id)).key(&index);
        if !client.is_empty() {
            inv.key(&format!("{index}c:{client}"));
        }
        let mut args = args.iter();
        if let Some(op) = args.next() {
            inv.arg(op.as_str()).arg(id);
        }
        for a in args {
            inv.arg(a.as_str());
        }
        let calls: Vec<Call> = vec![inv.call(&self.scripts.reservation, true)];
        self.run(calls)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Protocol("a reservation call answered nothing".into()))
    }
}

/// A record from its fields as the hash holds them.
fn parsed(
    [keys, total, lapse, counted, ended, ops]: [&str; 6],
) -> Result<ReservationRecord, StoreError> {
    let bad = |what: &str| StoreError::Protocol(format!("a reservation's {what} is not a number"));
    Ok(ReservationRecord {
        keys: keys_from(keys)?,
        total: total.parse().map_err(|_| bad("total"))?,
        expires_at: UnixMs(lapse.parse().map_err(|_| bad("lapse"))?),
        counted: counted_from(counted),
        ended: Ended::from_text(ended),
        extends: extends_from(ops),
    })
}

/// A cap as the script takes it: -1 when not checked.
fn lua_cap(cap: Option<u64>) -> String {
    cap.map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX))
        .to_string()
}

/// A record the script answered (`{}`: none; -1: past the deadline).
fn record(v: Value) -> Result<Option<ReservationRecord>, StoreError> {
    if let Value::Int(-1) = v {
        return Err(StoreError::TooLate);
    }
    let fields: Vec<String> = redis::from_owned_redis_value(v)?;
    match &fields[..] {
        [keys, total, lapse, counted, ended, ops] => {
            Ok(Some(parsed([keys, total, lapse, counted, ended, ops])?))
        }
        _ => Ok(None),
    }
}

/// An operation id, checked before it goes into a record's text.
fn checked(op: &str) -> Result<&str, StoreError> {
    match is_op(op) {
        true => Ok(op),
        false => Err(StoreError::Protocol(format!(
            "{op:?} is not an operation id"
        ))),
    }
}

impl ReservationStore for RedisStore {
    async fn open_reservations(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let index = self.reservation_index(namespace);
        let mut cmd = redis::cmd("ZCOUNT");
        cmd.arg(&index).arg(format!("({}", now.0)).arg("+inf");
        let n: Vec<u64> = self.replies(vec![Call::on(&index, cmd, false)]).await?;
        Ok(n.first().copied().unwrap_or(0))
    }

    async fn open_reservation(
        &self,
        namespace: &str,
        o: OpenReservation<'_>,
    ) -> Result<Opened, StoreError> {
        if !is_client(o.client) {
            return Err(StoreError::Protocol(format!(
                "{:?} cannot name a client",
                o.client
            )));
        }
        let args = [
            "open".to_owned(),
            keys_text(o.keys),
            o.total.to_string(),
            o.expires_at.0.to_string(),
            o.now.0.to_string(),
            counted_text(o.at, o.total),
            o.client.to_owned(),
            lua_cap(o.max_open),
            lua_cap(o.max_open_per_client),
        ];
        let v = self
            .reservation_op(namespace, o.id, &args, o.client)
            .await?;
        let (code, open, client_open): (i64, i64, i64) = redis::from_owned_redis_value(v)?;
        let opening = match code {
            1 => Opening::Open,
            0 => Opening::Taken,
            2 => Opening::Full,
            3 => Opening::ClientFull,
            n => {
                return Err(StoreError::Protocol(format!(
                    "a reservation's opening answered {n}"
                )))
            }
        };
        Ok(Opened {
            opening,
            open: u64::try_from(open).ok(),
            client_open: u64::try_from(client_open).ok(),
        })
    }

    async fn extend_reservation(
        &self,
        namespace: &str,
        id: &str,
        op: &str,
        more: f64,
        at: UnixMs,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        if extend_identity(op).is_none() {
            return Err(StoreError::Protocol(format!(
                "{op:?} is not an extend's operation id"
            )));
        }
        let args = [
            "extend".to_owned(),
            op.to_owned(),
            more.to_string(),
            now.0.to_string(),
            not_after.0.to_string(),
            counted_text(at, more),
            MAX_COUNTED_TEXT.to_string(),
            OPS_TEXT.to_string(),
        ];
        record(self.reservation_op(namespace, id, &args, "").await?)
    }

    async fn take_reservation(
        &self,
        namespace: &str,
        id: &str,
        op: &str,
        cost: f64,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let args = [
            "take".to_owned(),
            checked(op)?.to_owned(),
            cost.to_string(),
            now.0.to_string(),
            not_after.0.to_string(),
            now.0.saturating_add(ENDED_KEPT_MS).to_string(),
        ];
        record(self.reservation_op(namespace, id, &args, "").await?)
    }

    async fn read_reservation(
        &self,
        namespace: &str,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let key = self.reservation_key(namespace, id);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&key)
            .arg("keys")
            .arg("total")
            .arg("lapse")
            .arg("counted")
            .arg("ended")
            .arg("ops");
        let v: Vec<Option<String>> = self
            .replies::<Vec<Option<String>>>(vec![Call::on(&key, cmd, false)])
            .await?
            .into_iter()
            .next()
            .unwrap_or_default();
        let [Some(keys), Some(total), Some(lapse), counted, ended, ops] = &v[..] else {
            return Ok(None);
        };
        fn text(t: &Option<String>) -> &str {
            t.as_deref().unwrap_or("")
        }
        let r = parsed([keys, total, lapse, text(counted), text(ended), text(ops)])?;
        Ok((r.expires_at > now).then_some(r))
    }
}
