//! The store boundary, by purpose. [`CounterStore`]: push diffs (getting the new totals
//! back), read totals of given windows, load a namespace for warm-up, purge expired
//! windows, the same for GCRA buckets, reset a key, ping. [`QuotaStore`]: strict admission's
//! holds (windows) and grants (buckets). [`LimitStore`]: limits set per key at run time.
//! [`LeaseStore`]: concurrency leases. [`DemandStore`]: what the proxies of Envoy's
//! quota service ask for, shared among nodes. [`IdempotencyStore`]: records that answer a
//! retried request with its first answer. Each
//! store says what it can do ([`Capabilities`]). Three stores implement all of them,
//! dispatched by the [`Store`] enum; with the `faults` feature (tests only) `Faulty` wraps
//! one to inject failures.
//!
//! Each contract is declared once, with `store_calls!` (see `calls.rs`), which makes
//! both its trait and the [`Store`] methods that run its calls; what the calls carry is
//! in `types`.

#[macro_use]
mod calls;
pub mod demands;
#[cfg(feature = "faults")]
mod faulty;
pub mod idempotency;
pub mod leases;
pub mod limits;
mod memory;
mod normalize;
mod postgres;
mod redis;
pub mod reservations;
mod sql;
mod sql_tx;
mod sqlite;
mod types;

use std::future::Future;
use std::pin::Pin;

pub use self::demands::{DemandStore, Demands};
#[cfg(feature = "faults")]
pub use self::faulty::{Fault, FaultyStore};
pub use self::idempotency::{Claim, Claimed, ClientShare, Fingerprint, IdempotencyStore, Record};
pub use self::leases::{Acquire, Acquired, LeaseStore, Released, LEASE_END_KEPT_MS};
pub use self::limits::{LimitChanges, LimitStore, StoredLimit};
pub use self::memory::{MemoryStore, RECORD_OVERHEAD_BYTES};
pub(crate) use self::normalize::{normalize, normalize_advances};
pub use self::postgres::PostgresStore;
pub use self::redis::RedisStore;
pub use self::reservations::{
    extend_identity, extend_op, is_client, is_op, new_op, Ended, OpenReservation, Opened, Opening,
    ReservationRecord, ReservationStore, ENDED_KEPT_MS, MAX_COUNTED_TEXT, OPS_KEPT, OP_LEN,
};
pub use self::sqlite::SqliteStore;
pub use self::types::*;
use swin_core::{CompactString, Tat, Total, UnixMs};

use crate::StoreError;

store_calls! {
    /// The counting side of a store (windows and GCRA buckets). The backends implement it,
    /// so the compiler checks their signatures against one contract; [`Store`] picks one
    /// at run time. Every call is independent and may be retried: pushes carry their own
    /// exactly-once record.
    pub trait CounterStore {
        also {
            /// Which backend this is.
            fn kind(&self) -> StoreKind;

            /// What this backend can do.
            fn capabilities(&self) -> Capabilities;
        }

        /// Applies the schema (PostgreSQL, SQLite); nothing to do for Redis.
        fn migrate(&self) -> ();

        /// Adds the diffs and returns the new total of every pushed window; windows the
        /// store refuses for good come back in [`Pushed::rejected`], the rest are applied
        /// atomically. A stored count never goes below zero: a diff that would take it
        /// there leaves 0 (refunds on several nodes cannot make quota).
        fn push(&self, namespace: &str, push: Push<'_>) -> Pushed;

        /// Totals of the given windows; windows the store has never seen are left out.
        fn read(&self, namespace: &str, keys: &[WindowKey]) -> Vec<Total> where keys is empty;

        /// Every total of the namespace in windows of the given sizes starting at or after
        /// the paired start (a node's warm-up, Kong's `fetch`).
        fn load_namespace(&self, namespace: &str, windows: &[(u32, i64)]) -> Vec<Total>;

        /// Deletes windows that ended more than one window ago, and old push records.
        /// Returns the rows deleted (0 where the store expires keys by itself).
        fn purge(&self, now: UnixMs) -> u64;

        /// Applies TAT advances atomically and returns the new TAT of every pushed bucket.
        fn push_tats(&self, namespace: &str, push: TatPush<'_>) -> Vec<Tat> where push is empty;

        /// TATs of the given buckets; buckets the store does not hold (full) are left out.
        fn read_tats(&self, namespace: &str, keys: &[CompactString]) -> Vec<Tat>
            where keys is empty;

        /// Every bucket of the namespace that is not full at `now_ns` (warm-up).
        fn load_tats(&self, namespace: &str, now_ns: i64) -> Vec<Tat>;

        /// Deletes a key's counters (of the given window sizes, where the store needs them
        /// to find the key) and its bucket: a reset across the cluster. Push records stay.
        fn reset(&self, namespace: &str, key: &str, window_sizes: &[u32]) -> ();

        /// One round trip, to tell whether the store answers: with the store's time where
        /// the store has a clock of its own (Redis `TIME`, PostgreSQL `clock_timestamp()`;
        /// `None` for SQLite, whose clock is the node's).
        fn ping(&self) -> Option<UnixMs>;
    }
}

store_calls! {
    /// Strict admission's side of a store: quota held in windows ("holds") and units
    /// granted from buckets ("grants"). Every store implements it beside [`CounterStore`].
    pub trait QuotaStore {
        /// Strict admission: settles each hold atomically on its window's count and the
        /// holder's total there ([`swin_core::settle_hold`]), in order, and answers one
        /// [`Held`] per hold. Idempotent: asking again leaves the same state.
        fn hold(&self, namespace: &str, holder: &crate::Holder, holds: &[Hold]) -> Vec<Held>
            where holds is empty;

        /// Strict admission of GCRA buckets: settles each grant atomically on its
        /// bucket's TAT and the holder's last grant there
        /// ([`swin_core::settle_grant`]), in order, and answers one [`Granted`] per
        /// request. A repeated request number is answered as the first was.
        fn grant(&self, namespace: &str, holder: &crate::Holder, grants: &[Grant]) -> Vec<Granted>
            where grants is empty;
    }
}

/// The configured store: one of the backends (or, in tests, one wrapped to fail on
/// demand). Its calls are made by `store_calls!` from the contracts above: each runs
/// the backend's call in a span, and skips a call with nothing to do.
#[derive(Debug, Clone)]
pub enum Store {
    Postgres(PostgresStore),
    Redis(RedisStore),
    Sqlite(SqliteStore),
    /// The node's own memory: a local-only namespace's leases, reservations and
    /// idempotency records (see [`MemoryStore`]).
    Memory(std::sync::Arc<MemoryStore>),
    #[cfg(feature = "faults")]
    Faulty(std::sync::Arc<FaultyStore>),
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Store {
    /// `call`, in a span of its own (`swin::store`, TRACE: made only when traces are on)
    /// under the request that made it.
    async fn traced<T>(
        &self,
        op: &'static str,
        namespace: Option<&str>,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        use tracing::Instrument;
        // only under a request's span: a request not sampled makes none, nor do syncs
        if !tracing::enabled!(target: "swin::store", tracing::Level::TRACE)
            || tracing::Span::current().is_none()
        {
            return call.await;
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
        async move {
            let r = call.await;
            if let Err(e) = &r {
                tracing::Span::current().record("error.type", tracing::field::display(e));
            }
            r
        }
        .instrument(span)
        .await
    }

    pub fn kind(&self) -> StoreKind {
        match self {
            Store::Postgres(s) => s.kind(),
            Store::Redis(s) => s.kind(),
            Store::Sqlite(s) => s.kind(),
            Store::Memory(_) => StoreKind::Memory,
            #[cfg(feature = "faults")]
            Store::Faulty(f) => f.inner().kind(),
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        match self {
            Store::Postgres(s) => s.capabilities(),
            Store::Redis(s) => s.capabilities(),
            Store::Sqlite(s) => s.capabilities(),
            Store::Memory(_) => Capabilities {
                pipelines: false,
                expires_by_itself: false,
            },
            #[cfg(feature = "faults")]
            Store::Faulty(f) => f.inner().capabilities(),
        }
    }
}
