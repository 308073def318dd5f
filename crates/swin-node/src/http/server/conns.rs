//! The connections a listener holds, as its cap and timeouts see them: each one's
//! state in atomics its own requests change, and the table the cap and the reaper scan.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::ConnectionLimits;

/// `0` in the `*_ms` fields below: not set (times are stored plus one).
pub(super) const UNSET: u64 = 0;

/// One open connection, as the cap and the timeouts see it. A request changes only its
/// own connection's atomics: no lock every request takes.
#[derive(Debug)]
pub(super) struct ConnState {
    /// Requests in flight (head received).
    pub(super) busy: AtomicUsize,
    /// Of those, the ones whose body has not all arrived.
    pub(super) unread: AtomicUsize,
    /// Milliseconds after [`Conns::epoch`] it was accepted, or its last request ended.
    pub(super) idle_since_ms: AtomicU64,
    /// Plus one: when the first byte of a request head arrived, while none is in flight.
    pub(super) head_since_ms: AtomicU64,
    /// Plus one: when the last request whose body is still unread was received.
    pub(super) body_since_ms: AtomicU64,
    /// It has had a request (a new connection gets `header_timeout` for its first).
    pub(super) served: AtomicBool,
    /// Closes it at once.
    pub(super) close: CancellationToken,
    /// `close` was cancelled (read without the token's lock when scanning thousands).
    pub(super) closing: AtomicBool,
}

impl ConnState {
    pub(super) fn close(&self) {
        if !self.closing.swap(true, Ordering::Relaxed) {
            self.close.cancel();
        }
    }

    /// Nothing of it is being answered: idle, or every request in it still arriving.
    pub(super) fn evictable(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == self.unread.load(Ordering::Relaxed)
            && !self.closing.load(Ordering::Relaxed)
    }

    /// Whether its time is up at `now` (milliseconds after the epoch).
    pub(super) fn expired(&self, now: u64, limits: &ConnectionLimits) -> bool {
        let over = |since: u64, limit: Duration| {
            now.saturating_sub(since) > u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)
        };
        let busy = self.busy.load(Ordering::Relaxed);
        if busy == 0 {
            let head = self.head_since_ms.load(Ordering::Relaxed);
            let idle = self.idle_since_ms.load(Ordering::Relaxed);
            return if head != UNSET {
                over(head - 1, limits.header_timeout)
            } else if !self.served.load(Ordering::Relaxed) {
                over(idle, limits.header_timeout)
            } else {
                over(idle, limits.idle_timeout)
            };
        }
        // every request in flight still sending its body, past the body timeout and a
        // second for the 408 to go out
        let body = self.body_since_ms.load(Ordering::Relaxed);
        self.unread.load(Ordering::Relaxed) == busy
            && body != UNSET
            && over(body - 1, limits.body_timeout + Duration::from_secs(1))
    }
}

/// The open connections. The map is locked when a connection opens or closes, when
/// the cap is reached, and once per reaper tick — not per request.
#[derive(Debug)]
pub(super) struct Conns {
    pub(super) map: Mutex<HashMap<u64, Arc<ConnState>>>,
    pub(super) next: AtomicU64,
    pub(super) epoch: Instant,
    /// How many are open, for the metrics.
    pub(super) open: Arc<AtomicUsize>,
}

impl Conns {
    pub(super) fn new(open: Arc<AtomicUsize>) -> Self {
        Conns {
            map: Mutex::default(),
            next: AtomicU64::new(0),
            epoch: Instant::now(),
            open,
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn now_ms(&self) -> u64 {
        ms_since(self.epoch)
    }

    /// Makes room for one more under `max`: closes the connection idle the longest,
    /// else the one stuck the longest sending a request. False when every connection
    /// has a whole request being answered.
    pub(super) fn make_room(&self, max: usize) -> bool {
        let map = self.lock();
        if map.len() < max {
            return true;
        }
        let victim = map.values().filter(|c| c.evictable()).min_by_key(|c| {
            let stuck = c.busy.load(Ordering::Relaxed) > 0;
            let since = if stuck {
                c.body_since_ms.load(Ordering::Relaxed)
            } else {
                c.idle_since_ms.load(Ordering::Relaxed)
            };
            (stuck, since)
        });
        match victim {
            Some(c) => {
                c.close();
                true
            }
            None => false,
        }
    }

    pub(super) fn open(&self) -> (u64, Arc<ConnState>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            unread: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            head_since_ms: AtomicU64::new(UNSET),
            body_since_ms: AtomicU64::new(UNSET),
            served: AtomicBool::new(false),
            close: CancellationToken::new(),
            closing: AtomicBool::new(false),
        });
        let mut map = self.lock();
        map.insert(id, conn.clone());
        self.open.store(map.len(), Ordering::Relaxed);
        (id, conn)
    }

    pub(super) fn closed(&self, id: u64) {
        let mut map = self.lock();
        map.remove(&id);
        self.open.store(map.len(), Ordering::Relaxed);
    }

    /// Closes the connections whose time is up.
    pub(super) fn reap(&self, limits: &ConnectionLimits) {
        let now = self.now_ms();
        for c in self.lock().values() {
            if c.expired(now, limits) {
                c.close();
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

pub(super) fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}
