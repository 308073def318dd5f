//! What quiet, expired and evictable mean on each listener's connections ([`Watch`]).
//!
//! - **HTTP/1** ([`HttpConn`]): a new connection must send a whole request head within
//!   `header_timeout`, and so must a kept-alive one from its next request's first byte; a
//!   kept-alive connection may sit idle for `idle_timeout`; a body must arrive within
//!   `body_timeout` (the extractor answers 408, the reaper closes what is left). At the cap
//!   the connection idle the longest goes first, else the one stuck the longest in a
//!   request it has not finished sending; one with a whole request being answered never.
//! - **HTTP/2, gRPC** ([`GrpcConn`]): calls are multiplexed, so quiet is measured on the
//!   socket (bytes read or written): silent past `header_timeout` before its first byte,
//!   or quiet past `idle_timeout`, it is closed; at the cap the one quiet the longest goes,
//!   if it has been quiet a second.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::governor::{Closer, Watch};
use crate::config::ConnectionLimits;

/// `0` in the `*_since` fields below: not set (times are stored plus one).
pub const UNSET: u64 = 0;

fn over(now: u64, since: u64, limit: Duration) -> bool {
    now.saturating_sub(since) > u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)
}

/// One HTTP/1 connection. A request changes only its own connection's atomics: no
/// lock every request takes.
#[derive(Debug)]
pub struct HttpConn {
    /// Requests in flight (head received).
    pub busy: AtomicUsize,
    /// Of those, the ones whose body has not all arrived.
    pub unread: AtomicUsize,
    /// When it was accepted, or its last request ended.
    pub idle_since: AtomicU64,
    /// Plus one: when the first byte of a request head arrived, while none is in flight.
    pub head_since: AtomicU64,
    /// Plus one: when the last request whose body is still unread was received.
    pub body_since: AtomicU64,
    /// It has had a request (a new connection gets `header_timeout` for its first).
    pub served: AtomicBool,
    closer: Closer,
}

impl Watch for HttpConn {
    fn accepted(now: u64) -> Self {
        HttpConn {
            busy: AtomicUsize::new(0),
            unread: AtomicUsize::new(0),
            idle_since: AtomicU64::new(now),
            head_since: AtomicU64::new(UNSET),
            body_since: AtomicU64::new(UNSET),
            served: AtomicBool::new(false),
            closer: Closer::default(),
        }
    }

    /// A request head starts to arrive when bytes come while none is in flight.
    fn heard(&self, now: impl FnOnce() -> u64) {
        if self.busy.load(Ordering::Relaxed) == 0
            && self.head_since.load(Ordering::Relaxed) == UNSET
        {
            self.head_since.store(now() + 1, Ordering::Relaxed);
        }
    }

    fn said(&self, _now: impl FnOnce() -> u64) {}

    fn expired(&self, now: u64, limits: &ConnectionLimits) -> bool {
        let busy = self.busy.load(Ordering::Relaxed);
        if busy == 0 {
            let head = self.head_since.load(Ordering::Relaxed);
            let idle = self.idle_since.load(Ordering::Relaxed);
            return if head != UNSET {
                over(now, head - 1, limits.header_timeout)
            } else if !self.served.load(Ordering::Relaxed) {
                over(now, idle, limits.header_timeout)
            } else {
                over(now, idle, limits.idle_timeout)
            };
        }
        // every request in flight still sending its body, past the body timeout and a
        // second for the 408 to go out
        let body = self.body_since.load(Ordering::Relaxed);
        self.unread.load(Ordering::Relaxed) == busy
            && body != UNSET
            && over(now, body - 1, limits.body_timeout + Duration::from_secs(1))
    }

    /// Nothing of it is being answered (idle, or every request in it still arriving):
    /// idle ones first, then the one stuck the longest.
    fn evictable(&self, _now: u64) -> Option<(bool, u64)> {
        let busy = self.busy.load(Ordering::Relaxed);
        if busy != self.unread.load(Ordering::Relaxed) {
            return None;
        }
        let stuck = busy > 0;
        let since = if stuck {
            self.body_since.load(Ordering::Relaxed)
        } else {
            self.idle_since.load(Ordering::Relaxed)
        };
        Some((stuck, since))
    }

    fn closer(&self) -> &Closer {
        &self.closer
    }
}

/// One HTTP/2 (gRPC) connection, as its socket's traffic shows it.
#[derive(Debug)]
pub struct GrpcConn {
    /// The last byte read or written.
    last: AtomicU64,
    /// Whether the client has sent a byte.
    spoke: AtomicBool,
    closer: Closer,
}

impl Watch for GrpcConn {
    fn accepted(now: u64) -> Self {
        GrpcConn {
            last: AtomicU64::new(now),
            spoke: AtomicBool::new(false),
            closer: Closer::default(),
        }
    }

    fn heard(&self, now: impl FnOnce() -> u64) {
        self.last.store(now(), Ordering::Relaxed);
        self.spoke.store(true, Ordering::Relaxed);
    }

    fn said(&self, now: impl FnOnce() -> u64) {
        self.last.store(now(), Ordering::Relaxed);
    }

    fn expired(&self, now: u64, limits: &ConnectionLimits) -> bool {
        let allowed = if self.spoke.load(Ordering::Relaxed) {
            limits.idle_timeout
        } else {
            limits.header_timeout
        };
        over(now, self.last.load(Ordering::Relaxed), allowed)
    }

    /// Quiet for a second at least; the quietest first.
    fn evictable(&self, now: u64) -> Option<(bool, u64)> {
        let last = self.last.load(Ordering::Relaxed);
        (now.saturating_sub(last) >= 1_000).then_some((false, last))
    }

    fn closer(&self) -> &Closer {
        &self.closer
    }
}
