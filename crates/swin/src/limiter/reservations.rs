//! Reservations of a cost, as a caller asks them of a [`Limiter`]: reserve, extend and
//! commit, over one key or several (see `requests::reservations`). Each is one request
//! of the pipeline; an extend and a commit first read the reservation's record (its
//! keys, so that their first touch reads them).

use super::Limiter;
use crate::error::Error;
use crate::idempotency::ClientId;
use crate::pipeline::run;
use crate::policy::input::unsigned_zero;
use crate::requests::reservations::{not_open, open_record, Commit, Extend, Reserve};
use crate::requests::{Reserved, Settled};

impl Limiter {
    /// Spends `cost` (an estimate) on each of `keys` as a hit would and, when allowed,
    /// opens one reservation over them for `ttl` seconds (30 when `None`), which
    /// [`Limiter::commit`] (one key) or [`Limiter::commit_reservation`] settles. Over
    /// several keys (1 to 16,
    /// none twice) it is one request, all or nothing: a reserve denied by one key spends
    /// nothing on any, and errors name the key (`keys[i]: …`).
    ///
    /// It counts against the namespace's `reservations_max_open`; a service that knows
    /// its callers names the `client`, which holds at most
    /// `reservations_max_open_per_client` open reservations ([`Error::Exhausted`] past
    /// them).
    pub async fn reserve(
        &self,
        namespace: &str,
        keys: &[&str],
        cost: f64,
        ttl: Option<f64>,
        client: Option<&crate::Client>,
    ) -> Result<Reserved, Error> {
        let several = keys.len() != 1;
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        self.reserve_by(client, namespace, &keys, cost, ttl, several)
            .await
    }

    async fn reserve_by(
        &self,
        client: Option<&crate::Client>,
        namespace: &str,
        keys: &[String],
        cost: f64,
        ttl: Option<f64>,
        several: bool,
    ) -> Result<Reserved, Error> {
        let ns = self.namespace(namespace)?;
        run(Reserve {
            ns,
            keys: keys.to_vec(),
            cost: unsigned_zero(cost),
            ttl,
            several,
            client: client.map(ClientId::from),
        })
        .await
    }

    /// Adds `more` to the open reservation `id`, decided as a hit of `more` on each of its
    /// keys, all or nothing: allowed, the reservation's total grows; denied, it stays
    /// open at what it had. With `key`, the reservation must be of that key alone.
    pub async fn extend(
        &self,
        namespace: &str,
        key: Option<&str>,
        id: &str,
        more: f64,
    ) -> Result<Reserved, Error> {
        self.extend_of(namespace, key, id, more).await
    }

    async fn extend_of(
        &self,
        namespace: &str,
        key: Option<&str>,
        id: &str,
        more: f64,
    ) -> Result<Reserved, Error> {
        let ns = self.namespace(namespace)?;
        swin_core::check_cost(more).map_err(|_| {
            Error::BadRequest(format!(
                "cost: {more} is not a number of at least 0 and below 2^53"
            ))
        })?;
        let record = open_record(&ns, id, key).await?;
        // sent again under the same idempotency key, it is the same extend: applied
        // once (by whichever request got there), answered from the record after that
        let identity = crate::idempotency::identity_in_once("extend", id);
        let replay = identity
            .as_deref()
            .is_some_and(|i| record.applied_by(i).is_some());
        if record.ended.is_some() && !replay {
            return Err(not_open(id, ns.sync.name()));
        }
        run(Extend {
            ns,
            keys: record.keys,
            id: id.to_owned(),
            more: unsigned_zero(more),
            total: record.total,
            expires_at: record.expires_at,
            identity: identity.unwrap_or_else(swin_sync::store::new_op),
            replay,
        })
        .await
    }

    /// Ends the reservation `id` of `key` alone and settles it at the actual `cost`
    /// against its total, on any node, once.
    pub async fn commit(
        &self,
        namespace: &str,
        key: &str,
        id: &str,
        cost: f64,
    ) -> Result<Settled, Error> {
        self.commit_of(namespace, Some(key), id, cost)
            .await?
            .into_iter()
            .next()
            .ok_or(Error::Internal)
    }

    /// Ends the reservation `id` (over any number of keys) and settles each of its keys
    /// at the actual `cost` against its total, on any node, once: one [`Settled`] per
    /// key, in the reserve's order.
    pub async fn commit_reservation(
        &self,
        namespace: &str,
        id: &str,
        cost: f64,
    ) -> Result<Vec<Settled>, Error> {
        self.commit_of(namespace, None, id, cost).await
    }

    async fn commit_of(
        &self,
        namespace: &str,
        key: Option<&str>,
        id: &str,
        cost: f64,
    ) -> Result<Vec<Settled>, Error> {
        let ns = self.namespace(namespace)?;
        swin_core::check_cost(cost).map_err(|_| {
            Error::BadRequest(format!(
                "cost: {cost} is not a number of at least 0 and below 2^53"
            ))
        })?;
        let record = match open_record(&ns, id, key).await {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, Error::UnknownReservation(_)) {
                    ns.recorder().reservation(ns.sync.name(), "not_open");
                }
                return Err(e);
            }
        };
        run(Commit {
            ns,
            keys: record.keys,
            id: id.to_owned(),
            cost: unsigned_zero(cost),
        })
        .await
    }
}
