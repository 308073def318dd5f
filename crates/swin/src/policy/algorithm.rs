//! A namespace's algorithm (config key `algorithm`): sliding windows, fixed windows or
//! GCRA buckets, for its own limits, its descriptor rules and Envoy's request overrides;
//! or leases in flight (`concurrency`), which limit requests running, not hits.

use swin_core::WindowAlgorithm;

use super::FieldError;

/// The most slots one key may have in flight (`algorithm = "concurrency"`).
pub const MAX_CONCURRENCY: u64 = 1_000_000_000;

/// A namespace's algorithm (config key `algorithm`), for its own limits and for the
/// descriptor rules and request overrides it holds: read from the config in one place
/// ([`Algorithm::parse`]), matched as this type everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// Sliding windows (the default): the previous window weighs what is left of it.
    #[default]
    SlidingWindow,
    /// Fixed windows: a count per window, reset at its start.
    FixedWindow,
    /// GCRA buckets (`gcra = { burst, count, period }`).
    Gcra,
    /// Leases in flight per key (`limit`, `lease_ttl`): no limits of hits, no windows
    /// of limits.
    Concurrency,
}

impl Algorithm {
    /// The config's `algorithm`; sliding windows unless told otherwise.
    pub fn parse(raw: Option<&str>) -> Result<Algorithm, FieldError> {
        match raw {
            None | Some("sliding_window") => Ok(Algorithm::SlidingWindow),
            Some("fixed_window") => Ok(Algorithm::FixedWindow),
            Some("gcra") => Ok(Algorithm::Gcra),
            Some("concurrency") => Ok(Algorithm::Concurrency),
            Some(other) => Err((
                "algorithm".into(),
                format!(
                    "{other:?} is not \"sliding_window\", \"fixed_window\", \"gcra\" or \"concurrency\""
                ),
            )),
        }
    }

    /// Its name in the config and in answers.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// How its windows count (`None`: GCRA, no windows).
    ///
    /// # Errors
    /// A concurrency namespace takes no limits of hits: naming the field `limits`.
    pub fn window(self) -> Result<Option<WindowAlgorithm>, FieldError> {
        match self {
            Algorithm::SlidingWindow => Ok(Some(WindowAlgorithm::Sliding)),
            Algorithm::FixedWindow => Ok(Some(WindowAlgorithm::Fixed)),
            Algorithm::Gcra => Ok(None),
            Algorithm::Concurrency => Err((
                "limits".into(),
                "a concurrency namespace limits leases in flight (`limit`), not hits".into(),
            )),
        }
    }
}
