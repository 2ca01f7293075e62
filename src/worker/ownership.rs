//! Whether this worker still owns the partition a job was read from. The pool loop gives
//! each assignment of a partition one [`Ownership`] and ends it when the partition is
//! *lost*: taken from this member without a rebalance it joined in. librdkafka reports
//! that on its own session timeout, even while the broker is out of reach, so a worker
//! cut off from the broker ends its ownerships no later than the broker hands the
//! partitions to another member. A plain revocation (a rebalance, a deploy) lets the jobs
//! already running go on and publish: the member is alive, and the partition's next owner
//! waits for their heartbeats (`worker::check`). A job still in its checks at a revocation
//! marks its row running before its handler runs ([`may_start`] is false; the mark is
//! conditional on the row its check read, `exec::mark_running`): the partition's next
//! owner reads the same record, and a copy of it may have run there since that read (the
//! fleet simulator's seed 221890: a check's row read answered before the new owner's run,
//! the handler started after it). The mark is refused then, and this copy never runs.
//! The revocation reaches the ownership through the pool loop's rebalance event, not in
//! librdkafka's callback: a job that starts between the two starts the usual way.
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
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// One assignment of one partition to this worker: held, then revoked (jobs running go
/// on; one still in its checks starts only behind a running mark) or lost (nothing more
/// acts), in that order only.
#[derive(Debug, Clone)]
pub struct Ownership(Arc<AtomicU8>);

const HELD: u8 = 0;
const REVOKED: u8 = 1;
const LOST: u8 = 2;

impl Ownership {
    /// A partition just assigned.
    pub fn new() -> Self {
        Ownership(Arc::new(AtomicU8::new(HELD)))
    }

    /// An ownership already over (a job whose partition left before it started).
    pub fn ended() -> Self {
        Ownership(Arc::new(AtomicU8::new(LOST)))
    }

    /// The partition was revoked in a rebalance this member joined: a job read under this
    /// ownership starts only behind a running mark; those running go on.
    pub fn revoke(&self) {
        self.0.fetch_max(REVOKED, Ordering::SeqCst);
    }

    /// The partition was lost: the jobs read under this ownership stop acting here.
    pub fn end(&self) {
        self.0.fetch_max(LOST, Ordering::SeqCst);
    }

    /// Jobs read under it may still act (publish, write): not lost.
    pub fn holds(&self) -> bool {
        self.0.load(Ordering::SeqCst) < LOST
    }

    /// Jobs read under it may start as usual (a running mark only past its grace):
    /// neither revoked nor lost.
    pub fn may_start(&self) -> bool {
        self.0.load(Ordering::SeqCst) == HELD
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

/// Runs a job's route inside the ownership of the partition it was read from. A plain
/// function returning the scoped future: an `async fn` would hold the route twice (its
/// argument and the scoped future), doubling every job's task (3,928 bytes, not 1,968).
pub fn scope<F: Future>(ownership: Ownership, route: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(ownership, route)
}

/// Whether the route running now may still act for its job: true outside any [`scope`]
/// (records not read from a pool partition: the relay's copies, the reaper's index, the
/// route's tests and the simulator, which have no group).
pub fn holds() -> bool {
    CURRENT.try_with(Ownership::holds).unwrap_or(true)
}

/// Whether the route running now may start its job's handler without a running mark
/// first (see [`holds`] for routes outside any scope).
pub fn may_start() -> bool {
    CURRENT.try_with(Ownership::may_start).unwrap_or(true)
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

    #[tokio::test]
    async fn a_revoked_partitions_jobs_act_but_none_starts_and_a_loss_ends_both() {
        let o = Ownership::new();
        let inner = o.clone();
        let seen = scope(o.clone(), async move {
            let before = (holds(), may_start());
            inner.revoke();
            let revoked = (holds(), may_start());
            inner.end();
            inner.revoke();
            (before, revoked, (holds(), may_start()))
        })
        .await;
        assert_eq!(seen, ((true, true), (true, false), (false, false)), "a revocation never undoes a loss");
    }
}
