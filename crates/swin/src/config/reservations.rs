//! A namespace's caps on open reservations (`reservations_max_open`,
//! `reservations_max_open_per_client`): how many reservations of a cost may be open in
//! the namespace at once across the cluster, and how many of them one client may hold,
//! so that no client fills the store with records (a reservation of cost 0 is free to
//! make and counts as any other).

use super::{ConfigError, Parser};

/// `reservations_max_open` when the config leaves it out.
pub const DEFAULT_RESERVATIONS_MAX_OPEN: u64 = 1_000_000;
/// `reservations_max_open_per_client` when the config leaves it out (at most
/// `reservations_max_open`).
pub const DEFAULT_RESERVATIONS_MAX_OPEN_PER_CLIENT: u64 = 100_000;
/// The most either may say.
pub const MAX_RESERVATIONS_MAX_OPEN: u64 = 1_000_000_000;

/// How many reservations may be open in a namespace, and per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationCaps {
    /// Open reservations of the namespace at most, across the cluster
    /// (`reservations_max_open`).
    pub(crate) max_open: u64,
    /// Open reservations one client may hold in the namespace, across the cluster
    /// (`reservations_max_open_per_client`).
    pub(crate) max_open_per_client: u64,
}

impl Default for ReservationCaps {
    fn default() -> Self {
        ReservationCaps {
            max_open: DEFAULT_RESERVATIONS_MAX_OPEN,
            max_open_per_client: DEFAULT_RESERVATIONS_MAX_OPEN_PER_CLIENT,
        }
    }
}

impl ReservationCaps {
    /// Open reservations of the namespace at most (`reservations_max_open`).
    pub fn max_open(&self) -> u64 {
        self.max_open
    }

    /// Open reservations one client may hold (`reservations_max_open_per_client`).
    pub fn max_open_per_client(&self) -> u64 {
        self.max_open_per_client
    }
}

impl Parser<'_> {
    /// `reservations_max_open` and `reservations_max_open_per_client`, checked.
    pub(super) fn reservation_caps(
        &self,
        max_open: Option<i64>,
        per_client: Option<i64>,
        f: &dyn Fn(&str) -> String,
    ) -> Result<ReservationCaps, ConfigError> {
        let max_open = match max_open {
            None => DEFAULT_RESERVATIONS_MAX_OPEN,
            Some(n) if (1..=MAX_RESERVATIONS_MAX_OPEN as i64).contains(&n) => n as u64,
            Some(n) => {
                return Err(self.err(
                    &f("reservations_max_open"),
                    format!("{n} is not between 1 and {MAX_RESERVATIONS_MAX_OPEN}"),
                ))
            }
        };
        let max_open_per_client = match per_client {
            None => DEFAULT_RESERVATIONS_MAX_OPEN_PER_CLIENT.min(max_open),
            Some(n) if (1..=max_open as i64).contains(&n) => n as u64,
            Some(n) => {
                return Err(self.err(
                    &f("reservations_max_open_per_client"),
                    format!("{n} is not between 1 and reservations_max_open ({max_open})"),
                ))
            }
        };
        Ok(ReservationCaps {
            max_open,
            max_open_per_client,
        })
    }
}
