//! Changes a node owes the store and has not resolved: a commit or an extend whose reply
//! was lost (answered 503 `outcome_unknown`), a failed reserve's undo. Each is resolved
//! by a task of its own, which holds its entry here while it runs: a stop that leaves
//! one behind says which, and the process does not exit 0 (nothing owed is dropped
//! silently).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a namespace's node still owes (shared by the namespace's versions).
#[derive(Debug, Default)]
pub(crate) struct Unresolved {
    owed: Mutex<BTreeMap<u64, String>>,
    next: AtomicU64,
}

impl Unresolved {
    /// Holds `what` as owed until the returned guard drops.
    pub(crate) fn hold(self: &Arc<Self>, what: String) -> Owing {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, what);
        Owing {
            set: self.clone(),
            id,
        }
    }

    /// What is still owed, oldest first.
    pub(crate) fn owed(&self) -> Vec<String> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, String>> {
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
        let a = u.hold("a".into());
        let b = u.hold("b".into());
        assert_eq!(u.owed(), ["a", "b"]);
        drop(a);
        assert_eq!(u.owed(), ["b"]);
        drop(b);
        assert!(u.owed().is_empty());
    }
}
