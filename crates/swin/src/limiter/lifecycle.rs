//! Why a limiter could not start, take a new config or stop cleanly: [`LimiterError`].

use std::path::PathBuf;
use std::time::Duration;

/// What [`Limiter::start`](super::Limiter::start),
/// [`Limiter::reconfigure`](super::Limiter::reconfigure),
/// [`Limiter::stop`](super::Limiter::stop) and the store helpers
/// ([`open_store`](super::open_store), [`migrate_all`](super::migrate_all)) answer when
/// they fail: a caller tells them apart by [`kind`](LimiterError::kind); `Display` says
/// the whole of it (which store, step, directory, how many windows), and `source` the
/// cause, for a log line.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LimiterError(#[from] Failure);

/// What kind of failure a [`LimiterError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimiterErrorKind {
    /// `data_dir` cannot hold the spool (checked at the start when any store is
    /// configured, not at the stop that needs it).
    DataDir,
    /// A store could not be configured, opened, migrated or reached.
    Store,
    /// A store a new config switches to did not answer a ping within `store_timeout`:
    /// the config was not taken (hits counted for a store that never answers could only
    /// be spooled for it).
    StoreTimeout,
    /// [`Limiter::reconfigure`](super::Limiter::reconfigure) after the stop.
    Stopped,
    /// At the stop: namespaces whose engines did not stop within `shutdown_grace`; their
    /// unconfirmed hits are neither pushed nor spooled (the others are spooled).
    Unfinished,
    /// At the stop: what the stores did not confirm could not be written to the spool.
    Spool,
    /// At the stop: changes whose store reply was lost were not resolved before it: what
    /// they owed the store is not applied.
    Owed,
}

impl LimiterError {
    /// What kind of failure it is.
    pub fn kind(&self) -> LimiterErrorKind {
        match self.0 {
            Failure::DataDir { .. } => LimiterErrorKind::DataDir,
            Failure::Store { .. } => LimiterErrorKind::Store,
            Failure::StoreTimeout { .. } => LimiterErrorKind::StoreTimeout,
            Failure::Stopped => LimiterErrorKind::Stopped,
            Failure::Unfinished { .. } => LimiterErrorKind::Unfinished,
            Failure::Spool { .. } => LimiterErrorKind::Spool,
            Failure::Owed { .. } => LimiterErrorKind::Owed,
        }
    }

    /// A store step's error, by the store's name.
    pub(crate) fn store(
        store: &str,
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> LimiterError {
        Failure::Store {
            store: store.to_owned(),
            what,
            source: source.into(),
        }
        .into()
    }
}

/// A [`LimiterError`]'s case, with what its message names (each kind's own doc is on
/// [`LimiterErrorKind`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// `data_dir` cannot hold the spool (checked at the start when any store is
    /// configured, not at the stop that needs it).
    #[error("data_dir {}: the spool needs a directory this node can write: {source}", path.display())]
    DataDir {
        /// The configured `data_dir`.
        path: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// A store could not be configured, opened, migrated or reached (`what` says
    /// which: `"configure"`, `"open"`, `"migrate"`, `"ping"`).
    #[error("store {store:?}: {what}: {source}")]
    Store {
        /// The store's name in the config.
        store: String,
        /// The step that failed.
        what: &'static str,
        /// The store's or the driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A store a new config switches to did not answer a ping within `store_timeout`:
    /// the config was not taken (hits counted for a store that never answers could only
    /// be spooled for it).
    #[error(
        "store {store:?} does not answer: no answer to a ping within store_timeout ({timeout:?})"
    )]
    StoreTimeout {
        /// The store's name in the config.
        store: String,
        /// The config's `store_timeout`.
        timeout: Duration,
    },
    /// [`Limiter::reconfigure`](super::Limiter::reconfigure) after the stop.
    #[error("the limiter is stopped")]
    Stopped,
    /// At the stop: namespaces whose engines did not stop within `shutdown_grace`; their
    /// unconfirmed hits are neither pushed nor spooled (the others are spooled, at
    /// `spooled`).
    #[error("{namespaces} namespaces did not stop within shutdown_grace ({grace:?}): their unconfirmed hits are lost (others spooled: {spooled:?})")]
    Unfinished {
        /// How many namespaces.
        namespaces: usize,
        /// The config's `shutdown_grace`.
        grace: Duration,
        /// The spool file written for the others, if any.
        spooled: Option<PathBuf>,
    },
    /// At the stop: what the stores did not confirm could not be written to the spool.
    #[error("lost {windows} windows ({hits} hits): cannot write the spool under {}: {source}", dir.display())]
    Spool {
        /// Windows not written.
        windows: usize,
        /// Their hits.
        hits: f64,
        /// The config's `data_dir`.
        dir: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// At the stop: changes whose store reply was lost and that were not resolved
    /// before it (each logged with its namespace): what they owed the store is not
    /// applied.
    #[error("{changes} changes whose store reply was lost were not resolved before the stop (see the errors above): what they owed the store is not applied")]
    Owed {
        /// How many.
        changes: usize,
    },
}
