//! The swin daemon as a library, so tests can build the router without a socket.
//!
//! Layers, each using only those below it: the front doors `http` (routes, extractors,
//! the status of each error) and `rls` (Envoy's gRPC service) → `counting`, `requests`,
//! `giving_back` and `decisions` (what a request does, no HTTP or gRPC types, each using
//! only those after it in this list) and `auth` (the bearer-token check both doors make)
//! → `state` (the namespaces served) → `runtime_limits` (limits set per key at run
//! time, as this node holds them) → `config` (the
//! file, read into policy types) → `policy` (limits, descriptor rules, counter keys, what
//! a request may carry) and `metrics`. `node` runs it all: stores, engines, reloads,
//! shutdown.

pub mod auth;
pub mod config;
pub mod counting;
pub mod decisions;
pub mod error;
pub mod giving_back;
pub mod http;
pub mod leases;
pub mod listening;
pub mod metrics;
pub mod node;
pub mod policy;
pub mod requests;
pub mod reservations;
pub mod rls;
pub mod runtime_limits;
pub mod spool;
pub mod state;
pub mod telemetry;
pub mod tls;
