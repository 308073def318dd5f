//! The atomics and locks the lock-free counters are made of: the standard library's,
//! or loom's when built with `--cfg swin_loom` (`scripts/loom`), so that loom can run
//! the counters' concurrent operations under every interleaving (see `loom_models`).

#[cfg(swin_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
#[cfg(swin_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(swin_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
#[cfg(not(swin_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Where the counters rely on `SeqCst` accesses being in one total order (the eviction
/// protocol's store-then-load on each side, `entry.rs`): nothing in a normal build (the
/// accesses are `SeqCst`), a `SeqCst` fence under loom, which models `SeqCst` accesses
/// as acquire/release only and would otherwise report the protocol's Dekker pattern as
/// a race it is not.
#[inline(always)]
pub(crate) fn seq_cst_point() {
    #[cfg(swin_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}
