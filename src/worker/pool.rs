//! One pool's consumer loop: Kafka messages in, scheduling decisions, executions out.
//! The loop owns all mutable state (offset trackers, the dispatcher, paused partitions)
//! and talks to running jobs only through channels, so it never blocks on a job and a
//! multi-hour job never delays polling.

use super::backlog::{BacklogEvent, SpillReq, Spiller};
use super::dispatch::{Dispatcher, Queued, Ticket};
use super::durable::{self, Letter, Terminal};
use super::ownership::{self, Ownership};
use super::route::{Durable, Ended, Origin, Pending, SpillRef};
use super::Shared;
use super::{early_commit, exec};
use crate::core::backlog::TenantBacklog;
use crate::core::buffer::{Buffer, BufferBounds};
use crate::core::flow::Gate;
use crate::core::offsets::{hint_metadata, FinishedHint, PartitionOffsets};
use crate::core::outcomes::{OutcomeBounds, Outcomes};
use crate::core::promotion;
use crate::core::quota::Scope;
use crate::core::refusals::{Holder, RECYCLING_CAP};
use crate::core::tenants::TenantSet;
use crate::core::FastMap;
use crate::kafka::{self, RebalanceEvent};
use crate::model::{FailureClass, JobSubmitted, Millis};
use crate::seams::{CommitPoint, PoolConsumer, PoolGroup, PoolRecord};
use crate::{codec, metrics as m};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

struct Done {
    origin: Origin,
    incarnation: u64,
    /// The job held a scheduler slot (released earlier by a `Freed` message).
    had_slot: bool,
    /// The bytes its outcome held while waiting (payload and output), if it had a slot.
    held_bytes: usize,
    ended: Ended,
    spill: Option<SpillRef>,
    /// What takes the job in again if its outcome was not durable (`Loop::again_later`).
    again: Option<Again>,
    /// Its offset (or spilled row) was finished already, by an `Event::Committable`.
    committed_early: bool,
}

impl Done {
    /// The end of a message that held no scheduler slot (delayed, expired in the queue,
    /// refused), its offset finished only here.
    fn without_slot(
        origin: Origin,
        incarnation: u64,
        ended: Ended,
        spill: Option<SpillRef>,
        again: Option<Again>,
    ) -> Done {
        Done { origin, incarnation, had_slot: false, held_bytes: 0, ended, spill, again, committed_early: false }
    }
}

/// A job whose outcome was not durable, to take in again on a partition still owned: the
/// job as run, or the message as consumed (a delayed job, a refused message).
enum Again {
    Job(Arc<JobSubmitted>),
    Message(Vec<u8>),
}

impl Again {
    /// Bytes it holds, counted against `MAX_HOLDING_BYTES`.
    fn bytes(&self) -> usize {
        match self {
            Again::Job(job) => job.heap_bytes(),
            Again::Message(bytes) => bytes.len(),
        }
    }
}

/// How long a job whose outcome was not durable waits before it is taken in again (its
/// route already retried through the outage for as long as it could), the first time.
const AGAIN_AFTER: Duration = Duration::from_secs(5);
/// The longest wait before a job is taken in again ([`again_after`]).
const AGAIN_AFTER_MAX: Duration = Duration::from_secs(300);

/// How long a job whose outcome was not durable `times` times in a row here waits before
/// it is taken in again: 5 s, doubling, at most 5 minutes, so an outcome that stays
/// refused costs a run every 5 minutes, not every 5 s.
pub(crate) fn again_after(times: u32) -> Duration {
    crate::core::backoff::doubling(AGAIN_AFTER, AGAIN_AFTER_MAX, times)
}

/// What executions and the spill path tell the loop: a slot freed (handler returned),
/// then done (outcome durable or given up); spills written, rows read back.
enum Event {
    Freed(Freed),
    /// A route's result is out and its state write pending: its offset (or spilled row)
    /// counts as finished now (`early_commit`); its `Done` follows.
    Committable {
        partition: i32,
        offset: i64,
        incarnation: u64,
        spill: Option<SpillRef>,
    },
    Done(Done),
    Backlog(BacklogEvent),
    /// What was held until its job's `execute_at` (`Loop::hold_until_due`) is due.
    Due(Held),
    /// A job whose outcome was not durable, due to be taken in again.
    Again {
        origin: Origin,
        incarnation: u64,
        spill: Option<SpillRef>,
        again: Again,
    },
}

/// Most messages, and bytes of them, one pool loop holds until their `execute_at`
/// (`core::promotion::HOLD_AHEAD_MS` ahead at most); past either a job due soon goes to
/// the delayed topic as one due later.
const MAX_HOLDING: usize = 50_000;
const MAX_HOLDING_BYTES: usize = 64 << 20;

struct PartitionState {
    incarnation: u64,
    offsets: PartitionOffsets,
    /// Spilled backlogs of the tenants on this partition (`core::backlog`).
    backlogs: FastMap<String, TenantBacklog>,
    /// While the partition's backlog index loads, its messages wait here, so no tenant's
    /// new job overtakes its spilled ones; the partition pauses only once they fill
    /// [`HELD_MAX`] or [`HELD_MAX_BYTES`] ([`PartitionState::held_full`]).
    held: Option<Vec<(Origin, Vec<u8>)>>,
    /// The bytes of `held`.
    held_bytes: usize,
    /// Highest offset consumed: buckets of spilled rows below it are sealed.
    last_seen: i64,
    /// Spills handed to the writer and not yet reported.
    spilling: usize,
    /// Since when the partition is paused because `spilling` reached `MAX_SPILLING`.
    spill_paused_since: Option<tokio::time::Instant>,
    /// A commit point reached and not yet stored with the consumer (`Loop::store_offsets`).
    store_at: Option<i64>,
    /// This assignment of the partition: ended when it is lost (`worker::ownership`).
    ownership: Ownership,
    /// Jobs (by offset) whose outcome was not durable here, and how often in a row.
    again_times: FastMap<i64, u32>,
    /// Offsets above the commit point that finished early (`early_commit`: a result out,
    /// its state write pending; or read so from the commit metadata at the assignment):
    /// they go with every commit point stored, so the partition's next owner skips them.
    early: BTreeSet<i64>,
    /// `early` changed since the last commit point was stored.
    early_changed: bool,
}

/// Most bytes of commit metadata a commit point carries (Kafka's default
/// `offset.metadata.max.bytes` is 4,096); offsets finished early past it are left out and
/// may run again (a second result, never a loss).
const MAX_COMMIT_METADATA: usize = 4_000;
/// Most offsets finished early one partition remembers from its commit metadata.
const MAX_EARLY: usize = 4_096;

/// Most messages, and their bytes, a partition keeps while its backlog index loads before
/// it pauses. A partition is not paused the moment it is assigned: librdkafka can lose a
/// pause or resume given right after an assignment (its operations carry a version that a
/// newer one makes stale: confluentinc/librdkafka#2190, #5591), and the partition then
/// stays owned and never fetched. An index usually loads in one store read, before the
/// first fetch fills this.
const HELD_MAX: usize = 4_096;
const HELD_MAX_BYTES: usize = 4 << 20;

impl PartitionState {
    /// Whether the messages waiting for the backlog index fill their bound.
    fn held_full(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.len() >= HELD_MAX) || self.held_bytes >= HELD_MAX_BYTES
    }
}

/// Most jobs buffered in one worker for one pool, and their bytes (`core::buffer`): past
/// either, every tenant but light ones spills; at twice either every partition pauses.
/// Five times the default `worker.tenant_queue_limit`, so a burst of a few busy tenants'
/// backlogs stays in memory instead of a round trip through the store. Each job also costs
/// ~1 KiB the byte bound does not count (its decoded form, queue entries), so the count
/// bounds that part: ~100 MiB here, ~200 MiB at the pause.
const GLOBAL_BUFFER: usize = 100_000;
const GLOBAL_BUFFER_BYTES: usize = 256 << 20;
/// Most bytes of one tenant's jobs buffered in one worker for one pool (its job count is
/// `worker.tenant_queue_limit`): a tenant with large payloads spills sooner.
const TENANT_BUFFER_BYTES: usize = 32 << 20;
/// A tenant with fewer jobs and bytes than these in memory keeps its jobs there even when
/// the whole buffer is full (light tenants never pay for the spill path).
const LIGHT_TENANT: usize = 64;
const LIGHT_TENANT_BYTES: usize = 1 << 20;
/// Spills in flight per partition before it pauses (the writer is behind the store).
const MAX_SPILLING: usize = 20_000;
/// Messages one wake of the pool loop takes from the consumer at most (`Loop::take_ready`).
const TAKE_PER_WAKE: usize = 128;
/// Most rows one read-back takes.
const READ_CHUNK: usize = 1_000;

/// A job's slot is free: its handler returned (`ran`) or it was skipped.
struct Freed {
    ticket: Ticket,
    ran: bool,
    /// The job's flow scope, whose unit it frees too.
    flow: Option<String>,
    /// The bytes its outcome holds until done (payload and output).
    held_bytes: usize,
}

/// The pool loop's state besides the consumer: partitions, queues, what is in flight.
struct Loop {
    sh: Arc<Shared>,
    topic: String,
    dispatcher: Box<dyn Dispatcher<Pending>>,
    /// Jobs the dispatcher refused (tenant over its hard limit); their partitions pause.
    overflow: VecDeque<Queued<Pending>>,
    parts: FastMap<i32, PartitionState>,
    next_incarnation: u64,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<Event>,
    spiller: Spiller,
    /// Jobs whose handler returned but whose outcome is still being written (`core::outcomes`).
    outcomes: Outcomes,
    /// The jobs and bytes in memory, per tenant and in total, and their bounds: past
    /// a tenant's, its jobs spill (`worker.tenant_queue_limit`, `TENANT_BUFFER_BYTES`).
    buffer: Buffer,
    bounds: BufferBounds,
    /// The registry version the scheduler's tenant policies come from.
    tenants: Arc<TenantSet>,
    /// Its tenants with a `max_concurrency` or `rate_per_sec` (the quota pass's, besides
    /// the tenants the exchange still tracks): not every registered tenant per pass.
    limited: Vec<String>,
    /// The consumer group, and since when this member has owned no partition (if so).
    group: String,
    unassigned_since: Option<tokio::time::Instant>,
    warned_at: Option<tokio::time::Instant>,
    /// Jobs of flow keys at their fleet-wide parallelism or rate wait here (`core::flow`).
    gate: Gate<Pending>,
    /// The `Quotas::version` whose caps are applied.
    quota_version: u64,
    /// Tenants held by the recycling cap (`core::recycling`) and until when.
    recycling_held: HashMap<String, i64>,
    /// Messages held until their job's `execute_at` and their bytes (at most
    /// [`MAX_HOLDING`], [`MAX_HOLDING_BYTES`]).
    holding: usize,
    holding_bytes: usize,
    /// Jobs read back from spilled backlogs that wait until due here, counted in the
    /// buffer (`Loop::enqueue_when_due`).
    read_back_waiting: usize,
}

/// What the loop holds until its job falls due (`Loop::hold_until_due`).
enum Held {
    /// A message taken in before its job was due (at most [`MAX_HOLDING`] of them,
    /// [`MAX_HOLDING_BYTES`] in all): taken in again when due.
    Message { origin: Origin, incarnation: u64, bytes: Vec<u8> },
    /// A job read back from its tenant's spilled backlog before it was due on this
    /// worker's clock (`Loop::enqueue_when_due`): counted in the buffer meanwhile, queued
    /// when due.
    ReadBack(Pending),
}

impl Held {
    /// The partition it was read from, and that assignment's incarnation.
    fn read_from(&self) -> (i32, u64) {
        match self {
            Held::Message { origin, incarnation, .. } => (origin.partition, *incarnation),
            Held::ReadBack(p) => (p.origin.partition, p.incarnation),
        }
    }
}

/// How long a drain waits for running jobs to honour a stop request (then aborts them),
/// and again for the aborted ones to return: a drain takes at most the pool's
/// `drain_timeout` + 2 x this (Kubernetes' `terminationGracePeriodSeconds` must cover it).
pub const HAND_OFF_GRACE: Duration = Duration::from_secs(10);

/// The pool loop on the broker: a member of the pool's consumer group.
pub async fn run(
    sh: Arc<Shared>,
    dispatcher: Box<dyn Dispatcher<Pending>>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), super::WorkerError> {
    let members = kafka::seam::KafkaPoolGroup {
        cfg: sh.route.cfg.clone(),
        group: sh.route.cfg.group(sh.route.pool.as_str()),
        topic: sh.route.cfg.pool_topic(sh.route.pool),
        pool: sh.route.pool.as_str(),
    };
    run_in(sh, dispatcher, shutdown, members).await
}

/// The pool loop as a member of `members` (the broker's group, or the simulator's).
pub async fn run_in<G: PoolGroup>(
    sh: Arc<Shared>,
    dispatcher: Box<dyn Dispatcher<Pending>>,
    mut shutdown: watch::Receiver<bool>,
    members: G,
) -> Result<(), super::WorkerError> {
    let topic = sh.route.cfg.pool_topic(sh.route.pool);
    let group = sh.route.cfg.group(sh.route.pool.as_str());
    let (mut consumer, mut rebalances) = members.join()?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Event>();
    let report = done_tx.clone();
    let spiller = Spiller::start(sh.backlog.clone(), &topic, sh.route.pool.as_str(), move |ev| {
        let _ = report.send(Event::Backlog(ev));
    });
    let mut lp = Loop {
        sh: sh.clone(),
        topic: topic.clone(),
        dispatcher,
        overflow: VecDeque::new(),
        parts: FastMap::default(),
        next_incarnation: 0,
        tasks: JoinSet::new(),
        done_tx,
        spiller,
        outcomes: Outcomes::default(),
        buffer: Buffer::default(),
        bounds: BufferBounds {
            tenant_jobs: sh.route.cfg.worker.tenant_queue_limit.max(1),
            tenant_bytes: TENANT_BUFFER_BYTES,
            total_jobs: GLOBAL_BUFFER,
            total_bytes: GLOBAL_BUFFER_BYTES,
            light_jobs: LIGHT_TENANT,
            light_bytes: LIGHT_TENANT_BYTES,
        },
        tenants: sh.tenants.current(),
        limited: limited_tenants(&sh.tenants.current()),
        group: group.clone(),
        unassigned_since: Some(tokio::time::Instant::now()),
        warned_at: None,
        gate: Gate::default(),
        quota_version: 0,
        recycling_held: HashMap::new(),
        holding: 0,
        holding_bytes: 0,
        read_back_waiting: 0,
    };
    let mut registry = sh.tenants.subscribe();
    let slots = sh.route.cfg.pool(sh.route.pool).slots;
    let mut pauses = kafka::Pauses::default();
    let pool = sh.route.pool.as_str();
    let mut stats_tick = tokio::time::interval(Duration::from_millis(500));
    stats_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fleet = sh.fleet_usage.subscribe();

    loop {
        // The scheduler's next due time, or a parked flow key's next rate token.
        let now = lp.now();
        let due = [lp.dispatcher.next_wakeup(now), lp.gate.next_due()].into_iter().flatten().min();
        let wake = due.map(|t| (t - now).max(1) as u64).unwrap_or(3_600_000);
        let mut stuck = None;
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(ev) = rebalances.recv() => match ev {
                kafka::RebalanceEvent::GroupStuck(why) => stuck = Some(why),
                ev => lp.on_rebalance(&consumer, &mut pauses, ev),
            },
            // Ahead of the job streams: under a flood those are always ready, and the
            // stats, tenant changes and fleet usage must not wait for the flood to end.
            _ = stats_tick.tick() => {
                lp.expire_queued();
                lp.publish_stats();
                lp.log_state(&pauses);
                if let Some(reason) = consumer.fatal_error() {
                    // It never consumes again: the worker gives up (`watchdog`).
                    sh.watch.fatal("consumer", format!("the {pool} pool's consumer hit a fatal error: {reason}"));
                }
            }
            Ok(()) = registry.changed() => {
                let set = registry.borrow_and_update().clone();
                lp.apply_tenants(set);
            }
            Ok(()) = fleet.changed() => {
                let usage = fleet.borrow_and_update().clone();
                let now = lp.now();
                lp.dispatcher.fold_fleet_usage(&usage, now);
            }
            Some(ev) = done_rx.recv() => {
                lp.on_event(ev);
                while let Ok(ev) = done_rx.try_recv() {
                    lp.on_event(ev);
                }
                lp.store_offsets(&consumer);
            }
            msg = consumer.recv() => match msg {
                Err(e) => {
                    tracing::warn!(pool, error = %e, hint = kafka::error_hint(&e), "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(rec) => {
                    lp.take(rec);
                    lp.take_ready(&consumer);
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(wake)) => {}
        }
        if let Some(why) = stuck {
            if let Some((fresh, fresh_rx)) = lp.replacement_consumer(&members, &consumer, &mut pauses, &why) {
                let old = std::mem::replace(&mut consumer, fresh);
                rebalances = fresh_rx;
                pauses = kafka::Pauses::default();
                // Closing a consumer whose group requests never leave may take a while.
                tokio::task::spawn_blocking(move || drop(old));
            }
        }

        lp.after_each_wake(&consumer, &mut pauses, slots);
    }
    lp.drain(&consumer, &mut done_rx).await;
    Ok(())
}

/// A rate-limited tenant's share of its rate across the pool (`core::quota::share`):
/// applied to its token bucket here, then this worker's demand reported.
fn sync_tenant_rate(
    dispatcher: &mut dyn Dispatcher<Pending>,
    q: &mut crate::core::quota::Quotas,
    tenant: &str,
    limited: bool,
    now: i64,
) {
    let scope = Scope::Rate(tenant.to_string()).name();
    if !limited {
        if q.has(&scope) {
            dispatcher.set_fleet_rate(tenant, 1.0);
            q.report(&scope, 0, 0, 0);
        }
        return;
    }
    let want = dispatcher.queued(tenant) + dispatcher.running_of(tenant);
    if want == 0 && !q.has(&scope) {
        return;
    }
    dispatcher.set_fleet_rate(tenant, q.usable_share(&scope, now));
    q.report(&scope, 0, want as u32, 0);
}

/// Commits what finished, then leaves the consumer group: the broker hands this
/// member's partitions to the others right away.
fn leave_group<C: PoolConsumer>(consumer: &C, pool: &str) {
    consumer.leave();
    tracing::info!(pool, "left the consumer group; its partitions move to the other members");
}

impl Loop {
    /// A rebalance: assigned partitions get their state (and lose any old pause);
    /// revoked ones are forgotten, and their queued jobs dropped for the new owner.
    fn on_rebalance<C: PoolConsumer>(&mut self, consumer: &C, pauses: &mut kafka::Pauses, ev: RebalanceEvent) {
        let pool = self.pool();
        match ev {
            RebalanceEvent::Assigned(tps) => {
                for &(_, p) in &tps {
                    // Keep a state a message already created: replacing it would let
                    // commits pass offsets still queued under the old state.
                    self.partition(p);
                }
                self.read_early(consumer, &tps.iter().map(|&(_, p)| p).collect::<Vec<_>>());
                pauses.assigned(consumer, &tps);
                self.sh.assigned.store(self.parts.len(), std::sync::atomic::Ordering::SeqCst);
                if let Some(r) = self.sh.probes.worker_readiness() {
                    r.assigned(self.sh.route.pool);
                }
                self.track_assignment();
                tracing::info!(pool, partitions = ?self.parts.keys().collect::<Vec<_>>(), "partitions assigned");
            }
            RebalanceEvent::Revoked(tps) => {
                let gone: HashSet<i32> = tps.iter().map(|(_, p)| *p).collect();
                for p in &gone {
                    // Jobs still in their checks start behind a running mark (`worker::ownership`).
                    if let Some(st) = self.parts.remove(p) {
                        st.ownership.revoke();
                    }
                }
                pauses.revoked(&tps);
                self.sh.route.frontiers.forget(&gone.iter().copied().collect::<Vec<_>>());
                self.sh.assigned.store(self.parts.len(), std::sync::atomic::Ordering::SeqCst);
                self.track_assignment();
                // Queued jobs of revoked partitions belong to the new owner now (it
                // also reads their spilled backlogs back).
                let dropped = self.dispatcher.drain_where(&mut |j: &Pending| gone.contains(&j.origin.partition));
                let parked = self.gate.drain_where(&mut |j: &Pending| gone.contains(&j.origin.partition));
                let (lost, kept): (VecDeque<_>, VecDeque<_>) =
                    self.overflow.drain(..).partition(|q| gone.contains(&q.job.origin.partition));
                self.overflow = kept;
                for p in dropped.iter().chain(lost.iter().map(|q| &q.job)) {
                    self.release_flow(&p.job);
                }
                for p in dropped.iter().chain(parked.iter()).chain(lost.iter().map(|q| &q.job)) {
                    self.buffer.left(&p.job.tenant, p.job.heap_bytes());
                }
                tracing::info!(pool, partitions = ?gone, dropped = dropped.len(), "partitions revoked");
            }
            RebalanceEvent::Lost(tps) => {
                // Jobs in flight here stop acting for their jobs (`worker::ownership`); the
                // partitions' next owner runs them. A plain revocation keeps them going:
                // this member is alive, and the next owner waits for their heartbeats.
                for (_, p) in &tps {
                    if let Some(st) = self.parts.get(p) {
                        st.ownership.end();
                    }
                }
                tracing::warn!(pool, partitions = ?tps, "partitions lost (no answer from the group coordinator within the session): jobs in flight from them publish nothing more here");
                self.on_rebalance(consumer, pauses, RebalanceEvent::Revoked(tps));
            }
            RebalanceEvent::Stalled(stalled) => self.restart_fetchers(consumer, pauses, stalled),
            RebalanceEvent::GroupStuck(_) => {} // replaced by `run`: see `replacement_consumer`
        }
    }

    /// A new consumer for a group membership stuck unsettled (`kafka::stall::GROUP_STUCK_AFTER`),
    /// or None (the old one is kept) if one cannot be made. The partitions this member still
    /// owns are treated as lost first: jobs in flight from them publish nothing more here
    /// (`worker::ownership`), and their queued jobs go to the partitions' next owners.
    fn replacement_consumer<G: PoolGroup>(
        &mut self,
        members: &G,
        consumer: &G::Consumer,
        pauses: &mut kafka::Pauses,
        why: &str,
    ) -> Option<(G::Consumer, mpsc::UnboundedReceiver<RebalanceEvent>)> {
        let pool = self.sh.route.pool.as_str();
        let fresh = match members.join() {
            Ok(fresh) => fresh,
            Err(e) => {
                tracing::error!(pool, %why, error = %e, "the consumer's group membership is stuck and no new consumer could be made; trying again in a minute");
                return None;
            }
        };
        let owned: Vec<(String, i32)> = self.parts.keys().map(|p| (self.topic.clone(), *p)).collect();
        if !owned.is_empty() {
            self.on_rebalance(consumer, pauses, RebalanceEvent::Lost(owned));
        }
        self.unassigned_since.get_or_insert_with(tokio::time::Instant::now);
        metrics::counter!(m::CONSUMER_REPLACEMENTS, "pool" => pool).increment(1);
        tracing::warn!(pool, %why, group = %self.group, "the consumer's group membership is stuck: replaced by a new consumer, which joins the group afresh");
        Some(fresh)
    }

    /// Owned partitions are not being fetched (`kafka::stall`): unless this loop keeps
    /// them paused or does not own them, the consumer's fetchers restart, each partition
    /// right after the last record taken in from it (else at its committed offset).
    fn restart_fetchers<C: PoolConsumer>(
        &mut self,
        consumer: &C,
        pauses: &kafka::Pauses,
        stalled: Vec<(String, i32, String)>,
    ) {
        let pool = self.pool();
        let paused: HashSet<&kafka::TopicPartition> = pauses.paused().collect();
        let ours =
            |(t, p, _): &&(String, i32, String)| self.parts.contains_key(p) && !paused.contains(&(t.clone(), *p));
        if !stalled.iter().any(|s| ours(&s)) {
            tracing::debug!(pool, ?stalled, "partitions not fetched are paused or not ours: no restart");
            return;
        }
        let topic = self.sh.route.cfg.pool_topic(self.sh.route.pool);
        let books = self.parts.iter().map(|(p, st)| ((topic.clone(), *p), st.last_seen)).collect();
        let resume: Vec<(String, i32)> = stalled.iter().filter(|s| ours(s)).map(|(t, p, _)| (t.clone(), *p)).collect();
        match consumer.restart_fetchers(&books, &resume) {
            Ok(None) => tracing::debug!(pool, ?stalled, "the assignment is changing: no fetcher restart"),
            Ok(Some(starts)) => {
                metrics::counter!(m::FETCHER_RESTARTS, "pool" => pool).increment(1);
                tracing::warn!(pool, ?stalled, ?resume, ?starts, "restarted the fetchers and resumed the partitions: owned partitions, not paused by this worker, made no progress for 15 s with records waiting or their fetcher stopped (topic, partition, fetch state; start offsets, Invalid: the committed one)");
            }
            Err(e) => {
                tracing::warn!(pool, ?stalled, error = %e, "could not restart the fetchers of partitions not being fetched")
            }
        }
    }

    /// After every wake of the loop: retry what overflowed, apply the fleet's quotas,
    /// start what may start, tend the spilled backlogs, pause what must wait.
    fn after_each_wake<C: PoolConsumer>(&mut self, consumer: &C, pauses: &mut kafka::Pauses, slots: usize) {
        // Retry what overflowed once its tenant drained.
        let mut still = VecDeque::new();
        while let Some(q) = self.overflow.pop_front() {
            if let Err((_, q)) = self.dispatcher.enqueue(q, self.now()) {
                still.push_back(q);
            }
        }
        self.overflow = still;
        self.sync_quotas(false);
        self.start_jobs(slots);
        debug_assert_eq!(self.buffer.total().jobs, self.buffered(), "every job entering or leaving memory is counted");
        self.tend_backlogs();
        self.track_spill_pauses();
        pauses.set(consumer, &self.partitions_to_pause());
    }

    /// Graceful shutdown, after the loop: leave the group, let running jobs finish or hand
    /// them off.
    async fn drain<C: PoolConsumer>(&mut self, consumer: &C, done_rx: &mut mpsc::UnboundedReceiver<Event>) {
        let pool = self.pool();
        // Graceful shutdown (SIGTERM, SIGINT): take no more work. Running jobs get the
        // pool's `drain_timeout` to finish; then they are asked to stop (`ctx.stop_reason()`)
        // and each is handed off when its handler returns (re-queued at once, attempts
        // unchanged, not a crash); one that ignores the request is aborted after
        // HAND_OFF_GRACE and handed off from its last checkpoint. Queued jobs are simply not
        // committed: the partitions' next owners get them (spilled ones from the store).
        //
        // The group is left first, before anything drains: the partitions move to the other
        // members at once (the broker need not wait for a session timeout, and nothing waits
        // for this drain), so hand-off copies and queued jobs reach a live owner within about
        // a second. What finishes or is handed off later cannot be committed any more; its
        // redelivery is recognised by the effectively-once check (finished: skipped;
        // handed off: claimed by one copy; still running here: waits for the heartbeat).
        let queued = self.dispatcher.drain_where(&mut |_| true);
        for p in &queued {
            self.buffer.left(&p.job.tenant, p.job.heap_bytes());
        }
        // A worker that gave up asked its jobs to stop already, and waits for nothing
        // that needs what it lost: only the hand-off phases remain (`cli::ops::give_up`).
        let drain = match self.sh.watch.has_given_up() {
            true => Duration::ZERO,
            false => self.sh.route.cfg.pool(self.sh.route.pool).drain_timeout,
        };
        tracing::info!(pool, queued = queued.len(), running = self.dispatcher.running(), ?drain, "draining");
        leave_group(consumer, pool);
        let mut phase = 0;
        let mut deadline = tokio::time::Instant::now() + drain;
        while self.dispatcher.running() + self.outcomes.count() > 0 {
            tokio::select! {
                Some(ev) = done_rx.recv() => {
                    self.on_event(ev);
                    self.store_offsets(consumer);
                }
                // Serves the revoke of the leave (librdkafka sends LeaveGroup once the
                // application has seen it); whatever was still fetched is not ours any more.
                r = consumer.recv() => if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                },
                _ = tokio::time::sleep_until(deadline) => {
                    phase += 1;
                    deadline = tokio::time::Instant::now() + HAND_OFF_GRACE;
                    match phase {
                        1 => {
                            tracing::info!(pool, running = self.dispatcher.running(), "asking running jobs to stop for a hand-off");
                            self.sh.route.request_stop_all();
                        }
                        2 => {
                            tracing::warn!(pool, running = self.dispatcher.running(), "jobs ignored the stop request; aborting them (handed off from their last checkpoint)");
                            self.sh.route.abort_all();
                        }
                        _ => {
                            tracing::error!(pool, running = self.dispatcher.running(), "jobs could not be handed off; their heartbeats lapse and another worker takes them over");
                            break;
                        }
                    }
                }
            }
        }
        self.tasks.abort_all();
    }

    /// Stores the commit points reached since the last call with the consumer, in one
    /// call for all partitions (after each batch of events, not per job), each with the
    /// offsets above it that finished early (`early_commit`) as its metadata.
    fn store_offsets<C: PoolConsumer>(&mut self, consumer: &C) {
        let commits: Vec<CommitPoint> = self.parts.iter_mut().filter_map(|(&p, st)| commit_point(p, st)).collect();
        if !commits.is_empty() {
            if let Err(e) = consumer.store_offsets(&self.topic, &commits) {
                tracing::debug!(error = %e, "store offsets (a partition was likely revoked)");
            }
        }
    }

    /// The time the loop stamps and compares: its route's clock (epoch ms).
    fn now(&self) -> Millis {
        self.sh.route.clock.now_ms()
    }

    fn pool(&self) -> &'static str {
        self.sh.route.pool.as_str()
    }

    /// The state of a partition, created (with a load of its backlog index) if new.
    fn partition(&mut self, p: i32) -> &mut PartitionState {
        let (next_incarnation, spiller) = (&mut self.next_incarnation, &self.spiller);
        self.parts.entry(p).or_insert_with(|| new_partition(next_incarnation, spiller, p))
    }

    /// A consumed record, taken in.
    fn take(&mut self, rec: PoolRecord) {
        let PoolRecord { partition, offset, payload, submitted, timestamp } = rec;
        let origin = Origin { topic: self.topic.clone(), partition, offset, submitted, taken_again: false };
        self.on_message(origin, payload, timestamp);
    }

    /// Takes the messages the consumer already holds, up to [`TAKE_PER_WAKE`], without
    /// waiting: one wake of the loop (its bookkeeping, pauses and dispatch) serves a batch
    /// instead of each message. Stops early once a partition must pause, so pausing takes
    /// effect as soon as it would message by message.
    fn take_ready<C: PoolConsumer>(&mut self, consumer: &C) {
        for _ in 1..TAKE_PER_WAKE {
            if self.wants_pause() {
                return;
            }
            match consumer.try_recv() {
                Some(Ok(rec)) => self.take(rec),
                Some(Err(e)) => {
                    tracing::warn!(pool = self.pool(), error = %e, hint = kafka::error_hint(&e), "consumer error");
                    return;
                }
                None => return,
            }
        }
    }

    /// Whether any partition must pause now (see [`Loop::partitions_to_pause`]).
    fn wants_pause(&self) -> bool {
        !self.overflow.is_empty()
            || self.buffer.over(&self.bounds)
            || self.parts.values().any(|st| st.held_full() || st.spilling >= MAX_SPILLING)
    }

    /// A message from the pool topic: track its offset, then take it in (or hold it while
    /// its partition's backlog index loads).
    fn on_message(&mut self, origin: Origin, bytes: Vec<u8>, at: Option<i64>) {
        let p = origin.partition;
        let st = self.partition(p);
        if st.offsets.started_at(origin.offset, at).is_err() {
            // The partition rewound (a seek or a missed rebalance event): what was in
            // flight before no longer decides this partition's commits.
            let st = new_partition(&mut self.next_incarnation, &self.spiller, p);
            self.parts.insert(p, st);
            let _ = self.partition(p).offsets.started_at(origin.offset, at);
            // Offsets it started before may come again: re-read the frontier.
            self.sh.route.frontiers.forget(&[p]);
        }
        let st = self.partition(p);
        st.last_seen = st.last_seen.max(origin.offset);
        if st.early.contains(&origin.offset) {
            // Its result is out (`early_commit`): the worker that ran it wrote its state late
            // or not at all; running it again would publish a second result.
            finished(st, origin.offset);
            metrics::counter!(m::JOBS_SKIPPED, "pool" => self.pool(), "reason" => "finished_early").increment(1);
            return;
        }
        match st.held.as_mut() {
            Some(held) => {
                st.held_bytes += bytes.len();
                held.push((origin, bytes));
            }
            None => self.intake(origin, bytes),
        }
    }

    /// Intake of a consumed message: dead-letter what cannot run, delay what is due
    /// later, spill what exceeds its tenant's buffer, queue the rest.
    /// A job held until due comes back here too, its offset long consumed: its tenant's
    /// backlog refuses a spill a read may already have passed (`TenantBacklog::spill`),
    /// and the job stays in memory.
    fn intake(&mut self, origin: Origin, bytes: Vec<u8>) {
        let Some(incarnation) = self.parts.get(&origin.partition).map(|st| st.incarnation) else { return };
        tracing::trace!(target: "fairway::worker::intake", partition = origin.partition, offset = origin.offset, incarnation, "intake");
        let job = match validate(&self.sh, &bytes) {
            Ok(job) => job,
            Err(rejection) => return self.reject_later(Refused { rejection, bytes, origin, incarnation, spill: None }),
        };
        if let Some(at) = job.execute_at.filter(|at| *at > self.now()) {
            let room = self.holding < MAX_HOLDING && self.holding_bytes + bytes.len() <= MAX_HOLDING_BYTES;
            if promotion::hold_in_worker(at, self.now()) && room {
                return self.hold_until_due(at, Held::Message { origin, incarnation, bytes });
            }
            // Scheduled for later, even by a millisecond: the relay holds it (or parks it
            // in the store) until due, so no job starts before its `execute_at`.
            let (sh, tx) = (self.sh.clone(), self.done_tx.clone());
            self.tasks.spawn(async move {
                // A submitter's record: its offset counts as started (see `Frontiers::cover`).
                let covered = match origin.submitted {
                    true => sh.route.frontiers.cover(sh.route.store.as_ref(), &origin).await,
                    false => Ok(()),
                };
                let ended = if let Err(e) = covered {
                    tracing::warn!(job_id = %job.job_id, error = %e, "cannot record the dispatch frontier; the delayed job stays uncommitted and is not handed to the relay");
                    Ended::NotDurable
                } else {
                    Ended::Skipped.or_lost(durable::delay(&sh.route, job).await)
                };
                let again = (!ended.is_durable()).then_some(Again::Message(bytes));
                let _ = tx.send(Event::Done(Done::without_slot(origin, incarnation, ended, None, again)));
            });
            return;
        }
        self.sh.route.metrics.jobs_received.increment(1);
        let pending = Pending { job: Arc::new(job), origin, incarnation, received_at: self.now(), spill: None };
        if self.must_spill(&pending) && self.mark_spill(&pending) {
            metrics::counter!(m::JOBS_SPILLED, "pool" => self.pool()).increment(1);
            let (partition, offset, tenant) =
                (pending.origin.partition, pending.origin.offset, pending.job.tenant.clone());
            self.spiller.spill(SpillReq { incarnation, partition, tenant, offset, bytes, job: pending });
        } else {
            self.enqueue(pending);
        }
    }

    /// A tenant's job leaves memory for its spilled backlog when rows of it already wait
    /// there (order inside the tenant), when its share of the buffer is full (jobs or
    /// bytes), or when the whole buffer is full and the tenant is not a light one.
    fn must_spill(&self, p: &Pending) -> bool {
        if !self.sh.route.cfg.worker.spill_backlogs {
            return false;
        }
        let tenant = &p.job.tenant;
        let st = self.parts.get(&p.origin.partition);
        let active = st.and_then(|st| st.backlogs.get(tenant)).is_some_and(|b| b.is_active());
        self.buffer.must_spill(&self.bounds, tenant, p.job.heap_bytes(), active)
    }

    /// Records a spill in the tenant's backlog; false if it must stay in memory.
    fn mark_spill(&mut self, pending: &Pending) -> bool {
        let Some(st) = self.parts.get_mut(&pending.origin.partition) else { return false };
        let b = st.backlogs.entry(pending.job.tenant.clone()).or_insert_with(TenantBacklog::new);
        if !b.spill(pending.origin.offset) {
            return false;
        }
        b.saw_job(pending.job.heap_bytes());
        st.spilling += 1;
        true
    }

    fn buffered(&self) -> usize {
        self.dispatcher.queued_total() + self.overflow.len() + self.gate.parked() + self.read_back_waiting
    }

    /// A job for the scheduler, unless its flow key is at its parallelism or out of rate
    /// tokens here: then it waits in the gate (holding no slot, blocking no other key or
    /// tenant).
    fn enqueue(&mut self, pending: Pending) {
        self.buffer.entered(&pending.job.tenant, pending.job.heap_bytes());
        self.enqueue_entered(pending);
    }

    /// A job read back from its tenant's spilled backlog is queued when it is due on this
    /// worker's clock. The worker that spilled it found it due on its own clock, which may
    /// run ahead of this one; until due it waits, counted in the buffer (its tenant's reads
    /// stop as its share fills, as for queued jobs). So such jobs are bounded in number and
    /// bytes as queued ones are, and each waits at most as long as the spilling worker's
    /// clock ran ahead of this one's.
    fn enqueue_when_due(&mut self, pending: Pending) {
        let now = self.now();
        let Some(at) = pending.job.execute_at.filter(|at| *at > now) else { return self.enqueue(pending) };
        self.buffer.entered(&pending.job.tenant, pending.job.heap_bytes());
        self.hold_until_due(at, Held::ReadBack(pending));
    }

    /// Queues a job the buffer already counts: through its flow's gate, if it has one.
    fn enqueue_entered(&mut self, pending: Pending) {
        let pending = match self.sh.route.cfg.flow_scope(&pending.job) {
            Some((scope, limit)) => {
                match self.gate.offer(&scope, limit, &pending.job.tenant.clone(), pending, self.now()) {
                    Some(p) => p,
                    None => return,
                }
            }
            None => pending,
        };
        self.enqueue_past_flow(pending);
    }

    /// A job that left the loop without running gives its flow unit back.
    /// Queued jobs past their `not_after` expire now, without taking a slot (each still
    /// passes the effectively-once check, which settles it).
    fn expire_queued(&mut self) {
        let now = self.now();
        let expired = self.dispatcher.drain_where(&mut |p: &Pending| p.job.not_after.is_some_and(|at| at < now));
        for p in expired {
            self.release_flow(&p.job);
            self.buffer.left(&p.job.tenant, p.job.heap_bytes());
            metrics::counter!(m::JOBS_EXPIRED_QUEUED, "pool" => self.pool()).increment(1);
            let (route, tx) = (self.sh.route.clone(), self.done_tx.clone());
            self.tasks.spawn(async move {
                let ended = exec::expire_queued(route, p.job.clone(), p.origin.clone()).await;
                let again = (!ended.is_durable()).then_some(Again::Job(p.job));
                let _ = tx.send(Event::Done(Done::without_slot(p.origin, p.incarnation, ended, p.spill, again)));
            });
        }
    }

    fn release_flow(&mut self, job: &JobSubmitted) {
        if let Some((scope, _)) = self.sh.route.cfg.flow_scope(job) {
            self.gate.release(&scope);
        }
    }

    /// Applies the fleet-wide exchange's parts (`apply_quotas`), then lets through the
    /// flow keys' parked jobs that may go on: after a change, or when a rate token is due.
    fn sync_quotas(&mut self, full: bool) {
        let now = self.now();
        let applied = self.apply_quotas(full, now);
        if !applied && self.gate.next_due().is_none_or(|t| t > now) {
            return;
        }
        let ready = self.gate.ready(now);
        metrics::gauge!(m::FLOW_PARKED, "pool" => self.pool()).set(self.gate.parked() as f64);
        for p in ready {
            self.enqueue_past_flow(p);
        }
    }

    /// Reports this worker's demand of every limited scope (tenants with a
    /// `max_concurrency` or rate, limited flow keys) and applies its parts of the
    /// fleet-wide exchange (`worker::quota`: caps, rate shares): every call when `full`,
    /// else only when they changed. Whether it applied them.
    fn apply_quotas(&mut self, full: bool, now: i64) -> bool {
        let sh = self.sh.clone();
        let mut q = sh.quotas.lock().expect("quotas lock");
        if !full && q.version == self.quota_version {
            return false;
        }
        self.quota_version = q.version;
        let fleet = self.sh.route.cfg.worker.fleet_limits;
        if !full {
            tracing::debug!(pool = self.pool(), usable = ?q.all_usable(now), "fleet-wide caps changed");
        }
        for (scope, cap) in q.all_usable(now) {
            if fleet && matches!(Scope::parse(&scope), Some(Scope::Flow(_))) {
                self.gate.set_cap(&scope, cap);
                q.applied(&scope, cap);
            }
        }
        for (scope, limit, want, admitted) in self.gate.demand(now) {
            if fleet {
                q.report(&scope, limit.parallelism.unwrap_or(0), want, admitted);
                // 0 for a key new to the exchange, until its share is announced.
                self.gate.set_share(&scope, q.usable_share(&scope, now), now);
            } else {
                // Each worker on its own: the whole limit here.
                self.gate.set_cap(&scope, limit.parallelism.unwrap_or(0));
                self.gate.set_share(&scope, 1.0, now);
            }
        }
        if fleet && self.dispatcher.enforces_tenant_caps() {
            self.sync_tenant_quotas(&mut q, now);
        }
        true
    }

    /// Tenants' `max_concurrency` and `rate` across the pool: apply this worker's part to
    /// the scheduler, then report (the running count after the cap, in the same lock).
    fn sync_tenant_quotas(&mut self, q: &mut crate::core::quota::Quotas, now: i64) {
        let mut names: Vec<String> = q.tenants();
        names.extend(self.limited.iter().cloned());
        names.sort();
        names.dedup();
        for name in &names {
            let t = self.tenants.tenants.get(name);
            let rate = t.is_some_and(|t| t.rate_per_sec.is_some());
            sync_tenant_rate(self.dispatcher.as_mut(), q, name, rate, now);
            let scope = Scope::Tenant(name.clone()).name();
            let Some(limit) = t.and_then(|t| t.max_concurrency) else {
                if q.has(&scope) {
                    self.dispatcher.set_fleet_cap(name, None);
                    q.applied(&scope, 0);
                    q.report(&scope, 0, 0, 0);
                }
                continue;
            };
            let running = self.dispatcher.running_of(name);
            let want = self.dispatcher.queued(name) + running;
            if want == 0 && !q.has(&scope) {
                continue;
            }
            let cap = q.usable(&scope, now);
            self.dispatcher.set_fleet_cap(name, Some(cap as usize));
            q.applied(&scope, cap);
            q.report(&scope, limit as u32, want as u32, running as u32);
        }
    }

    /// A limited tenant's first job here waits for this worker's part of its fleet-wide
    /// cap and rate (0 until the exchange gave it one), instead of running under the
    /// policy's.
    fn cap_new_tenant(&mut self, tenant: &str) {
        if !self.sh.route.cfg.worker.fleet_limits || !self.dispatcher.enforces_tenant_caps() {
            return;
        }
        let Some(t) = self.tenants.tenants.get(tenant) else { return };
        let (rate, limit) = (t.rate_per_sec.is_some(), t.max_concurrency);
        let mut q = self.sh.quotas.lock().expect("quotas lock");
        let rate_scope = Scope::Rate(tenant.to_string()).name();
        if rate && !q.has(&rate_scope) {
            // Counted before it is queued: the demand includes it.
            let want = self.dispatcher.queued(tenant) + self.dispatcher.running_of(tenant) + 1;
            self.dispatcher.set_fleet_rate(tenant, q.usable_share(&rate_scope, self.now()));
            q.report(&rate_scope, 0, want as u32, 0);
        }
        let Some(limit) = limit else { return };
        let scope = Scope::Tenant(tenant.to_string()).name();
        if q.has(&scope) {
            return;
        }
        let running = self.dispatcher.running_of(tenant);
        let cap = q.usable(&scope, self.now());
        self.dispatcher.set_fleet_cap(tenant, Some(cap as usize));
        q.report(&scope, limit as u32, (self.dispatcher.queued(tenant) + running + 1) as u32, running as u32);
        q.applied(&scope, cap);
    }

    fn enqueue_past_flow(&mut self, pending: Pending) {
        self.cap_new_tenant(&pending.job.tenant);
        let q = Queued {
            tenant: pending.job.tenant.clone(),
            job_type: pending.job.job_type.clone(),
            priority: pending.job.priority,
            job: pending,
        };
        if let Err((rej, q)) = self.dispatcher.enqueue(q, self.now()) {
            // Once per partition going over, not per message already fetched behind it.
            let p = q.job.origin.partition;
            // (Expected, so quiet, when spilling is off: pausing is then the design.)
            if !self.overflow.iter().any(|o| o.job.origin.partition == p) {
                if self.sh.route.cfg.worker.spill_backlogs {
                    tracing::warn!(pool = self.pool(), partition = p, %rej, "tenant buffer over its hard limit; partition paused");
                } else {
                    tracing::debug!(pool = self.pool(), partition = p, %rej, "tenant buffer full; partition paused");
                }
            }
            self.overflow.push_back(q);
        }
    }

    /// Dead-letters a message that cannot run, in a task; its end comes back as `Done`.
    fn reject_later(&mut self, refused: Refused) {
        let (sh, tx) = (self.sh.clone(), self.done_tx.clone());
        self.tasks.spawn(async move {
            let Refused { rejection, bytes, origin, incarnation, spill } = refused;
            // Kept for a dead letter that cannot be written now: taken in again, the message
            // is refused and dead-lettered again (refusals are rare; the copy is cheap).
            let kept = spill.is_none().then(|| bytes.clone());
            let ended = Ended::Skipped.or_lost(reject(&sh, rejection, bytes, &origin).await);
            let again = kept.filter(|_| !ended.is_durable()).map(Again::Message);
            let _ = tx.send(Event::Done(Done::without_slot(origin, incarnation, ended, spill, again)));
        });
    }

    /// Starts every job the policy allows now (the policy enforces the slots). A job
    /// frees its slot when its handler returns; outcomes still being written are bounded
    /// separately ([`OUTCOMES_IN_FLIGHT`], `core::outcomes`), so a slow store holds new
    /// work back instead of piling up outcomes.
    fn start_jobs(&mut self, slots: usize) {
        // One clock read per call: the jobs it starts are dispatched within the same ms.
        let now = self.now();
        while self.outcomes.admits(OUTCOMES_IN_FLIGHT, slots) {
            let Some((p, ticket)) = self.dispatcher.next(now) else { break };
            self.buffer.left(&p.job.tenant, p.job.heap_bytes());
            let ticket_at = ticket.dispatched_at;
            if ticket.fast_lane {
                metrics::counter!(m::FAST_LANE_DISPATCHES, "pool" => self.pool()).increment(1);
            }
            let route = self.sh.route.clone();
            let tx = self.done_tx.clone();
            let freed = self.done_tx.clone();
            let flow = self.sh.route.cfg.flow_scope(&p.job).map(|(scope, _)| scope);
            // Queued jobs of a revoked partition are drained with it; one that is not
            // would start with its ownership ended, and so not run here.
            let owner = match self.parts.get(&p.origin.partition).filter(|st| st.incarnation == p.incarnation) {
                Some(st) => st.ownership.clone(),
                None => Ownership::ended(),
            };
            // Boxed: the job's future is large, and the task would copy it whole on spawn,
            // on completion and when its output is read.
            self.tasks.spawn(Box::pin(async move {
                let payload_bytes = p.job.payload.len();
                let mut slot = exec::SlotRelease::new(move |ran, output_bytes| {
                    let held_bytes = payload_bytes + output_bytes;
                    let _ = freed.send(Event::Freed(Freed { ticket, ran, flow, held_bytes }));
                });
                let waited = exec::Waited { received_at: p.received_at, dispatched_at: ticket_at };
                let hook = committable_hook(&tx, &p);
                let route = exec::execute(route, p.job.clone(), p.origin.clone(), &mut slot, waited);
                let ended = ownership::scope(owner, early_commit::scope(hook.clone(), route)).await;
                slot.release(false, 0); // skipped: its slot goes back now (before it is done)
                let held_bytes = payload_bytes + slot.output_bytes();
                let (origin, incarnation, spill) = (p.origin, p.incarnation, p.spill);
                let again = (!ended.is_durable()).then_some(Again::Job(p.job));
                let committed_early = hook.told();
                let done =
                    Done { origin, incarnation, had_slot: true, held_bytes, ended, spill, again, committed_early };
                let _ = tx.send(Event::Done(done));
            }));
        }
        while self.tasks.try_join_next().is_some() {}
    }

    /// Reads spilled rows back for tenants whose buffer drained below half, and drops
    /// buckets whose jobs are all done.
    fn tend_backlogs(&mut self) {
        let mut reads = Vec::new();
        let mut drops = Vec::new();
        for (&p, st) in self.parts.iter_mut() {
            if st.held.is_some() {
                continue;
            }
            for (tenant, b) in st.backlogs.iter_mut() {
                let room = self.buffer.read_room(&self.bounds, tenant, READ_CHUNK, b.largest_job());
                if room > 0 {
                    if let Some(plan) = b.plan_read(room) {
                        reads.push((st.incarnation, p, tenant.clone(), plan));
                    }
                }
                for bucket in b.deletable(st.last_seen) {
                    drops.push((st.incarnation, p, tenant.clone(), bucket));
                }
            }
            st.backlogs.retain(|_, b| !b.is_empty());
        }
        for (incarnation, p, tenant, plan) in reads {
            self.spiller.read(incarnation, p, tenant, plan);
        }
        for (incarnation, p, tenant, bucket) in drops {
            self.spiller.drop_bucket(incarnation, p, tenant, bucket);
        }
    }

    /// Counts and logs partitions that start or stop waiting for their spill writes (the
    /// store is behind the broker): every tenant behind the flood on them waits too.
    fn track_spill_pauses(&mut self) {
        let pool = self.sh.route.pool.as_str();
        let counters = self.spiller.counters.clone();
        for (&p, st) in self.parts.iter_mut() {
            let behind = st.spilling >= MAX_SPILLING;
            match (behind, st.spill_paused_since) {
                (true, None) => {
                    st.spill_paused_since = Some(tokio::time::Instant::now());
                    counters.pauses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!(m::SPILL_PAUSES, "pool" => pool).increment(1);
                    tracing::info!(
                        pool,
                        partition = p,
                        in_flight = st.spilling,
                        "spill writes behind the store; partition paused"
                    );
                }
                (false, Some(since)) => {
                    st.spill_paused_since = None;
                    let paused = since.elapsed();
                    let total_ms =
                        counters.paused_ms.fetch_add(paused.as_millis() as u64, std::sync::atomic::Ordering::Relaxed)
                            + paused.as_millis() as u64;
                    metrics::counter!(m::SPILL_PAUSED_SECONDS, "pool" => pool).absolute(total_ms / 1000);
                    tracing::info!(
                        pool,
                        partition = p,
                        paused_ms = paused.as_millis() as u64,
                        "spill writes caught up; partition resumed"
                    );
                }
                _ => {}
            }
        }
    }

    /// Backpressure, now only where spilling cannot help: partitions with jobs the
    /// dispatcher refused, partitions whose backlog index is loading with their waiting
    /// messages at their bound, or whose spill writes fell behind, and every partition
    /// when the whole buffer is twice full.
    fn partitions_to_pause(&self) -> HashSet<kafka::TopicPartition> {
        let mut want: HashSet<i32> = self.overflow.iter().map(|q| q.job.origin.partition).collect();
        for (&p, st) in &self.parts {
            if st.held_full() || st.spilling >= MAX_SPILLING {
                want.insert(p);
            }
        }
        if self.buffer.over(&self.bounds) {
            want.extend(self.parts.keys().copied());
        }
        want.into_iter().map(|p| (self.topic.clone(), p)).collect()
    }

    /// A new registry version: every added or changed tenant's policy goes to the
    /// scheduler (queued jobs stay queued). A reservation this pool cannot hold is left
    /// out (the rest applies), loudly; any other refusal keeps the previous settings.
    fn apply_tenants(&mut self, set: Arc<TenantSet>) {
        for t in set.changed_since(&self.tenants) {
            if let Err(e) = self.dispatcher.set_tenant(&t.name, t.policy()) {
                tracing::error!(pool = self.pool(), tenant = %t.name, error = %e, "cannot apply all of the tenant's new settings here");
                metrics::counter!(m::TENANT_APPLY_FAILURES, "pool" => self.pool()).increment(1);
            }
        }
        tracing::info!(pool = self.pool(), version = set.version, "tenants registry applied");
        self.limited = limited_tenants(&set);
        self.tenants = set;
    }

    fn track_assignment(&mut self) {
        if self.parts.is_empty() {
            self.unassigned_since.get_or_insert_with(tokio::time::Instant::now);
        } else {
            self.unassigned_since = None;
            self.warned_at = None;
        }
    }

    /// How long this member has owned no partition; past `kafka.unassigned_warning` it
    /// says so (once a minute), naming the group and what to check.
    fn unassigned_for(&mut self) -> Duration {
        let Some(since) = self.unassigned_since else { return Duration::ZERO };
        let idle = since.elapsed();
        let threshold = self.sh.route.cfg.kafka.unassigned_warning;
        if idle >= threshold && self.warned_at.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
            self.warned_at = Some(tokio::time::Instant::now());
            tracing::warn!(
                pool = self.pool(),
                group = %self.group,
                idle_s = idle.as_secs(),
                "this worker has had no partition of its pool topic for {}s: check the group with the broker's tools \
                 (a member stuck after a crash, another deployment sharing the group name: set kafka.group_prefix or a \
                 distinct topic_prefix), and that the topic has at least as many partitions as workers (extra workers idle)",
                idle.as_secs()
            );
        }
        idle
    }

    /// The loop's state in one debug line (a stalled partition or flow shows here).
    fn log_state(&self, pauses: &kafka::Pauses) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let paused: Vec<i32> = pauses.paused().map(|(_, p)| *p).collect();
        let held: Vec<(i32, usize)> =
            self.parts.iter().filter_map(|(p, st)| st.held.as_ref().map(|h| (*p, h.len()))).collect();
        tracing::debug!(
            pool = self.pool(),
            owned = ?self.parts.keys().collect::<Vec<_>>(),
            ?paused,
            ?held,
            queued = self.dispatcher.queued_total(),
            parked = self.gate.parked(),
            overflow = self.overflow.len(),
            buffered_bytes = self.buffer.total().bytes,
            finishing = self.outcomes.count(),
            finishing_bytes = self.outcomes.bytes(),
            quota_version = self.quota_version,
            "loop state"
        );
    }

    /// Holds (and releases) tenants at the recycling cap in the scheduler: their queued
    /// jobs wait with reason `recycling_cap` while the other tenants' run.
    fn apply_recycling(&mut self, now: i64) {
        let held: HashMap<String, i64> =
            self.sh.route.recycling.lock().expect("recycling lock").held(now).into_iter().collect();
        if held.is_empty() && self.recycling_held.is_empty() {
            return;
        }
        {
            let mut tally = self.sh.route.admission_tally.lock().expect("admission tally");
            for tenant in held.keys() {
                tally.held(tenant, RECYCLING_CAP, self.pool(), now);
            }
        }
        for (tenant, until) in &held {
            if self.recycling_held.get(tenant) != Some(until) {
                tracing::info!(pool = self.pool(), %tenant, until = *until, "tenant at the recycling cap: its jobs wait");
                self.dispatcher.set_held(tenant, Some(*until));
            }
        }
        for tenant in self.recycling_held.keys().filter(|t| !held.contains_key(*t)) {
            self.dispatcher.set_held(tenant, None);
        }
        metrics::gauge!(m::RECYCLING_HELD_TENANTS, "pool" => self.pool()).set(held.len() as f64);
        self.recycling_held = held;
    }

    /// Counts each tenant whose queued jobs wait at its own concurrency cap or rate here
    /// (`held:max_concurrency:<pool>`, `held:rate_per_sec:<pool>`) and each job type
    /// quarantined for a tenant here (`held:quarantine/<job type>:<pool>`), once a stats
    /// tick while it lasts: the tenant's page and limit alerts. Idle poison detectors are
    /// forgotten here once a minute (`PoisonDetectors::sweep_due`).
    fn mark_held(&self, now: i64) {
        let limited = self.dispatcher.held_at_limits(now);
        let quarantined = {
            let mut h = self.sh.route.health.lock().expect("health lock");
            h.poison.sweep_due(now);
            h.poison.quarantined_subjects(now)
        };
        if limited.is_empty() && quarantined.is_empty() {
            return;
        }
        let mut tally = self.sh.route.admission_tally.lock().expect("admission tally");
        for (tenant, limit) in limited {
            tally.held(&tenant, limit.as_str(), self.pool(), now);
        }
        for (tenant, job_type) in quarantined {
            let what = Holder::Quarantine(&self.sh.route.bounded_job_type(&job_type)).limit();
            tally.held(&tenant, &what, self.pool(), now);
        }
    }

    /// Scheduler snapshot (with spilled backlogs) for `fairway stats`, and fleet usage.
    fn publish_stats(&mut self) {
        let now = self.now();
        self.apply_recycling(now);
        self.mark_held(now);
        let unassigned = self.unassigned_for();
        metrics::gauge!(m::POOL_UNASSIGNED_SECONDS, "pool" => self.pool()).set(unassigned.as_secs_f64());
        let mut spilled: HashMap<&str, u64> = HashMap::new();
        for st in self.parts.values() {
            for (t, b) in &st.backlogs {
                *spilled.entry(t.as_str()).or_default() += b.spilled();
            }
        }
        let spilled_total: u64 = spilled.values().sum();
        metrics::gauge!(m::QUEUED, "pool" => self.pool()).set(self.buffered() as f64);
        metrics::gauge!(m::QUEUED_BYTES, "pool" => self.pool()).set(self.buffer.total().bytes as f64);
        metrics::gauge!(m::SPILLED_BACKLOG, "pool" => self.pool()).set(spilled_total as f64);
        metrics::gauge!(m::JOBS_HELD_UNTIL_DUE, "pool" => self.pool()).set(self.holding as f64);
        // Lag in time: the age of the oldest record whose offset is not yet committable.
        let oldest_uncommitted = self.parts.values().filter_map(|st| st.offsets.oldest_unfinished_at()).min();
        let lag_ms = oldest_uncommitted.map_or(0, |at| (now - at).max(0));
        metrics::gauge!(m::CONSUMER_LAG_SECONDS, "pool" => self.pool()).set(lag_ms as f64 / 1000.0);
        let (evicted, tracked) = self.dispatcher.evict_idle(now);
        metrics::counter!(m::SCHEDULER_TENANTS_EVICTED, "pool" => self.pool()).increment(evicted as u64);
        metrics::gauge!(m::SCHEDULER_TENANTS, "pool" => self.pool()).set(tracked as f64);
        let mut stats = self.dispatcher.stats_json(now);
        crate::core::fleet::add_spilled(&mut stats, &spilled, spilled_total);
        if let Some(pool) = stats.get_mut("pool").and_then(|p| p.as_object_mut()) {
            pool.insert("registry_version".into(), self.tenants.version.into());
            // Reported once past the threshold (a new member takes a few seconds to join).
            let overdue = unassigned >= self.sh.route.cfg.kafka.unassigned_warning;
            pool.insert("unassigned_ms".into(), (if overdue { unassigned.as_millis() as u64 } else { 0 }).into());
            pool.insert("group".into(), self.group.clone().into());
            pool.insert("spill".into(), self.spiller.counters.json());
            pool.insert("buffered_bytes".into(), self.buffer.total().bytes.into());
            if self.sh.route.runs_processes() {
                pool.insert(
                    "process_enforcement".into(),
                    crate::handlers::process::Enforcement::current().name().into(),
                );
            }
            // Job types whose circuit breaker is open or half-open here (the console).
            if let Ok(mut h) = self.sh.route.health.lock() {
                h.breakers.prune(now);
                let open: Vec<&str> = h.breakers.type_wide().not_closed().map(|(t, _)| t).collect();
                pool.insert("breakers_open".into(), open.into());
            }
        }
        // 0 once nothing waits (a stale age would keep an SLO alert firing).
        let oldest = crate::core::fleet::oldest_wait_ms(&stats).unwrap_or(0);
        metrics::gauge!(m::OLDEST_WAIT_SECONDS, "pool" => self.pool()).set(oldest as f64 / 1000.0);
        metrics::gauge!(m::POOL_SLOTS, "pool" => self.pool())
            .set(self.sh.route.cfg.pool(self.sh.route.pool).slots as f64);
        if let Ok(mut s) = self.sh.stats.lock() {
            *s = stats;
        }
        self.sync_quotas(true);
        // Hand this pool's slot-time to the fleet accounting.
        let used = self.dispatcher.take_usage(now);
        if let Ok(mut u) = self.sh.local_usage.lock() {
            for (t, v) in used {
                *u.entry(t).or_default() += v;
            }
        }
    }

    /// Holds a message or a read-back job whose job is due at `at` in this loop until then:
    /// its offset stays uncommitted (a crash redelivers it), and when due it is taken in
    /// again or queued ([`Held`]).
    fn hold_until_due(&mut self, at: Millis, held: Held) {
        match &held {
            Held::Message { bytes, .. } => {
                self.holding += 1;
                self.holding_bytes += bytes.len();
            }
            Held::ReadBack(_) => self.read_back_waiting += 1,
        }
        let tx = self.done_tx.clone();
        let wait = Duration::from_millis(u64::try_from(at.saturating_sub(self.now())).unwrap_or(0));
        self.tasks.spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = tx.send(Event::Due(held));
        });
    }

    /// What was held until due ([`Loop::hold_until_due`]) is due: taken in or queued,
    /// unless its partition was revoked (or rewound) since: its next owner reads it again.
    fn on_due(&mut self, held: Held) {
        let (partition, incarnation) = held.read_from();
        let current = self.parts.get(&partition).is_some_and(|st| st.incarnation == incarnation);
        match held {
            Held::Message { origin, bytes, .. } => {
                self.holding -= 1;
                self.holding_bytes -= bytes.len();
                if current {
                    self.intake(origin, bytes);
                }
            }
            Held::ReadBack(p) => {
                self.read_back_waiting -= 1;
                match current {
                    true => self.enqueue_entered(Pending { received_at: self.now(), ..p }),
                    false => self.buffer.left(&p.job.tenant, p.job.heap_bytes()),
                }
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        let done = match ev {
            Event::Due(held) => return self.on_due(held),
            Event::Freed(Freed { ticket, ran, flow, held_bytes }) => {
                let now = self.now();
                self.dispatcher.complete(&ticket, now, ran);
                self.apply_recycling(now);
                self.outcomes.waiting(held_bytes);
                if let Some(scope) = flow {
                    self.gate.release(&scope);
                    for p in self.gate.ready(now) {
                        self.enqueue_past_flow(p);
                    }
                }
                return;
            }
            Event::Backlog(ev) => return self.on_backlog(ev),
            Event::Again { origin, incarnation, spill, again } => {
                self.holding -= 1;
                self.holding_bytes -= again.bytes();
                if self.parts.get(&origin.partition).is_some_and(|st| st.incarnation == incarnation) {
                    metrics::counter!(m::JOBS_TAKEN_AGAIN, "pool" => self.pool()).increment(1);
                    let origin = Origin { taken_again: true, ..origin };
                    match again {
                        Again::Job(job) => {
                            self.enqueue(Pending { job, origin, incarnation, received_at: self.now(), spill })
                        }
                        Again::Message(bytes) => self.intake(origin, bytes),
                    }
                }
                return;
            }
            Event::Committable { partition, offset, incarnation, spill } => {
                return self.finish_early(partition, offset, incarnation, &spill)
            }
            Event::Done(done) => done,
        };
        self.on_done(done);
    }

    /// A job's result is out and its state write pending: its offset counts as finished,
    /// and, above the commit point, goes with the commit metadata (`early_commit`).
    fn finish_early(&mut self, partition: i32, offset: i64, incarnation: u64, spill: &Option<SpillRef>) {
        self.finish(partition, offset, incarnation, spill);
        let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else { return };
        if spill.is_none() && st.offsets.committable().is_some_and(|next| offset > next) {
            st.early.insert(offset);
            st.early_changed = true;
        }
    }

    /// A job's offset (or, read back from a spill, its row) counts as finished, if its
    /// partition is still the incarnation that read it.
    fn finish(&mut self, partition: i32, offset: i64, incarnation: u64, spill: &Option<SpillRef>) {
        let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else {
            return; // finished after its partition moved away: the new owner decides.
        };
        if !st.again_times.is_empty() {
            st.again_times.remove(&offset);
        }
        if let Some(SpillRef { tenant, bucket }) = spill {
            // Its offset was committed when it spilled; its bucket tracks its end.
            if let Some(b) = st.backlogs.get_mut(tenant) {
                b.job_done(*bucket, true);
            }
            return;
        }
        finished(st, offset);
    }

    /// A job's route ended. A durable end lets its offset (or its spilled row) count as
    /// finished. One that is not durable keeps it unfinished, and the job is taken in
    /// again ([`again_after`]) while its partition stays here: no job waits for a restart
    /// or rebalance to run again. Draining, it is left to the partition's next owner.
    fn on_done(&mut self, done: Done) {
        if done.had_slot {
            self.outcomes.ended(done.held_bytes);
        }
        if done.ended == Ended::Skipped {
            metrics::counter!(m::JOBS_NOT_RUN, "pool" => self.pool()).increment(1);
        }
        let durable = done.ended.is_durable();
        if durable {
            self.sh.settled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let draining = self.sh.route.stopping.load(std::sync::atomic::Ordering::SeqCst);
        let owned = self.parts.get(&done.origin.partition).is_some_and(|st| st.incarnation == done.incarnation);
        if !durable {
            let (partition, offset) = (done.origin.partition, done.origin.offset);
            if draining || !owned {
                // The group already left, or the partition moved: its next owner reads it.
                tracing::debug!(pool = self.pool(), partition, offset, "left to the partition's next owner");
                return;
            }
            let times = self.parts.get_mut(&partition).map_or(1, |st| {
                let t = st.again_times.entry(offset).or_default();
                *t = t.saturating_add(1);
                *t
            });
            let after = again_after(times);
            if done.again.is_some_and(|a| self.again_later(&done.origin, done.incarnation, &done.spill, a, after)) {
                tracing::error!(
                    pool = self.pool(),
                    partition,
                    offset,
                    times,
                    after_s = after.as_secs(),
                    "outcome not durable; the job is taken in again (its commit held at it meanwhile)"
                );
            } else {
                if let Some(st) = self.parts.get_mut(&partition) {
                    st.again_times.remove(&offset);
                }
                tracing::error!(pool = self.pool(), partition, offset, "outcome not durable and the job cannot be held here to run again; holding the partition's commit (or spilled row) at it until a restart or rebalance redelivers it");
            }
            return;
        }
        if !done.committed_early {
            self.finish(done.origin.partition, done.origin.offset, done.incarnation, &done.spill);
        }
    }

    /// Reads the offsets finished early above the commit points of partitions just
    /// assigned, from their commit metadata (`early_commit`): those jobs' results are out,
    /// and they are skipped when read. A hint written for another commit point than the
    /// one committed (an older commit's) is not used. Without it (the fetch failed), such a
    /// job runs again: a second result, never a loss.
    fn read_early<C: PoolConsumer>(&mut self, consumer: &C, partitions: &[i32]) {
        let committed = match consumer.committed_metadata(&self.topic, partitions) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(pool = self.pool(), error = %e, "cannot read the committed offsets' metadata of the partitions assigned; jobs whose results went out just before they moved may run again");
                return;
            }
        };
        let pool = self.pool();
        for (p, next, metadata) in committed.into_iter().filter(|(_, _, md)| !md.is_empty()) {
            let hint = match FinishedHint::parse(&metadata) {
                Ok(hint) if hint.base == next => hint,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(pool, partition = p, error = %e, "commit metadata not used");
                    continue;
                }
            };
            if let Some(st) = self.parts.get_mut(&p) {
                st.early.extend(hint.offsets().filter(|&o| o > next).take(MAX_EARLY));
                tracing::info!(
                    pool,
                    partition = p,
                    finished_early = st.early.len(),
                    "offsets finished early by the partition's last owner are skipped"
                );
            }
        }
    }

    /// Holds a job whose outcome was not durable for `after`, then takes it in again
    /// (`Event::Again`), within the holding bounds of jobs held until due. False when
    /// there is no room.
    fn again_later(
        &mut self,
        origin: &Origin,
        incarnation: u64,
        spill: &Option<SpillRef>,
        again: Again,
        after: Duration,
    ) -> bool {
        let bytes = again.bytes();
        if self.holding >= MAX_HOLDING || self.holding_bytes + bytes > MAX_HOLDING_BYTES {
            return false;
        }
        self.holding += 1;
        self.holding_bytes += bytes;
        let (tx, origin, spill) = (self.done_tx.clone(), origin.clone(), spill.clone());
        self.tasks.spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(Event::Again { origin, incarnation, spill, again });
        });
        true
    }

    fn on_backlog(&mut self, ev: BacklogEvent) {
        match ev {
            BacklogEvent::Spilled { incarnation, partition, tenant, acked, failed } => {
                let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                st.spilling = st.spilling.saturating_sub(acked.len() + failed.len());
                let b = st.backlogs.entry(tenant).or_insert_with(TenantBacklog::new);
                b.acked(&acked);
                let failed_offsets: Vec<i64> = failed.iter().map(|(o, _)| *o).collect();
                b.failed(&failed_offsets);
                // Durable in the store: the offsets may be committed past.
                for o in acked {
                    finished(st, o);
                }
                if !failed.is_empty() {
                    metrics::counter!(m::SPILL_FAILURES, "pool" => self.pool()).increment(failed.len() as u64);
                }
                for (_, pending) in failed {
                    // Back in memory (the partition pauses behind the overflow).
                    self.buffer.entered(&pending.job.tenant, pending.job.heap_bytes());
                    let q = Queued {
                        tenant: pending.job.tenant.clone(),
                        job_type: pending.job.job_type.clone(),
                        priority: pending.job.priority,
                        job: pending,
                    };
                    self.overflow.push_back(q);
                }
            }
            BacklogEvent::Read { incarnation, partition, tenant, plan, rows } => {
                let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                let Some(b) = st.backlogs.get_mut(&tenant) else { return };
                let rows = match rows {
                    Ok(rows) => rows,
                    Err(_) => return b.read_failed(),
                };
                let offsets: Vec<i64> = rows.iter().map(|(o, _)| *o).collect();
                b.read_done(&plan, &offsets);
                metrics::counter!(m::JOBS_UNSPILLED, "pool" => self.pool()).increment(rows.len() as u64);
                let mut largest = 0;
                for (offset, bytes) in rows {
                    // Read back from the store: whether it was the submitter's record is
                    // not kept, so it counts as a copy (its state is read).
                    let origin =
                        Origin { topic: self.topic.clone(), partition, offset, submitted: false, taken_again: false };
                    let spill = Some(SpillRef { tenant: tenant.clone(), bucket: plan.bucket });
                    match validate(&self.sh, &bytes) {
                        Ok(job) => {
                            largest = largest.max(job.heap_bytes());
                            let job = Arc::new(job);
                            self.enqueue_when_due(Pending { job, origin, incarnation, received_at: self.now(), spill });
                        }
                        Err(rejection) => self.reject_later(Refused { rejection, bytes, origin, incarnation, spill }),
                    }
                }
                // Learnt in the buffer's own measure, as when the jobs spilled.
                if let Some(b) = self.parts.get_mut(&partition).and_then(|st| st.backlogs.get_mut(&tenant)) {
                    b.saw_job(largest);
                }
            }
            BacklogEvent::Loaded { incarnation, partition, entries } => {
                let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                let mut by_tenant: HashMap<String, Vec<i64>> = HashMap::new();
                for (t, bucket) in entries {
                    by_tenant.entry(t).or_default().push(bucket);
                }
                if !by_tenant.is_empty() {
                    tracing::info!(
                        pool = self.sh.route.pool.as_str(),
                        partition,
                        tenants = by_tenant.len(),
                        "spilled backlogs found; reading them back"
                    );
                }
                for (t, buckets) in by_tenant {
                    st.backlogs.insert(t, TenantBacklog::recovered(buckets));
                }
                st.held_bytes = 0;
                for (origin, bytes) in st.held.take().unwrap_or_default() {
                    self.intake(origin, bytes);
                }
            }
            BacklogEvent::Dropped { incarnation, partition, tenant, bucket, ok } => {
                let Some(st) = self.parts.get_mut(&partition).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                if let Some(b) = st.backlogs.get_mut(&tenant) {
                    if ok {
                        b.deleted(bucket)
                    } else {
                        b.delete_failed(bucket)
                    }
                }
            }
        }
    }
}

/// The registry's tenants with a fleet-wide limit (`max_concurrency` or `rate_per_sec`).
fn limited_tenants(set: &TenantSet) -> Vec<String> {
    let limited = |t: &&crate::core::tenants::TenantRecord| t.max_concurrency.is_some() || t.rate_per_sec.is_some();
    set.tenants.values().filter(limited).map(|t| t.name.clone()).collect()
}

fn new_partition(next_incarnation: &mut u64, spiller: &Spiller, p: i32) -> PartitionState {
    *next_incarnation += 1;
    spiller.load(*next_incarnation, p);
    PartitionState::new(*next_incarnation)
}

impl PartitionState {
    /// A partition just assigned, its messages held until its backlog index loads.
    fn new(incarnation: u64) -> PartitionState {
        PartitionState {
            incarnation,
            offsets: PartitionOffsets::default(),
            backlogs: FastMap::default(),
            held: Some(Vec::new()),
            held_bytes: 0,
            last_seen: -1,
            spilling: 0,
            spill_paused_since: None,
            store_at: None,
            ownership: Ownership::new(),
            again_times: FastMap::default(),
            early: BTreeSet::new(),
            early_changed: false,
        }
    }
}

/// Most outcomes in flight per pool (`core::outcomes`): jobs whose handler returned
/// while their outcome is still being recorded (the result produced and acknowledged, the
/// state written). An outcome takes a producer linger (10 ms), a broker acknowledgement
/// and a coalesced store write that gathers up to half this count for up to 80 ms
/// (`store::coalesce`), so under load ~100-150 ms, and the count caps a worker's
/// short-job throughput by Little's law: 16,384 / 150 ms is ~110,000 jobs/s. 8,192
/// (~55,000 jobs/s) held 60,000-job bursts near that rate, and 4,096 stopped dispatch
/// while a gather filled (docs/performance.md, 2026-12-05 evening and 2026-12-06 early
/// morning). Each holds its job's payload and output (~1 KiB for a no-op job, at
/// worst 2 x `worker.max_payload_bytes`) and its task (up to ~2.5 KiB): 128 MiB of
/// payloads and outputs stop new jobs, so a pool holds at most that plus ~40 MiB of
/// tasks plus its running jobs' outcomes.
const OUTCOMES_IN_FLIGHT: OutcomeBounds = OutcomeBounds { count: 16_384, bytes: 128 << 20 };

/// An offset's job is done (or durably spilled): store the commit point it allows.
/// The commit point of a partition to store, if it moved or its offsets finished early
/// changed: committed at once when only they changed (the auto-commit would skip it).
fn commit_point(partition: i32, st: &mut PartitionState) -> Option<CommitPoint> {
    let moved = st.store_at.take();
    if moved.is_none() && !st.early_changed {
        return None;
    }
    let next = moved.or_else(|| st.offsets.committable())?;
    if !st.early.is_empty() {
        st.early = st.early.split_off(&next);
    }
    let metadata = (!st.early.is_empty()).then(|| hint_metadata(next, st.early.iter().copied(), MAX_COMMIT_METADATA));
    let now = std::mem::take(&mut st.early_changed) && moved.is_none();
    Some(CommitPoint { partition, next, metadata, now })
}

/// The hook through which a job's route tells the loop its offset may be committed before
/// the route ends (`early_commit`): it sends `Event::Committable`.
fn committable_hook(tx: &mpsc::UnboundedSender<Event>, p: &Pending) -> Arc<early_commit::Hook> {
    let (tx, partition, offset, incarnation) = (tx.clone(), p.origin.partition, p.origin.offset, p.incarnation);
    let spill = p.spill.clone();
    early_commit::Hook::new(move || {
        let spill = spill.clone();
        let _ = tx.send(Event::Committable { partition, offset, incarnation, spill });
    })
}

fn finished(st: &mut PartitionState, offset: i64) {
    if let Some(commit) = st.offsets.finished(offset) {
        st.store_at = Some(commit);
    }
}

/// Why a message cannot run: what it decoded to (None: nothing), its class, the reason.
struct Rejection {
    job: Option<Box<JobSubmitted>>,
    class: FailureClass,
    reason: String,
}

/// A consumed message refused by [`validate`], with where it was read from.
struct Refused {
    rejection: Rejection,
    bytes: Vec<u8>,
    origin: Origin,
    incarnation: u64,
    spill: Option<SpillRef>,
}

/// Decodes and validates a message; what cannot run goes to the DLQ with the reason.
fn validate(sh: &Shared, bytes: &[u8]) -> Result<JobSubmitted, Rejection> {
    let job = codec::decode_job(bytes).map_err(|e| Rejection {
        job: None,
        class: FailureClass::Permanent,
        reason: format!("undecodable message: {e}"),
    })?;
    let bad =
        |reason: String| Err(Rejection { job: Some(Box::new(job.clone())), class: FailureClass::Permanent, reason });
    if uuid::Uuid::parse_str(&job.job_id).is_err() {
        return bad(format!("job_id {:?} is not a UUID; producers must send a UUID (v7 recommended)", job.job_id));
    }
    if let Err(why) = sh.tenants.accept(&job.tenant) {
        return bad(why);
    }
    if let Err(why) = check_job(sh, &job) {
        return bad(why);
    }
    Ok(job)
}

/// The checks of a decoded job besides its tenant's: its type and its payload's size.
fn check_job(sh: &Shared, job: &JobSubmitted) -> Result<(), String> {
    if !sh.route.cfg.job_types.contains_key(&job.job_type) {
        return Err(format!(
            "unknown job type {:?}; add [job_types.{}] to the config or fix the producer",
            job.job_type, job.job_type
        ));
    }
    if job.payload.len() > sh.route.cfg.worker.max_payload_bytes {
        return Err(format!(
            "payload is {} bytes, above worker.max_payload_bytes = {}; store large inputs elsewhere and pass a reference",
            job.payload.len(),
            sh.route.cfg.worker.max_payload_bytes
        ));
    }
    Ok(())
}

/// A job refused for its tenant alone, whose tenant the registry has after all (added
/// within this worker's last poll interval): a copy goes back on the pool topic, read
/// again with the fresher view, instead of the DLQ. None: refuse it.
async fn requeue_if_registered(sh: &Shared, job: &JobSubmitted) -> Option<Durable> {
    if uuid::Uuid::parse_str(&job.job_id).is_err() || check_job(sh, job).is_err() {
        return None;
    }
    match sh.tenants.registered_after_all(&job.tenant).await {
        Ok(true) => {
            tracing::info!(job_id = %job.job_id, tenant = %job.tenant, "tenant registered after this worker's last registry read; job requeued");
            Some(durable::requeue(&sh.route, job).await)
        }
        Ok(false) => None,
        Err(e) => {
            // Refusing on a view that may be stale would dead-letter a good job: hold it.
            tracing::warn!(job_id = %job.job_id, error = %e, "cannot re-read the tenants registry; holding the job");
            Some(Durable::No)
        }
    }
}

async fn reject(sh: &Shared, rejection: Rejection, raw: Vec<u8>, origin: &Origin) -> Durable {
    let Rejection { job, class, reason } = rejection;
    if let Some(requeued) = match &job {
        Some(j) => requeue_if_registered(sh, j).await,
        None => None,
    } {
        return requeued;
    }
    tracing::warn!(pool = sh.route.pool.as_str(), topic = %origin.topic, partition = origin.partition, offset = origin.offset, %reason, "dead-lettering message");
    let raw = if job.is_none() { Some(raw) } else { None };
    let attempts = job.as_ref().map(|j| j.attempt).unwrap_or(0);
    let letter = Letter { job: job.as_deref(), raw, class, reason: reason.clone(), last_error: None, attempts, origin };
    let dl = durable::dead_letter(&sh.route, letter).await;
    match &job {
        // A decodable job still gets its one terminal result, so submitters are not left
        // waiting; after its dead letter is durable, never before (else the result ends
        // the job and its copy, taken in again, never dead-letters it).
        Some(job) if dl.is_yes() => durable::record_terminal(&sh.route, job, Terminal::failed(reason, class)).await,
        _ => dl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offsets finished early go with the commit point as its metadata, committed at once
    /// when the offset did not move, and are dropped once the commit point passes them.
    #[test]
    fn offsets_finished_early_ride_with_the_commit_point_until_it_passes_them() {
        let mut st = PartitionState::new(1);
        for o in 10..15 {
            st.offsets.started(o).unwrap();
        }
        assert_eq!(commit_point(0, &mut st), None, "nothing moved");
        finished(&mut st, 12);
        st.early.insert(12);
        st.early_changed = true;
        let point = commit_point(0, &mut st);
        assert_eq!(point, Some(CommitPoint { partition: 0, next: 10, metadata: Some("fw1@10:2".into()), now: true }));
        assert_eq!(commit_point(0, &mut st), None, "stored once");
        finished(&mut st, 10);
        let point = commit_point(0, &mut st);
        let carried = Some(CommitPoint { partition: 0, next: 11, metadata: Some("fw1@11:1".into()), now: false });
        assert_eq!(point, carried, "the auto-commit takes a moved offset with its metadata");
        finished(&mut st, 11);
        let point = commit_point(0, &mut st);
        assert_eq!(point, Some(CommitPoint { partition: 0, next: 13, metadata: None, now: false }));
        assert!(st.early.is_empty(), "passed");
    }

    #[test]
    fn a_job_whose_outcome_stays_refused_is_taken_in_again_ever_less_often() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (1..=8).map(again_after).collect();
        assert_eq!(waits, [s(5), s(10), s(20), s(40), s(80), s(160), s(300), s(300)]);
        assert_eq!(again_after(0), s(5));
        assert_eq!(again_after(u32::MAX), s(300), "no overflow however often");
    }

    /// `OUTCOMES_IN_FLIGHT`'s note: a gather of finished records is written while the
    /// next one fills, so the outcomes in flight hold two full gathers.
    #[test]
    fn outcomes_in_flight_hold_two_full_gathers_of_finished_records() {
        assert_eq!(OUTCOMES_IN_FLIGHT.count, crate::store::FINISHED_GATHER_MAX.saturating_mul(2));
    }

    /// `GLOBAL_BUFFER`'s note: five busy tenants' backlogs at the default tenant limit
    /// fit in a pool's buffer.
    #[test]
    fn a_pool_buffers_five_tenants_at_the_default_limit() {
        let tenant = crate::config::WorkerConfig::default().tenant_queue_limit;
        assert_eq!(GLOBAL_BUFFER, tenant.saturating_mul(5));
    }

    /// `GLOBAL_BUFFER`'s note: besides the bytes the buffer counts, a buffered job holds
    /// its decoded form behind an `Arc` and a scheduler queue entry (its `Pending` and the
    /// scheduler's job type index, name and time), in a queue that may hold twice its
    /// length. About 1 KiB at most, so the job count bounds that memory.
    #[test]
    fn a_buffered_jobs_uncounted_memory_stays_within_a_kib() {
        use std::mem::size_of;
        let entry = crate::core::scheduler::Scheduler::<Pending>::ENTRY_BYTES;
        let per_job = size_of::<JobSubmitted>() + 16 + 2 * entry;
        assert!(per_job <= 1024, "a buffered job holds {per_job} bytes the buffer does not count");
    }
}
