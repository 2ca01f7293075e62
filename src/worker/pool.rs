//! One pool's consumer loop: Kafka messages in, scheduling decisions, executions out.
//! The loop owns all mutable state (offset trackers, the dispatcher, paused partitions)
//! and talks to running jobs only through channels, so it never blocks on a job and a
//! multi-hour job never delays polling.

use super::dispatch::{Dispatcher, Queued, Ticket};
use super::exec::{self, Ended, Origin};
use super::Shared;
use crate::core::offsets::PartitionOffsets;
use crate::kafka::{self, Consumer, Message, RebalanceEvent, TopicPartitionList};
use crate::model::{FailureClass, JobStatus, JobSubmitted};
use crate::{codec, metrics as m, now_ms};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// A decoded job waiting in the dispatcher.
pub struct Pending {
    pub job: Arc<JobSubmitted>,
    pub origin: Origin,
    pub epoch: u64,
    /// When the consumer handed it over (epoch ms), for the wait breakdown.
    pub received_at: i64,
}

struct Done {
    origin: Origin,
    epoch: u64,
    /// The job held a scheduler slot (released earlier by a `Freed` message).
    had_slot: bool,
    ended: Ended,
}

/// What executions tell the loop, in order: a slot freed (handler returned), then done
/// (outcome durable or given up).
enum Event {
    Freed(Ticket, bool),
    Done(Done),
}

struct PartitionState {
    epoch: u64,
    offsets: PartitionOffsets,
}

/// Most jobs buffered in one worker for one pool before every partition is paused.
const GLOBAL_BUFFER: usize = 50_000;

pub async fn run(
    sh: Arc<Shared>,
    mut dispatcher: Box<dyn Dispatcher<Pending>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), kafka::KafkaError> {
    let topic = sh.cfg.pool_topic(sh.pool);
    let group = format!("{}{}", sh.cfg.kafka.group_prefix, sh.pool);
    let (consumer, mut rebalances) = kafka::consumer(&sh.cfg, &group, std::slice::from_ref(&topic))?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Event>();
    // Jobs whose handler returned but whose outcome is still being written.
    let mut finishing = 0usize;
    let slots = sh.cfg.pool(sh.pool).slots;
    let mut tasks = JoinSet::new();
    let mut parts: HashMap<i32, PartitionState> = HashMap::new();
    let mut next_epoch = 0u64;
    let mut paused: HashSet<i32> = HashSet::new();
    // Partitions paused for a tenant whose buffer is full: partition -> that tenant.
    let mut hot: HashMap<i32, String> = HashMap::new();
    let mut overflow: VecDeque<Queued<Pending>> = VecDeque::new();
    let limit = sh.cfg.worker.tenant_queue_limit.max(1);
    let pool = sh.pool.as_str();
    let mut stats_tick = tokio::time::interval(Duration::from_millis(500));
    let mut fleet = sh.fleet_usage.subscribe();

    loop {
        let wake = dispatcher.next_wakeup(now_ms()).map(|t| (t - now_ms()).max(1) as u64).unwrap_or(3_600_000);
        let buffering = dispatcher.queued_total() + overflow.len();
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(ev) = rebalances.recv() => match ev {
                RebalanceEvent::Assigned(tps) => {
                    for (_, p) in tps {
                        // Keep a state a message already created: replacing it would let
                        // commits pass offsets still queued under the old state.
                        parts.entry(p).or_insert_with(|| {
                            next_epoch += 1;
                            PartitionState { epoch: next_epoch, offsets: PartitionOffsets::default() }
                        });
                        paused.remove(&p);
                    }
                    sh.assigned.store(parts.len(), std::sync::atomic::Ordering::SeqCst);
                    tracing::info!(pool, partitions = ?parts.keys().collect::<Vec<_>>(), "partitions assigned");
                }
                RebalanceEvent::Revoked(tps) => {
                    let gone: HashSet<i32> = tps.iter().map(|(_, p)| *p).collect();
                    for p in &gone {
                        parts.remove(p);
                        paused.remove(p);
                    }
                    sh.frontiers.forget(&gone.iter().copied().collect::<Vec<_>>());
                    sh.assigned.store(parts.len(), std::sync::atomic::Ordering::SeqCst);
                    // Queued jobs of revoked partitions belong to the new owner now.
                    let dropped = dispatcher.drain_where(&mut |j: &Pending| gone.contains(&j.origin.partition));
                    overflow.retain(|q| !gone.contains(&q.job.origin.partition));
                    tracing::info!(pool, partitions = ?gone, dropped = dropped.len(), "partitions revoked");
                }
            },
            Some(ev) = done_rx.recv() => {
                on_event(&sh, &consumer, &topic, &mut parts, &mut *dispatcher, &mut finishing, ev);
                while let Ok(ev) = done_rx.try_recv() {
                    on_event(&sh, &consumer, &topic, &mut parts, &mut *dispatcher, &mut finishing, ev);
                }
            }
            msg = consumer.recv() => match msg {
                Err(e) => {
                    tracing::warn!(pool, error = %e, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(msg) => {
                    let origin = Origin { topic: msg.topic().to_string(), partition: msg.partition(), offset: msg.offset() };
                    let bytes = msg.payload().unwrap_or_default().to_vec();
                    drop(msg);
                    let st = parts.entry(origin.partition).or_insert_with(|| {
                        next_epoch += 1;
                        PartitionState { epoch: next_epoch, offsets: PartitionOffsets::default() }
                    });
                    if st.offsets.started(origin.offset).is_err() {
                        // The partition rewound (a seek or a missed rebalance event): what
                        // was in flight before no longer decides this partition's commits.
                        next_epoch += 1;
                        *st = PartitionState { epoch: next_epoch, offsets: PartitionOffsets::default() };
                        let _ = st.offsets.started(origin.offset);
                        // Offsets it started before may come again: re-read the frontier.
                        sh.frontiers.forget(&[origin.partition]);
                    }
                    let epoch = st.epoch;
                    match admit(&sh, &bytes) {
                        Ok(job) if job.execute_at.is_some_and(|at| at > now_ms() + 100) => {
                            // Scheduled for later: the relay holds it (or parks it in the store).
                            let (sh2, tx) = (sh.clone(), done_tx.clone());
                            tasks.spawn(async move {
                                let ended = if exec::delay(&sh2, job).await { Ended::Skipped } else { Ended::NotDurable };
                                let _ = tx.send(Event::Done(Done { origin, epoch, had_slot: false, ended }));
                            });
                        }
                        Ok(job) => {
                            metrics::counter!(m::JOBS_RECEIVED, "pool" => pool).increment(1);
                            let q = Queued {
                                tenant: job.tenant.clone(),
                                job_type: job.job_type.clone(),
                                priority: job.priority,
                                job: Pending { job: Arc::new(job), origin, epoch, received_at: now_ms() },
                            };
                            let (tenant, partition) = (q.tenant.clone(), q.job.origin.partition);
                            if let Err((rej, q)) = dispatcher.enqueue(q, now_ms()) {
                                tracing::warn!(pool, %rej, "tenant buffer over its hard limit; partition paused");
                                overflow.push_back(q);
                            }
                            if dispatcher.queued(&tenant) >= limit {
                                if hot.insert(partition, tenant).is_none() {
                                    metrics::counter!(m::PARTITION_PAUSES, "pool" => pool).increment(1);
                                }
                            }
                        }
                        Err((job, class, reason)) => {
                            let sh2 = sh.clone();
                            let tx = done_tx.clone();
                            tasks.spawn(async move {
                                let durable = reject(&sh2, job, bytes, class, reason, &origin).await;
                                let ended = if durable { Ended::Skipped } else { Ended::NotDurable };
                                let _ = tx.send(Event::Done(Done { origin, epoch, had_slot: false, ended }));
                            });
                        }
                    }
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(wake)) => {}
            _ = stats_tick.tick() => {
                metrics::gauge!(m::QUEUED, "pool" => pool).set(buffering as f64);
                if let Ok(mut s) = sh.stats.lock() {
                    *s = dispatcher.stats_json(now_ms());
                }
                // Hand this pool's slot-time to the fleet accounting.
                let used = dispatcher.take_usage(now_ms());
                if let Ok(mut u) = sh.local_usage.lock() {
                    for (t, v) in used {
                        *u.entry(t).or_default() += v;
                    }
                }
            }
            Ok(()) = fleet.changed() => {
                let usage = fleet.borrow_and_update().clone();
                dispatcher.fold_fleet_usage(&usage, now_ms());
            }
        }

        // Retry what overflowed once its tenant drained.
        let mut still = VecDeque::new();
        while let Some(q) = overflow.pop_front() {
            if let Err((_, q)) = dispatcher.enqueue(q, now_ms()) {
                still.push_back(q);
            }
        }
        overflow = still;

        // Start every job the policy allows now (the policy enforces the slots). A job
        // frees its slot when its handler returns; outcomes still being written are
        // bounded separately, so a slow store holds new work back instead of piling up
        // unfinished outcomes.
        while finishing < slots {
            let Some((p, ticket)) = dispatcher.next(now_ms()) else { break };
            let ticket_at = ticket.dispatched_at;
            if ticket.fast_lane {
                metrics::counter!(m::FAST_LANE_DISPATCHES, "pool" => pool).increment(1);
            }
            let sh2 = sh.clone();
            let tx = done_tx.clone();
            let freed = done_tx.clone();
            tasks.spawn(async move {
                let slot = exec::SlotRelease::new(move |ran| {
                    let _ = freed.send(Event::Freed(ticket, ran));
                });
                let waited = exec::Waited { received_at: p.received_at, dispatched_at: ticket_at };
                let ended = exec::execute(sh2, p.job, p.origin.clone(), slot, waited).await;
                let _ = tx.send(Event::Done(Done { origin: p.origin, epoch: p.epoch, had_slot: true, ended }));
            });
        }
        while tasks.try_join_next().is_some() {}

        // Backpressure: a partition carrying a tenant whose buffer reached its limit is
        // paused (a flooding tenant fills only its own buffer) until that tenant drained
        // to half; every partition pauses while the worker's whole buffer is full.
        hot.retain(|p, tenant| {
            parts.contains_key(p)
                && (dispatcher.queued(tenant) > limit / 2 || overflow.iter().any(|q| q.job.origin.partition == *p))
        });
        let mut want_paused: HashSet<i32> = hot.keys().copied().collect();
        want_paused.extend(overflow.iter().map(|q| q.job.origin.partition));
        if dispatcher.queued_total() + overflow.len() >= GLOBAL_BUFFER {
            want_paused.extend(parts.keys().copied());
        }
        set_paused(&consumer, &topic, &mut paused, want_paused);
    }

    // Graceful shutdown: take no more work, let running jobs finish within the pool's
    // grace period, then commit what finished. Queued jobs are simply not committed:
    // the partitions' next owners get them.
    let queued = dispatcher.drain_where(&mut |_| true);
    let grace = sh.cfg.pool(sh.pool).default_timeout.min(Duration::from_secs(30));
    tracing::info!(pool, queued = queued.len(), running = dispatcher.running(), ?grace, "draining");
    let deadline = tokio::time::Instant::now() + grace;
    while dispatcher.running() + finishing > 0 {
        tokio::select! {
            Some(ev) = done_rx.recv() => {
                on_event(&sh, &consumer, &topic, &mut parts, &mut *dispatcher, &mut finishing, ev)
            }
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(pool, running = dispatcher.running(), "grace period over; handing running jobs back");
                break;
            }
        }
    }
    tasks.abort_all();
    if let Err(e) = consumer.commit_consumer_state(kafka::CommitMode::Sync) {
        tracing::debug!(pool, error = %e, "final commit");
    }
    consumer.unsubscribe();
    Ok(())
}

fn on_event(
    sh: &Shared,
    consumer: &kafka::WorkerConsumer,
    topic: &str,
    parts: &mut HashMap<i32, PartitionState>,
    dispatcher: &mut dyn Dispatcher<Pending>,
    finishing: &mut usize,
    ev: Event,
) {
    let done = match ev {
        Event::Freed(ticket, ran) => {
            dispatcher.complete(&ticket, now_ms(), ran);
            *finishing += 1;
            return;
        }
        Event::Done(done) => done,
    };
    if done.had_slot {
        *finishing = finishing.saturating_sub(1);
    }
    if done.ended == Ended::Skipped {
        metrics::counter!(m::JOBS_NOT_RUN, "pool" => sh.pool.as_str()).increment(1);
    }
    if done.ended == Ended::NotDurable {
        // Keep the offset unfinished: commits stop below it and the job is redelivered
        // after a restart or rebalance rather than lost.
        tracing::error!(
            pool = sh.pool.as_str(),
            partition = done.origin.partition,
            offset = done.origin.offset,
            "outcome not durable; holding the partition's commit below this offset"
        );
        return;
    }
    let Some(st) = parts.get_mut(&done.origin.partition) else {
        return;
    };
    if st.epoch != done.epoch {
        return; // finished after its partition moved away: the new owner decides.
    }
    if let Some(commit) = st.offsets.finished(done.origin.offset) {
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(topic, done.origin.partition, kafka::Offset::Offset(commit)).is_ok() {
            if let Err(e) = consumer.store_offsets(&tpl) {
                tracing::debug!(error = %e, "store offset (partition likely revoked)");
            }
        }
    }
}

fn set_paused(consumer: &kafka::WorkerConsumer, topic: &str, paused: &mut HashSet<i32>, want: HashSet<i32>) {
    let to_pause: Vec<i32> = want.difference(paused).copied().collect();
    let to_resume: Vec<i32> = paused.difference(&want).copied().collect();
    if !to_pause.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for p in &to_pause {
            tpl.add_partition(topic, *p);
        }
        if consumer.pause(&tpl).is_ok() {
            paused.extend(to_pause);
        }
    }
    if !to_resume.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for p in &to_resume {
            tpl.add_partition(topic, *p);
        }
        if consumer.resume(&tpl).is_ok() {
            for p in to_resume {
                paused.remove(&p);
            }
        }
    }
}

type Rejection = (Option<JobSubmitted>, FailureClass, String);

/// Decodes and validates a message; what cannot run goes to the DLQ with the reason.
fn admit(sh: &Shared, bytes: &[u8]) -> Result<JobSubmitted, Rejection> {
    let job =
        codec::decode_job(bytes).map_err(|e| (None, FailureClass::Permanent, format!("undecodable message: {e}")))?;
    let bad = |why: String| Err((Some(job.clone()), FailureClass::Permanent, why));
    if uuid::Uuid::parse_str(&job.job_id).is_err() {
        return bad(format!("job_id {:?} is not a UUID; producers must send a UUID (v7 recommended)", job.job_id));
    }
    if !sh.cfg.tenants.contains_key(&job.tenant) {
        return bad(format!(
            "unknown tenant {:?}; add [tenants.{}] to the config or fix the producer",
            job.tenant, job.tenant
        ));
    }
    if !sh.cfg.job_types.contains_key(&job.job_type) {
        return bad(format!(
            "unknown job type {:?}; add [job_types.{}] to the config or fix the producer",
            job.job_type, job.job_type
        ));
    }
    if job.payload.len() > sh.cfg.worker.max_payload_bytes {
        return bad(format!(
            "payload is {} bytes, above worker.max_payload_bytes = {}; store large inputs elsewhere and pass a reference",
            job.payload.len(),
            sh.cfg.worker.max_payload_bytes
        ));
    }
    Ok(job)
}

async fn reject(
    sh: &Shared,
    job: Option<JobSubmitted>,
    raw: Vec<u8>,
    class: FailureClass,
    reason: String,
    origin: &Origin,
) -> bool {
    tracing::warn!(pool = sh.pool.as_str(), topic = %origin.topic, partition = origin.partition, offset = origin.offset, %reason, "dead-lettering message");
    let raw = if job.is_none() { Some(raw) } else { None };
    let dl = exec::dead_letter(
        sh,
        job.as_ref(),
        raw,
        class,
        reason.clone(),
        None,
        job.as_ref().map(|j| j.attempt).unwrap_or(0),
        origin,
    )
    .await;
    if let Some(job) = &job {
        // A decodable job still gets its one terminal result, so submitters are not left waiting.
        return exec::finish(sh, job, JobStatus::Failed, None, Some(reason), Some(class), None).await && dl;
    }
    dl
}
