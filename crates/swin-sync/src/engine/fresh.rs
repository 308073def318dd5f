//! Totals that raced. A sync's read (or push) of a key and a synchronous round trip or a
//! hold on it are separate store calls, each applying the totals the store answered it;
//! when the sync's call was sent before the other was answered, the store may have run
//! it first, and its totals, applied last, would overwrite the newer count with the older
//! one (a key read back 2 where the store, and this node's own answer, held 3). So each
//! apply of a call that counted or held stamps its keys, and a sync's apply leaves a key
//! stamped after the sync's call was sent: that key's count is newer than what the sync
//! read. The stamps are dropped at each tick's start, when no sync call is out.

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
    /// Applies so far (the last one's number).
    applies: u64,
    keys: HashMap<CompactString, u64>,
}

impl Fresh {
    fn lock(&self) -> MutexGuard<'_, Stamps> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number to give a sync's call as it is sent: its apply leaves keys stamped
    /// after it.
    pub(super) fn mark(&self) -> u64 {
        self.lock().applies
    }

    /// Drops every stamp (a tick begins: no sync call is out).
    pub(super) fn clear(&self) {
        self.lock().keys.clear();
    }

    /// Applies a sync call's `totals`, sent at `since` ([`Fresh::mark`]), except those of
    /// keys stamped after it.
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
    /// round trip, an owed one sent again, a hold), stamping their keys.
    pub(super) fn apply_answered(&self, totals: &[Total], now: UnixMs, create: Create) {
        let mut stamps = self.fresh.lock();
        stamps.applies += 1;
        let n = stamps.applies;
        for t in totals {
            match stamps.keys.get_mut(t.key.as_str()) {
                Some(s) => *s = n,
                None => {
                    stamps.keys.insert(t.key.clone(), n);
                }
            }
        }
        apply_to(&self.counters, totals, now, create);
    }
}
