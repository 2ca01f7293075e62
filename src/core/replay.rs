//! Replay decisions: which dead letters / retry records `fairway replay` sends back to
//! their pool, and in what shape. Pure: no I/O, `now` is an argument.
//!
//! - [`ReplaySource`]: where to read (`dlq`, `retry.<class>`).
//! - [`Candidate`]: one source record normalised (a dead letter and a retry record carry
//!   the failure facts in different places).
//! - [`ReplayFilter::matches`]: tenant, job type, class, time range, error text, job ids.
//! - [`check_loop`]: the loop guard. A job already replayed `max_replays` times is refused
//!   unless forced, so a job that can never succeed does not cycle DLQ -> pool -> DLQ.
//! - [`prepare`]: the job as it is re-produced. It gets a **fresh attempt counter**
//!   (`attempt` 0, `crash_count` 0) and provenance (`replay_count + 1`, `replayed_from`).
//!   The failure bookkeeping of the previous run (`not_before`, `last_error`,
//!   `last_failure_class`, `first_failure_at`) is **cleared**: the worker's retry and
//!   dead-letter code reads those fields as facts about the *current* run (the retry
//!   policy's `AttemptState::last_error`, `first_failure_at` of a new dead letter), so
//!   keeping them would blame a new failure on the old error and date it from the old
//!   run. The old run's history is not lost: its dead letter stays on the DLQ topic and
//!   `replayed_from` points there. The submitter's own contract (`execute_at`,
//!   `not_after`, `generation`, priority, pool, idempotency key) is kept.
//! - [`decide`]: the order the checks run in for one record (undecodable, filter,
//!   duplicate in this run, loop guard, past `not_after`, replay).

use crate::model::{DeadLetter, FailureClass, JobSubmitted, Millis};
use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

/// Replays of one job allowed before `--force` is needed.
pub const DEFAULT_MAX_REPLAYS: i32 = 3;

/// Failure classes that have a retry topic (`retry.<class>`).
pub const RETRY_CLASSES: [FailureClass; 4] =
    [FailureClass::AppError, FailureClass::Timeout, FailureClass::Dependency, FailureClass::WorkerCrash];

/// The topic a replay reads, named as on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplaySource {
    /// The dead-letter topic: records are [`DeadLetter`]s.
    Dlq,
    /// A per-class retry topic: records are [`JobSubmitted`] waiting for `not_before`.
    Retry(FailureClass),
}

impl ReplaySource {
    pub fn all() -> Vec<ReplaySource> {
        let mut v = vec![ReplaySource::Dlq];
        v.extend(RETRY_CLASSES.iter().map(|c| ReplaySource::Retry(*c)));
        v
    }
}

impl fmt::Display for ReplaySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplaySource::Dlq => f.write_str("dlq"),
            ReplaySource::Retry(c) => write!(f, "retry.{}", c.as_str()),
        }
    }
}

impl FromStr for ReplaySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ReplaySource::all().into_iter().find(|v| v.to_string() == s).ok_or_else(|| {
            let names: Vec<String> = ReplaySource::all().iter().map(|v| v.to_string()).collect();
            format!("unknown replay source {s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// One record of the source topic, normalised for filtering.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The job; None for a dead letter that only carries the raw bytes of a message
    /// that could not be decoded (nothing to replay).
    pub job: Option<JobSubmitted>,
    pub class: Option<FailureClass>,
    /// The time `since`/`until` compare with: `last_failure_at` of a dead letter,
    /// `first_failure_at` (else `submitted_at`) of a retry record.
    pub at: Millis,
    pub last_error: Option<String>,
    /// The dead letter's reason (None for retry records).
    pub reason: Option<String>,
    /// Attempts used up by the failed run.
    pub attempts: i32,
    /// Replays the job already went through.
    pub replay_count: i32,
}

impl Candidate {
    pub fn from_dead_letter(dl: DeadLetter) -> Candidate {
        let replay_count = dl.job.as_ref().map_or(dl.replay_count, |j| j.replay_count.max(dl.replay_count));
        Candidate {
            last_error: dl.last_error.or_else(|| dl.job.as_ref().and_then(|j| j.last_error.clone())),
            job: dl.job,
            class: Some(dl.failure_class),
            at: dl.last_failure_at,
            reason: Some(dl.reason),
            attempts: dl.attempts,
            replay_count,
        }
    }

    /// A record of the retry topic of `topic_class`.
    pub fn from_retry(job: JobSubmitted, topic_class: FailureClass) -> Candidate {
        Candidate {
            class: job.last_failure_class.or(Some(topic_class)),
            at: job.first_failure_at.unwrap_or(job.submitted_at),
            last_error: job.last_error.clone(),
            reason: None,
            attempts: job.attempt,
            replay_count: job.replay_count,
            job: Some(job),
        }
    }
}

/// What to replay. Every criterion that is set must match (AND); unset ones match all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    pub tenant: Option<String>,
    pub job_type: Option<String>,
    pub class: Option<FailureClass>,
    /// Inclusive lower bound on [`Candidate::at`].
    pub since: Option<Millis>,
    /// Exclusive upper bound on [`Candidate::at`].
    pub until: Option<Millis>,
    /// Case-insensitive substring of the last error or the dead letter's reason.
    pub error_contains: Option<String>,
    /// Only these job ids (an empty set matches nothing).
    pub job_ids: Option<HashSet<String>>,
}

impl ReplayFilter {
    /// True when the candidate has a job and satisfies every criterion set.
    pub fn matches(&self, rec: &Candidate) -> bool {
        let Some(job) = &rec.job else { return false };
        if self.tenant.as_ref().is_some_and(|t| *t != job.tenant) {
            return false;
        }
        if self.job_type.as_ref().is_some_and(|t| *t != job.job_type) {
            return false;
        }
        if self.class.is_some() && self.class != rec.class {
            return false;
        }
        if self.since.is_some_and(|s| rec.at < s) || self.until.is_some_and(|u| rec.at >= u) {
            return false;
        }
        if let Some(needle) = &self.error_contains {
            let needle = needle.to_lowercase();
            let hit = |h: &Option<String>| h.as_ref().is_some_and(|h| h.to_lowercase().contains(&needle));
            if !hit(&rec.last_error) && !hit(&rec.reason) {
                return false;
            }
        }
        if self.job_ids.as_ref().is_some_and(|ids| !ids.contains(&job.job_id)) {
            return false;
        }
        true
    }

    /// A stable text form of the criteria (sorted job ids), for deriving a replay id.
    pub fn canonical(&self) -> String {
        let mut parts = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        };
        put("tenant", self.tenant.clone());
        put("job_type", self.job_type.clone());
        put("class", self.class.map(|c| c.as_str().to_string()));
        put("since", self.since.map(|v| v.to_string()));
        put("until", self.until.map(|v| v.to_string()));
        put("error_contains", self.error_contains.clone());
        put(
            "job_ids",
            self.job_ids.as_ref().map(|ids| {
                let mut v: Vec<&str> = ids.iter().map(String::as_str).collect();
                v.sort_unstable();
                v.join(",")
            }),
        );
        parts.join("\u{1f}")
    }
}

/// The loop guard: `Ok` when a job replayed `replay_count` times may be replayed again.
/// With the default of 3, a job is replayed at most 3 times; the 4th needs `force`.
pub fn check_loop(replay_count: i32, max_replays: i32, force: bool) -> Result<(), String> {
    if force || replay_count < max_replays {
        return Ok(());
    }
    Err(format!(
        "already replayed {replay_count} time{} (limit {max_replays}): it keeps failing, so fix the cause \
         first, then replay it deliberately with --force --job-id <id>",
        if replay_count == 1 { "" } else { "s" }
    ))
}

/// The job as re-produced to its pool: fresh attempt counter, failure bookkeeping
/// cleared, provenance set (see the module documentation for why).
pub fn prepare(job: &JobSubmitted, from_topic: &str) -> JobSubmitted {
    JobSubmitted {
        attempt: 0,
        crash_count: 0,
        not_before: None,
        last_error: None,
        last_failure_class: None,
        first_failure_at: None,
        replay_count: job.replay_count.saturating_add(1),
        replayed_from: Some(from_topic.to_string()),
        traceparent: None,
        tracestate: None,
        ..job.clone()
    }
}

/// Why a record is not replayed (or that it is).
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No decodable job in the record.
    Undecodable,
    /// Another tenant's job, when the filter names a tenant (counted apart: a tenant's
    /// replay reports nothing of other tenants' records).
    OtherTenant,
    /// The filter does not match.
    Filtered,
    /// The same job id was already replayed earlier in this run.
    Duplicate,
    /// Refused by the loop guard; the message says why and what to do.
    LoopGuard(String),
    /// Its `not_after` passed: the worker would only expire it.
    Expired,
    /// Re-produce this job (already [`prepare`]d).
    Replay(Box<JobSubmitted>),
}

impl Decision {
    /// Whether the record passed the filter (counted as "matched").
    pub fn matched(&self) -> bool {
        !matches!(self, Decision::Undecodable | Decision::OtherTenant | Decision::Filtered)
    }
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Undecodable => "undecodable",
            Decision::OtherTenant => "other tenant",
            Decision::Filtered => "filtered",
            Decision::Duplicate => "duplicate",
            Decision::LoopGuard(_) => "loop guard",
            Decision::Expired => "expired",
            Decision::Replay(_) => "replay",
        }
    }
}

/// Replay settings the decision depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    pub max_replays: i32,
    pub force: bool,
}

impl Default for Guard {
    fn default() -> Self {
        Guard { max_replays: DEFAULT_MAX_REPLAYS, force: false }
    }
}

/// Decides one record. `seen` holds the job ids replayed earlier in this run (the
/// caller adds the id when the decision is `Replay`).
pub fn decide(
    rec: &Candidate,
    filter: &ReplayFilter,
    seen: &HashSet<String>,
    guard: Guard,
    from_topic: &str,
    now: Millis,
) -> Decision {
    let Some(job) = &rec.job else { return Decision::Undecodable };
    if filter.tenant.as_ref().is_some_and(|t| *t != job.tenant) {
        return Decision::OtherTenant;
    }
    if !filter.matches(rec) {
        return Decision::Filtered;
    }
    if seen.contains(&job.job_id) {
        return Decision::Duplicate;
    }
    if let Err(why) = check_loop(rec.replay_count, guard.max_replays, guard.force) {
        return Decision::LoopGuard(why);
    }
    if job.not_after.is_some_and(|n| n < now) {
        return Decision::Expired;
    }
    let mut out = prepare(job, from_topic);
    // A dead letter may know of more replays than the job it carries.
    out.replay_count = out.replay_count.max(rec.replay_count.saturating_add(1));
    Decision::Replay(Box::new(out))
}

/// The default replay id: the source and the filter, hashed (FNV-1a 64), so running the
/// same command again resumes the same replay. `canonical` is [`ReplayFilter::canonical`]
/// or any other stable text of the criteria (the CLI uses the arguments as typed, so a
/// relative `--since -1h` names the same replay on every run).
pub fn derive_id(source: ReplaySource, canonical: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in source.to_string().bytes().chain([0u8]).chain(canonical.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{source}-{h:016x}")
}

/// `s` cut to at most `max` characters (on a char boundary), with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    let mut it = s.char_indices();
    match it.nth(max) {
        None => s.to_string(),
        Some(_) => {
            let keep = max.saturating_sub(1);
            let end = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
            format!("{}…", &s[..end])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Pool, Priority};

    fn job(id: &str, tenant: &str, jt: &str) -> JobSubmitted {
        JobSubmitted {
            job_id: id.into(),
            tenant: tenant.into(),
            job_type: jt.into(),
            pool: Some(Pool::Short),
            priority: Priority::Urgent,
            payload: b"{}".to_vec(),
            idempotency_key: Some("k1".into()),
            execute_at: Some(5),
            not_after: None,
            attempt: 5,
            crash_count: 2,
            generation: 7,
            submitted_at: 1_000,
            not_before: Some(9_000),
            last_error: Some("job error".into()),
            last_failure_class: Some(FailureClass::AppError),
            first_failure_at: Some(2_000),
            replay_count: 1,
            replayed_from: Some("old.dlq".into()),
            traceparent: None,
            tracestate: None,
            flow_key: Some("vectorizer".into()),
            user_key: Some("user-42".into()),
            handoff_count: 1,
        }
    }

    fn dl(j: Option<JobSubmitted>) -> DeadLetter {
        DeadLetter {
            replay_count: j.as_ref().map_or(0, |j| j.replay_count),
            job: j,
            raw: None,
            failure_class: FailureClass::Timeout,
            reason: "deadline of 30s passed".into(),
            last_error: Some("Upstream returned 503".into()),
            attempts: 2,
            first_failure_at: 2_000,
            last_failure_at: 10_000,
            origin_topic: "p.jobs.short".into(),
            origin_partition: 1,
            origin_offset: 42,
        }
    }

    fn cand(tenant: &str, jt: &str) -> Candidate {
        Candidate::from_dead_letter(dl(Some(job("j1", tenant, jt))))
    }

    #[test]
    fn candidates_from_dead_letters_and_retry_records() {
        let c = cand("acme", "echo");
        assert_eq!(c.class, Some(FailureClass::Timeout));
        assert_eq!(c.at, 10_000, "last_failure_at for dead letters");
        assert_eq!(c.last_error.as_deref(), Some("Upstream returned 503"));
        assert_eq!(c.attempts, 2);
        assert_eq!(c.replay_count, 1);

        let mut d = dl(Some(job("j1", "a", "b")));
        d.replay_count = 3; // the dead letter knows more replays than its job
        assert_eq!(Candidate::from_dead_letter(d).replay_count, 3);

        let mut d = dl(None);
        d.raw = Some(b"junk".to_vec());
        let c = Candidate::from_dead_letter(d);
        assert!(c.job.is_none());
        assert!(!ReplayFilter::default().matches(&c), "nothing to replay without a job");

        let r = Candidate::from_retry(job("j2", "a", "b"), FailureClass::Dependency);
        assert_eq!(r.class, Some(FailureClass::AppError), "the job's own class wins");
        assert_eq!(r.at, 2_000, "first_failure_at for retry records");
        assert_eq!(r.attempts, 5);
        let mut j = job("j3", "a", "b");
        j.last_failure_class = None;
        j.first_failure_at = None;
        let r = Candidate::from_retry(j, FailureClass::Dependency);
        assert_eq!(r.class, Some(FailureClass::Dependency), "else the topic's class");
        assert_eq!(r.at, 1_000, "else submitted_at");
    }

    #[test]
    fn empty_filter_matches_everything_decodable() {
        assert!(ReplayFilter::default().matches(&cand("acme", "echo")));
    }

    #[test]
    fn each_criterion_filters() {
        let c = cand("acme", "echo");
        let f = |f: ReplayFilter| f.matches(&c);
        assert!(f(ReplayFilter { tenant: Some("acme".into()), ..Default::default() }));
        assert!(!f(ReplayFilter { tenant: Some("globex".into()), ..Default::default() }));
        assert!(f(ReplayFilter { job_type: Some("echo".into()), ..Default::default() }));
        assert!(!f(ReplayFilter { job_type: Some("report".into()), ..Default::default() }));
        assert!(f(ReplayFilter { class: Some(FailureClass::Timeout), ..Default::default() }));
        assert!(!f(ReplayFilter { class: Some(FailureClass::AppError), ..Default::default() }));
        // since inclusive, until exclusive
        assert!(f(ReplayFilter { since: Some(10_000), ..Default::default() }));
        assert!(!f(ReplayFilter { since: Some(10_001), ..Default::default() }));
        assert!(f(ReplayFilter { until: Some(10_001), ..Default::default() }));
        assert!(!f(ReplayFilter { until: Some(10_000), ..Default::default() }));
        assert!(f(ReplayFilter { since: Some(9_000), until: Some(11_000), ..Default::default() }));
        // error text: case-insensitive, last error or reason
        assert!(f(ReplayFilter { error_contains: Some("returned 503".into()), ..Default::default() }));
        assert!(f(ReplayFilter { error_contains: Some("UPSTREAM".into()), ..Default::default() }));
        assert!(f(ReplayFilter { error_contains: Some("deadline".into()), ..Default::default() }));
        assert!(!f(ReplayFilter { error_contains: Some("404".into()), ..Default::default() }));
        // job ids
        let ids = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<HashSet<_>>());
        assert!(f(ReplayFilter { job_ids: ids(&["j0", "j1"]), ..Default::default() }));
        assert!(!f(ReplayFilter { job_ids: ids(&["j0"]), ..Default::default() }));
        assert!(!f(ReplayFilter { job_ids: ids(&[]), ..Default::default() }));
        // all criteria AND together
        let all = ReplayFilter {
            tenant: Some("acme".into()),
            job_type: Some("echo".into()),
            class: Some(FailureClass::Timeout),
            since: Some(0),
            until: Some(20_000),
            error_contains: Some("503".into()),
            job_ids: ids(&["j1"]),
        };
        assert!(f(all.clone()));
        assert!(!f(ReplayFilter { tenant: Some("x".into()), ..all }));
    }

    #[test]
    fn error_filter_without_any_error_text_does_not_match() {
        let mut d = dl(Some(job("j", "a", "b")));
        d.last_error = None;
        d.reason = String::new();
        let mut c = Candidate::from_dead_letter(d);
        c.last_error = None;
        assert!(!ReplayFilter { error_contains: Some("x".into()), ..Default::default() }.matches(&c));
    }

    #[test]
    fn loop_guard_allows_up_to_max_and_force_overrides() {
        assert!(check_loop(0, 3, false).is_ok());
        assert!(check_loop(2, 3, false).is_ok());
        let e = check_loop(3, 3, false).unwrap_err();
        assert!(e.contains("already replayed 3 times") && e.contains("--force"), "{e}");
        assert!(check_loop(1, 1, false).unwrap_err().contains("1 time "));
        assert!(check_loop(3, 3, true).is_ok());
        assert!(check_loop(100, 3, true).is_ok());
        assert!(check_loop(0, 0, false).is_err(), "max 0: never without --force");
    }

    #[test]
    fn prepare_gives_a_fresh_attempt_counter_and_provenance() {
        let j = job("j1", "acme", "echo");
        let p = prepare(&j, "it.dlq");
        assert_eq!((p.attempt, p.crash_count), (0, 0));
        assert_eq!(p.not_before, None);
        assert_eq!((p.last_error.as_deref(), p.last_failure_class, p.first_failure_at), (None, None, None));
        assert_eq!(p.replay_count, 2);
        assert_eq!(p.replayed_from.as_deref(), Some("it.dlq"));
        // The submitter's contract is untouched.
        let keep = |x: &JobSubmitted| {
            (
                x.job_id.clone(),
                x.tenant.clone(),
                x.job_type.clone(),
                x.pool,
                x.priority,
                x.payload.clone(),
                x.idempotency_key.clone(),
                x.execute_at,
                x.not_after,
                x.generation,
                x.submitted_at,
                x.flow_key.clone(),
            )
        };
        assert_eq!(keep(&p), keep(&j));
        let mut big = j.clone();
        big.replay_count = i32::MAX;
        assert_eq!(prepare(&big, "t").replay_count, i32::MAX, "saturates");
    }

    #[test]
    fn decide_runs_the_checks_in_order() {
        let g = Guard::default();
        let none = ReplayFilter::default();
        let seen = HashSet::new();
        let mut raw = dl(None);
        raw.raw = Some(vec![1]);
        assert_eq!(decide(&Candidate::from_dead_letter(raw), &none, &seen, g, "t", 0), Decision::Undecodable);

        let c = cand("acme", "echo");
        let other = ReplayFilter { tenant: Some("globex".into()), ..Default::default() };
        assert_eq!(decide(&c, &other, &seen, g, "t", 0), Decision::OtherTenant, "another tenant's, counted apart");
        assert!(!Decision::OtherTenant.matched());
        let own_other_type =
            ReplayFilter { tenant: Some("acme".into()), job_type: Some("x".into()), ..Default::default() };
        assert_eq!(decide(&c, &own_other_type, &seen, g, "t", 0), Decision::Filtered);
        assert!(!Decision::Filtered.matched());

        let Decision::Replay(p) = decide(&c, &none, &seen, g, "it.dlq", 0) else { panic!() };
        assert_eq!((p.attempt, p.replay_count, p.replayed_from.as_deref()), (0, 2, Some("it.dlq")));

        let seen1: HashSet<String> = ["j1".to_string()].into();
        assert_eq!(decide(&c, &none, &seen1, g, "t", 0), Decision::Duplicate);

        let mut at_max = c.clone();
        at_max.replay_count = 3;
        let d = decide(&at_max, &none, &seen, g, "t", 0);
        assert!(matches!(&d, Decision::LoopGuard(m) if m.contains("--force")), "{d:?}");
        assert!(d.matched(), "refused records still count as matched");
        let forced = Guard { force: true, ..g };
        let Decision::Replay(p) = decide(&at_max, &none, &seen, forced, "t", 0) else { panic!() };
        assert_eq!(p.replay_count, 4, "the dead letter's count, plus one");

        let mut late = c.clone();
        late.job.as_mut().unwrap().not_after = Some(100);
        assert_eq!(decide(&late, &none, &seen, g, "t", 101), Decision::Expired);
        assert!(matches!(decide(&late, &none, &seen, g, "t", 100), Decision::Replay(_)));
    }

    #[test]
    fn sources_parse_and_print() {
        for s in ["dlq", "retry.app_error", "retry.timeout", "retry.dependency", "retry.worker_crash"] {
            assert_eq!(s.parse::<ReplaySource>().unwrap().to_string(), s);
        }
        assert_eq!("retry.timeout".parse::<ReplaySource>().unwrap(), ReplaySource::Retry(FailureClass::Timeout));
        let e = "retry.poison".parse::<ReplaySource>().unwrap_err();
        assert!(e.contains("retry.poison") && e.contains("retry.worker_crash"), "{e}");
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let f = ReplayFilter {
            tenant: Some("acme".into()),
            job_ids: Some(["b".to_string(), "a".to_string()].into()),
            ..Default::default()
        };
        let g = ReplayFilter { job_ids: Some(["a".to_string(), "b".to_string()].into()), ..f.clone() };
        assert_eq!(f.canonical(), g.canonical(), "job id order does not matter");
        let id = derive_id(ReplaySource::Dlq, &f.canonical());
        assert_eq!(id, derive_id(ReplaySource::Dlq, &g.canonical()));
        assert!(id.starts_with("dlq-") && id.len() == 4 + 16, "{id}");
        assert_ne!(id, derive_id(ReplaySource::Retry(FailureClass::Timeout), &f.canonical()));
        assert_ne!(id, derive_id(ReplaySource::Dlq, &ReplayFilter::default().canonical()));
        // Criteria with the same text in different fields differ.
        let t = ReplayFilter { tenant: Some("x".into()), ..Default::default() };
        let j = ReplayFilter { job_type: Some("x".into()), ..Default::default() };
        assert_ne!(t.canonical(), j.canonical());
        // Pinned: the id must not change between releases, or re-runs stop resuming.
        assert_eq!(derive_id(ReplaySource::Dlq, ""), "dlq-f593a5677016d83c");
    }

    #[test]
    fn truncate_is_char_safe() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly10!", 10), "exactly10!");
        assert_eq!(truncate("abcdefghijk", 10), "abcdefghi…");
        assert_eq!(truncate("ümlautümlautü", 5), "ümla…");
        assert_eq!(truncate("", 0), "");
    }
}
