//! Totals that raced. A sync's read (or push) of a key and a synchronous round trip or a
//! hold on it are separate store calls, each applying the totals the store answered it;
//! when the other call was sent after the sync's and answered before it, the store ran it
//! after the sync's (as far as the node can tell), and the sync's totals, applied last,
//! would overwrite the newer count with the older one (a key read back 2 where the store,
//! and this node's own answer, held 3). So every such call is numbered as it is sent;
//! the apply of a call that counted or held stamps its keys with its number, and a
//! sync's apply leaves a key stamped with a later number than its own. A first touch's
//! read stamps the keys it fills, and a start's load of the namespace is applied as a
//! sync's is. The stamps are dropped at each tick's start, when no sync call is out.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use swin_core::{CompactString, NamespaceCounters, Total, UnixMs};

use super::{apply_to, Create, NamespaceSync};

/// The keys applied from the answers to counting or holding calls since the last tick
/// began, each with the number of its latest such apply.
#[derive(Debug, Default)]
pub(super) struct Fresh(Mutex<Stamps>);

#[derive(Debug, Default)]
struct Stamps {
    /// Calls numbered so far (the last one's number).
    sent: u64,
    keys: HashMap<CompactString, u64>,
}

impl Fresh {
    fn lock(&self) -> MutexGuard<'_, Stamps> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of a call about to be sent: a sync's (its apply leaves keys stamped
    /// later), or one that counts or holds (its apply stamps its keys with it).
    pub(super) fn next(&self) -> u64 {
        let mut stamps = self.lock();
        stamps.sent += 1;
        stamps.sent
    }

    /// Drops every stamp (a tick begins: no sync call is out).
    pub(super) fn clear(&self) {
        self.lock().keys.clear();
    }

    /// Applies a sync call's `totals`, sent as `since` ([`Fresh::next`]), except those of
    /// keys stamped later.
    pub(super) fn apply_unless_newer(
        &self,
        counters: &NamespaceCounters,
        totals: Vec<Total>,
        now: UnixMs,
        since: u64,
        create: Create,
    ) {
        // held through the apply: a stamp cannot land between the check and the write
        let stamps = self.lock();
        if stamps.keys.is_empty() {
            return apply_to(counters, &totals, now, create);
        }
        let older = |t: &Total| stamps.keys.get(t.key.as_str()).is_none_or(|&n| n <= since);
        let kept: Vec<Total> = totals.into_iter().filter(older).collect();
        apply_to(counters, &kept, now, create);
    }
}

impl NamespaceSync {
    /// Applies the totals the store answered a call that counted or held (a synchronous
    /// round trip, an owed one sent again, a hold), sent as `sent` ([`Fresh::next`]),
    /// stamping their keys.
    pub(super) fn apply_answered(&self, totals: &[Total], now: UnixMs, create: Create, sent: u64) {
        let mut stamps = self.fresh.lock();
        for t in totals {
            match stamps.keys.get_mut(t.key.as_str()) {
                Some(s) => *s = (*s).max(sent),
                None => {
                    stamps.keys.insert(t.key.clone(), sent);
                }
            }
        }
        apply_to(&self.counters, totals, now, create);
    }

    /// Applies a first touch's read, sent as `sent`, to the keys not held yet, stamping
    /// them: a load sent before it (a start's, a sync's), answered after it, leaves them
    /// as read. A key held by now was counted or read meanwhile, and keeps what it holds.
    pub(super) fn apply_first_read(&self, totals: &[Total], now: UnixMs, sent: u64) {
        let mut stamps = self.fresh.lock();
        let unheld: Vec<Total> = totals
            .iter()
            .filter(|t| !self.holds(&t.key))
            .cloned()
            .collect();
        for t in &unheld {
            let s = stamps.keys.entry(t.key.clone()).or_insert(sent);
            *s = (*s).max(sent);
        }
        apply_to(&self.counters, &unheld, now, Create::Absent);
    }

    /// The number of a store call about to be sent (see `fresh`).
    pub(crate) fn fresh_number(&self) -> u64 {
        self.fresh.next()
    }
}
