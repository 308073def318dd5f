//! How a node's local counts meet everyone else's: the stores (PostgreSQL, Redis,
//! SQLite) behind one small boundary, and the per-namespace sync engine.

pub mod admission;
mod backoff;
pub mod clock;
mod engine;
mod error;
mod identity;
pub mod store;
mod sync;
mod unconfirmed;

pub use admission::{horizon, BucketView, StrictView, IDLE_MS, MAX_HORIZON, MIN_HORIZON};
pub use engine::{
    now, NamespaceSync, QuotaKeeper, SyncMode, SyncReport, SyncStatus, DEFAULT_ANSWER_WITHIN,
    SYNC_BUCKETS_SECS,
};
pub use error::StoreError;
pub use identity::{Holder, PushId};
pub use store::{
    Access, Grant, Granted, Held, Hold, Push, Pushed, Rejected, Store, TatPush, WindowKey,
};
pub use unconfirmed::{Chunk, Rows, Unconfirmed};

/// A random id for this process, so the store can tell its pushes from other nodes'.
pub fn new_node_id() -> String {
    use rand::Rng;
    let n: u64 = rand::thread_rng().gen();
    format!("{}-{n:016x}", std::process::id())
}
