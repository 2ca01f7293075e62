//! Domain vocabulary shared by every layer: jobs, results, dead letters and the
//! small enums that classify them. Plain data, no I/O; the Avro codec (`crate::codec`)
//! maps these types to and from the wire.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Milliseconds since the Unix epoch. All wire and store timestamps use this unit.
pub type Millis = i64;

/// Duration pool a job runs in; one Kafka topic and one consumer group per pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Short,
    Medium,
    Long,
}

impl Pool {
    pub const ALL: [Pool; 3] = [Pool::Short, Pool::Medium, Pool::Long];
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Short => "short",
            Pool::Medium => "medium",
            Pool::Long => "long",
        }
    }
}

/// Priority inside one tenant's queue (fairness across tenants is the scheduler's job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Urgent,
    #[default]
    Normal,
    Low,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Low];
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// Why an attempt failed; decides the retry topic and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The handler returned an error.
    AppError,
    /// The job type's deadline passed.
    Timeout,
    /// A dependency of the handler failed (connect error, 502/503/504).
    Dependency,
    /// The worker died or lost the job (heartbeat lapsed); never uses up an attempt.
    WorkerCrash,
    /// The job type is quarantined for failing most of the time.
    Poison,
    /// Invalid input: retrying cannot help (4xx, undecodable, unknown tenant/type).
    Permanent,
    /// A `process` job's child was killed for a resource limit (memory, CPU time, wall
    /// time, output size) or held its slot without progress (`stuck_after`): retried
    /// once, then dead-lettered with the limit and the peak; never a worker crash.
    Resource,
}

impl FailureClass {
    /// A failure of the platform or a shared dependency rather than of the job's own
    /// input or code: dependency, timeout, worker crash. Only these may close a pool or
    /// job type to every tenant (and only when seen across several tenants).
    pub fn is_infrastructure(self) -> bool {
        matches!(self, FailureClass::Dependency | FailureClass::Timeout | FailureClass::WorkerCrash)
    }

    pub const ALL: [FailureClass; 7] = [
        FailureClass::AppError,
        FailureClass::Timeout,
        FailureClass::Dependency,
        FailureClass::WorkerCrash,
        FailureClass::Poison,
        FailureClass::Permanent,
        FailureClass::Resource,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::AppError => "app_error",
            FailureClass::Timeout => "timeout",
            FailureClass::Dependency => "dependency",
            FailureClass::WorkerCrash => "worker_crash",
            FailureClass::Poison => "poison",
            FailureClass::Permanent => "permanent",
            FailureClass::Resource => "resource",
        }
    }
}

/// Terminal outcome published on the results topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Expired => "expired",
        }
    }
}

macro_rules! impl_str_enum {
    ($t:ty, $what:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL_VALUES.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL_VALUES.iter().map(|v| v.as_str()).collect();
                    format!("unknown {} {:?}: expected one of {}", $what, s, names.join(", "))
                })
            }
        }
    };
}

impl Pool {
    const ALL_VALUES: &'static [Pool] = &Pool::ALL;
}
impl Priority {
    const ALL_VALUES: &'static [Priority] = &Priority::ALL;
}
impl FailureClass {
    const ALL_VALUES: &'static [FailureClass] = &FailureClass::ALL;
}
impl JobStatus {
    const ALL_VALUES: &'static [JobStatus] =
        &[JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled, JobStatus::Expired];
}
impl_str_enum!(Pool, "pool");
impl_str_enum!(Priority, "priority");
impl_str_enum!(FailureClass, "failure class");
impl_str_enum!(JobStatus, "job status");

/// A job as submitted to a pool topic, and as carried on retry topics (then with
/// `not_before` and the failure bookkeeping filled in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSubmitted {
    /// UUID v7 in canonical text form.
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    /// None: the job type's configured pool.
    pub pool: Option<Pool>,
    pub priority: Priority,
    #[serde(with = "serde_bytes_compat")]
    pub payload: Vec<u8>,
    pub idempotency_key: Option<String>,
    /// Do not start before this time (scheduled jobs).
    pub execute_at: Option<Millis>,
    /// Give up (result `expired`) if not started by this time.
    pub not_after: Option<Millis>,
    /// Attempts already used up (0 on first submission).
    pub attempt: i32,
    /// Worker crashes seen so far (do not use up attempts, bounded separately).
    pub crash_count: i32,
    /// Rerun generation this submission belongs to.
    pub generation: i64,
    pub submitted_at: Millis,
    /// On retry topics: earliest time of the next attempt.
    pub not_before: Option<Millis>,
    pub last_error: Option<String>,
    pub last_failure_class: Option<FailureClass>,
    pub first_failure_at: Option<Millis>,
    /// How many times this job was replayed from a DLQ/retry topic.
    pub replay_count: i32,
    /// Topic the last replay read it from.
    pub replayed_from: Option<String>,
    /// W3C Trace Context of the submitting request (`traceparent`, `tracestate`): kept
    /// through retries, parking, hand-offs and replays, handed to the handler.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Flow-control key (e.g. a job family, a downstream service): jobs with the same key
    /// share the key's fleet-wide `parallelism` and `rate` (`core::flow`). Kept through
    /// retries, parking, hand-offs and replays. Not the per-user rate key (`user_key`).
    pub flow_key: Option<String>,
    /// The end user the job is submitted for: the front door's per-user rate window
    /// (`admission.user_rate`) is keyed by (tenant, `user_key`). Kept like `flow_key`.
    pub user_key: Option<String>,
    /// Times a draining worker handed this job (of this generation) to the next worker;
    /// like `crash_count`, never an attempt.
    pub handoff_count: i32,
}

impl JobSubmitted {
    /// About what the job holds in memory besides its fixed fields: its payload and its
    /// variable-length strings (what a worker's buffer counts it as, `core::buffer`).
    pub fn heap_bytes(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        self.payload.len()
            + self.job_id.len()
            + self.tenant.len()
            + self.job_type.len()
            + opt(&self.idempotency_key)
            + opt(&self.last_error)
            + opt(&self.replayed_from)
            + opt(&self.traceparent)
            + opt(&self.tracestate)
            + opt(&self.flow_key)
    }

    /// A first submission: normal priority, the job type's pool, attempt 0, generation 0,
    /// no schedule and no failure or replay bookkeeping (set what differs on the result).
    pub fn original(job_id: String, tenant: String, job_type: String, payload: Vec<u8>, submitted_at: Millis) -> Self {
        JobSubmitted {
            job_id,
            tenant,
            job_type,
            pool: None,
            priority: Priority::Normal,
            payload,
            idempotency_key: None,
            execute_at: None,
            not_after: None,
            attempt: 0,
            crash_count: 0,
            generation: 0,
            submitted_at,
            not_before: None,
            last_error: None,
            last_failure_class: None,
            first_failure_at: None,
            replay_count: 0,
            replayed_from: None,
            traceparent: None,
            tracestate: None,
            flow_key: None,
            user_key: None,
            handoff_count: 0,
        }
    }

    /// Whether this is the first dispatch ever of this job's generation, as far as the
    /// record tells: no attempt used, no crash re-dispatch, no hand-off, no replay.
    pub fn first_dispatch(&self) -> bool {
        self.attempt == 0 && self.crash_count == 0 && self.handoff_count == 0 && self.replay_count == 0
    }
}

/// What a process job's attempt used over its whole process tree (read from its cgroup,
/// else from the leader alone): carried on the job's result and charged by the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUsage {
    pub peak_memory_bytes: i64,
    pub cpu_ms: i64,
}

/// One terminal record per job on the results topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    pub pool: Pool,
    pub status: JobStatus,
    #[serde(with = "serde_bytes_compat_opt")]
    pub output: Option<Vec<u8>>,
    pub error: Option<String>,
    pub failure_class: Option<FailureClass>,
    pub attempts: i32,
    pub generation: i64,
    pub submitted_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Millis,
    pub worker_id: String,
    /// Process jobs: the last attempt's peak memory over its whole process tree, bytes.
    pub peak_memory_bytes: Option<i64>,
    /// Process jobs: the last attempt's CPU time over its whole process tree, milliseconds.
    pub cpu_ms: Option<i64>,
}

/// A message fairway gave up on, with enough context to understand and replay it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The job, when the message could be decoded.
    pub job: Option<JobSubmitted>,
    /// The raw message bytes, when it could not.
    #[serde(with = "serde_bytes_compat_opt")]
    pub raw: Option<Vec<u8>>,
    pub failure_class: FailureClass,
    /// Human-readable reason: what is wrong and how to fix it.
    pub reason: String,
    pub last_error: Option<String>,
    pub attempts: i32,
    pub first_failure_at: Millis,
    pub last_failure_at: Millis,
    pub origin_topic: String,
    pub origin_partition: i32,
    pub origin_offset: i64,
    pub replay_count: i32,
}

// Avro `bytes` must be serialized as serde bytes, not as a sequence of u8.
mod serde_bytes_compat {
    use serde::{Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        super::bytes_visitor::deserialize(d)
    }
}
mod serde_bytes_compat_opt {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_some(&Bytes(b)),
            None => s.serialize_none(),
        }
    }
    struct Bytes<'a>(&'a [u8]);
    impl serde::Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    #[derive(Deserialize)]
    struct Owned(#[serde(with = "super::serde_bytes_compat")] Vec<u8>);
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<Owned>::deserialize(d)?.map(|o| o.0))
    }
}
mod bytes_visitor {
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};
    use std::fmt;
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_str<E: Error>(self, v: &str) -> Result<Vec<u8>, E> {
            Ok(v.as_bytes().to_vec())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_bytes(V)
    }
}

/// What a [`JobEvent`] reports (symbols of `schemas/job_event.avsc`, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Queued,
    Scheduled,
    Waiting,
    Started,
    Progress,
    Retrying,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
    /// The job was picked after its `not_after` (it is then `expired`).
    LateExecution,
    DeadLettered,
    WebhookDelivered,
    WebhookFailed,
    /// The pool classifier moved a job type to another pool (not about one job: the
    /// event's `job_id` is `job_type/<name>`, its tenant empty).
    PoolReclassified,
    /// A dead letter or parked job was put back on its pool topic by a replay; `message`
    /// says who asked and which replay.
    Replayed,
    /// The fleet-wide breaker of a dependency opened: retries of the job types that
    /// declare it are held (`job_id` is `dependency/<name>`, tenant empty;
    /// `next_attempt_at` is when it lets jobs through again).
    DependencyCircuitOpen,
    /// The fleet-wide breaker of a dependency closed (`job_id` `dependency/<name>`).
    DependencyCircuitClosed,
}

impl EventKind {
    pub const ALL: [EventKind; 18] = [
        EventKind::Queued,
        EventKind::Scheduled,
        EventKind::Waiting,
        EventKind::Started,
        EventKind::Progress,
        EventKind::Retrying,
        EventKind::Succeeded,
        EventKind::Failed,
        EventKind::Cancelled,
        EventKind::Expired,
        EventKind::LateExecution,
        EventKind::DeadLettered,
        EventKind::WebhookDelivered,
        EventKind::WebhookFailed,
        EventKind::PoolReclassified,
        EventKind::Replayed,
        EventKind::DependencyCircuitOpen,
        EventKind::DependencyCircuitClosed,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Queued => "queued",
            EventKind::Scheduled => "scheduled",
            EventKind::Waiting => "waiting",
            EventKind::Started => "started",
            EventKind::Progress => "progress",
            EventKind::Retrying => "retrying",
            EventKind::Succeeded => "succeeded",
            EventKind::Failed => "failed",
            EventKind::Cancelled => "cancelled",
            EventKind::Expired => "expired",
            EventKind::LateExecution => "late_execution",
            EventKind::DeadLettered => "dead_lettered",
            EventKind::WebhookDelivered => "webhook_delivered",
            EventKind::WebhookFailed => "webhook_failed",
            EventKind::PoolReclassified => "pool_reclassified",
            EventKind::Replayed => "replayed",
            EventKind::DependencyCircuitOpen => "dependency_circuit_open",
            EventKind::DependencyCircuitClosed => "dependency_circuit_closed",
        }
    }
    /// About a job type or a dependency, not one job (`job_id` is `job_type/<name>` or
    /// `dependency/<name>`, the tenant empty or the job type's).
    pub fn is_about_no_job(self) -> bool {
        matches!(
            self,
            EventKind::PoolReclassified | EventKind::DependencyCircuitOpen | EventKind::DependencyCircuitClosed
        )
    }
    /// The job's last word: nothing but webhook deliveries follows it.
    pub fn is_terminal(self) -> bool {
        matches!(self, EventKind::Succeeded | EventKind::Failed | EventKind::Cancelled | EventKind::Expired)
    }
}
impl EventKind {
    const ALL_VALUES: &'static [EventKind] = &EventKind::ALL;
}
impl_str_enum!(EventKind, "event kind");

impl From<JobStatus> for EventKind {
    fn from(s: JobStatus) -> EventKind {
        match s {
            JobStatus::Succeeded => EventKind::Succeeded,
            JobStatus::Failed => EventKind::Failed,
            JobStatus::Cancelled => EventKind::Cancelled,
            JobStatus::Expired => EventKind::Expired,
        }
    }
}

/// One step of a job's life, on the events topic (key = job id) and in `job_events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    /// UUID v7: unique per event, so readers can drop copies.
    pub event_id: String,
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    pub kind: EventKind,
    pub at: Millis,
    /// Attempts used up before this event.
    pub attempt: i32,
    pub worker: Option<String>,
    pub progress: Option<f64>,
    pub message: Option<String>,
    /// `retrying`: the next attempt's earliest time; `scheduled`: `execute_at`.
    pub next_attempt_at: Option<Millis>,
}
