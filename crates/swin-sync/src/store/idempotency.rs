//! Idempotency records: a request retried under the same idempotency key is answered
//! with its first answer, on any node, and counts nothing more. A record is claimed
//! atomically in the store (put-if-absent) before its request runs, holds the request's
//! fingerprint, and then its first answer (opaque bytes: the caller encodes them) until it
//! lapses. Its times are the store's (the caller's clock, corrected to the store's).
//!
//! - A claim finds the record absent or lapsed and makes it the caller's (in flight
//!   until `held_until`: a holder that went away without an answer no longer holds it
//!   after that), or finds it in flight or answered and says so, or finds the namespace
//!   holding `max_records` live records, or the claim's client holding its share
//!   ([`ClientShare`]) of them, and writes nothing. A record stays counted for the client
//!   that made it, also when another claim takes it over.
//! - The holder then keeps its answer (the record is answered until `expires_at`), or
//!   releases the claim (the record goes: the next retry runs the request again). Both
//!   act only while the claim is still the holder's (its `token`).
//!
//! Layout: PostgreSQL and SQLite, the table `swin_idempotency` (namespace, key →
//! fingerprint, token, held_until, expires_at, answer) and `swin_idempotency_counts`
//! (namespace → records, the cap's count) and `swin_idempotency_client_counts` (namespace,
//! client → records, a client's share), changed in the transaction that adds or deletes
//! a record. Redis: per record a string, `swin:{<len(ns)>:<ns>}:idem:<key>`, that
//! expires by itself, per namespace a sorted set, `swin:{<len(ns)>:<ns>}:idem`
//! (key → expires_at), the cap's count, and per client another,
//! `swin:{<len(ns)>:<ns>}:idemc:<client>`, its share's; all share the namespace's hash tag
//! so one script claims atomically (see `redis/idempotency_claim.lua`).

use swin_core::UnixMs;

/// A request's fingerprint: a hash (SHA-256) of what it asked. A retry must ask the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// From stored bytes; `None` when they are not 32.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        bytes.try_into().ok().map(Fingerprint)
    }
}

/// A claim of the record `key`.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The record's key in its namespace (the caller composes it).
    pub key: &'a str,
    pub fingerprint: &'a Fingerprint,
    /// The holder's token: only it keeps an answer or releases the claim.
    pub token: i64,
    /// Past this, a claim not answered is no longer held (at most `expires_at`).
    pub held_until: UnixMs,
    /// When the record lapses, answered or not.
    pub expires_at: UnixMs,
    pub now: UnixMs,
    /// Live records the namespace may hold: a new record past them is refused.
    pub max_records: u64,
    /// Who claims, and how many of the namespace's live records they may hold (`None`:
    /// the claim counts against the namespace's cap only).
    pub client: Option<ClientShare<'a>>,
}

/// A client's share of a namespace's records: a new record of a client holding
/// `max_records` live ones is refused ([`Claimed::ClientFull`]), whatever room the
/// namespace has.
#[derive(Debug, Clone, Copy)]
pub struct ClientShare<'a> {
    /// The client, as its caller names it (a short id: letters, digits, `-`, `_`, `.`).
    pub client: &'a str,
    /// Live records it may hold in the namespace.
    pub max_records: u64,
}

/// A record another request made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Its request has not answered yet.
    InFlight { fingerprint: Fingerprint },
    /// Its request's first answer.
    Answered {
        fingerprint: Fingerprint,
        answer: Vec<u8>,
    },
}

impl Record {
    /// What the record's request asked.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Record::InFlight { fingerprint } | Record::Answered { fingerprint, .. } => fingerprint,
        }
    }
}

/// What a claim found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The record is the caller's now: run the request, then keep or release.
    Mine,
    /// A live record (nothing was written).
    Found(Record),
    /// The namespace holds `max_records` live records: nothing was written.
    Full,
    /// The claim's client holds its share of live records: nothing was written.
    ClientFull,
}

store_calls! {
    /// The idempotency side of a store. Every store implements it beside
    /// [`super::CounterStore`].
    pub trait IdempotencyStore kept in_memory {
        /// Claims a record for a request, atomically across the cluster (see the module's
        /// note).
        fn claim_idempotency(&self, namespace: &str, claim: Claim<'_>) -> Claimed;

        /// Keeps `answer` as the first answer of the record `key`, if the claim `token`
        /// still holds it (false: it lapsed, and another request may have taken it over).
        fn keep_answer(
            &self,
            namespace: &str,
            key: &str,
            token: i64,
            answer: &[u8],
            now: UnixMs,
        ) -> bool;

        /// Ends the claim `token` on the record `key` without an answer: the record goes,
        /// so that a retry runs the request again. False when the claim is not held.
        fn release_claim(&self, namespace: &str, key: &str, token: i64) -> bool;

        /// Records of the namespace live at `now` (what the cap counts).
        fn idempotency_records(&self, namespace: &str, now: UnixMs) -> u64;

        /// Deletes the records lapsed at `now`, of every namespace; answers how many
        /// (0 where the store expires them by itself).
        fn purge_idempotency(&self, now: UnixMs) -> u64;
    }
}

/// A record as the SQL stores read it: (fingerprint, held_until, expires_at, answer).
pub(crate) type Row = (Vec<u8>, i64, i64, Option<Vec<u8>>);

/// What a claim found in a row the SQL stores read (under their lock): `None` when the
/// row is absent, lapsed or held no longer, so the claim takes it.
pub(crate) fn live(row: Option<Row>, now: UnixMs) -> Result<Option<Record>, crate::StoreError> {
    let Some((fingerprint, held_until, expires_at, answer)) = row else {
        return Ok(None);
    };
    if expires_at <= now.0 {
        return Ok(None);
    }
    let fingerprint = Fingerprint::from_slice(&fingerprint).ok_or_else(|| {
        crate::StoreError::Protocol("an idempotency record's fingerprint is not 32 bytes".into())
    })?;
    Ok(match answer {
        Some(answer) => Some(Record::Answered {
            fingerprint,
            answer,
        }),
        None if held_until > now.0 => Some(Record::InFlight { fingerprint }),
        None => None,
    })
}

/// The statements both SQL stores run, written in PostgreSQL's placeholders (SQLite's:
/// [`sqlite_text`](crate::store::sql::sqlite_text)). Counting a new record, reading a
/// record to claim, releasing and purging are each store's own.
pub(crate) mod sql {
    /// A claim's first statement: its record, unless one is there.
    pub const CLAIM: &str = "INSERT INTO swin_idempotency
             (namespace, key, fingerprint, token, held_until, expires_at, client)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING";
    /// A record found lapsed or held no longer, made the claim's.
    pub const TAKE_OVER: &str =
        "UPDATE swin_idempotency SET fingerprint = $3, token = $4, held_until = $5,
             expires_at = $6, answer = NULL
         WHERE namespace = $1 AND key = $2";
    pub const KEEP: &str = "UPDATE swin_idempotency SET answer = $4
         WHERE namespace = $1 AND key = $2 AND token = $3 AND answer IS NULL
           AND expires_at > $5";
}

/// Implements [`IdempotencyStore`] for a SQL store (PostgreSQL, SQLite) whose module
/// holds what differs: `claim` (the store's claim and its tries), `release`
/// (`release_claim`) and `purge_lapsed` (of one namespace or all), with the statements
/// `count` (counts a record just inserted if its namespace has room, bound to the
/// namespace and the cap: a row back when it does), `count_client` (the same for the
/// claim's client, bound to the namespace, the client and its share) and `records` (the
/// live records of a namespace), and those of [`sql`] in its placeholders. It also gives the store the
/// steps of a claim both stores take alike: `insert_claim`, `count_claim`, `take_over`.
macro_rules! sql_idempotency_store {
    (
        $store:ty,
        db: $db:ty,
        err: $err:path,
        claim: $claim:expr,
        count: $count:expr,
        count_client: $count_client:expr,
        take_over: $take_over:expr,
        keep: $keep:expr,
        records: $records:expr $(,)?
    ) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::UnixMs;
            use $crate::store::idempotency::{Claim, Claimed, IdempotencyStore};
            use $crate::StoreError;

            /// A claim's transaction.
            type Tx = sqlx::Transaction<'static, $db>;

            impl $store {
                /// A claim's first statement: inserts its record, true, or finds one
                /// there, false (the transaction then goes on).
                async fn insert_claim(
                    tx: &mut Tx,
                    namespace: &str,
                    c: &Claim<'_>,
                ) -> Result<bool, StoreError> {
                    let inserted = sqlx::query($claim)
                        .bind(namespace)
                        .bind(c.key)
                        .bind(&c.fingerprint.0[..])
                        .bind(c.token)
                        .bind(c.held_until.0)
                        .bind(c.expires_at.0)
                        .bind(c.client.map_or("", |s| s.client))
                        .execute(&mut **tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    Ok(inserted == 1)
                }

                /// Counts the record a claim inserted, if its namespace and its
                /// client have room, and ends the claim: `Mine`, or `Full` or
                /// `ClientFull` (rolled back).
                async fn count_claim(
                    mut tx: Tx,
                    namespace: &str,
                    c: &Claim<'_>,
                ) -> Result<Claimed, StoreError> {
                    let cap = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    let room: Option<i64> = sqlx::query_scalar($count)
                        .bind(namespace)
                        .bind(cap(c.max_records))
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    if room.is_none() || c.max_records == 0 {
                        tx.rollback().await.map_err($err)?;
                        return Ok(Claimed::Full);
                    }
                    if let Some(share) = c.client {
                        // the client's count row is locked until commit, as the
                        // namespace's: its claims on every node take turns
                        let room: Option<i64> = sqlx::query_scalar($count_client)
                            .bind(namespace)
                            .bind(share.client)
                            .bind(cap(share.max_records))
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err($err)?;
                        if room.is_none() || share.max_records == 0 {
                            tx.rollback().await.map_err($err)?;
                            return Ok(Claimed::ClientFull);
                        }
                    }
                    tx.commit().await.map_err($err)?;
                    Ok(Claimed::Mine)
                }

                /// Makes a record found lapsed, or held no longer, the claim's (it is
                /// counted already) and ends the claim: `Mine`.
                async fn take_over(
                    mut tx: Tx,
                    namespace: &str,
                    c: &Claim<'_>,
                ) -> Result<Claimed, StoreError> {
                    sqlx::query($take_over)
                        .bind(namespace)
                        .bind(c.key)
                        .bind(&c.fingerprint.0[..])
                        .bind(c.token)
                        .bind(c.held_until.0)
                        .bind(c.expires_at.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    tx.commit().await.map_err($err)?;
                    Ok(Claimed::Mine)
                }
            }

            impl IdempotencyStore for $store {
                async fn claim_idempotency(
                    &self,
                    namespace: &str,
                    c: Claim<'_>,
                ) -> Result<Claimed, StoreError> {
                    self.claim(namespace, c).await
                }

                async fn keep_answer(
                    &self,
                    namespace: &str,
                    key: &str,
                    token: i64,
                    answer: &[u8],
                    now: UnixMs,
                ) -> Result<bool, StoreError> {
                    let kept = sqlx::query($keep)
                        .bind(namespace)
                        .bind(key)
                        .bind(token)
                        .bind(answer)
                        .bind(now.0)
                        .execute(self.pool())
                        .await
                        .map_err($err)?
                        .rows_affected();
                    Ok(kept > 0)
                }

                async fn release_claim(
                    &self,
                    namespace: &str,
                    key: &str,
                    token: i64,
                ) -> Result<bool, StoreError> {
                    self.release(namespace, key, token).await
                }

                async fn idempotency_records(
                    &self,
                    namespace: &str,
                    now: UnixMs,
                ) -> Result<u64, StoreError> {
                    let n: i64 = sqlx::query_scalar($records)
                        .bind(namespace)
                        .bind(now.0)
                        .fetch_one(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                }

                async fn purge_idempotency(&self, now: UnixMs) -> Result<u64, StoreError> {
                    let gone = self.purge_lapsed(None, now).await?;
                    // a client holding no record keeps no row: a row per address ever
                    // seen would grow without end (a claim under way adds its row again)
                    sqlx::query("DELETE FROM swin_idempotency_client_counts WHERE records <= 0")
                        .execute(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(gone)
                }
            }
        };
    };
}
pub(crate) use sql_idempotency_store;
