//! A namespace's algorithm (config key `algorithm`): sliding windows, fixed windows or
//! GCRA buckets, for its own limits, its descriptor rules and Envoy's request overrides.

use swin_core::WindowAlgorithm;

use super::FieldError;

/// A namespace's algorithm (config key `algorithm`), for its own limits and for the
/// descriptor rules and request overrides it holds: read from the config in one place
/// ([`Algorithm::parse`]), matched as this type everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    #[default]
    SlidingWindow,
    FixedWindow,
    Gcra,
}

impl Algorithm {
    /// The config's `algorithm`; sliding windows unless told otherwise.
    pub fn parse(raw: Option<&str>) -> Result<Algorithm, FieldError> {
        match raw {
            None | Some("sliding_window") => Ok(Algorithm::SlidingWindow),
            Some("fixed_window") => Ok(Algorithm::FixedWindow),
            Some("gcra") => Ok(Algorithm::Gcra),
            Some(other) => Err((
                "algorithm".into(),
                format!("{other:?} is not \"sliding_window\", \"fixed_window\" or \"gcra\""),
            )),
        }
    }

    /// Its name in the config and in answers.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
        }
    }

    /// How its windows count (`None`: GCRA, no windows).
    pub fn window(self) -> Option<WindowAlgorithm> {
        match self {
            Algorithm::SlidingWindow => Some(WindowAlgorithm::Sliding),
            Algorithm::FixedWindow => Some(WindowAlgorithm::Fixed),
            Algorithm::Gcra => None,
        }
    }
}
