//! The swin daemon: the `swin` library behind its doors, and a library itself so tests
//! can build the router without a socket.
//!
//! Layers, each using only those below it: the front doors `http` (routes, extractors,
//! the status of each error) and `rls` (Envoy's gRPC service), which translate requests
//! into calls of the `swin` library and its answers back → `auth` (bearer tokens, the
//! same on both doors) → `state` (what every request shares: the namespaces served, the
//! metrics, each door's limits) → `metrics`; `config` reads the file, the daemon's keys
//! and (through the library) the rest. `node` runs it all: the limiter, the listeners,
//! reloads, signals and the stop.

pub(crate) mod auth;
pub mod config;
pub mod http;
pub(crate) mod listening;
pub(crate) mod metrics;
pub mod node;
pub(crate) mod rls;
pub mod state;
pub mod telemetry;
pub(crate) mod tls;
