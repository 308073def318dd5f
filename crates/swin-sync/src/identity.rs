//! Who a store call comes from, as types of their own so the two are never mixed up: a
//! node's push identity (the store applies each of its sequence numbers once) and a
//! strict holder (the quota one run of an engine holds in windows or was granted from
//! buckets).

use std::sync::Arc;

/// The identity an engine pushes under: `<node>.<generation>` in the node, unique to the
/// engine, so a namespace rebuilt by a reload never reuses a `(push id, namespace, seq)`
/// the store has seen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PushId(Arc<str>);

impl PushId {
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        PushId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PushId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whose quota it is in strict admission: one run of one engine (`<push id>/<run>`), so
/// a restarted node never counts what its previous run held as its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder(Arc<str>);

impl Holder {
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Holder(name.into())
    }

    /// The holder of this run of the engine pushing as `push`.
    pub fn of_run(push: &PushId) -> Self {
        use std::hash::BuildHasher;
        let run = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        Holder(format!("{push}/{run:016x}").into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for PushId {
    fn from(s: String) -> Self {
        PushId(s.into())
    }
}

impl From<&str> for PushId {
    fn from(s: &str) -> Self {
        PushId(s.into())
    }
}

impl From<String> for Holder {
    fn from(s: String) -> Self {
        Holder(s.into())
    }
}

impl From<&str> for Holder {
    fn from(s: &str) -> Self {
        Holder(s.into())
    }
}
