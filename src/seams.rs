//! The narrow seams a job's route (`worker::route`) reaches the outside world through:
//! [`RouteStore`] (the store reads and writes of its checks and outcomes), [`RouteBroker`]
//! (the records it produces) and [`Clock`] (the time it stamps and compares). `store` and
//! `kafka` implement the first two for the real edges; `sim::doubles` implements them in
//! memory, so the route runs in one process under tokio's paused time (`TokioClock`).
//! The pool loop (`worker::pool`) reaches the pool topic through [`PoolGroup`] and
//! [`PoolConsumer`] (joining the group; records, pauses, commit points), implemented by
//! `kafka` on librdkafka and by `sim::broker` in memory; its spill path through
//! [`BacklogStore`], and the tenants registry through [`TenantsView`].

use crate::core::tenants::{TenantRecord, TenantSet};
use crate::kafka::{ConsumeError, KafkaError, RebalanceEvent, TopicPartition};
use crate::model::Millis;
use crate::store::{BacklogKey, HeartbeatRow, JobRow, RunMark, SeenRow, StateUpdate, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A future of one edge call (boxed: the seams are trait objects).
pub type Io<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a job's route reads and writes in the store.
pub trait RouteStore: Send + Sync {
    /// A job's state (its row merged with its finished record), if any.
    fn job<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<JobRow>, StoreError>>;
    /// The last heartbeat of a running job (it expires after its TTL).
    fn heartbeat<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<HeartbeatRow>, StoreError>>;
    /// A heartbeat of a job running on `beat.worker`, living `beat.ttl_secs`.
    fn put_heartbeat<'a>(&'a self, beat: Beat<'a>) -> Io<'a, Result<(), StoreError>>;
    /// Heartbeats of a batch of running jobs on `worker`: (job id, progress, message) each.
    fn put_heartbeats<'a>(
        &'a self,
        beats: &'a [(String, f64, String)],
        worker: &'a str,
        at: Millis,
        ttl_secs: i32,
    ) -> Io<'a, Result<(), StoreError>>;
    /// Which of `job_ids` a cancellation was requested for.
    fn cancel_requested<'a>(&'a self, job_ids: &'a [String]) -> Io<'a, Result<Vec<String>, StoreError>>;
    /// A job's state at one step of its route (running, retrying, or terminal).
    fn put_state<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>>;
    /// A finished UUIDv7 job's packed record (`core::finished`), instead of a row.
    fn put_finished<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>>;
    /// The running row, first heartbeat and reaper entry of a job that outlived its grace:
    /// false (nothing written) if the row shows the job finished (not a rerun of it).
    fn put_running_with_heartbeat<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
    ) -> Io<'a, Result<bool, StoreError>>;
    /// [`RouteStore::put_running_with_heartbeat`], only while the row is still the one
    /// the run's check read (`seen`: its worker and last write): false if it is not.
    fn put_running_as_seen<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
        seen: SeenRow<'a>,
    ) -> Io<'a, Result<bool, StoreError>>;
    /// A job's state, only while its row shows the run `mark` running: false if not.
    fn put_state_if_marked<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        mark: RunMark<'a>,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>>;
    /// Clears a job's reaper entry once its run ended.
    fn delete_running_job<'a>(&'a self, pool: &'a str, job_id: &'a str) -> Io<'a, Result<(), StoreError>>;
    /// Claims a handed-off job for `worker`, atomically: whether this claim won.
    fn claim_hand_off<'a>(&'a self, job_id: &'a str, worker: &'a str, now: Millis) -> Io<'a, Result<bool, StoreError>>;
    /// Takes over a job whose run `from` lapsed for `worker`, atomically, only while its
    /// row is still the one read (running on that worker, last written then): whether
    /// this claim won.
    fn claim_take_over<'a>(
        &'a self,
        job_id: &'a str,
        from: SeenRow<'a>,
        worker: &'a str,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>>;
    /// Marks a job running on `worker` as handed off: whether the row showed it so.
    fn mark_handed_off<'a>(&'a self, job_id: &'a str, worker: &'a str, now: Millis)
        -> Io<'a, Result<bool, StoreError>>;
    /// How often generation `generation` of a job was handed off (0 if never).
    fn handoff_count<'a>(&'a self, job_id: &'a str, generation: i64) -> Io<'a, Result<i32, StoreError>>;
    fn put_handoff_count<'a>(&'a self, job_id: &'a str, generation: i64, count: i32) -> Io<'a, Result<(), StoreError>>;
    /// The dispatch frontier recorded for a partition (`core::frontier`).
    fn dispatch_frontier<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Option<i64>, StoreError>>;
    fn raise_dispatch_frontier<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        offset: i64,
    ) -> Io<'a, Result<(), StoreError>>;
}

/// Spilled jobs read back: (offset, encoded job), in offset order.
pub type SpilledRows = Vec<(i64, Vec<u8>)>;

/// The spill path's rows in the store (`worker::backlog`): one tenant's jobs of a
/// partition past its buffer, in buckets of offsets, with an index per partition.
pub trait BacklogStore: Send + Sync {
    /// Writes spilled jobs `(offset, encoded job)` of one bucket, in ascending offset
    /// order, its index entry first: the pack rows written.
    fn put_rows<'a>(&'a self, key: BacklogKey<'a>, rows: &'a [(i64, &'a [u8])]) -> Io<'a, Result<usize, StoreError>>;
    /// The spilled jobs of a bucket with `after < offset < before`, at most `limit`.
    fn read_rows<'a>(
        &'a self,
        key: BacklogKey<'a>,
        after: i64,
        before: i64,
        limit: usize,
    ) -> Io<'a, Result<SpilledRows, StoreError>>;
    /// The index of a partition: (tenant, bucket) of every bucket with rows.
    fn list<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Vec<(String, i64)>, StoreError>>;
    /// Drops a bucket read back whole, and its index entry.
    fn drop_bucket<'a>(&'a self, key: BacklogKey<'a>) -> Io<'a, Result<(), StoreError>>;
}

/// The tenants registry as the pool loop reads it (`ops::tenants::LiveTenants`).
pub trait TenantsView: Send + Sync {
    /// The registry as this process last read it.
    fn current(&self) -> Arc<TenantSet>;
    /// Each version as it is read.
    fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<TenantSet>>;
    /// How a job of `tenant` is admitted (its record), or why not.
    fn accept(&self, tenant: &str) -> Result<TenantRecord, String>;
    /// Whether `tenant` is registered once this view caught up with the registry.
    fn registered_after_all<'a>(&'a self, tenant: &'a str) -> Io<'a, Result<bool, StoreError>>;
}

/// One record of the pool topic, copied out of the consumer's buffer.
#[derive(Debug, Clone)]
pub struct PoolRecord {
    pub partition: i32,
    pub offset: i64,
    pub payload: Vec<u8>,
    /// It carries the submitter's header (`core::frontier::SUBMITTED_HEADER`).
    pub submitted: bool,
    /// Its create time (epoch ms), if the broker gave one.
    pub timestamp: Option<i64>,
}

/// Pausing and resuming a consumer's partitions (`kafka::Pauses` keeps the books).
pub trait Pausable {
    fn pause(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError>;
    fn resume(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError>;
}

/// The pool topic as one member of the pool's consumer group reads it. Offsets stored here
/// are committed by the consumer itself (auto-commit of stored offsets); assignments and
/// revocations arrive on the channel [`PoolGroup::join`] hands out beside it.
pub trait PoolConsumer: Pausable + Send + Sync + 'static {
    /// The next record of an owned, unpaused partition (waits for one).
    fn recv(&self) -> impl Future<Output = Result<PoolRecord, ConsumeError>> + Send + '_;
    /// A record already fetched, without waiting; None if none is.
    fn try_recv(&self) -> Option<Result<PoolRecord, ConsumeError>>;
    /// Commit points of `topic`, committed later (those marked `now`, at once).
    fn store_offsets(&self, topic: &str, commits: &[CommitPoint]) -> Result<(), ConsumeError>;
    /// The group's committed offsets of `partitions` of `topic`, with their commit
    /// metadata: (partition, next offset to read, metadata). Partitions with no commit are
    /// left out. Waits for the broker's answer (an offset fetch) for up to a few seconds.
    fn committed_metadata(&self, topic: &str, partitions: &[i32]) -> Result<Vec<(i32, i64, String)>, ConsumeError>;
    /// The consumer's fatal error, if it hit one: it never consumes again.
    fn fatal_error(&self) -> Option<String>;
    /// Restarts the fetchers of the owned partitions (`kafka::stall::restart_fetchers`):
    /// `books` holds each owned partition's last offset taken in, `resume` those to resume.
    /// None if the assignment is changing (nothing done).
    fn restart_fetchers(
        &self,
        books: &std::collections::HashMap<TopicPartition, i64>,
        resume: &[TopicPartition],
    ) -> Result<Option<Vec<crate::kafka::stall::Start>>, KafkaError>;
    /// Commits what is stored and leaves the group: the partitions move to the others.
    fn leave(&self);
}

/// A partition's commit point: the next offset to read, and the commit metadata that goes
/// with it (`worker::early_commit`: offsets above it finished early). `now`: commit it at
/// once, not with the next auto-commit, which skips a partition whose offset did not
/// move (only its metadata changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPoint {
    pub partition: i32,
    pub next: i64,
    pub metadata: Option<String>,
    pub now: bool,
}

/// A pool's consumer group as a member joins it.
pub trait PoolGroup: Send + Sync + 'static {
    type Consumer: PoolConsumer;
    /// A new member of the group, and its rebalance events.
    fn join(&self) -> Result<(Self::Consumer, tokio::sync::mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError>;
}

/// A heartbeat to write ([`RouteStore::put_heartbeat`]).
#[derive(Debug, Clone, Copy)]
pub struct Beat<'a> {
    pub job_id: &'a str,
    pub worker: &'a str,
    pub at: Millis,
    pub progress: f64,
    pub message: &'a str,
    pub ttl_secs: i32,
}

/// What a job's route produces: records it waits for (results, retries, dead letters,
/// copies) and events it does not (`watch::events`).
pub trait RouteBroker: Send + Sync {
    /// Produces one record and waits for the broker's acknowledgement: (partition, offset).
    fn send<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a [u8],
        headers: &'a [(&'a str, &'a str)],
    ) -> Io<'a, Result<(i32, i64), KafkaError>>;
    /// Queues one record without waiting; false if it could not be queued.
    fn send_nowait(&self, topic: &str, key: &str, payload: &[u8]) -> bool;
}

/// The time a job's route stamps and compares (epoch milliseconds). Its waits are
/// tokio's (`tokio::time::sleep`), so a clock driven by tokio's time keeps both in step.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> Millis;
}

/// Where the route draws its random numbers (a retry's jitter, a held job's spread):
/// the thread's generator in a worker, a seeded one in the simulator, so a seed replays.
pub trait Dice: Send + Sync {
    /// A number in [0, 1).
    fn unit(&self) -> f64;
}

/// The thread's random generator (the real worker's).
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadDice;

impl Dice for ThreadDice {
    fn unit(&self) -> f64 {
        rand::random()
    }
}

/// The wall clock (the real worker's).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        crate::now_ms()
    }
}

/// A clock that starts at `epoch` and moves with tokio's time: under
/// `tokio::time::pause` it advances only as the runtime's timers do.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: Millis,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts now (tokio's now) at `epoch` ms.
    pub fn starting_at(epoch: Millis) -> Self {
        TokioClock { epoch, start: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> Millis {
        self.epoch + self.start.elapsed().as_millis() as Millis
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under paused time the clock moves exactly as far as tokio's timers did.
    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_paused_time() {
        let clock = TokioClock::starting_at(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
        assert_eq!(clock.now_ms(), 3_500);
    }
}
