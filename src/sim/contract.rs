//! Cases the in-memory store double (`sim::doubles::MemStore`) must answer as the real
//! store does, written once against the seam (`seams::RouteStore`): run on the double by
//! this module's test and on Cassandra by the integration test `it::store_contract`, so
//! the double cannot drift from the store the route ships with.

use crate::model::Millis;
use crate::seams::{Beat, RouteStore};

/// What a contract case found wrong.
#[derive(Debug, thiserror::Error)]
pub enum Broken {
    #[error("the store failed: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{case}: expected {expected}, read {read}")]
    Read { case: &'static str, expected: String, read: String },
}

fn beat<'a>(job_id: &'a str, worker: &'a str, at: Millis) -> Beat<'a> {
    Beat { job_id, worker, at, progress: 0.0, message: "", ttl_secs: 600 }
}

/// A heartbeat that lands after a newer one but was stamped before it (a cut-off worker's
/// write, retried once its link is back) does not replace it: the heartbeat read is the
/// newest stamp's, whatever the order the writes landed in. `job_id` must be unused;
/// `now` is the clock's time (the beats are stamped within a second before it).
pub async fn a_late_older_heartbeat_never_replaces_a_newer_one(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let (older, newer) = (now - 1_000, now - 500);
    store.put_heartbeat(beat(job_id, "taker", newer)).await?;
    store.put_heartbeat(beat(job_id, "cut-off", older)).await?;
    let read = store.heartbeat(job_id).await?;
    let got = read.as_ref().map(|h| (h.worker.clone().unwrap_or_default(), h.at));
    if got != Some(("taker".to_string(), Some(newer))) {
        return Err(Broken::Read {
            case: "a late older heartbeat",
            expected: format!("the taker's beat at {newer}"),
            read: format!("{got:?}"),
        });
    }
    // A newer beat still replaces it.
    store.put_heartbeat(beat(job_id, "taker", now)).await?;
    let at = store.heartbeat(job_id).await?.and_then(|h| h.at);
    if at != Some(now) {
        return Err(Broken::Read { case: "a newer heartbeat", expected: format!("{now}"), read: format!("{at:?}") });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seams::{Clock, TokioClock};
    use crate::sim::doubles::MemStore;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn the_double_keeps_the_newest_heartbeat() {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_790_000_000_000));
        let store = MemStore::new(clock.clone());
        a_late_older_heartbeat_never_replaces_a_newer_one(&store, "job-1", clock.now_ms()).await.unwrap();
    }
}
