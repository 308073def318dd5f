//! A node's own memory as a store, for what a local-only namespace keeps beside its
//! counters: its concurrency leases, reservations of a cost and idempotency records,
//! under the same contracts ([`LeaseStore`](super::LeaseStore),
//! [`ReservationStore`](super::ReservationStore),
//! [`IdempotencyStore`](super::IdempotencyStore)) and rules as the shared stores, and
//! reached the same way: through the namespace's engine and [`Store`](super::Store).
//! Its counters are the node's own tables already; a call of another contract made on it
//! is refused ([`StoreError::Unavailable`](crate::StoreError::Unavailable): no store asked).
//!
//! One store per namespace: the calls' `namespace` is not read, and neither is
//! `not_after` (nothing here waits, and no reply is lost between a node and its memory).
//! A table that is full refuses with [`StoreError::Full`](crate::StoreError::Full): a new
//! key, reservation or record waits until some lapse.

mod idempotency;
mod leases;
mod reservations;

pub use self::idempotency::RECORD_OVERHEAD_BYTES;

/// A local-only namespace's leases, reservations and idempotency records.
#[derive(Debug)]
pub struct MemoryStore {
    leases: leases::Leases,
    reservations: reservations::Reservations,
    records: idempotency::Records,
}

impl MemoryStore {
    /// Tables of leases of at most `max_keys` keys and of at most `max_keys` open
    /// reservations (the namespace's `max_counters`); records are bounded by each
    /// claim's cap.
    pub fn new(max_keys: usize) -> Self {
        MemoryStore {
            leases: leases::Leases::new(max_keys),
            reservations: reservations::Reservations::new(max_keys),
            records: idempotency::Records::default(),
        }
    }

    /// Idempotency records held (live or not yet swept).
    pub fn records(&self) -> usize {
        self.records.count()
    }

    /// The bytes the idempotency records take, as [`RECORD_OVERHEAD_BYTES`] counts them,
    /// with their keys, answers and clients' ids.
    pub fn record_bytes(&self) -> usize {
        self.records.bytes()
    }

    /// Keys with live leases.
    pub fn lease_keys(&self) -> usize {
        self.leases.keys()
    }
}
