//! The kinds of request, each in a file of its own that builds what its request asks of
//! the pipeline (`pipeline::run`) and renders what it got: hits alone and in
//! batches (`hits`), Envoy's descriptors (`descriptors`), increments and reads
//! (`counting`), leases (`leases`), reservations (`reservations`), refunds (`refunds`),
//! runtime limit changes (`limit_changes`) and reports of Envoy's quota service
//! (`quota`). What a caller of [`crate::Limiter`] gets
//! back is here too.

pub(crate) mod counting;
pub(crate) mod descriptors;
pub(crate) mod hits;
pub(crate) mod leases;
pub(crate) mod limit_changes;
pub(crate) mod quota;
pub(crate) mod refunds;
pub(crate) mod reservations;

pub use self::descriptors::{Answer, Decided, Descriptor};
pub use self::hits::Batch;
pub use self::limit_changes::Change;
pub use self::refunds::Refunded;
pub use self::reservations::{Reserved, Settled};
pub use crate::decisions::Verdict;
pub use crate::leases::{AcquireAnswer, AcquireRequest};
