//! The swin daemon as a library, so tests can build the router without a socket.

pub mod app;
pub mod config;
pub mod error;
pub mod hit;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod spool;
