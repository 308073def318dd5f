//! What can go wrong with a request, in the node's own terms. `http::error` gives each
//! case its status and JSON body.

use swin_core::CoreError;

/// The longest request URI served (414 past it, with a JSON error).
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The most header bytes (names and values) of one request (431 past it, JSON error).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

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
    /// No namespace of that name.
    #[error("namespace {0:?} is not configured")]
    UnknownNamespace(String),
    /// A window size the namespace does not count in.
    #[error("namespace {namespace:?} has no window size {window_size}")]
    UnknownWindowSize {
        /// The namespace asked for.
        namespace: String,
        /// The size asked for, in seconds.
        window_size: u32,
    },
    /// Nothing is served at that path.
    #[error("no route for {0}")]
    NotFound(String),
    /// The path is served, not with that method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A body past `body_limit` (bytes).
    #[error("body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// A body that is not declared JSON.
    #[error("body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// A request URI past [`MAX_URI_BYTES`] (its length).
    #[error("the request URI is {0} bytes; the limit is {MAX_URI_BYTES}")]
    UriTooLong(usize),
    /// Request headers past [`MAX_HEADER_BYTES`] (their length).
    #[error("the request headers are {0} bytes; the limit is {MAX_HEADER_BYTES}")]
    HeadersTooLarge(usize),
    /// A body that did not arrive within `body_timeout`.
    #[error("the body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
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
    /// No token, or one the node does not know: 401 with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(String),
    /// A known token without the route's scope.
    #[error("{0}")]
    Forbidden(String),
    /// A lease to release or renew that is not live (released, lapsed, never granted).
    #[error("{0}")]
    UnknownLease(String),
    /// A reservation to commit that is not open (committed, lapsed, never made).
    #[error("{0}")]
    UnknownReservation(String),
    /// A bug: logged where it happened, answered without detail.
    #[error("internal error")]
    Internal,
}

impl Error {
    /// The same error about one item of a batch: its message starts with `at`.
    pub fn at(self, at: &str) -> Error {
        match self {
            Error::BadRequest(m) => Error::BadRequest(format!("{at}: {m}")),
            Error::InvalidKey(m) => Error::InvalidKey(format!("{at}: {m}")),
            Error::InvalidValue(m) => Error::InvalidValue(format!("{at}: {m}")),
            other => other,
        }
    }
}

impl Error {
    /// A store failure as a client may see it, its detail logged here.
    pub fn store(e: &swin_sync::StoreError, what: &str) -> Error {
        tracing::warn!(cause = %e, "{what}");
        Error::Store {
            reason: e.reason(),
            message: format!("{what}: the store could not be used; nothing was changed"),
        }
    }

    /// Whether the store failed (it may have applied the call before failing).
    pub fn is_store(&self) -> bool {
        matches!(self, Error::Store { .. })
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
            } => Error::UnknownWindowSize {
                namespace,
                window_size,
            },
            CoreError::CapacityExceeded { .. } | CoreError::BucketsFull { .. } => {
                Error::Unavailable(e.to_string())
            }
        }
    }
}
