//! Watching a job: the state model, which event each step emits, how long rows live,
//! when progress is worth an event, and how an idempotent submission answers a key it
//! finds taken. Pure: no I/O, `now` is an argument (the I/O shell is `crate::watch::events`).
//!
//! States (what `GET /v1/jobs/{id}` and `fairway status` show):
//!
//! | state       | meaning                                                   | written by |
//! |-------------|-----------------------------------------------------------|------------|
//! | `queued`    | accepted, waiting for a worker                            | API / CLI at submission |
//! | `scheduled` | accepted, `execute_at` still ahead                        | API / CLI at submission |
//! | `waiting`   | queued, and the fleet says why its tenant's next job waits (rate limited, concurrency cap, circuit open, fair share, suspended) | derived when read (worker snapshots) |
//! | `running`   | a worker runs it                                          | worker |
//! | `retrying`  | an attempt failed; the next one is due at `next_attempt_at` | worker |
//! | `succeeded` / `failed` / `cancelled` / `expired` | terminal              | worker |
//!
//! Only terminal states absorb: a late `queued` write can never hide a result, because
//! the submission's row is written with the submission time as its write timestamp
//! (every worker write comes after the produce, so it wins; see `store::events`).

use crate::model::{EventKind, JobEvent, JobResult, JobSubmitted, Millis};
use std::time::Duration;

/// The state model (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    Queued,
    Scheduled,
    Waiting,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

impl JobState {
    pub const ALL: [JobState; 9] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Waiting,
        JobState::Running,
        JobState::Retrying,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Expired,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Scheduled => "scheduled",
            JobState::Waiting => "waiting",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Expired => "expired",
        }
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Expired)
    }
    /// The state a stored status names. Statuses the worker uses internally map to what a
    /// client should see: `handed_off` and `replayed` jobs are waiting for a worker again.
    pub fn from_status(s: &str) -> Option<JobState> {
        Some(match s {
            "handed_off" | "replayed" => JobState::Queued,
            other => *JobState::ALL.iter().find(|v| v.as_str() == other)?,
        })
    }
}

/// Why a queued job's tenant waits (the scheduler's reasons, named for clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    RateLimited,
    ConcurrencyCap,
    CircuitOpen,
    /// Other tenants are ahead of it in fair share (the scheduler's deficit).
    FairShare,
    ReservedSlots,
    Suspended,
    /// The tenant's job children were killed too often in the pool (`core::recycling`).
    RecyclingCap,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::RateLimited => "rate_limited",
            WaitReason::ConcurrencyCap => "concurrency_cap",
            WaitReason::CircuitOpen => "circuit_open",
            WaitReason::FairShare => "fair_share",
            WaitReason::ReservedSlots => "reserved_slots",
            WaitReason::Suspended => "suspended",
            WaitReason::RecyclingCap => "recycling_cap",
        }
    }
    /// From the scheduler's snapshot names (`fairway stats`); unknown names are ignored.
    pub fn from_scheduler(s: &str) -> Option<WaitReason> {
        Some(match s {
            "rate_limited" => WaitReason::RateLimited,
            "concurrency_cap" => WaitReason::ConcurrencyCap,
            "breaker_open" | "circuit_open" => WaitReason::CircuitOpen,
            "deficit" | "fair_share" => WaitReason::FairShare,
            "reserved_slots" => WaitReason::ReservedSlots,
            "suspended" => WaitReason::Suspended,
            "recycling_cap" => WaitReason::RecyclingCap,
            _ => return None,
        })
    }
}

/// The state shown for a stored status: a queued job whose tenant waits for a known
/// reason is `waiting` (with the reason); anything else shows as stored.
pub fn shown_state(status: &str, tenant_wait: Option<WaitReason>) -> Option<(JobState, Option<WaitReason>)> {
    let s = JobState::from_status(status)?;
    Some(match (s, tenant_wait) {
        (JobState::Queued, Some(w)) => (JobState::Waiting, Some(w)),
        (s, _) => (s, None),
    })
}

/// The state a job enters when it is accepted at `now`.
pub fn submission_state(job: &JobSubmitted, now: Millis) -> JobState {
    match job.execute_at {
        Some(at) if at > now => JobState::Scheduled,
        _ => JobState::Queued,
    }
}

/// The state an event moves its job to; None for events that report without moving it
/// (progress, late execution, dead-lettering (a `failed` follows), webhook deliveries).
pub fn state_after(kind: EventKind) -> Option<JobState> {
    Some(match kind {
        EventKind::Queued => JobState::Queued,
        EventKind::Scheduled => JobState::Scheduled,
        EventKind::Waiting => JobState::Waiting,
        EventKind::Started => JobState::Running,
        EventKind::Retrying => JobState::Retrying,
        EventKind::Succeeded => JobState::Succeeded,
        EventKind::Failed => JobState::Failed,
        EventKind::Cancelled => JobState::Cancelled,
        EventKind::Expired => JobState::Expired,
        EventKind::Progress
        | EventKind::LateExecution
        | EventKind::DeadLettered
        | EventKind::WebhookDelivered
        | EventKind::WebhookFailed
        | EventKind::PoolReclassified
        | EventKind::Replayed
        | EventKind::DependencyCircuitOpen
        | EventKind::DependencyCircuitClosed => return None,
    })
}

/// The state a history of events leaves its job in (events in any order: sorted by time,
/// then id). A terminal state absorbs: nothing after it moves the job.
pub fn fold(events: &[JobEvent]) -> Option<JobState> {
    let mut sorted: Vec<&JobEvent> = events.iter().collect();
    sorted.sort_by(|a, b| (a.at, &a.event_id).cmp(&(b.at, &b.event_id)));
    let mut state = None;
    for e in sorted {
        if state.is_some_and(JobState::is_terminal) {
            break;
        }
        if let Some(s) = state_after(e.kind) {
            state = Some(s);
        }
    }
    state
}

/// Whether a follower (SSE, `status --follow`) stops after this event.
pub fn ends_stream(kind: EventKind) -> bool {
    kind.is_terminal()
}

/// An event with a fresh id (`event_id` is the caller's UUID v7: ids are not this
/// module's business, it has no randomness).
pub fn event(event_id: String, job: &JobSubmitted, kind: EventKind, at: Millis) -> JobEvent {
    JobEvent {
        event_id,
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        kind,
        at,
        attempt: job.attempt,
        worker: None,
        progress: None,
        message: None,
        next_attempt_at: None,
    }
}

/// A `succeeded` event of job `job_id` of `tenant` at `at`, for tests.
#[cfg(test)]
pub(crate) fn succeeded_for_test(tenant: &str, job_id: &str, at: Millis) -> JobEvent {
    JobEvent {
        event_id: job_id.to_string(),
        job_id: job_id.to_string(),
        tenant: tenant.into(),
        job_type: "echo".into(),
        kind: EventKind::Succeeded,
        at,
        attempt: 1,
        worker: None,
        progress: None,
        message: None,
        next_attempt_at: None,
    }
}

/// The event of a (job type, tenant)'s move to another pool (`core::classifier`): about
/// no one job, so keyed `job_type/<name>`, for the tenant whose jobs moved (its feeds
/// and admin feeds show it); `message` says what moved and why, `next_attempt_at` until
/// when the move is sticky.
pub fn pool_reclassified(
    event_id: String,
    subject: &crate::core::classifier::Subject,
    message: String,
    sticky_until: Millis,
    at: Millis,
) -> JobEvent {
    JobEvent {
        event_id,
        job_id: format!("job_type/{}", subject.job_type),
        tenant: subject.tenant.clone(),
        job_type: subject.job_type.clone(),
        kind: EventKind::PoolReclassified,
        at,
        attempt: 0,
        worker: None,
        progress: None,
        message: Some(message),
        next_attempt_at: Some(sticky_until),
    }
}

/// The event of a dependency's fleet-wide breaker opening (`open`) or closing: about no
/// one job, so keyed `dependency/<name>` with an empty tenant; `job_type` names the job
/// types it holds (comma-separated), `message` why, `next_attempt_at` (opening) until
/// when they are held.
pub fn dependency_circuit(
    event_id: String,
    dependency: &str,
    job_types: &str,
    open: bool,
    message: String,
    until: Option<Millis>,
    at: Millis,
) -> JobEvent {
    JobEvent {
        event_id,
        job_id: format!("dependency/{dependency}"),
        tenant: String::new(),
        job_type: job_types.to_string(),
        kind: if open { EventKind::DependencyCircuitOpen } else { EventKind::DependencyCircuitClosed },
        at,
        attempt: 0,
        worker: None,
        progress: None,
        message: Some(message),
        next_attempt_at: until,
    }
}

/// The audit event of a replay putting `job` back on its pool topic: who asked
/// (`requested_by`: a tenant's key, an admin key, the CLI's user), which replay, from
/// which topic, and the job's replay count after it (its fresh attempt counter starts
/// at 0).
pub fn replayed(event_id: String, job: &JobSubmitted, requested_by: &str, replay_id: &str, at: Millis) -> JobEvent {
    JobEvent {
        event_id,
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        kind: EventKind::Replayed,
        at,
        attempt: 0,
        worker: None,
        progress: None,
        message: Some(format!(
            "replayed by {requested_by} (replay {replay_id}, replay {} of this job)",
            job.replay_count
        )),
        next_attempt_at: None,
    }
}

/// The event of a submission, derived from the job's record on its pool topic (the pool
/// topic is the `queued` event, as the results topic is the terminal one): `queued`, or
/// `scheduled` with its `execute_at`, at the submission time. Its id is derived from the
/// job, so every copy of the record is the same event. None for records that are not an
/// original submission (retries, replays: their own events tell those steps).
pub fn from_submission(job: &JobSubmitted) -> Option<JobEvent> {
    if job.attempt != 0 || job.replay_count != 0 {
        return None;
    }
    let id = submission_event_id(&job.job_id, job.generation);
    let now = job.submitted_at;
    Some(match submission_state(job, now) {
        JobState::Scheduled => {
            JobEvent { next_attempt_at: job.execute_at, ..event(id, job, EventKind::Scheduled, now) }
        }
        _ => event(id, job, EventKind::Queued, now),
    })
}

/// The id of a generation's submission event: one for every copy of its record and for
/// the event its state tells ([`from_submission`], [`with_submission`]).
fn submission_event_id(job_id: &str, generation: i64) -> String {
    format!("submitted-{job_id}-g{generation}")
}

/// A submission's facts as its job's state holds them (the packed `queued` record or the
/// row): what [`with_submission`] needs to tell its `queued` / `scheduled` event.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmittedState<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub job_type: &'a str,
    pub generation: i64,
    pub submitted_at: Millis,
    /// The state now: `scheduled` tells a `scheduled` event, anything else `queued`.
    pub status: &'a str,
}

/// The Kafka header a submitter puts on a job's original record when it writes the job's
/// `queued` state itself (packed, `core::finished`): the events recorder then records no
/// `queued` event for it, since the state already tells it ([`with_submission`]). A record
/// without it (produced straight to Kafka) is recorded as before.
pub const STATE_WRITTEN_HEADER: &str = "fairway-state-written";

/// A job's history with its submission's event, told by its state when the recorder did
/// not record it (see [`STATE_WRITTEN_HEADER`]): the same event id as
/// [`from_submission`]'s, so a recorded copy is kept and not doubled; in time order.
pub fn with_submission(mut history: Vec<JobEvent>, state: Option<SubmittedState<'_>>) -> Vec<JobEvent> {
    let Some(s) = state else { return history };
    let id = submission_event_id(s.job_id, s.generation);
    if history.iter().any(|e| e.event_id == id) {
        return history;
    }
    let kind = if s.status == JobState::Scheduled.as_str() { EventKind::Scheduled } else { EventKind::Queued };
    let at = s.submitted_at;
    let ev = JobEvent {
        event_id: id,
        job_id: s.job_id.to_string(),
        tenant: s.tenant.to_string(),
        job_type: s.job_type.to_string(),
        kind,
        at,
        attempt: 0,
        worker: None,
        progress: None,
        message: None,
        next_attempt_at: None,
    };
    let at_or_after = history.iter().position(|e| e.at > at).unwrap_or(history.len());
    history.insert(at_or_after, ev);
    history
}

/// The terminal event of a result record (the results topic is the terminal event):
/// its id is derived from the result, so every copy of one result is the same event.
pub fn from_result(r: &JobResult) -> JobEvent {
    JobEvent {
        event_id: format!("result-{}-g{}-a{}", r.job_id, r.generation, r.attempts),
        job_id: r.job_id.clone(),
        tenant: r.tenant.clone(),
        job_type: r.job_type.clone(),
        kind: r.status.into(),
        at: r.finished_at,
        attempt: r.attempts,
        worker: (!r.worker_id.is_empty()).then(|| r.worker_id.clone()),
        progress: None,
        message: r.error.clone(),
        next_attempt_at: None,
    }
}

/// `late_execution`: the job was picked at `now`, after its `not_after`; says how late.
pub fn late_execution(event_id: String, job: &JobSubmitted, not_after: Millis, now: Millis) -> JobEvent {
    let late = now.saturating_sub(not_after).max(0);
    JobEvent {
        message: Some(format!(
            "picked {late} ms after not_after ({not_after}); expired without running (submit with a later \
             not_after, or add capacity if its pool is backlogged)"
        )),
        ..event(event_id, job, EventKind::LateExecution, now)
    }
}

/// Seconds a job's row and events live: `retention` after the job can have finished. A
/// job scheduled ahead keeps its row until `retention` after its `execute_at`, so a far
/// schedule never expires before it runs. At least 1 s (a CQL TTL of 0 means forever).
pub fn row_ttl_secs(retention: Duration, now: Millis, execute_at: Option<Millis>) -> i32 {
    let ahead_ms = execute_at.map_or(0, |at| at.saturating_sub(now).max(0));
    let secs = retention.as_secs().saturating_add((ahead_ms as u64).div_ceil(1000));
    secs.clamp(1, i32::MAX as u64) as i32
}

/// Decides which progress reports become `progress` events: the first, one whose
/// fraction moved by at least `min_step` or whose message changed, at most one per
/// `min_interval_ms` (the last report before the end is always in the heartbeat row).
#[derive(Debug, Clone)]
pub struct ProgressGate {
    min_step: f64,
    min_interval_ms: i64,
    last: Option<(f64, String, Millis)>,
}

impl ProgressGate {
    pub fn new(min_step: f64, min_interval_ms: i64) -> Self {
        ProgressGate { min_step, min_interval_ms, last: None }
    }
    pub fn admit(&mut self, progress: f64, message: &str, now: Millis) -> bool {
        let pass = match &self.last {
            None => true,
            Some((p, m, at)) => {
                now - at >= self.min_interval_ms && ((progress - p).abs() >= self.min_step || m != message)
            }
        };
        if pass {
            self.last = Some((progress, message.to_string(), now));
        }
        pass
    }
}

/// What an idempotent submission does with a key that is already taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakenKey {
    /// The original job exists (a state row): answer with it.
    Duplicate,
    /// No trace of the original job, and the claim is older than any produce can take:
    /// its produce failed and the release was lost. Take the key over (by LWT on the
    /// old job id) and submit.
    Orphaned,
    /// No trace yet, but its produce may still be in flight: answer with its id, state
    /// unknown (the client may ask again).
    Pending,
}

/// `row_exists`: the original job has a state row (written with the produce);
/// `claimed_at`: when the key was claimed; `max_produce_ms`: the producer's delivery
/// timeout (after it, a produce has either failed or its job's row exists).
pub fn taken_key(row_exists: bool, claimed_at: Millis, now: Millis, max_produce_ms: i64) -> TakenKey {
    if row_exists {
        TakenKey::Duplicate
    } else if now - claimed_at > max_produce_ms {
        TakenKey::Orphaned
    } else {
        TakenKey::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobSubmitted;
    use proptest::prelude::*;

    fn job() -> JobSubmitted {
        JobSubmitted::original("j1".into(), "acme".into(), "echo".into(), vec![], 1_000)
    }

    fn ev(kind: EventKind, at: Millis, id: &str) -> JobEvent {
        event(id.into(), &job(), kind, at)
    }

    fn state(status: &'static str, generation: i64, submitted_at: Millis) -> SubmittedState<'static> {
        SubmittedState { job_id: "j1", tenant: "acme", job_type: "echo", generation, submitted_at, status }
    }

    #[test]
    fn the_state_tells_a_submission_the_recorder_did_not_record() {
        let running = ev(EventKind::Started, 1_500, "r1");
        let done = ev(EventKind::Succeeded, 2_000, "d1");
        let h = with_submission(vec![running.clone(), done.clone()], Some(state("succeeded", 0, 1_000)));
        let recorded_copy = from_submission(&job()).unwrap();
        assert_eq!(h[0], recorded_copy, "the same event the recorder would have written, first");
        assert_eq!(&h[1..], &[running, done]);
        // Recorded already (a record produced straight to Kafka): kept, not doubled.
        let again = with_submission(h.clone(), Some(state("succeeded", 0, 1_000)));
        assert_eq!(again, h);
        // No state: the history as it is.
        assert_eq!(with_submission(vec![], None), vec![]);
    }

    #[test]
    fn a_scheduled_state_tells_a_scheduled_event_and_a_rerun_its_generations() {
        let h = with_submission(vec![], Some(state("scheduled", 0, 1_000)));
        assert_eq!(h[0].kind, EventKind::Scheduled);
        let gen0 = from_submission(&job()).unwrap();
        let h = with_submission(vec![gen0.clone()], Some(state("queued", 1, 3_000)));
        assert_eq!(h.len(), 2, "the rerun's submission is its own event");
        assert_eq!((h[0].event_id.as_str(), h[1].event_id.as_str()), (gen0.event_id.as_str(), "submitted-j1-g1"));
    }

    #[test]
    fn submission_is_queued_or_scheduled() {
        let mut j = job();
        assert_eq!(submission_state(&j, 5_000), JobState::Queued);
        let e = from_submission(&j).unwrap();
        assert_eq!((e.kind, e.at, e.event_id.as_str()), (EventKind::Queued, 1_000, "submitted-j1-g0"));
        j.execute_at = Some(9_000);
        assert_eq!(submission_state(&j, 5_000), JobState::Scheduled);
        let e = from_submission(&j).unwrap();
        assert_eq!((e.kind, e.next_attempt_at), (EventKind::Scheduled, Some(9_000)));
        j.attempt = 1;
        assert_eq!(from_submission(&j), None, "a retry is not a submission");
        assert_eq!(submission_state(&j, 9_000), JobState::Queued, "due now: queued");
    }

    #[test]
    fn queued_jobs_show_why_they_wait() {
        assert_eq!(
            shown_state("queued", Some(WaitReason::RateLimited)),
            Some((JobState::Waiting, Some(WaitReason::RateLimited)))
        );
        assert_eq!(shown_state("running", Some(WaitReason::RateLimited)), Some((JobState::Running, None)));
        assert_eq!(shown_state("handed_off", None), Some((JobState::Queued, None)));
        assert_eq!(shown_state("succeeded", None), Some((JobState::Succeeded, None)));
        assert_eq!(shown_state("bogus", None), None);
        assert_eq!(WaitReason::from_scheduler("deficit"), Some(WaitReason::FairShare));
        assert_eq!(WaitReason::from_scheduler("nope"), None);
    }

    #[test]
    fn history_folds_to_the_last_state_and_terminal_absorbs() {
        let h = vec![ev(EventKind::Started, 20, "b"), ev(EventKind::Queued, 10, "a"), ev(EventKind::Progress, 25, "c")];
        assert_eq!(fold(&h), Some(JobState::Running));
        let mut h2 = h.clone();
        h2.push(ev(EventKind::Succeeded, 30, "d"));
        h2.push(ev(EventKind::Retrying, 40, "e"));
        h2.push(ev(EventKind::WebhookDelivered, 41, "f"));
        assert_eq!(fold(&h2), Some(JobState::Succeeded));
        assert_eq!(fold(&[]), None);
        assert_eq!(fold(&[ev(EventKind::Progress, 1, "x")]), None);
    }

    #[test]
    fn a_result_is_the_terminal_event() {
        let r = JobResult {
            job_id: "j1".into(),
            tenant: "acme".into(),
            job_type: "echo".into(),
            pool: crate::model::Pool::Short,
            status: crate::model::JobStatus::Failed,
            output: None,
            error: Some("boom".into()),
            failure_class: None,
            attempts: 3,
            generation: 1,
            submitted_at: 1,
            started_at: Some(2),
            finished_at: 9,
            worker_id: "w".into(),
            peak_memory_bytes: None,
            cpu_ms: None,
        };
        let e = from_result(&r);
        assert_eq!((e.kind, e.at, e.attempt, e.message.as_deref()), (EventKind::Failed, 9, 3, Some("boom")));
        assert!(ends_stream(e.kind));
        assert_eq!(e.event_id, from_result(&r).event_id, "copies of one result are one event");
        assert_ne!(e.event_id, from_result(&JobResult { attempts: 4, ..r }).event_id);
    }

    #[test]
    fn late_execution_says_how_late_and_what_to_do() {
        let e = late_execution("e".into(), &job(), 1_000, 3_500);
        assert_eq!(e.kind, EventKind::LateExecution);
        let m = e.message.unwrap();
        assert!(m.contains("2500 ms") && m.contains("not_after"), "{m}");
        assert!(!ends_stream(EventKind::LateExecution) && ends_stream(EventKind::Expired));
    }

    #[test]
    fn row_ttl_covers_the_schedule() {
        let day = Duration::from_secs(86_400);
        assert_eq!(row_ttl_secs(day, 0, None), 86_400);
        assert_eq!(row_ttl_secs(day, 0, Some(-5)), 86_400, "past schedule adds nothing");
        assert_eq!(row_ttl_secs(day, 0, Some(3_600_001)), 86_400 + 3_601);
        assert_eq!(row_ttl_secs(Duration::ZERO, 0, None), 1, "never 0 (forever)");
        assert_eq!(row_ttl_secs(Duration::from_secs(u64::MAX), 0, None), i32::MAX);
        // Times of a record produced straight to Kafka (no submit checks) do not overflow.
        assert_eq!(row_ttl_secs(day, i64::MAX, Some(i64::MIN)), 86_400);
        assert_eq!(row_ttl_secs(day, i64::MIN, Some(i64::MAX)), i32::MAX);
        let e = late_execution("e".into(), &job(), i64::MIN, i64::MAX);
        assert!(e.message.unwrap().contains(&i64::MAX.to_string()));
    }

    #[test]
    fn progress_gate_throttles() {
        let mut g = ProgressGate::new(0.01, 500);
        assert!(g.admit(0.0, "", 0));
        assert!(!g.admit(0.5, "", 100), "too soon");
        assert!(g.admit(0.5, "", 600));
        assert!(!g.admit(0.505, "", 2_000), "too small a step");
        assert!(g.admit(0.505, "phase 2", 2_000), "message changed");
    }

    #[test]
    fn taken_keys() {
        assert_eq!(taken_key(true, 0, 1_000_000, 30_000), TakenKey::Duplicate);
        assert_eq!(taken_key(false, 0, 10_000, 30_000), TakenKey::Pending);
        assert_eq!(taken_key(false, 0, 30_001, 30_000), TakenKey::Orphaned);
    }

    fn arb_kind() -> impl Strategy<Value = EventKind> {
        prop::sample::select(EventKind::ALL.to_vec())
    }

    proptest! {
        /// Whatever arrives after a terminal event, the fold stays at that terminal state;
        /// the fold does not depend on arrival order.
        #[test]
        fn prop_fold_is_order_free_and_terminal_absorbs(
            kinds in prop::collection::vec((arb_kind(), 0i64..1_000), 0..30),
            seed in any::<u64>(),
        ) {
            let evs: Vec<JobEvent> =
                kinds.iter().enumerate().map(|(i, (k, at))| ev(*k, *at, &format!("{i:04}"))).collect();
            let mut shuffled = evs.clone();
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            prop_assert_eq!(fold(&evs), fold(&shuffled));
            let mut sorted = evs.clone();
            sorted.sort_by(|a, b| (a.at, &a.event_id).cmp(&(b.at, &b.event_id)));
            if let Some(first_terminal) = sorted.iter().position(|e| e.kind.is_terminal()) {
                prop_assert_eq!(fold(&evs), state_after(sorted[first_terminal].kind));
            } else if let Some(last) = sorted.iter().rev().find_map(|e| state_after(e.kind)) {
                prop_assert_eq!(fold(&evs), Some(last));
            }
        }

        #[test]
        fn prop_ttl_is_positive_and_covers_the_schedule(ret in 0u64..10_000_000, now in 0i64..1<<40, ahead in -1i64<<30..1<<36) {
            let t = row_ttl_secs(Duration::from_secs(ret), now, Some(now + ahead));
            prop_assert!(t >= 1);
            prop_assert!(i64::from(t) * 1000 >= ahead.max(0));
            prop_assert!(i64::from(t) as u64 >= ret.min(i32::MAX as u64));
        }

        /// Events pass at most once per interval.
        #[test]
        fn prop_progress_gate_rate(reports in prop::collection::vec((0.0f64..1.0, 0i64..50), 1..200)) {
            let mut g = ProgressGate::new(0.01, 100);
            let mut now = 0;
            let mut passed: Vec<Millis> = Vec::new();
            for (p, dt) in reports {
                now += dt;
                if g.admit(p, "", now) {
                    passed.push(now);
                }
            }
            prop_assert!(passed.windows(2).all(|w| w[1] - w[0] >= 100));
            prop_assert!(!passed.is_empty());
        }
    }
}
