//! Draining the API server (`fairway serve` on SIGTERM/SIGINT): it stops accepting
//! connections, lets requests in flight finish, and ends every Server-Sent Events stream
//! with a final `shutdown` event (clients reconnect to another server) instead of holding
//! the shutdown open, all within the serve command's grace.

use super::ApiState;
use axum::response::sse::Event;
use futures::{Stream, StreamExt};
use std::convert::Infallible;

/// `stream`, ended with a final `shutdown` event once the server drains.
pub(crate) fn ending<S>(st: &ApiState, stream: S) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let draining = st.draining();
    futures::stream::unfold((Box::pin(stream), draining, false), |(mut s, mut d, ended)| async move {
        if ended {
            return None;
        }
        enum Next {
            Item(Option<Result<Event, Infallible>>),
            Drain,
        }
        let next = tokio::select! {
            biased;
            _ = d.wait_for(|draining| *draining) => Next::Drain,
            item = s.next() => Next::Item(item),
        };
        match next {
            Next::Item(item) => item.map(|i| (i, (s, d, false))),
            Next::Drain => {
                let e =
                    Event::default().event("shutdown").data(r#"{"reason":"the server is shutting down; reconnect"}"#);
                Some((Ok(e), (s, d, true)))
            }
        }
    })
}
