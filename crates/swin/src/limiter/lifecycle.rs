//! Why a limiter could not start, take a new config or stop cleanly: [`LimiterError`].

use std::path::PathBuf;
use std::time::Duration;

/// What [`Limiter::start`](super::Limiter::start),
/// [`Limiter::reconfigure`](super::Limiter::reconfigure),
/// [`Limiter::stop`](super::Limiter::stop) and the store helpers
/// ([`open_store`](super::open_store), [`migrate_all`](super::migrate_all)) answer when
/// they fail. A caller tells them apart by variant; `Display` says the whole of it
/// (with the cause), for a log line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
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

impl LimiterError {
    /// A store step's error, by the store's name.
    pub(crate) fn store(
        store: &str,
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> LimiterError {
        LimiterError::Store {
            store: store.to_owned(),
            what,
            source: source.into(),
        }
    }
}
