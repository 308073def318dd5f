//! Random histories against a swin cluster under a nemesis, checked against each mode's
//! promise: the clients and the faults ([`workload`], [`nemesis`]) run against real
//! nodes and a real store ([`setup`]), every request is recorded ([`history`]), and
//! once the nodes have stopped the store's counts are checked against what the answers
//! said ([`accounting`], [`check`]). [`run`] ties them together for `scripts/histories`.

pub mod accounting;
pub mod answers;
pub mod check;
pub mod history;
pub mod leases;
pub mod nemesis;
mod plans;
pub mod reservations;
pub mod rls;
pub mod run;
pub mod setup;
pub mod shrink;
pub mod verdict;
pub mod workload;
