//! What can go wrong with a request, in the library's own terms: what a caller sent
//! wrong, or what the limiter could not do. A door gives each case its status (the
//! daemon's `http::error`, its gRPC service).

use swin_core::CoreError;

/// Why a request was not decided. Being limited is no error: a denial is a
/// [`crate::decisions::Verdict`]. Each case names what a client sent wrong, or what the
/// node could not do, in a message meant for the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: the message names the field and why.
    #[error("{0}")]
    BadRequest(String),
    /// A key that is empty, too long or not UTF-8 text.
    #[error("{0}")]
    InvalidKey(String),
    /// A value or cost that is not a finite number in range.
    #[error("{0}")]
    InvalidValue(String),
    /// No namespace of that name: the message names it (`namespace "…" is not configured`).
    #[error("{0}")]
    UnknownNamespace(String),
    /// A window size the namespace does not count in: the message names both.
    #[error("{0}")]
    UnknownWindowSize(String),
    /// The node cannot take the request now: its memory for the namespace is full
    /// (`max_counters`); the client may try again later.
    #[error("{0}")]
    Unavailable(String),
    /// A cap on what one client may hold is reached (the message names the cap); gRPC's
    /// RESOURCE_EXHAUSTED, HTTP 429.
    #[error("{0}")]
    Exhausted(String),
    /// The store could not do what the request needed; `reason` is the short code a
    /// client gets (`store_unreachable`, `store_rejected`, `store_failed`), the store's
    /// own error goes to the log only.
    #[error("{message}")]
    Store {
        /// `store_unreachable`, `store_rejected` or `store_failed`.
        reason: &'static str,
        /// What the client is told.
        message: String,
    },
    /// A lease to release or renew that is not live (released, lapsed, never granted).
    #[error("{0}")]
    UnknownLease(String),
    /// A reservation to commit that is not open (committed, lapsed, never made).
    #[error("{0}")]
    UnknownReservation(String),
    /// A reservation already committed at another cost than this commit's: the first
    /// commit stands (HTTP 409 `already_committed`).
    #[error("{0}")]
    AlreadyCommitted(String),
    /// The store took a change but its answer was lost, and asking again within the
    /// answer time did not tell whether it applied: the node resolves it (exactly once)
    /// when the store answers, and the client learns the outcome by retrying the same
    /// request (the same `Idempotency-Key`, or the same reservation id). HTTP 503
    /// `outcome_unknown`.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// An idempotency key sent again with another request (another method, route or
    /// body) than the first one under it.
    #[error("{0}")]
    IdempotencyKeyReused(String),
    /// An idempotency key whose first request is still running past the answer time.
    #[error("{0}")]
    IdempotencyInProgress(String),
    /// A new idempotency key past the namespace's `idempotency_max_keys` live records.
    #[error("{0}")]
    IdempotencyFull(String),
    /// A bug: logged where it happened, answered without detail.
    #[error("internal error")]
    Internal,
}

impl Error {
    /// No namespace `name`.
    pub(crate) fn unknown_namespace(name: &str) -> Error {
        Error::UnknownNamespace(format!("namespace {name:?} is not configured"))
    }

    /// The same error about one item of a batch: the message of every error a client
    /// caused starts with `at` (its kind, hence its status and code, unchanged); the
    /// node's own failures are about the request, not the item.
    pub(crate) fn at(self, at: &str) -> Error {
        let p = |m: String| format!("{at}: {m}");
        match self {
            Error::BadRequest(m) => Error::BadRequest(p(m)),
            Error::InvalidKey(m) => Error::InvalidKey(p(m)),
            Error::InvalidValue(m) => Error::InvalidValue(p(m)),
            Error::UnknownNamespace(m) => Error::UnknownNamespace(p(m)),
            Error::UnknownLease(m) => Error::UnknownLease(p(m)),
            Error::UnknownReservation(m) => Error::UnknownReservation(p(m)),
            Error::AlreadyCommitted(m) => Error::AlreadyCommitted(p(m)),
            Error::Exhausted(m) => Error::Exhausted(p(m)),
            Error::UnknownWindowSize(m) => Error::UnknownWindowSize(p(m)),
            other @ (Error::Unavailable(_)
            | Error::Store { .. }
            | Error::OutcomeUnknown(_)
            | Error::Internal
            | Error::IdempotencyKeyReused(_)
            | Error::IdempotencyInProgress(_)
            | Error::IdempotencyFull(_)) => other,
        }
    }
}

impl Error {
    /// A store failure as a client may see it, its detail logged here.
    pub(crate) fn store(e: &swin_sync::StoreError, what: &str) -> Error {
        tracing::warn!(cause = %e, "{what}");
        Error::Store {
            reason: e.reason(),
            message: format!("{what}: the store could not be used; nothing was changed"),
        }
    }

    /// A store failure after which the store may have applied the call (its answer lost,
    /// or late past the store's timeout), as a client may see it: never "nothing was
    /// changed"; `then` says what the client does. Its detail logged here.
    pub(crate) fn store_maybe(e: &swin_sync::StoreError, what: &str, then: &str) -> Error {
        tracing::warn!(cause = %e, "{what}: the store may have applied it");
        Error::Store {
            reason: e.reason(),
            message: format!(
                "{what}: the store could not be used, or its answer was lost or late, so \
                 whether it took the change is unknown: {then}"
            ),
        }
    }

    /// Whether the store failed (it may have applied the call before failing).
    pub(crate) fn is_store(&self) -> bool {
        matches!(self, Error::Store { .. } | Error::OutcomeUnknown(_))
    }

    /// A change whose outcome the store did not tell in time (see
    /// [`Error::OutcomeUnknown`]): `what` it was and how the client learns the outcome.
    pub(crate) fn outcome_unknown(what: &str, retry: &str) -> Error {
        Error::OutcomeUnknown(format!(
            "{what}: the store took the change but its answer was lost; this node applies it exactly once (or takes it back) when the store answers: {retry}"
        ))
    }
}

impl From<swin_sync::admission::AdmitError> for Error {
    fn from(e: swin_sync::admission::AdmitError) -> Self {
        use swin_sync::admission::AdmitError;
        match e {
            AdmitError::Invalid(e) => e.into(),
            AdmitError::Store { what, cause } => Error::store(&cause, what),
            AdmitError::NoLimits => Error::BadRequest("the key has no limits".into()),
        }
    }
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::NonFiniteValue(_) | CoreError::CountOutOfRange { .. } => {
                Error::InvalidValue(e.to_string())
            }
            CoreError::InvalidWindowSize { .. }
            | CoreError::InvalidCost { .. }
            | CoreError::InvalidLimit(_) => Error::BadRequest(e.to_string()),
            CoreError::UnknownWindowSize {
                namespace,
                window_size,
            } => Error::UnknownWindowSize(format!(
                "namespace {namespace:?} has no window size {window_size}"
            )),
            CoreError::CapacityExceeded { .. } | CoreError::BucketsFull { .. } => {
                Error::Unavailable(e.to_string())
            }
        }
    }
}
