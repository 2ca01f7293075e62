//! Skipping the effectively-once read for jobs that provably need none (see
//! `core::frontier`): the dispatch frontier of each partition of the pool topic, raised
//! before any job starts beyond it, and the polled feed of recent cancel requests.

use super::route::Origin;
use crate::core::frontier::{self, PartitionFrontier};
use crate::model::{JobSubmitted, Millis};
use crate::now_ms;
use crate::seams::RouteStore;
use crate::store::{cancellation_bucket, Store, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Offsets one frontier write covers: one store write per this many jobs.
const CHUNK: i64 = 2_000;
/// How often the cancellation feed is polled.
const FEED_POLL: Duration = Duration::from_millis(250);
/// Minute buckets of the feed read per poll (the current one and the ones before).
const FEED_MINUTES: i64 = 3;
/// Only jobs younger than this may skip the read: the feed surely covers their lifetime.
const MAX_AGE_MS: Millis = 60_000;
/// The feed counts as current only if polled this recently.
const FEED_FRESH_MS: Millis = 2_000;

/// What the frontier says of a record about to start (`Frontiers::before_start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// Nobody can have started the job: its state read may be skipped.
    pub skip_read: bool,
    /// A worker may have started this record before: a redelivery (after a crash, a
    /// rebalance) or a record taken in again here.
    pub maybe_started: bool,
}

/// Per pool: the frontiers of the pool topic's partitions this worker owns.
pub struct Frontiers {
    topic: String,
    skip_reads: bool,
    parts: Mutex<HashMap<i32, Arc<tokio::sync::Mutex<Option<PartitionFrontier>>>>>,
    feed: Arc<CancelFeed>,
}

impl Frontiers {
    pub fn new(topic: String, skip_reads: bool, feed: Arc<CancelFeed>) -> Self {
        Frontiers { topic, skip_reads, parts: Mutex::new(HashMap::new()), feed }
    }

    /// Forgets partitions that were revoked or rewound: the partition's next incarnation re-reads
    /// the recorded frontier (which then includes what this worker reserved).
    pub fn forget(&self, partitions: &[i32]) {
        let mut parts = self.parts.lock().expect("frontiers");
        for p in partitions {
            parts.remove(p);
        }
    }

    /// Called before a job of the pool topic starts. Records the frontier past its offset
    /// (every started offset must be covered, whatever this job's own check is) and says
    /// whether the state read may be skipped: only if nobody can have started the job
    /// (else read it: a copy, a redelivery, a record taken in again after a run of it
    /// here, a cancel on the feed, or no proof), and whether a worker may have started
    /// this very record before (its offset was covered before this assignment, or it was
    /// taken in again here). An error means the store is unavailable: the job must not
    /// start.
    pub async fn before_start(
        &self,
        store: &dyn RouteStore,
        job: &JobSubmitted,
        origin: &Origin,
        now: Millis,
    ) -> Result<Start, StoreError> {
        if origin.topic != self.topic {
            return Ok(Start { skip_read: false, maybe_started: false });
        }
        let never_started = self.reserve(store, origin).await?;
        let skip_read = self.skip_reads
            && !origin.taken_again
            && never_started
            && frontier::straight_from_submitter(job, origin.submitted, now, MAX_AGE_MS)
            && self.feed.rules_out_cancel(&job.job_id, now);
        Ok(Start { skip_read, maybe_started: origin.taken_again || !never_started })
    }

    /// Called before a submitter's record of the pool topic is handed to a relay (a
    /// delayed job not held here): its copy may run elsewhere, so the frontier is raised
    /// past its offset as a start would, and a later reader of the offset reads the
    /// job's state instead of skipping it. An error means the store is unavailable: the
    /// job must not be handed over (its offset stays uncommitted).
    pub async fn cover(&self, store: &dyn RouteStore, origin: &Origin) -> Result<(), StoreError> {
        if origin.topic != self.topic {
            return Ok(());
        }
        self.reserve(store, origin).await.map(|_| ())
    }

    /// Records the frontier past `origin`'s offset if it is not covered yet; whether no
    /// worker can have started the offset before this assignment.
    async fn reserve(&self, store: &dyn RouteStore, origin: &Origin) -> Result<bool, StoreError> {
        let cell = {
            let mut parts = self.parts.lock().expect("frontiers");
            parts.entry(origin.partition).or_default().clone()
        };
        let mut guard = cell.lock().await;
        if guard.is_none() {
            // Boxed (both store calls): they are rare, and inline they would make every
            // job's future larger.
            let recorded = Box::pin(store.dispatch_frontier(&self.topic, origin.partition)).await?;
            *guard = Some(PartitionFrontier::new(recorded));
        }
        let f = guard.as_mut().expect("set above");
        if let Some(upto) = f.to_reserve(origin.offset, CHUNK) {
            Box::pin(store.raise_dispatch_frontier(&self.topic, origin.partition, upto)).await?;
            f.reserved(upto);
        }
        Ok(f.never_started(origin.offset))
    }
}

/// Recent cancel requests, polled from the store.
#[derive(Default)]
pub struct CancelFeed {
    state: Mutex<(HashSet<String>, Millis)>,
}

impl CancelFeed {
    /// The feed as if polled at `at` and found no cancel request (tests on doubles).
    #[cfg(test)]
    pub fn polled_empty(&self, at: Millis) {
        *self.state.lock().expect("feed") = (HashSet::new(), at);
    }

    /// The feed is current and has no cancel request for the job.
    fn rules_out_cancel(&self, job_id: &str, now: Millis) -> bool {
        let (ids, polled_at) = &*self.state.lock().expect("feed");
        now - polled_at <= FEED_FRESH_MS && !ids.contains(job_id)
    }

    /// Polls the feed until shutdown.
    pub async fn run(self: Arc<Self>, store: Store, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(FEED_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
            }
            let started = now_ms();
            let now_bucket = cancellation_bucket(started);
            let buckets: Vec<i64> = (0..FEED_MINUTES).map(|i| now_bucket - i).collect();
            match store.recent_cancellations(&buckets).await {
                Ok(ids) => {
                    // Stamped with the poll's start: a cancel written after it is unknown.
                    *self.state.lock().expect("feed") = (ids.into_iter().collect(), started);
                }
                Err(e) => tracing::debug!(error = %e, "cancellation feed poll failed"),
            }
        }
    }
}
