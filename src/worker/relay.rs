//! The retry relay: consumes the per-class retry topics and hands each job back to its
//! pool topic once its `not_before` is due, so the retried job goes through the fair
//! scheduler like any other. A partition whose head is not due yet is paused (no busy
//! polling, other partitions keep flowing) and resumed when it is. A delayed job goes back
//! a little ahead of its `execute_at` (`core::promotion::release_at`) and its pool worker
//! holds it until then, so the hops are behind it when it falls due.

use super::durable::{self, with_retries};
use super::route::Origin;
use crate::config::Config;
use crate::core::offsets::PartitionOffsets;
use crate::core::promotion::{self, Pace};
use crate::kafka::{self, Consumer, Message, RebalanceEvent, TopicPartitionList};
use crate::model::{FailureClass, JobSubmitted, Millis, Pool};
use crate::{codec, metrics as m, now_ms};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

struct Held {
    job: JobSubmitted,
    offset: i64,
}

impl Held {
    /// When it goes back to its pool (`core::promotion::release_at`).
    fn release_at(&self) -> Millis {
        promotion::release_at(self.job.not_before.unwrap_or(0), self.job.execute_at)
    }
}

#[derive(Default)]
struct PartitionState {
    held: VecDeque<Held>,
    offsets: PartitionOffsets,
    incarnation: u64,
}

type Key = kafka::TopicPartition;

/// The topics the relay serves: the per-class retry topics and the delayed topic.
pub fn relay_topics(cfg: &Config) -> Vec<String> {
    let mut t: Vec<String> =
        [FailureClass::AppError, FailureClass::Timeout, FailureClass::Dependency, FailureClass::WorkerCrash]
            .iter()
            .map(|c| cfg.retry_topic(*c))
            .collect();
    t.push(cfg.delayed_topic());
    t
}

/// A job's hand-off is durable: its partition, offset and the partition state's incarnation.
type Done = (Key, i64, u64);

/// The retry relay loop: hands each retried job back to its pool topic once due.
pub async fn run(
    cfg: Arc<Config>,
    producer: crate::kafka::Producer,
    store: crate::store::Store,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), kafka::KafkaError> {
    let topics = relay_topics(&cfg);
    let group = cfg.group("retry");
    let (consumer, mut rebalances) = kafka::consumer(&cfg, &group, &topics)?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut relay = Relay::new(cfg, producer, store, done_tx);
    loop {
        let next_due = relay.next_due();
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(ev) = rebalances.recv() => relay.on_rebalance(&consumer, ev),
            Some(done) = done_rx.recv() => relay.on_done(&consumer, done),
            msg = consumer.recv() => match msg {
                Err(e) => { tracing::warn!(error = %e, hint = kafka::error_hint(&e), "retry relay consumer error"); tokio::time::sleep(Duration::from_millis(200)).await; }
                Ok(m) => relay.on_message(m),
            },
            _ = tokio::time::sleep(next_due) => {}
        }
        relay.release_due(&consumer);
    }
    let _ = consumer.commit_consumer_state(kafka::CommitMode::Sync);
    Ok(())
}

/// The relay loop's state besides the consumer: partitions, their held jobs, incarnations.
struct Relay {
    cfg: Arc<Config>,
    producer: crate::kafka::Producer,
    store: crate::store::Store,
    done_tx: mpsc::UnboundedSender<Done>,
    parts: HashMap<Key, PartitionState>,
    incarnation: u64,
    /// Partitions paused while their head waits (kept apart from `parts`: a state
    /// started afresh must not forget a pause librdkafka still holds).
    pauses: kafka::Pauses,
    // Jobs due within this long are held here (their partition paused); later ones are
    // parked in the store for the promoter, so a 30-minute backoff never blocks the
    // 1-second retries behind it in the same partition.
    hold_at_most: i64,
}

impl Relay {
    /// A relay with no partitions yet.
    fn new(
        cfg: Arc<Config>,
        producer: crate::kafka::Producer,
        store: crate::store::Store,
        done_tx: mpsc::UnboundedSender<Done>,
    ) -> Self {
        let hold_at_most = cfg.worker.relay_hold_max.as_millis() as i64;
        Relay {
            cfg,
            producer,
            store,
            done_tx,
            parts: HashMap::new(),
            incarnation: 0,
            pauses: Default::default(),
            hold_at_most,
        }
    }

    /// How long the loop may sleep: until the earliest held head is due (1 ms to 1 min).
    fn next_due(&self) -> Duration {
        let now = now_ms();
        let next_due = self
            .parts
            .values()
            .filter_map(|p| p.held.front().map(|h| h.release_at()))
            .min()
            .map(|t| (t - now).clamp(1, 60_000) as u64)
            .unwrap_or(60_000);
        Duration::from_millis(next_due)
    }

    /// A rebalance: assigned partitions get a state (and lose a pause kept from before a
    /// revocation); revoked ones are forgotten, and remembered if they were paused.
    fn on_rebalance(&mut self, consumer: &kafka::WorkerConsumer, ev: RebalanceEvent) {
        match ev {
            RebalanceEvent::Assigned(tps) => {
                self.pauses.assigned(consumer, &tps);
                for k in tps {
                    // Keep a state a message already created (see pool.rs).
                    self.parts.entry(k).or_insert_with(|| {
                        self.incarnation += 1;
                        PartitionState { incarnation: self.incarnation, ..Default::default() }
                    });
                }
            }
            RebalanceEvent::Revoked(tps) | RebalanceEvent::Lost(tps) => {
                self.pauses.revoked(&tps);
                for k in &tps {
                    self.parts.remove(k);
                }
            } // The relay's consumers report no statistics, so no stall is ever reported.
            RebalanceEvent::Stalled(_) | RebalanceEvent::GroupStuck(_) => {}
        }
    }

    /// A job's hand-off is durable: store the offset it lets the partition commit, unless
    /// the partition's state changed since (another incarnation).
    fn on_done(&mut self, consumer: &kafka::WorkerConsumer, (key, offset, ep): Done) {
        if let Some(st) = self.parts.get_mut(&key) {
            if st.incarnation == ep {
                if let Some(c) = st.offsets.finished(offset) {
                    let mut tpl = TopicPartitionList::new();
                    if tpl.add_partition_offset(&key.0, key.1, kafka::Offset::Offset(c)).is_ok() {
                        let _ = consumer.store_offsets(&tpl);
                    }
                }
            }
        }
    }

    /// A message from a relay topic: track its offset, then park its job in the store
    /// (due far ahead), hold it (due soon) or dead-letter it (undecodable).
    fn on_message(&mut self, m: kafka::BorrowedMessage<'_>) {
        let key: Key = (m.topic().to_string(), m.partition());
        let offset = m.offset();
        let payload = m.payload().unwrap_or_default();
        let decoded = codec::decode_job(payload).map_err(|e| (e, payload.to_vec()));
        drop(m);
        let hold_at_most = self.hold_at_most;
        let st = self.track(&key, offset);
        match decoded {
            Ok(job) if job.not_before.unwrap_or(0) - now_ms() > hold_at_most => {
                // Far in the future: park it in the store, release the partition.
                let ep = st.incarnation;
                self.park(key, offset, ep, job);
            }
            Ok(job) => st.held.push_back(Held { job, offset }),
            Err((e, raw)) => {
                // Only fairway writes retry topics, but a record it cannot read
                // any more (a schema it does not know) is dead-lettered, never
                // dropped; its offset is released once the dead letter is acked.
                let ep = st.incarnation;
                self.dead_letter(key, offset, ep, e, raw);
            }
        }
    }

    /// The state of a message's partition, under a new incarnation: created if new, started
    /// afresh if its offsets refuse this one.
    fn track(&mut self, key: &Key, offset: i64) -> &mut PartitionState {
        self.incarnation += 1;
        let e2 = self.incarnation;
        let st =
            self.parts.entry(key.clone()).or_insert_with(|| PartitionState { incarnation: e2, ..Default::default() });
        if st.offsets.started(offset).is_err() {
            *st = PartitionState { incarnation: e2, ..Default::default() };
            let _ = st.offsets.started(offset);
        }
        st
    }

    /// Parks a job due far ahead in the store for the promoter; its offset is released
    /// once it is parked.
    fn park(&self, key: Key, offset: i64, ep: u64, job: JobSubmitted) {
        let (store, tx) = (self.store.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let at = job.not_before.unwrap_or(0);
            let parked = match codec::encode_job(&job) {
                Ok(bytes) => with_retries(|| store.put_scheduled(at, &job.job_id, &bytes)).await,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode job to park");
                    Ok(())
                }
            };
            match parked {
                Ok(()) => {
                    let _ = tx.send((key, offset, ep));
                }
                // Not parked: leave the offset uncommitted; it is redelivered.
                Err(e) => tracing::error!(error = %e, job_id = %job.job_id, "cannot park job"),
            }
        });
    }

    /// Dead-letters a record that cannot be decoded; its offset is released once acked.
    fn dead_letter(&self, key: Key, offset: i64, ep: u64, e: codec::CodecError, raw: Vec<u8>) {
        let (cfg, producer, tx) = (self.cfg.clone(), self.producer.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let origin =
                Origin { topic: key.0.clone(), partition: key.1, offset, submitted: false, taken_again: false };
            if durable::dead_letter_undecodable(&cfg, &producer, raw, &e, &origin).await.is_yes() {
                let _ = tx.send((key, offset, ep));
            }
        });
    }

    /// After every wake of the loop: hands every due head back to its pool, then pauses
    /// the partitions whose head must wait and resumes the others.
    fn release_due(&mut self, consumer: &kafka::WorkerConsumer) {
        // Release every due head; pause partitions whose head must wait.
        let now = now_ms();
        for (key, st) in self.parts.iter_mut() {
            while st.held.front().is_some_and(|h| h.release_at() <= now) {
                let Some(h) = st.held.pop_front() else { break };
                let (cfg, producer, tx, key, ep) =
                    (self.cfg.clone(), self.producer.clone(), self.done_tx.clone(), key.clone(), st.incarnation);
                tokio::spawn(hand_back(cfg, producer, tx, key, h, ep));
            }
        }
        // Pause the partitions whose head must wait, resume the others.
        let want = self.parts.iter().filter(|(_, st)| !st.held.is_empty()).map(|(k, _)| k.clone()).collect();
        self.pauses.set(consumer, &want);
    }
}

/// Produces a due retry to its pool topic; its offset is released once acknowledged.
async fn hand_back(
    cfg: Arc<Config>,
    producer: crate::kafka::Producer,
    tx: mpsc::UnboundedSender<Done>,
    key: Key,
    h: Held,
    ep: u64,
) {
    let pool = h.job.pool.or_else(|| cfg.job_types.get(&h.job.job_type).map(|j| j.pool)).unwrap_or(Pool::Short);
    let topic = cfg.pool_topic(pool);
    match codec::encode_job(&h.job) {
        Ok(bytes) => {
            let headers = kafka::trace_headers(&h.job);
            let send = || kafka::send_with_headers(&producer, &topic, &h.job.tenant, &bytes, &headers);
            if let Err(e) = with_retries(send).await {
                // Not acknowledged: keep the offset uncommitted so it is redelivered.
                tracing::error!(error = %e, job_id = %h.job.job_id, "cannot hand retry back to its pool");
                return;
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot encode retry"),
    }
    let _ = tx.send((key, h.offset, ep));
}

/// The promoter's lease: its holder also fires recurring schedules (`worker::schedules`).
pub const PROMOTER_LEASE: &str = "promoter";
pub const PROMOTER_LEASE_SECS: i32 = 10;

/// The promoter: one leader at a time (LWT lease) moves parked jobs whose time has come
/// from the scheduled table back to their pool topics, at most `worker.promoter_rate`
/// per second (`core::promotion::Pace`), oldest first, and reports how long the oldest
/// due job still parked has waited (`fairway_oldest_due_unpromoted_age_seconds`).
pub async fn promoter_loop(
    cfg: Arc<Config>,
    producer: crate::kafka::Producer,
    store: crate::store::Store,
    worker_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    // The first minute bucket not yet fully promoted; a new leader starts at the oldest
    // bucket the index names, however old.
    let mut cursor: Option<i64> = None;
    let mut pace = Pace::new(cfg.worker.promoter_rate);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        match store.lease(PROMOTER_LEASE, &worker_id, PROMOTER_LEASE_SECS, now_ms()).await {
            Ok(true) => {}
            _ => {
                cursor = None;
                continue;
            }
        }
        let now = now_ms();
        let current = crate::store::schedule_bucket(now);
        let mut budget = pace.take(usize::MAX, now);
        let (mut all_done, mut oldest_left) = (true, None);
        for bucket in buckets_to_visit(&store, cursor, current).await {
            let pass = promote_bucket(&cfg, &producer, &store, bucket, now, &mut budget).await;
            all_done &= pass.all_done;
            oldest_left = oldest_left.or(pass.oldest_left);
            // Only buckets entirely in the past can be left behind for good.
            if all_done && bucket < current {
                cursor = Some(bucket + 1);
                if let Err(e) = store.delete_scheduled_bucket(bucket).await {
                    tracing::debug!(error = %e, bucket, "could not forget a promoted bucket (visited again, empty)");
                }
            }
            if budget == 0 && !pass.all_done {
                break;
            }
        }
        metrics::gauge!(m::OLDEST_DUE_UNPROMOTED_AGE).set(promotion::oldest_due_age_secs(oldest_left, now_ms()));
    }
}

/// The buckets one promoter pass visits, oldest first, from `cursor` (a new leader:
/// from the oldest one named): those the `scheduled_buckets` index names, at most
/// `INDEX_READ`. Every parked job's bucket is indexed before its row is written
/// (`Store::put_scheduled`), so no other bucket holds one.
async fn buckets_to_visit(store: &crate::store::Store, cursor: Option<i64>, current: i64) -> Vec<i64> {
    const INDEX_READ: usize = 1_000;
    match store.scheduled_buckets(cursor.unwrap_or(i64::MIN), current, INDEX_READ).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "promoter: cannot read the scheduled buckets index; nothing promoted this pass");
            Vec::new()
        }
    }
}

/// What one pass over a bucket left.
struct BucketPass {
    /// Every due job of the bucket was promoted.
    all_done: bool,
    /// The oldest due job left parked (out of budget, or its produce failed).
    oldest_left: Option<Millis>,
}

/// Promotes the due jobs of one minute bucket, oldest first, while `budget` lasts.
async fn promote_bucket(
    cfg: &Config,
    producer: &crate::kafka::Producer,
    store: &crate::store::Store,
    bucket: i64,
    now: Millis,
    budget: &mut usize,
) -> BucketPass {
    // One more than the budget: tells whether jobs are left beyond it.
    let due = match store.scheduled_due(bucket, now, budget.saturating_add(1)).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, bucket, "promoter read failed");
            return BucketPass { all_done: false, oldest_left: None };
        }
    };
    let mut pass = BucketPass { all_done: true, oldest_left: None };
    for (at, job_id, blob) in due {
        if *budget == 0 {
            pass.all_done = false;
            pass.oldest_left = pass.oldest_left.or(Some(at));
            break;
        }
        *budget -= 1;
        let job = match codec::decode_job(&blob) {
            Ok(job) => job,
            Err(e) => {
                let origin = Origin {
                    topic: "store:scheduled_jobs".into(),
                    partition: -1,
                    offset: at,
                    submitted: false,
                    taken_again: false,
                };
                if durable::dead_letter_undecodable(cfg, producer, blob, &e, &origin).await.is_yes() {
                    let _ = store.delete_scheduled(at, &job_id).await;
                } else {
                    pass.all_done = false;
                }
                continue;
            }
        };
        let pool = job.pool.or_else(|| cfg.job_types.get(&job.job_type).map(|j| j.pool)).unwrap_or(Pool::Short);
        let headers = kafka::trace_headers(&job);
        if kafka::send_with_headers(producer, &cfg.pool_topic(pool), &job.tenant, &blob, &headers).await.is_ok() {
            let _ = store.delete_scheduled(at, &job_id).await;
            metrics::counter!(m::JOBS_PROMOTED).increment(1);
        } else {
            pass.all_done = false;
            pass.oldest_left = pass.oldest_left.or(Some(at));
        }
    }
    pass
}
