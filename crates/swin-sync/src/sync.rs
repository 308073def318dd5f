//! The locks and atomics strict admission keeps its quota under (`admission/grants.rs`,
//! `admission/holds`): the standard library's, or loom's when built with
//! `--cfg swin_loom` (`scripts/loom`), so that loom can run what their concurrent
//! operations do under them under every interleaving (the `loom_models` modules).

#[cfg(swin_loom)]
pub(crate) use loom::sync::atomic::AtomicI64;
#[cfg(swin_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(swin_loom))]
pub(crate) use std::sync::atomic::AtomicI64;
#[cfg(not(swin_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
