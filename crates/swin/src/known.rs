//! What became of a change sent to a store that can be sent again without changing
//! anything more (a reservation's change under its operation id, a lease's under its
//! id, a runtime limit set to the same limits). A change whose reply is lost is sent
//! again until the store answers or the caller's time is up; only then is its outcome
//! unknown (the store may have applied it), and the caller answers so (503
//! `outcome_unknown`) — a reservation's change the node also resolves in the background
//! ([`resolve`]): it asks again, with the same id, until the store answers.

use std::future::Future;
use std::time::Duration;

use swin_sync::StoreError;
use tokio::time::Instant;

/// What a change sent until the store answers came to.
#[derive(Debug)]
pub(crate) enum Outcome<T> {
    /// The store's answer (to the first attempt, or to one sent again).
    Known(T),
    /// No attempt reached the store: nothing was changed.
    NotApplied(StoreError),
    /// An attempt may have been applied and none answered in time.
    Unknown(StoreError),
}

/// The pause between two attempts of a change (a connection cut with the reply is
/// made again meanwhile).
const AGAIN_AFTER: Duration = Duration::from_millis(20);

/// Sends `change` (given the time left to wait for it) until the store answers, for at
/// most `within`.
pub(crate) async fn until_known<T, F, Fut>(within: Duration, change: F) -> Outcome<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    until_known_as(within, StoreError::may_have_run, change).await
}

/// [`until_known`], with what says whether a failed attempt may have been applied.
async fn until_known_as<T, F, Fut>(
    within: Duration,
    may_have_applied: fn(&StoreError) -> bool,
    mut change: F,
) -> Outcome<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + within;
    let mut may_have_run = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = match change(left).await {
            Ok(v) => return Outcome::Known(v),
            Err(e) => e,
        };
        may_have_run |= may_have_applied(&e);
        // a table of the node's own memory that is full stays full for now: no reply was
        // lost, so there is nothing to learn by asking again
        let full = matches!(e, StoreError::Full(_));
        if full || Instant::now() + AGAIN_AFTER >= deadline {
            return match may_have_run {
                true => Outcome::Unknown(e),
                false => Outcome::NotApplied(e),
            };
        }
        tokio::time::sleep(AGAIN_AFTER).await;
    }
}

/// How long the node keeps asking the store for the outcome of a change whose answer
/// was lost (then it logs that the outcome stays unknown).
pub(crate) const RESOLVE_FOR: Duration = Duration::from_secs(300);

/// Sends `change` again (each attempt waiting up to `each`) until the store answers, for
/// at most [`RESOLVE_FOR`]: `None` when it never did.
pub(crate) async fn resolve<T, F, Fut>(each: Duration, mut change: F) -> Option<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + RESOLVE_FOR;
    let mut pause = AGAIN_AFTER;
    while Instant::now() < deadline {
        match change(each).await {
            Ok(v) => return Some(v),
            Err(e) => tracing::debug!(cause = %e, "a change's outcome is still unknown"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lost_reply_then_an_answer_is_known() {
        let mut n = 0;
        let got = until_known(Duration::from_secs(1), |_| {
            n += 1;
            let r = match n {
                1 => Err(StoreError::Timeout(Duration::ZERO)),
                _ => Ok(n),
            };
            async move { r }
        })
        .await;
        assert!(matches!(got, Outcome::Known(2)), "{got:?}");
    }

    #[tokio::test]
    async fn a_lost_reply_then_refusals_stay_unknown() {
        let mut n = 0;
        let got = until_known(Duration::from_millis(200), |_| {
            n += 1;
            let e = match n {
                1 => StoreError::Timeout(Duration::ZERO),
                _ => StoreError::Unavailable("down".into()),
            };
            async move { Err::<(), _>(e) }
        })
        .await;
        assert!(matches!(got, Outcome::Unknown(_)), "{got:?}");
        let got = until_known(Duration::from_millis(200), |_| async {
            Err::<(), _>(StoreError::Unavailable("down".into()))
        })
        .await;
        assert!(matches!(got, Outcome::NotApplied(_)), "{got:?}");
    }
}
