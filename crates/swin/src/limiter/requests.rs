//! What a caller asks of a [`Limiter`]: one method per kind of request, each run through
//! the request pipeline ([`crate::pipeline::run`]). Being limited is an answer, not an
//! error; an error is a request the limiter cannot decide (an unknown namespace, a bad
//! key or cost, a store that failed where the namespace waits on it).

use swin_core::UnixMs;

use super::Limiter;
use crate::error::Error;
use crate::pipeline::run;
use crate::requests::counting::{Increment, IncrementBatch, ReadKey};
use crate::requests::descriptors::Descriptors;
use crate::requests::hits::{HitBatch, OneHit};
use crate::requests::leases::{Acquire, EndOrRenew};
use crate::requests::limit_changes::{Changed, LimitChange, Op};
use crate::requests::quota::QuotaReport;
use crate::requests::refunds::Refund;
use crate::requests::{
    AcquireAnswer, AcquireRequest, Batch, Change, Decided, Descriptor, Refunded, Verdict,
};
use crate::shares::{BucketAction, Proxy, Reports};
use swin_core::WindowRate;
use swin_sync::store::StoredLimit;

impl Limiter {
    /// Decides a hit of `cost` on `key` of `namespace` against the key's limits and
    /// spends it when allowed — what `POST /v1/namespaces/{namespace}/keys/{key}/hit`
    /// does.
    ///
    /// ```no_run
    /// # async fn run(limiter: &swin::Limiter) -> Result<(), swin::error::Error> {
    /// let v = limiter.hit("api", "user:42", 1.0).await?;
    /// println!("allowed: {}, remaining: {}", v.allowed(), v.decision().remaining);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn hit(&self, namespace: &str, key: &str, cost: f64) -> Result<Verdict, Error> {
        run(self.one_hit(namespace, key, cost, false)?).await
    }

    /// What [`Limiter::hit`] would decide, spending nothing (a dry run).
    pub async fn check(&self, namespace: &str, key: &str, cost: f64) -> Result<Verdict, Error> {
        run(self.one_hit(namespace, key, cost, true)?).await
    }

    fn one_hit(
        &self,
        namespace: &str,
        key: &str,
        cost: f64,
        dry_run: bool,
    ) -> Result<OneHit, Error> {
        Ok(OneHit {
            ns: self.namespace(namespace)?,
            key: key.to_owned(),
            cost,
            dry_run,
        })
    }

    /// Decides 1 to `max` hits, each `(namespace, key, cost)`, as one request: all
    /// checked before any is spent, all or nothing (a denied batch spends nothing); an
    /// error names the hit (`hits[i]: …`).
    pub async fn hits(
        &self,
        hits: &[(&str, &str, f64)],
        dry_run: bool,
        max: usize,
    ) -> Result<Batch, Error> {
        run(HitBatch::new(&self.serving.load(), hits, dry_run, max)?).await
    }

    /// Decides Envoy's descriptors on `namespace` as one request (a `ShouldRateLimit`
    /// call): all or nothing. A descriptor's own limit in a unit outside Envoy's
    /// `RateLimit.Unit` is a bad request (no limit can be read from it: nothing of the
    /// request is counted).
    pub async fn descriptors(
        &self,
        namespace: &str,
        descriptors: &[Descriptor<'_>],
    ) -> Result<Decided, Error> {
        crate::requests::descriptors::check_units(descriptors)?;
        let ns = self.namespace(namespace)?;
        run(Descriptors::new(ns, descriptors)).await
    }

    /// Counts `value` (1 when `None`) on `key`, in `window_size` or every window size of
    /// the namespace, no limit asked: the key's windows after it.
    pub async fn increment(
        &self,
        namespace: &str,
        key: &str,
        value: Option<f64>,
        window_size: Option<u32>,
    ) -> Result<Vec<WindowRate>, Error> {
        crate::policy::input::check_key(key)?;
        let ns = self.namespace(namespace)?;
        run(Increment {
            ns,
            key: key.to_owned(),
            value,
            window_size,
        })
        .await
    }

    /// Counts 1 to `max` increments, each `(namespace, key, value, window_size)`, as
    /// one request: all or nothing; an error names the item (`increments[i]: …`).
    pub async fn increments(
        &self,
        items: &[(&str, &str, Option<f64>, Option<u32>)],
        max: usize,
    ) -> Result<Vec<Vec<WindowRate>>, Error> {
        run(IncrementBatch::new(&self.serving.load(), items, max)?).await
    }

    /// `key`'s rates in `window_size` or every window size, as this node knows them.
    pub async fn rates(
        &self,
        namespace: &str,
        key: &str,
        window_size: Option<u32>,
    ) -> Result<Vec<WindowRate>, Error> {
        crate::policy::input::check_key(key)?;
        let ns = self.namespace(namespace)?;
        run(ReadKey {
            ns,
            key: key.to_owned(),
            window_size,
        })
        .await
    }

    /// Gives back `cost` of hits admitted on `key` but not used (never below zero).
    pub async fn refund(&self, namespace: &str, key: &str, cost: f64) -> Result<Refunded, Error> {
        let ns = self.namespace(namespace)?;
        let key = key.to_owned();
        run(Refund { ns, key, cost }).await
    }

    /// Takes slots of `key` on a concurrency namespace under a lease, if its live leases
    /// leave room.
    pub async fn acquire(
        &self,
        namespace: &str,
        key: &str,
        req: AcquireRequest,
    ) -> Result<AcquireAnswer, Error> {
        let ns = self.namespace(namespace)?;
        let key = key.to_owned();
        run(Acquire { ns, key, req }).await
    }

    /// Ends a live lease: its slots are free at once (404 `unknown_lease` when it is not
    /// live). True when another release had ended it, less than two minutes ago (a
    /// release sent again after its answer was lost: `replayed`, nothing changed).
    pub async fn release(&self, namespace: &str, key: &str, lease: &str) -> Result<bool, Error> {
        let (_, replayed) = self.end_or_renew(namespace, key, lease, None).await?;
        Ok(replayed)
    }

    /// Moves a live lease's lapse to `ttl` seconds from now (the namespace's `lease_ttl`
    /// when `None`): the new lapse time, in the store's time.
    pub async fn renew(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        ttl: Option<f64>,
    ) -> Result<std::time::SystemTime, Error> {
        let (to, _) = self.end_or_renew(namespace, key, lease, Some(ttl)).await?;
        Ok(crate::policy::system_time(to))
    }

    async fn end_or_renew(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        renew: Option<Option<f64>>,
    ) -> Result<(UnixMs, bool), Error> {
        let ns = self.namespace(namespace)?;
        run(EndOrRenew {
            ns,
            key: key.to_owned(),
            lease: lease.to_owned(),
            renew,
        })
        .await
    }

    /// Sets `key`'s limits from now on; answers what was stored.
    pub(super) async fn set_stored_limits(
        &self,
        namespace: &str,
        key: &str,
        change: Change,
    ) -> Result<StoredLimit, Error> {
        match self.limits_op(namespace, key, Op::Set(change)).await? {
            Changed::Set(s) => Ok(s),
            _ => Err(Error::Internal),
        }
    }

    /// Removes `key`'s runtime limits (the config's decide again); whether it had some.
    pub async fn remove_limits(&self, namespace: &str, key: &str) -> Result<bool, Error> {
        match self.limits_op(namespace, key, Op::Remove).await? {
            Changed::Removed(had) => Ok(had),
            _ => Err(Error::Internal),
        }
    }

    /// `key`'s runtime limits live now, as the store holds them.
    pub(super) async fn stored_limits(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<StoredLimit>, Error> {
        match self.limits_op(namespace, key, Op::Read).await? {
            Changed::Read(l) => Ok(l),
            _ => Err(Error::Internal),
        }
    }

    /// Up to `count` keys' live runtime limits after `after`, in key order.
    pub(super) async fn list_stored_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StoredLimit>, Error> {
        let op = Op::List(after.map(str::to_owned), count);
        match self.limits_op(namespace, "", op).await? {
            Changed::Listed(l) => Ok(l),
            _ => Err(Error::Internal),
        }
    }

    async fn limits_op(&self, namespace: &str, key: &str, op: Op) -> Result<Changed, Error> {
        let ns = self.namespace(namespace)?;
        let key = key.to_owned();
        run(LimitChange { ns, key, op }).await
    }

    /// Opens a stream of Envoy's quota service for `client` (a token's name, or a peer
    /// address): the proxy, whose reports [`Limiter::quota_report`] takes, and where its
    /// assignments arrive between them. Each bucket's limit is divided among clients
    /// first, then among each one's streams. A client holding `quota.streams_per_client`
    /// streams already is refused ([`Error::Exhausted`]).
    pub fn quota_stream(
        &self,
        client: &crate::Client,
    ) -> Result<(Proxy, tokio::sync::mpsc::Receiver<Vec<BucketAction>>), Error> {
        self.shares.open(&crate::shares::Sharer::of(client))
    }

    /// The key a proxied request's hit on `namespace` counts under, as the namespace's
    /// `key_from` says: a header's value (trimmed), or the client's address (its key: an
    /// IPv6 client's /64) read from the `X-Forwarded-For` and `X-Real-IP` that the
    /// `trusted` proxies among the request's `peer` and its hops passed. `Ok(Err(why))`
    /// when the request carries no key (the header is missing, or the address cannot be
    /// told): there is nothing to limit it by, and a door refuses it.
    pub fn request_key(
        &self,
        namespace: &str,
        peer: Option<std::net::SocketAddr>,
        headers: &http::HeaderMap,
        trusted: &[ipnet::IpNet],
    ) -> Result<Result<String, String>, Error> {
        use crate::policy::limits::KeyFrom;
        let ns = self.namespace(namespace)?;
        Ok(
            match crate::decisions::limits_of(&ns, namespace)?.key_from() {
                KeyFrom::ClientAddress => {
                    crate::policy::client_address::client_key(peer, headers, trusted)
                        .map_err(|e| e.to_string())
                }
                KeyFrom::Header(h) => headers
                    .get(h.as_str())
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("header {h} is missing")),
            },
        )
    }

    /// Takes a report of `proxy`'s stream: records each bucket's demand, counts what the
    /// proxy allowed, and answers each bucket's assignment now. An error (no domain, too
    /// many buckets) ends the stream; a bad bucket, one no rule covers, or a new one past
    /// the caps on live buckets is abandoned, the others answered as usual.
    pub async fn quota_report(
        &self,
        proxy: &Proxy,
        reports: Reports,
    ) -> Result<Vec<BucketAction>, Error> {
        run(QuotaReport::new(proxy.stream(), reports)?).await
    }
}
