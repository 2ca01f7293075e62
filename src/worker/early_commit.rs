//! A job's offset committed before its route ends: once its result is out (acknowledged
//! by the broker) and the store refused the first write of its terminal state. The
//! route goes on retrying that write through the outage (`durable::record_result`), but
//! the partition's commit no longer waits for it. Without this, a rebalance during the
//! outage hands the uncommitted record to the partition's next owner, which finds no
//! terminal state once the store is back and runs the job again: a second result with no
//! crash (the fleet simulator's seeds 220108, 933656634374). The broker is the one place
//! that can say "the result is out" while the store cannot.
//!
//! Only for runs that hold no claim on the job's row (no running mark, not taken over nor
//! claimed after a hand-off), successes and terminal failures (their dead letter goes
//! first) alike: a marked or claimed run's row shows it running, and it is run again once
//! its heartbeats lapse whatever the offset says, so its commit keeps waiting for the
//! state write. The cost: a worker that crashes (or gives up after
//! `durable::OUTAGE_RETRY`) before the state write lands leaves the job's state unrecorded
//! although its result is on the results topic (logged as an error and counted in
//! `fairway_outcome_write_failures_total`), where it would otherwise run the job again.
//!
//! The offset usually cannot move at once: a longer job before it on the partition is
//! still running. So the offsets finished early above a partition's commit point go with
//! it as its commit metadata (`core::offsets::hint_metadata`, at most 4,000 bytes), and the
//! partition's next owner reads them at the assignment and skips those records
//! (`pool::Loop::read_early`). Bounds: a partition's set of them holds offsets in flight
//! there (under `pool::OUTCOMES_IN_FLIGHT`), and at most 4,096 read from a commit.
//!
//! The pool loop gives each job's route one [`Hook`] ([`scope`]); the route calls [`tell`]
//! and the loop receives the hook's message once; the route's end then finds
//! [`Hook::told`] and does not finish the offset a second time.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How one job's route tells its pool loop, at most once, that its offset may be
/// committed before the route ends.
pub struct Hook {
    told: AtomicBool,
    send: Box<dyn Fn() + Send + Sync>,
}

impl Hook {
    /// A hook whose first [`tell`] calls `send` (it sends the pool loop its message).
    pub fn new(send: impl Fn() + Send + Sync + 'static) -> Arc<Hook> {
        Arc::new(Hook { told: AtomicBool::new(false), send: Box::new(send) })
    }

    /// Whether the route told it: its offset was released early.
    pub fn told(&self) -> bool {
        self.told.load(Ordering::SeqCst)
    }

    fn tell(&self) {
        if !self.told.swap(true, Ordering::SeqCst) {
            (self.send)()
        }
    }
}

tokio::task_local! {
    static CURRENT: Arc<Hook>;
}

/// Runs a job's route with its hook (a plain function, as `ownership::scope`, so the
/// route's future is held once).
pub fn scope<F: Future>(hook: Arc<Hook>, route: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(hook, route)
}

/// The route running now has its result out and its state write pending: its offset may
/// be committed. Returns whether a pool loop was told (false outside any [`scope`]: the
/// route's tests, records not read from a pool partition).
pub fn tell() -> bool {
    CURRENT.try_with(|hook| hook.tell()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn a_route_tells_its_loop_once_and_only_inside_its_scope() {
        assert!(!tell(), "outside a scope there is no loop to tell");
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        let hook = Hook::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert!(!hook.told());
        let told = scope(hook.clone(), async { (tell(), tell()) }).await;
        assert_eq!(told, (true, true));
        assert_eq!(sent.load(Ordering::SeqCst), 1, "the loop hears it once");
        assert!(hook.told());
        assert!(!tell(), "the scope ended with the route");
    }
}
