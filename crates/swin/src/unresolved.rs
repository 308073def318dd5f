//! Changes a node owes the store and has not resolved: a commit or an extend whose reply
//! was lost (answered 503 `outcome_unknown`), a failed reserve's undo. Each is resolved
//! by a task of its own, which holds its entry here while it runs. A stop spools the
//! commits still owed (the next start resolves them, once: by their operation id) and
//! names the rest, and then the process does not exit 0 (nothing owed is dropped
//! silently).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// A commit whose outcome the store did not tell: its reservation, the commit's
/// operation id and cost. Resolved by asking the store again under the same id: the
/// commit that ended the reservation settles it, once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwedCommit {
    /// The reservation's namespace.
    pub(crate) namespace: String,
    /// The reservation's id.
    pub(crate) reservation: String,
    /// The commit's operation id.
    pub(crate) op: String,
    /// The commit's actual cost.
    pub(crate) cost: f64,
}

/// One change owed to the store.
#[derive(Debug, Clone)]
pub(crate) enum Owed {
    /// A commit: spooled at a stop.
    Commit(OwedCommit),
    /// Anything else, as a person reads it: named at a stop.
    Other(String),
}

impl std::fmt::Display for Owed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owed::Commit(c) => write!(
                f,
                "the commit of reservation {:?} at cost {} (its outcome unknown)",
                c.reservation, c.cost
            ),
            Owed::Other(what) => f.write_str(what),
        }
    }
}

/// What a namespace's node still owes (shared by the namespace's versions).
#[derive(Debug, Default)]
pub(crate) struct Unresolved {
    owed: Mutex<BTreeMap<u64, Owed>>,
    next: AtomicU64,
}

impl Unresolved {
    /// Holds `what` as owed until the returned guard drops.
    pub(crate) fn hold(self: &Arc<Self>, what: Owed) -> Owing {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, what);
        Owing {
            set: self.clone(),
            id,
        }
    }

    /// What is still owed, oldest first.
    pub(crate) fn owed(&self) -> Vec<Owed> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Owed>> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One owed change, until it is resolved (dropped).
#[derive(Debug)]
pub(crate) struct Owing {
    set: Arc<Unresolved>,
    id: u64,
}

impl Drop for Owing {
    fn drop(&mut self) {
        self.set.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_owed_while_its_guard_lives() {
        let u = Arc::new(Unresolved::default());
        let a = u.hold(Owed::Other("a".into()));
        let b = u.hold(Owed::Other("b".into()));
        let names = |u: &Unresolved| u.owed().iter().map(|o| o.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&u), ["a", "b"]);
        drop(a);
        assert_eq!(names(&u), ["b"]);
        drop(b);
        assert!(u.owed().is_empty());
    }
}
