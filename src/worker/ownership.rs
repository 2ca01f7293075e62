//! Whether this worker still owns the partition a job was read from. The pool loop gives
//! each assignment of a partition one [`Ownership`] and ends it when the partition is
//! *lost*: taken from this member without a rebalance it joined in. librdkafka reports
//! that on its own session timeout, even while the broker is out of reach, so a worker
//! cut off from the broker ends its ownerships no later than the broker hands the
//! partitions to another member. A plain revocation (a rebalance, a deploy) ends nothing:
//! the member is alive, its jobs in flight go on and publish, and the partition's next
//! owner waits for their heartbeats (`worker::check`).
//!
//! A job's route runs inside its partition's ownership ([`scope`]) and checks it
//! ([`holds`]) before its handler starts and before each send of an outcome: once the
//! ownership ended, the partition's next owner may already have run the job, so this
//! worker neither starts it nor publishes anything more for it (the job is left to that
//! owner). Together with the worker producer's delivery timeout
//! (`kafka::worker_delivery_timeout`, below the session timeout), a record queued before
//! a cut is delivered in time or never: a worker that comes back from a cut publishes no
//! result for a job another worker took.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One assignment of one partition to this worker: holds until [`Ownership::end`].
#[derive(Debug, Clone)]
pub struct Ownership(Arc<AtomicBool>);

impl Ownership {
    /// A partition just assigned.
    pub fn new() -> Self {
        Ownership(Arc::new(AtomicBool::new(true)))
    }

    /// An ownership already over (a job whose partition left before it started).
    pub fn ended() -> Self {
        Ownership(Arc::new(AtomicBool::new(false)))
    }

    /// The partition was lost: the jobs read under this ownership stop acting here.
    pub fn end(&self) {
        self.0.store(false, Ordering::SeqCst)
    }

    pub fn holds(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl Default for Ownership {
    fn default() -> Self {
        Self::new()
    }
}

tokio::task_local! {
    static CURRENT: Ownership;
}

/// Runs a job's route inside the ownership of the partition it was read from.
pub async fn scope<F: Future>(ownership: Ownership, route: F) -> F::Output {
    CURRENT.scope(ownership, route).await
}

/// Whether the route running now may still act for its job: true outside any [`scope`]
/// (records not read from a pool partition: the relay's copies, the reaper's index, the
/// route's tests and the simulator, which have no group).
pub fn holds() -> bool {
    CURRENT.try_with(Ownership::holds).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_route_sees_its_partitions_ownership_end() {
        assert!(holds(), "outside a scope nothing is known: it holds");
        let o = Ownership::new();
        let inner = o.clone();
        let seen = scope(o.clone(), async move {
            let before = holds();
            inner.end();
            (before, holds())
        })
        .await;
        assert_eq!(seen, (true, false));
        assert!(!o.holds());
        assert!(holds(), "the scope ended with the route");
    }
}
