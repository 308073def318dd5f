//! The store boundary, by purpose. [`CounterStore`]: push diffs (getting the new totals
//! back), read totals of given windows, load a namespace for warm-up, purge expired
//! windows, the same for GCRA buckets, reset a key, ping. [`QuotaStore`]: strict admission's
//! holds (windows) and grants (buckets). [`LimitStore`]: limits set per key at run time.
//! [`LeaseStore`]: concurrency leases. [`DemandStore`]: what the proxies of Envoy's
//! quota service ask for, shared among nodes. Each
//! store says what it can do ([`Capabilities`]). Three stores implement all of them,
//! dispatched by the [`Store`] enum; with the `faults` feature (tests only) `Faulty` wraps
//! one to inject failures.
//!
//! The contracts and the one enum that dispatches all of their calls are kept together
//! here, so a new call is added in one place; what the calls carry is in `types`.

pub mod demands;
#[cfg(feature = "faults")]
mod faulty;
pub mod leases;
pub mod limits;
mod normalize;
mod postgres;
mod redis;
mod sql;
mod sqlite;
mod types;

use std::future::Future;
use std::pin::Pin;

pub use self::demands::{DemandStore, Demands};
#[cfg(feature = "faults")]
pub use self::faulty::{Fault, FaultyStore};
pub use self::leases::{Acquire, Acquired, LeaseStore};
pub use self::limits::{LimitChanges, LimitStore, StoredLimit};
pub(crate) use self::normalize::{normalize, normalize_advances};
pub use self::postgres::PostgresStore;
pub use self::redis::RedisStore;
pub use self::sqlite::SqliteStore;
pub use self::types::*;
use swin_core::{CompactString, Tat, Total, UnixMs};

use crate::StoreError;

/// The counting side of a store (windows and GCRA buckets). The backends implement it,
/// so the compiler checks their signatures against one contract; [`Store`] picks one
/// at run time. Every call is independent and may be retried: pushes carry their own
/// exactly-once record.
pub trait CounterStore: Send + Sync {
    fn kind(&self) -> StoreKind;

    fn capabilities(&self) -> Capabilities;

    /// Applies the schema (PostgreSQL, SQLite); nothing to do for Redis.
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds the diffs and returns the new total of every pushed window; windows the
    /// store refuses for good come back in [`Pushed::rejected`], the rest are applied
    /// atomically. A stored count never goes below zero: a diff that would take it
    /// there leaves 0 (refunds on several nodes cannot make quota).
    fn push(
        &self,
        namespace: &str,
        push: Push<'_>,
    ) -> impl Future<Output = Result<Pushed, StoreError>> + Send;

    /// Totals of the given windows; windows the store has never seen are left out.
    fn read(
        &self,
        namespace: &str,
        keys: &[WindowKey],
    ) -> impl Future<Output = Result<Vec<Total>, StoreError>> + Send;

    /// Every total of the namespace in windows of the given sizes starting at or after
    /// the paired start (a node's warm-up, Kong's `fetch`).
    fn load_namespace(
        &self,
        namespace: &str,
        windows: &[(u32, i64)],
    ) -> impl Future<Output = Result<Vec<Total>, StoreError>> + Send;

    /// Deletes windows that ended more than one window ago, and old push records.
    /// Returns the rows deleted (0 where the store expires keys by itself).
    fn purge(&self, now: UnixMs) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Applies TAT advances atomically and returns the new TAT of every pushed bucket.
    fn push_tats(
        &self,
        namespace: &str,
        push: TatPush<'_>,
    ) -> impl Future<Output = Result<Vec<Tat>, StoreError>> + Send;

    /// TATs of the given buckets; buckets the store does not hold (full) are left out.
    fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> impl Future<Output = Result<Vec<Tat>, StoreError>> + Send;

    /// Every bucket of the namespace that is not full at `now_ns` (warm-up).
    fn load_tats(
        &self,
        namespace: &str,
        now_ns: i64,
    ) -> impl Future<Output = Result<Vec<Tat>, StoreError>> + Send;

    /// Deletes a key's counters (of the given window sizes, where the store needs them
    /// to find the key) and its bucket: a reset across the cluster. Push records stay.
    fn reset(
        &self,
        namespace: &str,
        key: &str,
        window_sizes: &[u32],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One round trip, to tell whether the store answers: with the store's time where
    /// the store has a clock of its own (Redis `TIME`, PostgreSQL `clock_timestamp()`;
    /// `None` for SQLite, whose clock is the node's).
    fn ping(&self) -> impl Future<Output = Result<Option<UnixMs>, StoreError>> + Send;
}

/// Strict admission's side of a store: quota held in windows ("holds") and units
/// granted from buckets ("grants"). Every store implements it beside [`CounterStore`].
pub trait QuotaStore: Send + Sync {
    /// Strict admission: settles each hold atomically on its window's count and the
    /// holder's total there ([`swin_core::settle_hold`]), in order, and answers one
    /// [`Held`] per hold. Idempotent: asking again leaves the same state.
    fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> impl Future<Output = Result<Vec<Held>, StoreError>> + Send;

    /// Strict admission of GCRA buckets: settles each grant atomically on its
    /// bucket's TAT and the holder's last grant there
    /// ([`swin_core::settle_grant`]), in order, and answers one [`Granted`] per
    /// request. A repeated request number is answered as the first was.
    fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> impl Future<Output = Result<Vec<Granted>, StoreError>> + Send;
}

/// The configured store: one of the backends (or, in tests, one wrapped to fail on
/// demand). Its methods box the backend's future, so callers hold one type whatever the
/// backend, and skip calls with nothing to do.
#[derive(Debug, Clone)]
pub enum Store {
    Postgres(PostgresStore),
    Redis(RedisStore),
    Sqlite(SqliteStore),
    #[cfg(feature = "faults")]
    Faulty(std::sync::Arc<FaultyStore>),
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `$call` on the backend `$s` inside `$store`.
macro_rules! dispatch {
    ($store:expr, $s:ident => $call:expr) => {
        match $store {
            Store::Postgres($s) => $call,
            Store::Redis($s) => $call,
            Store::Sqlite($s) => $call,
            #[cfg(feature = "faults")]
            Store::Faulty($s) => $call,
        }
    };
}

impl Store {
    /// `call`, in a span of its own (`swin::store`, TRACE: made only when traces are on)
    /// under the request that made it.
    fn traced<'a, T>(
        &self,
        op: &'static str,
        namespace: &str,
        call: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        use tracing::Instrument;
        // only under a request's span: a request not sampled makes none, nor do syncs
        if !tracing::enabled!(target: "swin::store", tracing::Level::TRACE)
            || tracing::Span::current().is_none()
        {
            return Box::pin(call);
        }
        let span = tracing::trace_span!(
            target: "swin::store",
            "store",
            otel.name = op,
            otel.kind = "client",
            db.system.name = self.kind().name(),
            db.namespace = namespace,
            error.type = tracing::field::Empty,
        );
        Box::pin(
            async move {
                let r = call.await;
                if let Err(e) = &r {
                    tracing::Span::current().record("error.type", tracing::field::display(e));
                }
                r
            }
            .instrument(span),
        )
    }

    pub fn kind(&self) -> StoreKind {
        dispatch!(self, s => s.kind())
    }

    pub fn capabilities(&self) -> Capabilities {
        dispatch!(self, s => s.capabilities())
    }

    /// See [`CounterStore::migrate`].
    pub fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { dispatch!(self, s => s.migrate().await) })
    }

    /// See [`CounterStore::push`].
    pub fn push<'a>(
        &'a self,
        namespace: &'a str,
        push: Push<'a>,
    ) -> BoxFuture<'a, Result<Pushed, StoreError>> {
        self.traced("push", namespace, async move {
            dispatch!(self, s => s.push(namespace, push).await)
        })
    }

    /// See [`CounterStore::read`]; no call for no keys.
    pub fn read<'a>(
        &'a self,
        namespace: &'a str,
        keys: &'a [WindowKey],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
        self.traced("read", namespace, async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.read(namespace, keys).await)
        })
    }

    /// See [`CounterStore::load_namespace`].
    pub fn load_namespace<'a>(
        &'a self,
        namespace: &'a str,
        windows: &'a [(u32, i64)],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
        self.traced("load_namespace", namespace, async move {
            dispatch!(self, s => s.load_namespace(namespace, windows).await)
        })
    }

    /// See [`CounterStore::purge`].
    pub fn purge(&self, now: UnixMs) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { dispatch!(self, s => s.purge(now).await) })
    }

    /// See [`CounterStore::push_tats`]; no call for no advances.
    pub fn push_tats<'a>(
        &'a self,
        namespace: &'a str,
        push: TatPush<'a>,
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        self.traced("push_tats", namespace, async move {
            if push.advances.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.push_tats(namespace, push).await)
        })
    }

    /// See [`CounterStore::read_tats`]; no call for no keys.
    pub fn read_tats<'a>(
        &'a self,
        namespace: &'a str,
        keys: &'a [CompactString],
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        self.traced("read_tats", namespace, async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.read_tats(namespace, keys).await)
        })
    }

    /// See [`CounterStore::load_tats`].
    pub fn load_tats<'a>(
        &'a self,
        namespace: &'a str,
        now_ns: i64,
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        self.traced("load_tats", namespace, async move {
            dispatch!(self, s => s.load_tats(namespace, now_ns).await)
        })
    }

    /// See [`CounterStore::reset`].
    pub fn reset<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        window_sizes: &'a [u32],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.traced("reset", namespace, async move {
            dispatch!(self, s => s.reset(namespace, key, window_sizes).await)
        })
    }

    /// See [`CounterStore::ping`].
    pub fn ping(&self) -> BoxFuture<'_, Result<Option<UnixMs>, StoreError>> {
        Box::pin(async move { dispatch!(self, s => s.ping().await) })
    }

    /// See [`LimitStore::put_limit`].
    pub fn put_limit<'a>(
        &'a self,
        namespace: &'a str,
        limit: &'a StoredLimit,
        not_after: UnixMs,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.traced("put_limit", namespace, async move {
            dispatch!(self, s => s.put_limit(namespace, limit, not_after).await)
        })
    }

    /// See [`LimitStore::delete_limit`].
    pub fn delete_limit<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        not_after: UnixMs,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.traced("delete_limit", namespace, async move {
            dispatch!(self, s => s.delete_limit(namespace, key, not_after).await)
        })
    }

    /// See [`LimitStore::read_limits`]; no call for no keys.
    pub fn read_limits<'a>(
        &'a self,
        namespace: &'a str,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<StoredLimit>, StoreError>> {
        self.traced("read_limits", namespace, async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.read_limits(namespace, keys).await)
        })
    }

    /// See [`LimitStore::list_limits`].
    pub fn list_limits<'a>(
        &'a self,
        namespace: &'a str,
        after: Option<&'a str>,
        count: usize,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Vec<StoredLimit>, StoreError>> {
        Box::pin(
            async move { dispatch!(self, s => s.list_limits(namespace, after, count, now).await) },
        )
    }

    /// See [`LimitStore::limit_changes`].
    pub fn limit_changes<'a>(
        &'a self,
        namespace: &'a str,
        since: Option<&'a str>,
    ) -> BoxFuture<'a, Result<LimitChanges, StoreError>> {
        self.traced("limit_changes", namespace, async move {
            dispatch!(self, s => s.limit_changes(namespace, since).await)
        })
    }

    /// See [`LeaseStore::acquire`].
    pub fn acquire<'a>(
        &'a self,
        namespace: &'a str,
        acquire: Acquire<'a>,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        self.traced("acquire", namespace, async move {
            dispatch!(self, s => s.acquire(namespace, acquire).await)
        })
    }

    /// See [`LeaseStore::release`] (`renew_to: None`) and [`LeaseStore::renew`].
    pub fn end_or_renew<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        lease: &'a str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
        not_after: UnixMs,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.traced("end_or_renew", namespace, async move {
            match renew_to {
                None => {
                    dispatch!(self, s => s.release(namespace, key, lease, now, not_after).await)
                }
                Some(t) => {
                    dispatch!(self, s => s.renew(namespace, key, lease, t, now, not_after).await)
                }
            }
        })
    }

    /// See [`LeaseStore::release_slots`].
    pub fn release_slots<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        prefix: &'a str,
        count: u32,
        now: UnixMs,
        not_after: UnixMs,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        self.traced("release_slots", namespace, async move {
            dispatch!(self, s => s.release_slots(namespace, key, prefix, count, now, not_after).await)
        })
    }

    /// See [`LeaseStore::in_flight`].
    pub fn leases_in_flight<'a>(
        &'a self,
        namespace: &'a str,
        now: UnixMs,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.traced("leases_in_flight", namespace, async move {
            dispatch!(self, s => s.in_flight(namespace, now).await)
        })
    }

    /// See [`QuotaStore::hold`]; no call for no holds.
    pub fn hold<'a>(
        &'a self,
        namespace: &'a str,
        holder: &'a crate::Holder,
        holds: &'a [Hold],
    ) -> BoxFuture<'a, Result<Vec<Held>, StoreError>> {
        self.traced("hold", namespace, async move {
            if holds.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.hold(namespace, holder, holds).await)
        })
    }

    /// See [`QuotaStore::grant`]; no call for no requests.
    pub fn grant<'a>(
        &'a self,
        namespace: &'a str,
        holder: &'a crate::Holder,
        grants: &'a [Grant],
    ) -> BoxFuture<'a, Result<Vec<Granted>, StoreError>> {
        self.traced("grant", namespace, async move {
            if grants.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.grant(namespace, holder, grants).await)
        })
    }

    /// See [`DemandStore::post_demands`]; no call for no entries.
    pub fn post_demands<'a>(
        &'a self,
        namespace: &'a str,
        entries: &'a [Demands],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.traced("post_demands", namespace, async move {
            if entries.is_empty() {
                return Ok(());
            }
            dispatch!(self, s => s.post_demands(namespace, entries).await)
        })
    }

    /// See [`DemandStore::read_demands`]; no call for no buckets.
    pub fn read_demands<'a>(
        &'a self,
        namespace: &'a str,
        buckets: &'a [&'a str],
        now: UnixMs,
    ) -> BoxFuture<'a, Result<Vec<Demands>, StoreError>> {
        self.traced("read_demands", namespace, async move {
            if buckets.is_empty() {
                return Ok(Vec::new());
            }
            dispatch!(self, s => s.read_demands(namespace, buckets, now).await)
        })
    }
}
