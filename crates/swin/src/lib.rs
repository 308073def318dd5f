//! swin: cluster-wide sliding-window rate limits, in process.
//!
//! Each namespace counts in local memory (lock-free atomic counters) and syncs with a
//! central store (PostgreSQL, Redis, Redis Cluster or SQLite) on a timer of its own:
//! it pushes its diffs and reads the cluster's totals. A [`Limiter`] is built from a
//! [`config::Config`] and decides hits, leases and reservations against the limits of
//! its namespaces; the `swin-node` daemon is this crate behind HTTP and gRPC doors.
//!
//! Layers, each using only those below it (no module imports one that imports it):
//! [`Limiter`] (stores, namespaces, their engines, reconfiguring and stopping, and one
//! method per kind of request) → the kinds of request, one file each under `requests`
//! (what each asks and answers; its public types in [`requests`]) and the quota
//! service ([`shares`]) → `pipeline` (the one runner every request goes through: check,
//! first touch, effective limits, take together, all or nothing, run to the end,
//! record) → `decisions` (what a decision answers) → the namespace (`state`) →
//! `leases` (where leases are kept), [`idempotency`] (where idempotency records are
//! kept) and `runtime_limits` (limits set per key at run
//! time, as this node holds them) → [`config`] (a config, read into policy types) →
//! [`policy`] (limits, descriptor rules, counter keys, what a request may carry) and
//! `spool`.
//! What the pipeline decides is told to a [`recorder::Recorder`] (the daemon's metrics).
//! The read side — each namespace's [`status::NamespaceStatus`], readiness, the clock,
//! the heaviest keys, a sync now, a key reset ([`status`]) and a key's limits with where
//! they come from ([`limiter::KeyLimitsView`]) — answers owned snapshots: a caller (the
//! daemon's admin and limits routes, its metrics) reads without holding an engine.
//!
//! With the feature `tower`, `swin::tower::LimiterLayer` puts a [`Limiter`] in front of an
//! axum router's or a tonic server's routes: built once with its namespace checked, a hit
//! per request of the cost it says on a key the caller picks (the client's address behind
//! trusted proxies, the peer's, a header's bytes, or a closure's), 429 (gRPC:
//! RESOURCE_EXHAUSTED) with `Retry-After` when denied or what its error hook answers, the
//! RateLimit headers on every answer (`examples/axum.rs`: two services on one store
//! sharing one limit).

#![warn(missing_docs)]
pub(crate) mod client;
pub mod config;
pub(crate) mod decisions;
pub mod error;
pub mod idempotency;
pub(crate) mod known;
pub(crate) mod leases;
pub mod limiter;
pub(crate) mod pipeline;
pub mod policy;
pub mod recorder;
pub mod requests;
pub(crate) mod runtime_limits;
pub mod shares;
pub mod spans;
pub(crate) mod spool;
pub(crate) mod state;
pub mod status;
#[cfg(feature = "tower")]
pub mod tower;
pub(crate) mod unresolved;

pub use client::Client;
pub use limiter::Limiter;
/// What the library's answers are made of: a decision, a window's rate. (Their times
/// are the store's clock's, as `std::time::SystemTime`.)
pub use swin_core::{Decision, WindowRate};
