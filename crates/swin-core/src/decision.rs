//! The one answer to "may this hit pass?", whatever limit decided it (a sliding or fixed
//! window, a GCRA bucket), and the order that picks the strictest of several.
//!
//! Invariants: `retry_after` is zero exactly when `allowed`; `remaining` is a whole
//! number of hits of cost 1, never negative; `limit` is the limit's own size (a window's
//! limit, a bucket's burst).

use std::cmp::Ordering;
use std::time::Duration;

use crate::{CoreError, MAX_COUNT};

/// A cost any limit could take (0 up to, not including, 2^53), checked before the key's limits are known;
/// each limit then checks its own bound ([`crate::WindowLimit::check_cost`],
/// [`crate::Gcra::units`]).
pub fn check_cost(cost: f64) -> Result<(), CoreError> {
    // below 2^53, exclusive, for the reason `check_value` gives
    if !(cost.is_finite() && (0.0..MAX_COUNT).contains(&cost)) {
        return Err(CoreError::InvalidCost {
            cost,
            max: MAX_COUNT,
            what: "a number",
        });
    }
    Ok(())
}

/// What a limit decided for one hit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// The limit the decision was taken against (a window's limit, a bucket's burst).
    pub limit: f64,
    /// Whole hits of cost 1 still allowed now (after this one when it was allowed).
    pub remaining: f64,
    /// Until the state this decision saw weighs nothing: the counts have left the
    /// windows, the bucket is full again.
    pub reset_after: Duration,
    /// Until the same hit would be allowed; zero when it was.
    pub retry_after: Duration,
    /// How far the key's counts are past the limit (after this hit when it was
    /// allowed or forced in), 0 within it: a commit charged beyond the limit (overrun
    /// as debt) leaves the key here until its windows or bucket bring it back under.
    pub debt: f64,
}

impl Decision {
    /// The strictness order: a denial before an admission, then the longer wait, then
    /// the fewer remaining. `Greater` means `self` is the stricter.
    pub fn cmp_strictness(&self, other: &Decision) -> Ordering {
        (!self.allowed)
            .cmp(&!other.allowed)
            .then(self.retry_after.cmp(&other.retry_after))
            .then(other.remaining.total_cmp(&self.remaining))
    }

    /// The strictest of several decisions (`None` for none); of equals, the last.
    pub fn strictest<'a, T: 'a>(
        items: impl IntoIterator<Item = &'a T>,
        decision: impl Fn(&T) -> &Decision,
    ) -> Option<&'a T> {
        items
            .into_iter()
            .max_by(|a, b| decision(a).cmp_strictness(decision(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, retry_secs: u64, remaining: f64) -> Decision {
        Decision {
            allowed,
            limit: 10.0,
            remaining,
            reset_after: Duration::from_secs(60),
            retry_after: Duration::from_secs(retry_secs),
            debt: 0.0,
        }
    }

    #[test]
    fn a_denial_then_the_longer_wait_then_fewer_remaining() {
        let all = [
            d(true, 0, 1.0),
            d(false, 5, 0.0),
            d(false, 9, 3.0),
            d(true, 0, 0.0),
        ];
        assert_eq!(Decision::strictest(&all, |x| x), Some(&all[2]));
        let allowed = [d(true, 0, 4.0), d(true, 0, 2.0), d(true, 0, 7.0)];
        assert_eq!(Decision::strictest(&allowed, |x| x), Some(&allowed[1]));
        assert_eq!(
            d(false, 0, 0.0).cmp_strictness(&d(true, 0, 0.0)),
            Ordering::Greater
        );
        assert_eq!(Decision::strictest(&[] as &[Decision], |x| x), None);
    }
}
