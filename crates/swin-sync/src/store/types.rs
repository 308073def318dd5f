//! What the store calls carry: pushes and their answers, strict admission's holds and
//! grants, window keys, store kinds and what each store can do.

use swin_core::{Advance, CompactString, Diff, GrantRequest, HoldRequest, HoldState, Total};

/// Strict admission: a holder asks to hold quota in one window (see
/// [`swin_core::settle_hold`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub key: CompactString,
    pub window_size: u32,
    pub window_start: i64,
    pub request: HoldRequest,
}

/// The window after a [`Hold`]: its count, the previous window's, the holder's total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    pub state: HoldState,
}

/// What a server store needs beyond its URL: a password kept out of the URL (a node
/// reads it from the environment, so configs hold no secret) and a CA certificate (PEM)
/// to verify the server's TLS certificate by, for a CA the system does not trust. Its
/// `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub password: Option<String>,
    pub ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Strict admission of a GCRA bucket: a holder grants units of one bucket (see
/// [`swin_core::settle_grant`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub key: CompactString,
    pub request: GrantRequest,
}

/// The answer to a [`Grant`]: the units granted (0: none) and the bucket's TAT after
/// it (`None`: the store holds no bucket, it is full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub granted: i64,
    pub tat_ns: Option<i64>,
}

/// One key's window, to read its total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WindowKey {
    pub key: CompactString,
    pub window_size: u32,
    pub window_start: i64,
}

impl WindowKey {
    /// The window a diff counts in.
    pub fn of(d: &Diff) -> Self {
        WindowKey {
            key: d.key.clone(),
            window_size: d.window_size,
            window_start: d.window_start,
        }
    }
}

/// A window a store refused for good (a count it cannot hold, a key its column cannot
/// hold): never applied, and never worth retrying.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub diff: Diff,
    pub reason: String,
}

/// What a push did: the new total of every window it applied, and the windows the store
/// refused. A push applies all but the refused windows, exactly once: one row the store
/// cannot take never holds back the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pushed {
    pub totals: Vec<Total>,
    pub rejected: Vec<Rejected>,
}

impl From<Vec<Total>> for Pushed {
    fn from(totals: Vec<Total>) -> Self {
        Pushed {
            totals,
            rejected: Vec::new(),
        }
    }
}

/// A batch of diffs from one node. With `seq`, the store applies the batch at most once
/// per `(node_id, namespace, seq)`: the engine retries a failed push with the same
/// sequence number and the same diffs, so a push whose reply was lost is not counted
/// twice. Without `seq` (synchronous increments) there is no such record: a synchronous
/// round trip that the store applied but whose reply timed out leaves its hits counted
/// locally as well (the fallback), and the next sync pushes them again — those hits count
/// twice. Losing acknowledged hits instead would be worse; a store that answers within
/// `store_timeout` never gets there.
#[derive(Debug, Clone, Copy)]
pub struct Push<'a> {
    pub node_id: &'a crate::PushId,
    pub seq: Option<u64>,
    pub diffs: &'a [Diff],
}

/// A batch of GCRA TAT advances from one node, applied at `now_ns` as
/// `tat = max(tat, now) + Σ advances`, at most once per `(node_id, namespace, seq)` like
/// [`Push`] (the two share the namespace's sequence numbers).
#[derive(Debug, Clone, Copy)]
pub struct TatPush<'a> {
    pub node_id: &'a crate::PushId,
    pub seq: Option<u64>,
    pub now_ns: i64,
    pub advances: &'a [Advance],
}

impl TatPush<'_> {
    /// No advances: nothing to push.
    pub fn is_empty(&self) -> bool {
        self.advances.is_empty()
    }
}

/// Which store it is, for logs, metrics and the fingerprint of a spool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    Postgres,
    Redis,
    RedisCluster,
    Sqlite,
    /// A node's own memory (a local-only namespace's leases, reservations and
    /// idempotency records): never configured.
    Memory,
}

impl StoreKind {
    /// `postgres`, `redis`, `redis_cluster` or `sqlite`, as the config names it (`memory`:
    /// a node's own).
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::RedisCluster => "redis_cluster",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Memory => "memory",
        }
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a store can do, so callers ask for a capability, never for a store by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// One call can carry several writes and reads of any windows (a diff of 0 in a push
    /// brings its window's count back: Redis's script, PostgreSQL's statement), so a
    /// synchronous increment's previous window, and the windows a sync reads of the
    /// keys it pushes, ride in the push; SQLite reads beside it.
    pub pipelines: bool,
    /// Keys expire by themselves (Redis TTLs): nothing to purge.
    pub expires_by_itself: bool,
}
