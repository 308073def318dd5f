//! The swin daemon as a library, so tests can build the router without a socket.
//!
//! Layers, each using only those below it: `http` (routes, extractors, the status of
//! each error) → `counting` and `decisions` (what a request does, no HTTP types) →
//! `state` (the namespaces served) and `input` (what a request may carry) → `limits`,
//! `config`, `metrics`. `node` runs it all: stores, engines, reloads, shutdown.

pub mod config;
pub mod counting;
pub mod decisions;
pub mod error;
pub mod http;
pub mod input;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod rls;
pub mod spool;
pub mod state;
pub mod tls;
