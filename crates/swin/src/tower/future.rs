//! The future of a request behind the layer: the inner service's own future when the
//! request passes unlimited (nothing boxed, nothing allocated), an answer already made
//! (a request with no key), or a decision and then the inner call, boxed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

type Boxed<R, E> = Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The [`super::Limited`] service's future.
    pub struct LimitedFuture<F, R, E> {
        #[pin]
        state: State<F, R, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, R, E> {
        Pass { #[pin] inner: F },
        Answered { answer: Option<Response<R>> },
        Deciding { decision: Boxed<R, E> },
    }
}

impl<F, R, E> LimitedFuture<F, R, E> {
    pub(super) fn pass(inner: F) -> Self {
        LimitedFuture {
            state: State::Pass { inner },
        }
    }

    pub(super) fn answered(answer: Response<R>) -> Self {
        LimitedFuture {
            state: State::Answered {
                answer: Some(answer),
            },
        }
    }

    pub(super) fn deciding(
        decision: impl Future<Output = Result<Response<R>, E>> + Send + 'static,
    ) -> Self {
        LimitedFuture {
            state: State::Deciding {
                decision: Box::pin(decision),
            },
        }
    }
}

impl<F, R, E> std::fmt::Debug for LimitedFuture<F, R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for LimitedFuture<F, R, E>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Pass { inner } => inner.poll(cx),
            // polled again after it answered: it has nothing more to give
            StateProj::Answered { answer } => match answer.take() {
                Some(a) => Poll::Ready(Ok(a)),
                None => Poll::Pending,
            },
            StateProj::Deciding { decision } => decision.as_mut().poll(cx),
        }
    }
}
