//! The retry relay: consumes the per-class retry topics and hands each job back to its
//! pool topic once its `not_before` is due, so the retried job goes through the fair
//! scheduler like any other. A partition whose head is not due yet is paused (no busy
//! polling, other partitions keep flowing) and resumed when it is.

use super::exec::Origin;
use super::outcome::{self, with_retries};
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

#[derive(Default)]
struct PartitionState {
    held: VecDeque<Held>,
    offsets: PartitionOffsets,
    paused: bool,
    epoch: u64,
}

type Key = (String, i32);

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

pub async fn run(
    cfg: Arc<Config>,
    producer: rdkafka::producer::FutureProducer,
    store: crate::store::Store,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), kafka::KafkaError> {
    let topics = relay_topics(&cfg);
    let group = cfg.group("retry");
    let (consumer, mut rebalances) = kafka::consumer(&cfg, &group, &topics)?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Key, i64, u64)>();
    let mut parts: HashMap<Key, PartitionState> = HashMap::new();
    let mut epoch = 0u64;
    // Partitions revoked while paused: librdkafka keeps them paused until resumed.
    let mut stale_pauses: std::collections::HashSet<Key> = Default::default();
    // Jobs due within this long are held here (their partition paused); later ones are
    // parked in the store for the promoter, so a 30-minute backoff never blocks the
    // 1-second retries behind it in the same partition.
    let hold_at_most = cfg.worker.relay_hold_max.as_millis() as i64;
    loop {
        let now = now_ms();
        let next_due = parts
            .values()
            .filter_map(|p| p.held.front().map(|h| h.job.not_before.unwrap_or(0)))
            .min()
            .map(|t| (t - now).clamp(1, 60_000) as u64)
            .unwrap_or(60_000);
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(ev) = rebalances.recv() => match ev {
                RebalanceEvent::Assigned(tps) => {
                    // A partition paused for its held head, revoked and given back would
                    // stay paused in librdkafka while its new state says it is not.
                    let (lift, _): (Vec<Key>, Vec<Key>) = tps.iter().cloned().partition(|k| stale_pauses.remove(k));
                    kafka::lift_pauses(&consumer, &lift);
                    for k in tps {
                        // Keep a state a message already created (see pool.rs).
                        parts.entry(k).or_insert_with(|| {
                            epoch += 1;
                            PartitionState { epoch, ..Default::default() }
                        });
                    }
                }
                RebalanceEvent::Revoked(tps) => for k in tps {
                    if parts.remove(&k).is_some_and(|st| st.paused) {
                        stale_pauses.insert(k);
                    }
                },
            },
            Some((key, offset, ep)) = done_rx.recv() => {
                if let Some(st) = parts.get_mut(&key) {
                    if st.epoch == ep {
                        if let Some(c) = st.offsets.finished(offset) {
                            let mut tpl = TopicPartitionList::new();
                            if tpl.add_partition_offset(&key.0, key.1, kafka::Offset::Offset(c)).is_ok() {
                                let _ = consumer.store_offsets(&tpl);
                            }
                        }
                    }
                }
            }
            msg = consumer.recv() => match msg {
                Err(e) => { tracing::warn!(error = %e, "retry relay consumer error"); tokio::time::sleep(Duration::from_millis(200)).await; }
                Ok(m) => {
                    let key: Key = (m.topic().to_string(), m.partition());
                    let offset = m.offset();
                    let payload = m.payload().unwrap_or_default();
                    let decoded = codec::decode_job(payload).map_err(|e| (e, payload.to_vec()));
                    drop(m);
                    epoch += 1;
                    let e2 = epoch;
                    let st = parts.entry(key.clone()).or_insert_with(|| PartitionState { epoch: e2, ..Default::default() });
                    if st.offsets.started(offset).is_err() {
                        *st = PartitionState { epoch: e2, ..Default::default() };
                        let _ = st.offsets.started(offset);
                    }
                    match decoded {
                        Ok(job) if job.not_before.unwrap_or(0) - now_ms() > hold_at_most => {
                            // Far in the future: park it in the store, release the partition.
                            let (store, tx, ep) = (store.clone(), done_tx.clone(), st.epoch);
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
                        Ok(job) => st.held.push_back(Held { job, offset }),
                        Err((e, raw)) => {
                            // Only fairway writes retry topics, but a record it cannot read
                            // any more (a schema it does not know) is dead-lettered, never
                            // dropped; its offset is released once the dead letter is acked.
                            let (cfg, producer, tx, ep) = (cfg.clone(), producer.clone(), done_tx.clone(), st.epoch);
                            tokio::spawn(async move {
                                let origin = Origin { topic: key.0.clone(), partition: key.1, offset };
                                if outcome::dead_letter_undecodable(&cfg, &producer, raw, &e, &origin).await {
                                    let _ = tx.send((key, offset, ep));
                                }
                            });
                        }
                    }
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(next_due)) => {}
        }

        // Release every due head; pause partitions whose head must wait.
        let now = now_ms();
        for (key, st) in parts.iter_mut() {
            while st.held.front().is_some_and(|h| h.job.not_before.unwrap_or(0) <= now) {
                let Some(h) = st.held.pop_front() else { break };
                let (cfg, producer, tx, key, ep) =
                    (cfg.clone(), producer.clone(), done_tx.clone(), key.clone(), st.epoch);
                tokio::spawn(async move {
                    let pool = h
                        .job
                        .pool
                        .or_else(|| cfg.job_types.get(&h.job.job_type).map(|j| j.pool))
                        .unwrap_or(Pool::Short);
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
                });
            }
            let want_pause = !st.held.is_empty();
            if want_pause != st.paused {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&key.0, key.1);
                let r = if want_pause { consumer.pause(&tpl) } else { consumer.resume(&tpl) };
                if r.is_ok() {
                    st.paused = want_pause;
                }
            }
        }
    }
    let _ = consumer.commit_consumer_state(kafka::CommitMode::Sync);
    Ok(())
}

/// The promoter: one leader at a time (LWT lease) moves parked jobs whose time has come
/// from the scheduled table back to their pool topics, at most `worker.promoter_rate`
/// per second (`core::promotion::Pace`), oldest first, and reports how long the oldest
/// due job still parked has waited (`fairway_oldest_due_unpromoted_age_seconds`).
pub async fn promoter_loop(
    cfg: Arc<Config>,
    producer: rdkafka::producer::FutureProducer,
    store: crate::store::Store,
    worker_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    const LEASE_SECS: i32 = 10;
    // Minute buckets not yet fully promoted; a new leader looks back a day.
    let mut cursor: Option<i64> = None;
    let mut pace = Pace::new(cfg.worker.promoter_rate);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        match store.lease("promoter", &worker_id, LEASE_SECS, now_ms()).await {
            Ok(true) => {}
            _ => {
                cursor = None;
                continue;
            }
        }
        let now = now_ms();
        let current = crate::store::schedule_bucket(now);
        let from = cursor.unwrap_or(current - 24 * 60);
        let mut budget = pace.take(usize::MAX, now);
        let (mut all_done, mut oldest_left) = (true, None);
        for bucket in from..=current {
            let pass = promote_bucket(&cfg, &producer, &store, bucket, now, &mut budget).await;
            all_done &= pass.all_done;
            oldest_left = oldest_left.or(pass.oldest_left);
            // Only buckets entirely in the past can be left behind for good.
            if all_done && bucket < current {
                cursor = Some(bucket + 1);
            }
            if budget == 0 && !pass.all_done {
                break;
            }
        }
        metrics::gauge!(m::OLDEST_DUE_UNPROMOTED_AGE).set(promotion::oldest_due_age_secs(oldest_left, now_ms()));
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
    producer: &rdkafka::producer::FutureProducer,
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
                let origin = Origin { topic: "store:scheduled_jobs".into(), partition: -1, offset: at };
                if outcome::dead_letter_undecodable(cfg, producer, blob, &e, &origin).await {
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
