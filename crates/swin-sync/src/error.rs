//! Store errors, split by what the sync engine should do about them.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("postgres: {0}")]
    Postgres(#[source] sqlx::Error),
    #[error("sqlite: {0}")]
    Sqlite(#[source] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("migrate: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store answered something unexpected: {0}")]
    Protocol(String),
    #[error("injected fault")]
    Injected,
    /// The engine did not ask the store: it failed lately (a sync finding it again
    /// clears this), or the call was dropped on the way.
    #[error("store not asked: {0}")]
    Unavailable(String),
    /// A write the store's primary took but fewer replicas than asked acknowledged in
    /// time (`wait_replicas`): not confirmed, so pushed again.
    #[error("redis: {acked} of {wanted} replicas acknowledged the writes in time")]
    Unreplicated { wanted: u32, acked: u32 },
    /// A change the store took after its deadline (its caller was told it failed): the
    /// store did not apply it.
    #[error("the store took the change after its deadline; not applied")]
    TooLate,
    /// A table of the node's own memory ([`crate::store::MemoryStore`]) is full: nothing
    /// was changed; room comes back as its entries lapse or end.
    #[error("{0}")]
    Full(String),
}

impl StoreError {
    /// What a client may be told (the detail goes to the log, never into a response):
    /// `store_rejected` when the store refused the data itself, `store_unreachable` when
    /// it may answer later (down, slow, busy), `store_failed` for the rest (a schema, a
    /// permission, an answer it should not have given).
    pub fn reason(&self) -> &'static str {
        if self.is_rejection() {
            "store_rejected"
        } else if self.is_transient() {
            "store_unreachable"
        } else {
            "store_failed"
        }
    }

    /// Worth retrying: the store may answer later (down, slow, busy, a lost connection,
    /// a serialization failure). Everything else needs an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout(_)
            | StoreError::Injected
            | StoreError::Unavailable(_)
            | StoreError::Unreplicated { .. }
            | StoreError::TooLate
            | StoreError::Full(_) => true,
            StoreError::Postgres(e) | StoreError::Sqlite(e) => sqlx_transient(e),
            StoreError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || e.is_cluster_error()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::BusyLoadingError | redis::ErrorKind::TryAgain
                    )
            }
            StoreError::Migrate(_) | StoreError::Protocol(_) => false,
        }
    }
}

impl StoreError {
    /// Whether the failed call may have run in the store all the same (cut short, its
    /// reply lost, an answer that did not read): false only where it surely did not (no
    /// connection was made or lent, the engine did not ask, the store refused it).
    pub fn may_have_run(&self) -> bool {
        match self {
            StoreError::Unavailable(_)
            | StoreError::Migrate(_)
            | StoreError::TooLate
            | StoreError::Full(_) => false,
            StoreError::Postgres(e) | StoreError::Sqlite(e) => !matches!(
                e,
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Database(_)
            ),
            StoreError::Redis(e) => !e.is_connection_refusal(),
            StoreError::Timeout(_)
            | StoreError::Protocol(_)
            | StoreError::Injected
            | StoreError::Unreplicated { .. } => true,
        }
    }

    /// The store refused the data itself (a value its column cannot hold, a key its
    /// encoding cannot hold): the same rows will fail every time, so they are isolated
    /// and dropped rather than retried. Errors about anything else (a missing table, a
    /// lost connection) are never rejections: those rows wait and are retried.
    pub fn is_rejection(&self) -> bool {
        match self {
            StoreError::Postgres(sqlx::Error::Database(db)) => {
                // PostgreSQL: data exception (22), integrity constraint violation (23)
                let code = db.code().unwrap_or_default();
                code.starts_with("22") || code.starts_with("23")
            }
            StoreError::Sqlite(sqlx::Error::Database(db)) => {
                // SQLite: TOOBIG (18), CONSTRAINT (19), MISMATCH (20), RANGE (25) and
                // their extended codes
                let code = db.code().unwrap_or_default();
                matches!(
                    code.parse::<i32>().map(|c| c & 0xff),
                    Ok(18) | Ok(19) | Ok(20) | Ok(25)
                )
            }
            _ => false,
        }
    }
}

fn sqlx_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // PostgreSQL: connection (08), serialization/deadlock (40), resources (53),
            // shutdown (57P). SQLite: BUSY (5), LOCKED (6) and their extended codes.
            code.starts_with("08")
                || code.starts_with("40")
                || code.starts_with("53")
                || code.starts_with("57P")
                || matches!(code.parse::<i32>().map(|c| c & 0xff), Ok(5) | Ok(6))
        }
        _ => false,
    }
}
