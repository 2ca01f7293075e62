//! Watching a job, the I/O shell (rules: `core::events`, statements: `store::events`).
//!
//! - **The job records are the first and last events.** A job's `queued` / `scheduled`
//!   event is its original record on its pool topic (`core::events::from_submission`),
//!   its end its record on the results topic (`core::events::from_result`): the recorder
//!   and the feed read those topics too, so a short job (done within 250 ms) costs no
//!   event record at all, and a job produced straight to Kafka is visible (from its
//!   history) as soon as the recorder reads it, before any worker runs it. A job whose
//!   submitter wrote its packed `queued` state (`core::events::STATE_WRITTEN_HEADER` on
//!   its record) costs no `queued` row either: its history tells that event from the
//!   state (`core::events::with_submission`), so the API's common submission costs the
//!   database no write of its own beyond its share of a pack.
//! - **Publishing.** Lifecycle and progress events go to `<prefix>events` (Avro
//!   `schemas/job_event.avsc`, key = job id, so one job's events stay in order on one
//!   partition). They are produced without waiting for the acknowledgement: a worker's
//!   hot path never waits for an event, and an event the producer cannot queue is
//!   dropped and counted (`fairway_events_dropped_total`); the job's row stays the truth.
//! - **History.** The recorder ([`record`], run by `fairway serve`) consumes the topic
//!   in its own consumer group and writes each job's events to `job_events` (TTL
//!   `retention.results`), committing only what is written; an API down for a while
//!   catches up (within `retention.events`).
//! - **Push.** [`Feed`] tails the topic from its end in every API process (own group, no
//!   commits) and broadcasts to the SSE streams, which also re-read the history every
//!   second to fill any gap (events are deduplicated by id). A record is decoded only
//!   while a stream listens.

use crate::config::Config;
use crate::core::events as rules;
use crate::kafka::{self, Consumer, Message};
use crate::model::{EventKind, JobEvent, JobSubmitted, Millis};
use crate::seams::RouteBroker;
use crate::store::Store;
use crate::{codec, metrics as m, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};

fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Publishes an event without waiting (see the module docs).
pub fn emit(producer: &dyn RouteBroker, cfg: &Config, ev: &JobEvent) {
    if !cfg.events.publish {
        return;
    }
    let Ok(bytes) = codec::encode_event(ev) else { return };
    if producer.send_nowait(&cfg.events_topic(), &ev.job_id, &bytes) {
        metrics::counter!(m::EVENTS_PUBLISHED, "kind" => ev.kind.as_str()).increment(1);
    } else {
        metrics::counter!(m::EVENTS_DROPPED).increment(1);
    }
}

/// A worker's event about `job` (`worker` set).
fn worker_event(job: &JobSubmitted, kind: EventKind, worker: &str) -> JobEvent {
    JobEvent { worker: Some(worker.to_string()), ..rules::event(new_id(), job, kind, now_ms()) }
}

/// `started`: an attempt has run for a moment (published with the job's running row,
/// after 250 ms: short jobs go from `queued` straight to their result).
pub fn started(producer: &dyn RouteBroker, cfg: &Config, worker: &str, job: &JobSubmitted, at: Millis) {
    emit(producer, cfg, &JobEvent { at, ..worker_event(job, EventKind::Started, worker) });
}

/// `progress`: a running job reported progress (the caller throttles with
/// `core::events::ProgressGate`).
pub fn progress(producer: &dyn RouteBroker, cfg: &Config, worker: &str, job: &JobSubmitted, p: f64, msg: &str) {
    let ev = JobEvent {
        progress: Some(p),
        message: (!msg.is_empty()).then(|| msg.to_string()),
        ..worker_event(job, EventKind::Progress, worker)
    };
    emit(producer, cfg, &ev);
}

/// A running job's progress reports as `progress` events, throttled by
/// `core::events::ProgressGate` (a 1 % step or a new message, at most every 250 ms).
pub struct ProgressSink {
    producer: Arc<dyn RouteBroker>,
    cfg: Arc<Config>,
    worker: String,
    job: Arc<JobSubmitted>,
    gate: std::sync::Mutex<rules::ProgressGate>,
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressSink").field("job_id", &self.job.job_id).finish()
    }
}

impl ProgressSink {
    pub fn new(producer: Arc<dyn RouteBroker>, cfg: &Arc<Config>, worker: &str, job: &Arc<JobSubmitted>) -> Self {
        ProgressSink {
            producer,
            cfg: cfg.clone(),
            worker: worker.to_string(),
            job: job.clone(),
            gate: std::sync::Mutex::new(rules::ProgressGate::new(0.01, 250)),
        }
    }
    pub fn report(&self, p: f64, msg: &str) {
        let pass = self.gate.lock().map(|mut g| g.admit(p, msg, now_ms())).unwrap_or(false);
        if pass {
            progress(self.producer.as_ref(), &self.cfg, &self.worker, &self.job, p, msg);
        }
    }
}

/// `pool_reclassified`: the classifier's leader moved `job_type` (see
/// `core::events::pool_reclassified`).
pub fn pool_reclassified(
    producer: &dyn RouteBroker,
    cfg: &Config,
    worker: &str,
    subject: &crate::core::classifier::Subject,
    message: String,
    sticky_until: Millis,
) {
    let ev = rules::pool_reclassified(new_id(), subject, message, sticky_until, now_ms());
    emit(producer, cfg, &JobEvent { worker: Some(worker.to_string()), ..ev });
}

/// `dependency_circuit_open` / `_closed` (see `core::events::dependency_circuit`).
pub fn dependency_circuit(
    producer: &dyn RouteBroker,
    cfg: &Config,
    dependency: &str,
    open: bool,
    message: String,
    until: Option<Millis>,
) {
    let mut types: Vec<&str> = cfg
        .job_types
        .iter()
        .filter(|(_, jt)| jt.dependencies.iter().any(|d| d == dependency))
        .map(|(n, _)| n.as_str())
        .collect();
    types.sort_unstable();
    let ev = rules::dependency_circuit(new_id(), dependency, &types.join(","), open, message, until, now_ms());
    emit(producer, cfg, &ev);
}

/// `replayed`: a replay put `job` (as produced, its replay count raised) back on its pool
/// topic (see `core::events::replayed`); `at`: taken before the produce, so the event
/// comes before every event of the new run.
pub fn replayed(
    producer: &dyn RouteBroker,
    cfg: &Config,
    job: &JobSubmitted,
    requested_by: &str,
    replay_id: &str,
    at: Millis,
) {
    emit(producer, cfg, &rules::replayed(new_id(), job, requested_by, replay_id, at));
}

/// `retrying`: an attempt failed and the next is due at `next_at`.
pub fn retrying(
    producer: &dyn RouteBroker,
    cfg: &Config,
    worker: &str,
    job: &JobSubmitted,
    next_at: Millis,
    error: &str,
) {
    let ev = JobEvent {
        next_attempt_at: Some(next_at),
        message: Some(error.to_string()),
        ..worker_event(job, EventKind::Retrying, worker)
    };
    emit(producer, cfg, &ev);
}

/// `late_execution`: picked after its `not_after` (then `expired` follows).
pub fn late(producer: &dyn RouteBroker, cfg: &Config, worker: &str, job: &JobSubmitted, not_after: Millis) {
    let ev = JobEvent { worker: Some(worker.to_string()), ..rules::late_execution(new_id(), job, not_after, now_ms()) };
    emit(producer, cfg, &ev);
}

/// `dead_lettered`: the job went to the DLQ (a `failed` follows).
pub fn dead_lettered(producer: &dyn RouteBroker, cfg: &Config, worker: &str, job: &JobSubmitted, reason: &str) {
    let ev = JobEvent { message: Some(reason.to_string()), ..worker_event(job, EventKind::DeadLettered, worker) };
    emit(producer, cfg, &ev);
}

/// An event from a message of the events topic, the terminal event of a result, or the
/// `queued` / `scheduled` event of a job's original record.
fn decode(bytes: &[u8]) -> Option<JobEvent> {
    match codec::sniff(bytes)? {
        codec::RecordKind::JobEvent => codec::decode_event(bytes).ok(),
        codec::RecordKind::JobResult => codec::decode_result(bytes).ok().map(|r| rules::from_result(&r)),
        codec::RecordKind::JobSubmitted => codec::decode_job(bytes).ok().as_ref().and_then(rules::from_submission),
        _ => None,
    }
}

/// The event the recorder writes for a message: none for a job's original record whose
/// submitter wrote its `queued` state (`core::events::STATE_WRITTEN_HEADER`: the history
/// tells it from the state, `core::events::with_submission`), else [`decode`]'s.
fn to_record(m: &impl Message) -> Option<JobEvent> {
    use crate::kafka::Headers;
    let written = m.headers().is_some_and(|h| h.iter().any(|h| h.key == rules::STATE_WRITTEN_HEADER));
    if written {
        return None;
    }
    m.payload().and_then(decode)
}

/// The topics events are read from: the events topic, the results topic and the pool
/// topics (see the module docs).
fn sources(cfg: &Config) -> Vec<String> {
    let mut t = vec![cfg.events_topic(), cfg.results_topic()];
    t.extend(crate::model::Pool::ALL.map(|p| cfg.pool_topic(p)));
    t
}

// ---------------------------------------------------------------------------------------
// History recorder
// ---------------------------------------------------------------------------------------

/// Most events written per batch.
const RECORD_BATCH: usize = 500;

/// Why the events history recorder could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
}

/// Consumes the events topic (group `<group prefix>events-history`) and writes each
/// event to its job's history until `stop` turns true. Offsets are committed only after
/// a batch is written: an event is recorded at least once (rows are idempotent).
pub async fn record(cfg: Arc<Config>, store: Store, mut stop: watch::Receiver<bool>) -> Result<(), RecorderError> {
    let stmts = store.event_statements().await?;
    let consumer = kafka::reader(&cfg, &cfg.group("events-history"), false)?;
    let topics = sources(&cfg);
    consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>()).map_err(kafka::KafkaError::from)?;
    let ttl = rules::row_ttl_secs(cfg.retention.results, 0, None);
    loop {
        let mut batch = Vec::new();
        // Wait for one message, then take what else arrives within 50 ms.
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            m = consumer.recv() => match m {
                Ok(m) => batch.extend(to_record(&m)),
                Err(e) => {
                    tracing::warn!(error = %e, "events recorder: consume failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        }
        let until = tokio::time::Instant::now() + Duration::from_millis(50);
        while batch.len() < RECORD_BATCH {
            match tokio::time::timeout_at(until, consumer.recv()).await {
                Ok(Ok(m)) => batch.extend(to_record(&m)),
                _ => break,
            }
        }
        // Written (with retries) before the offsets move on.
        let mut delay = Duration::from_millis(200);
        loop {
            match stmts.put_events(&batch, ttl).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!(m::EVENT_RECORD_FAILURES).increment(1);
                    tracing::warn!(error = %e, "events recorder: cannot write history; retrying");
                    if *stop.borrow() {
                        return Ok(());
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
        metrics::counter!(m::EVENTS_RECORDED).increment(batch.len() as u64);
        if let Err(e) = consumer.commit_consumer_state(kafka::CommitMode::Async) {
            tracing::debug!(error = %e, "events recorder: commit failed (re-recorded after a restart)");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Live feed
// ---------------------------------------------------------------------------------------

/// Live events of this deployment, from the topic's end (see the module docs).
#[derive(Clone)]
pub struct Feed {
    tx: broadcast::Sender<Arc<JobEvent>>,
}

/// Events buffered per slow subscriber before it skips (it then re-reads history).
const FEED_BUFFER: usize = 4096;

impl Feed {
    /// Starts tailing the events topic until `stop` turns true.
    pub fn start(cfg: &Config, mut stop: watch::Receiver<bool>) -> Result<Feed, kafka::KafkaError> {
        let (tx, _) = broadcast::channel(FEED_BUFFER);
        let consumer = kafka::tail_reader(cfg, &cfg.group(&format!("events-feed-{}", uuid::Uuid::new_v4().simple())))?;
        let topics = sources(cfg);
        consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        let feed = Feed { tx: tx.clone() };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    m = consumer.recv() => match m {
                        // Nobody to tell: the record is not decoded (streams that
                        // subscribe later read the history for what they missed).
                        Ok(_) if tx.receiver_count() == 0 => {}
                        Ok(m) => {
                            if let Some(ev) = m.payload().and_then(decode) {
                                let _ = tx.send(Arc::new(ev));
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "events feed: consume failed");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    },
                }
            }
        });
        Ok(feed)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<JobEvent>> {
        self.tx.subscribe()
    }
}
