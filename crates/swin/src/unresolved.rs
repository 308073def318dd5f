//! Changes a node owes the store and has not resolved: a commit or an extend whose reply
//! was lost (answered 503 `outcome_unknown`), a failed reserve's undo, a key's settlement
//! the store refused, a give-back waiting for its takes to land. Each is resolved by a
//! task of its own, which holds its entry here while it runs. A stop spools what is
//! still owed between two of its task's steps (the next start resolves them, once: by their
//! operation id) and names the rest, and then the process does not exit 0 (nothing owed
//! is dropped silently). Once a stop has taken what is owed, a task that learns what it
//! must still do (an extend not applied: its hits to give back) leaves it to the next
//! start ([`Owing::go_on`]), so that nothing is done twice.

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

/// An extend whose outcome the store did not tell: its reservation and keys, the
/// extend's operation id, what it added and when its hits were taken. Resolved by
/// asking the store again under the same id: applied (then or now), its hits stay;
/// the reservation no longer open, its hits are given back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwedExtend {
    /// The reservation's namespace.
    pub(crate) namespace: String,
    /// The reservation's id.
    pub(crate) reservation: String,
    /// Its keys.
    pub(crate) keys: Vec<String>,
    /// The extend's operation id.
    pub(crate) op: String,
    /// What it adds to each key.
    pub(crate) more: f64,
    /// When its hits were taken (Unix ms).
    pub(crate) at: i64,
}

/// The undo of a reserve that answered an error (its record not confirmed, or a cap
/// refused it): its estimate back on each key (unless `given_back`), then its record
/// ended by `op` (at cost 0), in case the store wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwedUndo {
    /// The reservation's namespace.
    pub(crate) namespace: String,
    /// The reservation's id.
    pub(crate) reservation: String,
    /// Its keys.
    pub(crate) keys: Vec<String>,
    /// The estimate spent on each key.
    pub(crate) cost: f64,
    /// When it was spent (Unix ms).
    pub(crate) at: i64,
    /// When the record lapses anyway (Unix ms).
    pub(crate) lapse: i64,
    /// The operation id that ends the record.
    pub(crate) op: String,
    /// Whether the estimate is back already.
    pub(crate) given_back: bool,
}

/// A key's settlement of a reservation its commit ended, which the store could not take
/// so far (nothing of it applied): the key stays settled at the estimate until it is.
/// Tried again until the store takes it; the next start tries it under the key's limits
/// then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwedSettle {
    /// The reservation's namespace.
    pub(crate) namespace: String,
    /// The reservation's id.
    pub(crate) reservation: String,
    /// The key.
    pub(crate) key: String,
    /// Whether an overrun is capped (`overrun = "cap"`) rather than charged as debt.
    pub(crate) capped: bool,
    /// The reservation's total.
    pub(crate) estimate: f64,
    /// Where its total was counted: each take's time (Unix ms) and amount.
    pub(crate) counted: Vec<(i64, f64)>,
    /// The commit's actual cost.
    pub(crate) cost: f64,
}

/// What a commit's give-back on a key found short (takes of the reservation counted on
/// a node whose push has not landed yet): per take's time (Unix ms), the part still to
/// give back once it lands, while its windows are counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwedGiveBack {
    /// The reservation's namespace.
    pub(crate) namespace: String,
    /// The reservation's id.
    pub(crate) reservation: String,
    /// The key.
    pub(crate) key: String,
    /// Per take's time, what is left to give back.
    pub(crate) short: Vec<(i64, f64)>,
}

/// One change owed to the store.
#[derive(Debug, Clone)]
pub(crate) enum Owed {
    /// A commit: spooled at a stop.
    Commit(OwedCommit),
    /// An extend: spooled at a stop.
    Extend(OwedExtend),
    /// A failed reserve's undo: spooled at a stop.
    Undo(OwedUndo),
    /// A key's settlement the store refused so far: spooled at a stop.
    Settle(OwedSettle),
    /// A give-back waiting for its takes to land: spooled at a stop.
    GiveBack(OwedGiveBack),
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
            Owed::Extend(x) => write!(
                f,
                "the extend of reservation {:?} by {} (its outcome unknown)",
                x.reservation, x.more
            ),
            Owed::Undo(u) if u.given_back => write!(
                f,
                "the end of the record of a reserve that answered an error (reservation {:?})",
                u.reservation
            ),
            Owed::Undo(u) => write!(
                f,
                "the undo of a reserve of {} that answered an error (reservation {:?})",
                u.cost, u.reservation
            ),
            Owed::Settle(s) => write!(
                f,
                "the settlement of reservation {:?} on key {:?} at cost {} (the store refused it so far)",
                s.reservation, s.key, s.cost
            ),
            Owed::GiveBack(g) => write!(
                f,
                "the give-back of {} to key {:?} of reservation {:?} (its takes not yet in the store)",
                g.short.iter().map(|&(_, v)| v).sum::<f64>(),
                g.key,
                g.reservation
            ),
            Owed::Other(what) => f.write_str(what),
        }
    }
}

/// What a namespace's node still owes (shared by the namespace's versions).
#[derive(Debug, Default)]
pub(crate) struct Unresolved {
    owed: Mutex<Entries>,
    next: AtomicU64,
}

/// The entries, and whether a stop has taken them.
#[derive(Debug, Default)]
struct Entries {
    entries: BTreeMap<u64, Owed>,
    taken: bool,
}

impl Unresolved {
    /// Holds `what` as owed until the returned guard drops.
    pub(crate) fn hold(self: &Arc<Self>, what: Owed) -> Owing {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().entries.insert(id, what);
        Owing {
            set: self.clone(),
            id,
        }
    }

    /// What is still owed, oldest first.
    #[cfg(test)]
    pub(crate) fn owed(&self) -> Vec<Owed> {
        self.lock().entries.values().cloned().collect()
    }

    /// What is still owed, oldest first, taken by a stop: from now on no task goes on
    /// to a step of its own ([`Owing::go_on`] is false), the next start does it.
    pub(crate) fn take_at_stop(&self) -> Vec<Owed> {
        let mut owing = self.lock();
        owing.taken = true;
        owing.entries.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One owed change, until it is resolved (dropped).
#[derive(Debug)]
pub(crate) struct Owing {
    set: Arc<Unresolved>,
    id: u64,
}

impl Owing {
    /// Before a task's next step (`now`, as the entry reads from then on): false when a
    /// stop has taken what is owed (the entry as it was is spooled, and the next start
    /// takes that step), and then the task stops there.
    pub(crate) fn go_on(&self, now: Owed) -> bool {
        let mut owing = self.set.lock();
        if owing.taken {
            return false;
        }
        owing.entries.insert(self.id, now);
        true
    }
}

impl Drop for Owing {
    fn drop(&mut self) {
        self.set.lock().entries.remove(&self.id);
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

    #[test]
    fn after_a_stop_took_them_no_task_goes_on() {
        let u = Arc::new(Unresolved::default());
        let a = u.hold(Owed::Other("a".into()));
        assert!(a.go_on(Owed::Other("a, next".into())));
        let taken = u.take_at_stop();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].to_string(), "a, next");
        assert!(!a.go_on(Owed::Other("a, after".into())));
        assert_eq!(u.owed()[0].to_string(), "a, next");
    }
}
