//! Producing jobs: validation against the config, idempotency keys (LWT in the store),
//! and the keyed, idempotent produce to the pool topic. Used by the CLI, the HTTP API
//! and the demo.
//!
//! With a store, a submission also writes the job's `queued` (or `scheduled`) row,
//! alongside the produce (the two run concurrently, so the submit waits for the slower
//! of the two, not their sum), and publishes the `queued` event without waiting.
//!
//! Idempotency: the key is claimed (LWT) before the produce. If the produce fails, the
//! claim and the row are taken back, so the client's retry submits afresh. If taking
//! the claim back fails too, the claim points at a job with no row: once it is older
//! than any produce can take, the next submission with the key takes it over (LWT on the
//! old job id, `core::events::taken_key`). A duplicate answers with the original job's
//! id and its row (state, and result when finished).
//!
//! Unique jobs and debounce, the other two ways a submission can be held back, are in
//! [`dedupe`].

pub mod dedupe;
mod many;
mod payload;

pub use payload::Payload;

use crate::config::Config;
use crate::core::lanes::Lane;
use crate::core::{promotion, trace};
use crate::kafka::Producer;
use crate::model::{JobSubmitted, Millis, Pool, Priority};
use crate::store::{EventStatements, IdempotencyClaim, JobRow, Store, SubmittedRow};
use crate::{codec, kafka, now_ms};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The tenant, and what is wrong and how to fix it.
    #[error("{1}")]
    UnknownTenant(String, String),
    #[error("unknown job type {0:?}: add [job_types.{0}] to the config (known: {1})")]
    UnknownJobType(String, String),
    #[error("payload is {size} bytes, above worker.max_payload_bytes = {limit}; store large inputs elsewhere and submit a reference")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("not_after ({not_after}) is before execute_at ({execute_at}): the job could never run")]
    NeverRunnable { execute_at: Millis, not_after: Millis },
    /// `execute_at` / `not_after` outside the instants fairway accepts.
    #[error(transparent)]
    OutOfRange(#[from] crate::core::bounds::BoundError),
    #[error("{0}")]
    BadTraceContext(String),
    #[error("{0}")]
    BadFlowKey(String),
    #[error("{0}")]
    BadUserKey(String),
    #[error(
        "tenant {tenant:?} has {max} debounce windows open, the most a tenant may have (debounce.max_open_per_tenant); \
         wait for some to close or debounce on fewer keys"
    )]
    TooManyWindows { tenant: String, max: usize },
    /// A unique or debounce field: the field and how to fix it.
    #[error("field `{field}`: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("tenant {tenant:?} may not submit job type {job_type:?}: its [job_types.{job_type}] lists tenants = [{allowed}]; add the tenant there or use another job type")]
    JobTypeNotAllowed { tenant: String, job_type: String, allowed: String },
    #[error("execute_at is {ahead_ms} ms ahead, beyond admission.max_schedule_ahead = {horizon}; submit it within {horizon} of its time (retry after the Retry-After wait) or raise admission.max_schedule_ahead")]
    TooFarAhead { ahead_ms: Millis, horizon: crate::core::retry::DurationMs },
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Codec(#[from] codec::CodecError),
}

/// A job to submit, as given by a user (CLI flags, an NDJSON line, an HTTP body).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NewJob {
    /// Empty when the input named none (a tenant's API key fills in its own; validation
    /// refuses a job that still names none).
    #[serde(default)]
    pub tenant: String,
    pub job_type: String,
    /// Any JSON, read without building its tree ([`Payload`]).
    #[serde(default)]
    pub payload: Payload,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub pool: Option<Pool>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Do not start before this time. More than an hour ahead it is spread by up to
    /// ±60 s (`core::promotion::jittered`) unless `exact_schedule` is set.
    #[serde(default)]
    pub execute_at: Option<Millis>,
    /// Keep `execute_at` exactly as given (no jitter).
    #[serde(default)]
    pub exact_schedule: bool,
    #[serde(default)]
    pub not_after: Option<Millis>,
    #[serde(default)]
    pub generation: i64,
    /// W3C Trace Context of the caller (the HTTP API takes the request's `traceparent`
    /// and `tracestate` headers); a new trace is started when absent.
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub tracestate: Option<String>,
    /// Flow-control key (`core::flow`): jobs with the same key share its fleet-wide
    /// limits (a downstream flow; the per-user rate window is `user_key`'s).
    #[serde(default)]
    pub flow_key: Option<String>,
    /// The end user the job is for (`core::flow::check_key` rules): the front door's
    /// per-user rate window (`admission.user_rate`) is keyed by it (`crate::admission`).
    #[serde(default)]
    pub user_key: Option<String>,
    /// Jobs of a tenant that share an ordering key stay on one partition of their pool
    /// topic, in submission order, whatever the tenant's lane count (`core::lanes`);
    /// jobs without one spread over the tenant's lanes in no particular order. Used to
    /// place the record only (it is not carried by the job).
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Unique job (`core::unique`): while the job holding this key is in `unique_scope`,
    /// a submission with the key returns that job's id instead of a new job.
    #[serde(default)]
    pub unique_key: Option<String>,
    /// `queued`, `queued_or_running` (default) or `window` (with `unique_window`).
    #[serde(default)]
    pub unique_scope: Option<crate::core::unique::UniqueScope>,
    /// How long a `window` key holds, e.g. "10m".
    #[serde(default)]
    pub unique_window: Option<String>,
    /// Debounce (`core::unique`): submissions with this key fold into one job that runs
    /// `debounce_delay` after the last of them (at most `debounce_max_delay` after the first).
    #[serde(default)]
    pub debounce_key: Option<String>,
    #[serde(default)]
    pub debounce_delay: Option<String>,
    #[serde(default)]
    pub debounce_max_delay: Option<String>,
    /// `replace` (default: the job runs with the last payload) or `keep_first`.
    #[serde(default)]
    pub debounce_mode: Option<crate::core::unique::DebounceMode>,
    /// The job id to use instead of a new one: set by the promoter for a schedule's fire
    /// (derived from the schedule and the fire time), never read from users' input.
    #[serde(skip)]
    pub job_id: Option<String>,
}

impl NewJob {
    /// Payload bytes: a JSON string is sent as its text, anything else as its JSON.
    pub fn payload_bytes(&self) -> Vec<u8> {
        self.payload.as_bytes().to_vec()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub job_id: String,
    /// True when the idempotency key was already used: nothing was produced.
    pub duplicate: bool,
    pub pool: Pool,
    /// For a duplicate: the original job's row (state, and result when finished), when
    /// the store has it.
    pub original: Option<JobRow>,
    /// The submission joined a job that exists (its `unique_key` is held, or its debounce
    /// window is open): `job_id` is that job's; the HTTP API answers 200, not 201.
    pub joined: bool,
    /// This submission stored the job's `queued` state (its row, or a queued record in a
    /// pack), which names its tenant (so the HTTP API need not record the owner separately).
    pub queued_row: bool,
}

pub struct Submitter {
    cfg: std::sync::Arc<Config>,
    producer: Producer,
    /// The producer of whole batches (`submit_many`), created on the first batch: a
    /// second client with a shorter linger (`kafka::bulk_producer`).
    bulk: tokio::sync::OnceCell<Producer>,
    store: Option<Store>,
    /// The live registry (API, CLI); without it, the config file's tenants.
    tenants: Option<crate::ops::tenants::LiveTenants>,
    /// Statements of the submission's row and the idempotency claim (prepared once).
    events: tokio::sync::OnceCell<EventStatements>,
    /// The pool classifier's decisions (with a store and the classifier on).
    classes: Option<crate::classifier::PoolClasses>,
    /// Statements of debounce windows (prepared on first use).
    debounces: tokio::sync::OnceCell<dedupe::Windows>,
    /// Each tenant's recent submission rate here, which sets its lanes (`core::lanes`).
    lanes: std::sync::Mutex<crate::core::lanes::LaneMeter>,
}

/// Most tenants whose rate a submitter tracks per second (`core::lanes::LaneMeter`):
/// a tenant first seen beyond it keeps one lane for that second.
const LANE_METER_TENANTS: usize = 20_000;

/// Where a record goes on its pool topic: its key and, when the topic's partition count
/// is known, its partition (`core::lanes`).
pub(crate) struct Placement {
    pub key: String,
    pub partition: Option<i32>,
}

/// Longest a produce can take before it either failed or its job's row exists
/// (`message.timeout.ms` of `kafka::producer` plus a margin): an idempotency claim
/// older than this without a row is orphaned.
const MAX_PRODUCE_MS: i64 = 30_000 + 15_000;

impl Submitter {
    pub fn new(cfg: std::sync::Arc<Config>, store: Option<Store>) -> Result<Self, SubmitError> {
        let producer = kafka::submit_producer(&cfg)?;
        let classes = store
            .as_ref()
            .filter(|_| cfg.classifier.enabled)
            .map(|s| crate::classifier::PoolClasses::new(cfg.clone(), s.clone()));
        Ok(Submitter {
            producer,
            bulk: Default::default(),
            store,
            tenants: None,
            events: Default::default(),
            lanes: std::sync::Mutex::new(crate::core::lanes::LaneMeter::new(cfg.kafka.lane_rate, LANE_METER_TENANTS)),
            cfg,
            classes,
            debounces: Default::default(),
        })
    }

    /// Checks tenants against the live registry instead of the config file's list.
    pub fn with_tenants(mut self, tenants: crate::ops::tenants::LiveTenants) -> Self {
        self.tenants = Some(tenants);
        self
    }

    /// Checks a job against the registry (or the config) and the job types; returns
    /// the pool it goes to: its own, else its type's as last read from the classifier
    /// ([`Submitter::refresh_classes`]), else its type's configured pool.
    pub fn validate(&self, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
        let pool = match &self.tenants {
            Some(live) => {
                no_tenant(job)?;
                let pool = validate_job(&self.cfg, job, payload_len)?;
                live.accept(&job.tenant).map_err(|why| SubmitError::UnknownTenant(job.tenant.clone(), why))?;
                pool
            }
            None => validate(&self.cfg, job, payload_len)?,
        };
        Ok(match (&self.classes, job.pool) {
            (Some(classes), None) => classes.route(None, &job.job_type, &job.tenant, pool),
            _ => pool,
        })
    }

    /// Reads the pool classifier's decisions if the copy is older than `classifier.cache`.
    pub async fn refresh_classes(&self) {
        if let Some(c) = &self.classes {
            c.refresh().await;
        }
    }

    async fn statements(&self) -> Result<Option<&EventStatements>, SubmitError> {
        let Some(store) = &self.store else { return Ok(None) };
        Ok(Some(self.events.get_or_try_init(|| store.event_statements()).await?))
    }

    pub async fn submit(&self, job: &NewJob) -> Result<Submitted, SubmitError> {
        self.submit_counted(job, false).await
    }

    /// [`Submitter::submit`]; `counted`: the job was already counted in its tenant's rate
    /// (a batch counts all its jobs first, see [`crate::core::lanes::LaneMeter`]).
    pub(crate) async fn submit_counted(&self, job: &NewJob, counted: bool) -> Result<Submitted, SubmitError> {
        self.refresh_classes().await;
        let payload = job.payload_bytes();
        let pool = self.validate(job, payload.len())?;
        let job_id = job.job_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let now = now_ms();
        let stmts = self.statements().await?;
        if (job.unique_key.is_some() || job.debounce_key.is_some()) && stmts.is_none() {
            return Err(SubmitError::Invalid {
                field: if job.unique_key.is_some() { "unique_key" } else { "debounce_key" },
                message: "needs the store (submit through the HTTP API or `fairway submit`)".into(),
            });
        }
        if let (Some(key), Some(stmts)) = (&job.idempotency_key, stmts) {
            // The keyed paths are boxed: the common one's future stays small (a batch holds
            // a thousand of them at once).
            if let Some(dup) = Box::pin(self.claim(stmts, &job.tenant, key, &job_id, now, pool)).await? {
                return Ok(dup);
            }
        }
        let mut rec = self.record(job, job_id.clone(), pool, payload, now);
        if let (Some(key), Some(store)) = (&job.debounce_key, &self.store) {
            let d = dedupe::Debounce::of(job, &self.cfg.debounce)?;
            return Box::pin(dedupe::debounce(store, &self.debounces, key, &d, &mut rec, now)).await;
        }
        if let (Some(_), Some(stmts), Some(store)) = (&job.unique_key, stmts, &self.store) {
            let claim = dedupe::UniqueClaim::of(&self.cfg, job)?;
            if let Some(dup) = Box::pin(claim.claim(stmts, store, &job_id, now, pool, MAX_PRODUCE_MS)).await? {
                return Ok(dup);
            }
        }
        // With span export on, the job carries its `send` span's context from here on.
        let span = crate::observe::telemetry::submit(&rec, &self.cfg.pool_topic(pool), now);
        if let Some(tp) = span.as_ref().and_then(crate::observe::telemetry::Live::traceparent) {
            rec.traceparent = Some(tp);
        }
        let packed = self.packs_submission(stmts, &rec, now);
        let lane = self.count_and_lane(&rec, job.ordering_key.as_deref(), u64::from(!counted), now);
        let (produced, written) = if packed {
            // A packed record cannot be taken back: written once the job is on its topic.
            let produced = self.produce_state_written(&rec, true, lane).await;
            let written = produced.is_ok() && self.put_submitted(stmts, &rec, pool, now, true).await;
            (produced, written)
        } else {
            tokio::join!(
                self.produce_state_written(&rec, false, lane),
                self.put_submitted(stmts, &rec, pool, now, false)
            )
        };
        if let Some(span) = span {
            span.end(now_ms(), produced.as_ref().err().map(ToString::to_string).as_deref(), Vec::new());
        }
        if let Err(e) = produced {
            // Never queued: take back what says it was, so a retry submits afresh.
            if let Some(stmts) = stmts {
                Box::pin(self.take_back(stmts, job, &job_id, written, now)).await;
            }
            return Err(e);
        }
        Ok(Submitted { job_id, duplicate: false, pool, original: None, joined: false, queued_row: written })
    }

    /// The record a submission produces (jitter applied to a far `execute_at`).
    fn record(&self, job: &NewJob, job_id: String, pool: Pool, payload: Vec<u8>, now: Millis) -> JobSubmitted {
        JobSubmitted {
            pool: Some(pool),
            priority: job.priority,
            idempotency_key: job.idempotency_key.clone(),
            // Jitter never moves it past `not_after` (validated against the asked time).
            execute_at: job.execute_at.map(|at| {
                promotion::jittered(at, now, job.exact_schedule, rand::random())
                    .min(job.not_after.unwrap_or(Millis::MAX))
            }),
            not_after: job.not_after,
            generation: job.generation,
            traceparent: Some(
                job.traceparent.clone().unwrap_or_else(|| trace::new_traceparent(rand::random(), rand::random())),
            ),
            tracestate: job.tracestate.clone(),
            flow_key: job.flow_key.clone(),
            user_key: job.user_key.clone(),
            ..JobSubmitted::original(job_id, job.tenant.clone(), job.job_type.clone(), payload, now)
        }
    }

    /// Takes back the row and the keys of a job whose produce failed.
    async fn take_back(&self, stmts: &EventStatements, job: &NewJob, job_id: &str, written: bool, now: Millis) {
        if written {
            if let Err(d) = stmts.delete_submitted(job_id, now).await {
                tracing::warn!(job_id, error = %d, "could not take back the row of a job whose produce failed");
            }
        }
        let keys = job.idempotency_key.iter().cloned().chain(job.unique_key.as_deref().map(dedupe::unique_claim_key));
        for key in keys {
            if let Err(r) = stmts.release_key(&job.tenant, &key, job_id).await {
                tracing::warn!(
                    job_id, error = %r,
                    "could not release the idempotency or unique key of a job whose produce failed; a retry after \
                     {} s takes it over",
                    MAX_PRODUCE_MS / 1000
                );
            }
        }
    }

    /// Claims `key` for `job_id`: None when claimed (submit), else the answer to give.
    async fn claim(
        &self,
        stmts: &EventStatements,
        tenant: &str,
        key: &str,
        job_id: &str,
        now: crate::model::Millis,
        pool: Pool,
    ) -> Result<Option<Submitted>, SubmitError> {
        let window = self.cfg.idempotency.window.as_secs().min(i32::MAX as u64) as i32;
        let store = self.store.as_ref().expect("statements come from the store");
        let IdempotencyClaim::Held { job_id: held, at } = stmts.claim_key(tenant, key, job_id, now, window).await?
        else {
            return Ok(None);
        };
        let row = store.job_direct(&held).await?;
        use crate::core::events::{taken_key, TakenKey};
        match taken_key(row.is_some(), at, now, MAX_PRODUCE_MS) {
            TakenKey::Duplicate | TakenKey::Pending => {
                let pool = row.as_ref().and_then(|r| r.pool.as_deref()?.parse().ok()).unwrap_or(pool);
                Ok(Some(Submitted {
                    job_id: held,
                    duplicate: true,
                    pool,
                    original: row,
                    joined: false,
                    queued_row: false,
                }))
            }
            TakenKey::Orphaned => {
                if stmts.take_over_key(tenant, key, &held, job_id, now, window).await? {
                    tracing::info!(old = held, job_id, "took over an idempotency key whose job was never produced");
                    return Ok(None);
                }
                // Someone else took it over first: theirs is the original now.
                match stmts.claim_key(tenant, key, job_id, now, window).await? {
                    IdempotencyClaim::Claimed => Ok(None),
                    IdempotencyClaim::Held { job_id: other, .. } => {
                        let row = store.job_direct(&other).await?;
                        Ok(Some(Submitted {
                            job_id: other,
                            duplicate: true,
                            pool,
                            original: row,
                            joined: false,
                            queued_row: false,
                        }))
                    }
                }
            }
        }
    }

    /// Whether the submission's state is a queued record in a pack (`core::finished`)
    /// rather than a `jobs` row: a UUIDv7 job due now, with a store to write it to. A job
    /// scheduled ahead keeps a row (its lifetime runs past the packs' TTL).
    fn packs_submission(&self, stmts: Option<&EventStatements>, rec: &JobSubmitted, now: Millis) -> bool {
        use crate::core::events::{submission_state, JobState};
        stmts.is_some()
            && self.store.is_some()
            && crate::core::finished::pack_bucket(&rec.job_id).is_some()
            && submission_state(rec, now) == JobState::Queued
    }

    /// Writes the job's `queued`/`scheduled` state (a row, or a queued record in a pack when
    /// `packed`, see [`Submitter::packs_submission`]); false if it was not written (the job
    /// is accepted anyway and becomes visible once a worker records it).
    async fn put_submitted(
        &self,
        stmts: Option<&EventStatements>,
        rec: &JobSubmitted,
        pool: Pool,
        now: crate::model::Millis,
        packed: bool,
    ) -> bool {
        let Some(stmts) = stmts else { return false };
        use crate::core::events::{row_ttl_secs, submission_state};
        let row = SubmittedRow {
            job_id: &rec.job_id,
            tenant: &rec.tenant,
            job_type: &rec.job_type,
            pool: pool.as_str(),
            status: submission_state(rec, now).as_str(),
            generation: rec.generation,
            submitted_at: now,
            ttl_secs: row_ttl_secs(self.cfg.retention.results, now, rec.execute_at),
        };
        let t = std::time::Instant::now();
        let r = match &self.store {
            Some(store) if packed => store.put_queued(&row).await,
            _ => stmts.put_submitted(&row).await,
        };
        metrics::histogram!(crate::metrics::SUBMIT_STATE_WRITE_SECONDS).record(t.elapsed().as_secs_f64());
        match r {
            Ok(()) => true,
            Err(e) => {
                metrics::counter!(crate::metrics::SUBMIT_STATE_WRITE_FAILURES).increment(1);
                tracing::warn!(job_id = %rec.job_id, error = %e, "queued row not written (the job is accepted)");
                false
            }
        }
    }

    /// Produces an already built record to its pool topic, on its tenant's home lane:
    /// records produced as built (replays, the library's own records) keep the order
    /// they are produced in, as one partition keeps it.
    pub async fn produce(&self, rec: &JobSubmitted) -> Result<(), SubmitError> {
        self.produce_state_written(rec, false, Lane::Home).await
    }

    /// Counts `n` submissions of the record's tenant (see [`crate::core::lanes::LaneMeter`])
    /// and returns the record's lane: its ordering key's place, else one of the tenant's
    /// lanes picked by its job id.
    fn count_and_lane(&self, rec: &JobSubmitted, ordering_key: Option<&str>, n: u64, now: Millis) -> Lane {
        let mut meter = self.lanes.lock().expect("lane meter");
        if n > 0 {
            meter.record(&rec.tenant, n, now);
        }
        match ordering_key {
            Some(k) => Lane::ordered(k),
            None => Lane::of_job(&rec.job_id, meter.lanes(&rec.tenant, now)),
        }
    }

    /// Counts a batch's jobs in their tenants' rates, all before any is placed, so a
    /// batch spreads by the rate it makes.
    pub(crate) fn count_batch(&self, jobs: &[NewJob], now: Millis) {
        let mut meter = self.lanes.lock().expect("lane meter");
        for job in jobs {
            meter.record(&job.tenant, 1, now);
        }
    }

    /// The lanes of a batch's records, already counted ([`Submitter::count_batch`]).
    pub(crate) fn batch_lanes<'a>(
        &self,
        recs: impl Iterator<Item = (&'a JobSubmitted, Option<&'a str>)>,
        now: Millis,
    ) -> Vec<Lane> {
        let mut meter = self.lanes.lock().expect("lane meter");
        recs.map(|(rec, ordering_key)| match ordering_key {
            Some(k) => Lane::ordered(k),
            None => Lane::of_job(&rec.job_id, meter.lanes(&rec.tenant, now)),
        })
        .collect()
    }

    /// Where a record of `tenant` on `lane` goes on `topic` (see [`Placement`]).
    pub(crate) async fn place(producer: &Producer, topic: &str, tenant: &str, lane: Lane) -> Placement {
        let key = crate::core::lanes::key(tenant, lane).into_owned();
        if lane == Lane::Home {
            return Placement { key, partition: None };
        }
        metrics::counter!(crate::metrics::SUBMIT_LANES).increment(1);
        let partition = producer.partition_count(topic).await.map(|count| {
            let count = u32::try_from(count).unwrap_or(1);
            crate::core::lanes::partition(tenant, lane, count) as i32
        });
        Placement { key, partition }
    }

    /// [`Submitter::produce`] on `lane`, saying on the record whether this submitter
    /// writes the job's packed `queued` state (see [`record_headers`]).
    async fn produce_state_written(
        &self,
        rec: &JobSubmitted,
        state_written: bool,
        lane: Lane,
    ) -> Result<(), SubmitError> {
        let pool = rec.pool.or_else(|| self.cfg.job_types.get(&rec.job_type).map(|j| j.pool)).unwrap_or(Pool::Short);
        let bytes = codec::encode_job(rec)?;
        let headers = record_headers(rec, state_written);
        let topic = self.cfg.pool_topic(pool);
        let at = Self::place(&self.producer, &topic, &rec.tenant, lane).await;
        self.producer.send_to(&topic, at.partition, &at.key, &bytes, &headers).await?;
        Ok(())
    }

    /// Produces a replayed job: to its type's current pool unless its record names a
    /// pool other than the configured one (`core::classifier::replay_pool`).
    pub async fn produce_replay(&self, job: &JobSubmitted) -> Result<(), SubmitError> {
        let (Some(classes), Some(jt)) = (&self.classes, self.cfg.job_types.get(&job.job_type)) else {
            return self.produce(job).await;
        };
        classes.refresh().await;
        let pool = Some(classes.replay_pool(job.pool, &job.job_type, &job.tenant, jt.pool));
        self.produce(&JobSubmitted { pool, ..job.clone() }).await
    }

    /// The audit of a replayed job: its `replayed` event at `at` (`watch::events::replayed`).
    pub fn replayed(&self, job: &JobSubmitted, requested_by: &str, replay_id: &str, at: crate::model::Millis) {
        crate::watch::events::replayed(&self.producer, &self.cfg, job, requested_by, replay_id, at);
    }

    pub fn producer(&self) -> &Producer {
        &self.producer
    }
}

/// A job's original record's headers: its trace context,
/// `core::frontier::SUBMITTED_HEADER` (the submission itself, not a copy), and
/// `core::events::STATE_WRITTEN_HEADER` when its submitter writes its packed `queued`
/// state (the events recorder then writes no `queued` event: the state tells it).
pub(crate) fn record_headers(rec: &JobSubmitted, state_written: bool) -> Vec<(&'static str, &str)> {
    let mut headers = kafka::trace_headers(rec);
    headers.push((crate::core::frontier::SUBMITTED_HEADER, "1"));
    if state_written {
        headers.push((crate::core::events::STATE_WRITTEN_HEADER, "queued"));
    }
    headers
}

/// Checks a job against the config file (tenants included): for producers without a store.
pub fn validate(cfg: &Config, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
    no_tenant(job)?;
    if !cfg.tenants.contains_key(&job.tenant) {
        let known: Vec<&str> = cfg.tenants.keys().map(String::as_str).collect();
        let t = &job.tenant;
        return Err(SubmitError::UnknownTenant(
            t.clone(),
            format!("unknown tenant {t:?}: add [tenants.{t}] to the config (known: {})", known.join(", ")),
        ));
    }
    validate_job(cfg, job, payload_len)
}

/// A job that names no tenant (an admin's or the CLI's input without `tenant`).
fn no_tenant(job: &NewJob) -> Result<(), SubmitError> {
    if job.tenant.is_empty() {
        return Err(SubmitError::UnknownTenant(
            String::new(),
            "the job names no tenant: set `tenant` (only a tenant's API key may leave it out)".into(),
        ));
    }
    Ok(())
}

/// Everything but the tenant: job type, payload size, times.
pub(crate) fn validate_job(cfg: &Config, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
    let Some(jt) = cfg.job_types.get(&job.job_type) else {
        let known: Vec<&str> = cfg.job_types.keys().map(String::as_str).collect();
        return Err(SubmitError::UnknownJobType(job.job_type.clone(), known.join(", ")));
    };
    if payload_len > cfg.worker.max_payload_bytes {
        return Err(SubmitError::PayloadTooLarge { size: payload_len, limit: cfg.worker.max_payload_bytes });
    }
    if let Some(allowed) = jt.tenants.as_ref().filter(|a| !a.contains(&job.tenant)) {
        return Err(SubmitError::JobTypeNotAllowed {
            tenant: job.tenant.clone(),
            job_type: job.job_type.clone(),
            allowed: allowed.join(", "),
        });
    }
    crate::core::bounds::optional("execute_at", job.execute_at)?;
    crate::core::bounds::optional("not_after", job.not_after)?;
    if let (Some(e), Some(n)) = (job.execute_at, job.not_after) {
        if n < e {
            return Err(SubmitError::NeverRunnable { execute_at: e, not_after: n });
        }
    }
    let horizon = cfg.admission.max_schedule_ahead;
    if let Some(ahead_ms) = job.execute_at.map(|at| at - now_ms()).filter(|ahead| *ahead > horizon.0) {
        return Err(SubmitError::TooFarAhead { ahead_ms, horizon });
    }
    if let Some(tp) = &job.traceparent {
        trace::check_traceparent(tp).map_err(SubmitError::BadTraceContext)?;
    }
    if let Some(ts) = &job.tracestate {
        if job.traceparent.is_none() {
            return Err(SubmitError::BadTraceContext(
                "tracestate given without traceparent; send both or neither".into(),
            ));
        }
        trace::check_tracestate(ts).map_err(SubmitError::BadTraceContext)?;
    }
    if let Some(key) = &job.flow_key {
        crate::core::flow::check_key(key).map_err(SubmitError::BadFlowKey)?;
    }
    if let Some(key) = &job.user_key {
        crate::core::flow::check_named_key("user_key", key).map_err(SubmitError::BadUserKey)?;
    }
    if let Some(key) = &job.ordering_key {
        crate::core::flow::check_named_key("ordering_key", key)
            .map_err(|message| SubmitError::Invalid { field: "ordering_key", message })?;
    }
    dedupe::check(job, &cfg.debounce)?;
    Ok(job.pool.unwrap_or(jt.pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(t: &str, jt: &str) -> NewJob {
        NewJob { tenant: t.into(), job_type: jt.into(), ..Default::default() }
    }

    #[test]
    fn validation_names_the_problem() {
        let cfg = Config::builtin();
        assert_eq!(validate(&cfg, &job("acme", "echo"), 10).unwrap(), Pool::Short);
        let e = validate(&cfg, &job("nobody", "echo"), 10).unwrap_err().to_string();
        assert!(e.contains("nobody") && e.contains("[tenants.nobody]"), "{e}");
        let e = validate(&cfg, &job("acme", "nope"), 10).unwrap_err().to_string();
        assert!(e.contains("[job_types.nope]"), "{e}");
        let e = validate(&cfg, &job("acme", "echo"), 10 << 20).unwrap_err().to_string();
        assert!(e.contains("max_payload_bytes"), "{e}");
    }

    #[test]
    fn a_job_type_with_a_tenants_list_refuses_the_others() {
        let mut cfg = Config::builtin();
        cfg.job_types.get_mut("echo").unwrap().tenants = Some(vec!["globex".into()]);
        let e = validate(&cfg, &job("acme", "echo"), 10).unwrap_err();
        assert!(matches!(e, SubmitError::JobTypeNotAllowed { .. }), "{e}");
        assert!(e.to_string().contains("tenants = [globex]"), "{e}");
        assert!(validate(&cfg, &job("globex", "echo"), 10).is_ok());
    }

    #[test]
    fn execute_at_beyond_the_horizon_is_refused_with_the_setting() {
        let cfg = Config::builtin();
        let horizon = cfg.admission.max_schedule_ahead.0;
        let mut j = job("acme", "echo");
        j.execute_at = Some(now_ms() + horizon - 60_000);
        assert!(validate(&cfg, &j, 10).is_ok());
        j.execute_at = Some(now_ms() + horizon + 60_000);
        let e = validate(&cfg, &j, 10).unwrap_err().to_string();
        assert!(e.contains("admission.max_schedule_ahead"), "{e}");
    }

    #[test]
    fn payload_string_is_sent_verbatim() {
        let mut j = job("acme", "echo");
        j.payload = serde_json::json!("hello").into();
        assert_eq!(j.payload_bytes(), b"hello");
        j.payload = serde_json::json!({"ms": 5}).into();
        assert_eq!(j.payload_bytes(), br#"{"ms":5}"#);
    }
}
