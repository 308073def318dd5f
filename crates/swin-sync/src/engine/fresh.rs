//! Totals that raced. A sync's read (or push) of a key and a synchronous round trip or a
//! hold on it are separate store calls, each applying the totals the store answered it;
//! when the other call was sent after the sync's and answered before it, the store ran it
//! after the sync's (as far as the node can tell), and the sync's totals, applied last,
//! would overwrite the newer count with the older one (a key read back 2 where the store,
//! and this node's own answer, held 3). So every such call is numbered as it is sent;
//! the apply of a call that counted or held stamps its keys with its number, and a
//! sync's apply leaves a key stamped with a later number than its own. A first touch's
//! read stamps the keys it fills, and a start's load of the namespace is applied as a
//! sync's is. Stamps no sync call still out could skip are dropped at each tick's start.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use swin_core::{CompactString, NamespaceCounters, Total, UnixMs};

use super::{apply_to, Create, NamespaceSync};

/// The keys applied from the answers to counting or holding calls, each with the number
/// of its latest such apply, and the sync calls still out.
#[derive(Debug, Default)]
pub(super) struct Fresh(Mutex<Stamps>);

#[derive(Debug, Default)]
struct Stamps {
    /// Calls numbered so far (the last one's number).
    sent: u64,
    keys: HashMap<CompactString, u64>,
    /// The numbers of the sync calls sent and not applied yet (each with how many: a
    /// number is taken once, but a count keeps this honest).
    out: BTreeMap<u64, usize>,
}

/// A sync call's number, held while the call is out: the stamps it must honour stay
/// until it is applied, or given up (dropped).
#[derive(Debug)]
pub(super) struct Since {
    fresh: Arc<Fresh>,
    n: u64,
}

impl Drop for Since {
    fn drop(&mut self) {
        let mut stamps = self.fresh.lock();
        if let Some(c) = stamps.out.get_mut(&self.n) {
            *c -= 1;
            if *c == 0 {
                stamps.out.remove(&self.n);
            }
        }
    }
}

impl Fresh {
    fn lock(&self) -> MutexGuard<'_, Stamps> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of a call about to be sent that counts, holds or first reads: its
    /// apply stamps its keys with it.
    pub(super) fn next(&self) -> u64 {
        let mut stamps = self.lock();
        stamps.sent += 1;
        stamps.sent
    }

    /// The number of a sync call about to be sent (a tick's read or push, a start's load):
    /// its apply leaves keys stamped later.
    pub(super) fn since(self: &Arc<Self>) -> Since {
        let mut stamps = self.lock();
        stamps.sent += 1;
        let n = stamps.sent;
        *stamps.out.entry(n).or_default() += 1;
        Since {
            fresh: self.clone(),
            n,
        }
    }

    /// Drops the stamps no sync call still out would skip (a tick begins; a start's load
    /// may still be out).
    pub(super) fn clear(&self) {
        let mut stamps = self.lock();
        match stamps.out.keys().next().copied() {
            None => stamps.keys.clear(),
            Some(oldest) => stamps.keys.retain(|_, n| *n > oldest),
        }
    }

    /// Applies a sync call's `totals`, sent as `since`, except those of keys stamped
    /// later.
    pub(super) fn apply_unless_newer(
        &self,
        counters: &NamespaceCounters,
        totals: Vec<Total>,
        now: UnixMs,
        since: Since,
        create: Create,
    ) {
        // held through the apply: a stamp cannot land between the check and the write
        let stamps = self.lock();
        if stamps.keys.is_empty() {
            return apply_to(counters, &totals, now, create);
        }
        let older = |t: &Total| {
            stamps
                .keys
                .get(t.key.as_str())
                .is_none_or(|&n| n <= since.n)
        };
        let kept: Vec<Total> = totals.into_iter().filter(older).collect();
        apply_to(counters, &kept, now, create);
        drop(stamps);
        drop(since);
    }
}

fn stamp(stamps: &mut Stamps, key: &CompactString, sent: u64) {
    match stamps.keys.get_mut(key.as_str()) {
        Some(s) => *s = (*s).max(sent),
        None => {
            stamps.keys.insert(key.clone(), sent);
        }
    }
}

impl NamespaceSync {
    /// Applies the totals the store answered a call that counted or held (a synchronous
    /// round trip, an owed one sent again, a hold), sent as `sent` ([`Fresh::next`]),
    /// stamping their keys.
    pub(super) fn apply_answered(&self, totals: &[Total], now: UnixMs, create: Create, sent: u64) {
        let mut stamps = self.fresh.lock();
        for t in totals {
            stamp(&mut stamps, &t.key, sent);
        }
        apply_to(&self.counters, totals, now, create);
    }

    /// Applies a first touch's read, sent as `sent`, to the tables that do not hold its
    /// keys, and stamps every key some table lacked: a sync's or a start's load sent
    /// before it and answered after it leaves them as read. What a table holds by now
    /// was counted or read meanwhile, and stays. The whole read at once: a key is filled
    /// in every table that lacked it, whatever call of the read brought each window.
    pub(super) fn apply_first_read(&self, totals: &[Total], now: UnixMs, sent: u64) {
        let mut stamps = self.fresh.lock();
        let tables = self.counters.tables();
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for t in totals {
            if seen.insert(t.key.as_str()) && tables.iter().any(|table| !table.contains(&t.key)) {
                stamp(&mut stamps, &t.key, sent);
            }
        }
        apply_to(&self.counters, totals, now, Create::Absent);
    }

    /// The number of a store call about to be sent (see `fresh`).
    pub(crate) fn fresh_number(&self) -> u64 {
        self.fresh.next()
    }
}
