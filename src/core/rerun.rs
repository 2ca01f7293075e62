//! "Rerun all" decisions by generation numbers: which records of a pool topic a rerun
//! re-produces, under which generation, and in what shape. Pure: no I/O, `now` is an
//! argument. The I/O shell is [`crate::ops::rerun`] (`fairway rerun`).
//!
//! # Generations
//!
//! Every job carries a `generation` (0 on submission unless the producer sets one). A
//! rerun draws a new number `G` for each (tenant, job type) pair it covers from the
//! `generations` table (the *target* generation) and re-produces every selected job with
//! `generation = G`. The worker's effectively-once check does the rest: it records the
//! generation it ran in the job's row, skips a copy of a *lower* generation as
//! superseded, runs a copy of a *higher* one even if the job finished, and makes a
//! higher copy wait while the lower one still runs with a fresh heartbeat. So a job in
//! flight when the rerun starts completes its old run, then runs again as `G`; no job
//! row is reset.
//!
//! - [`next_generation`]: `G` for a new rerun (above every pair's target *and* above any
//!   generation already seen on the selected records, since producers may set one), or
//!   the current target when resuming an interrupted rerun.
//! - [`raise`]: the write that moves one pair's target to `G` (insert or
//!   compare-and-set; the I/O edge runs it as an LWT and retries on a lost race, so two
//!   concurrent reruns never share a number).
//! - [`RerunFilter`]: scope (tenant and/or job type), submission time range, job ids.
//! - [`Selection`]: the filtered records of the scan, deduplicated by job id keeping the
//!   **newest** record (highest generation, then latest broker timestamp, then offset):
//!   a pool topic holds the submission, relayed retries and earlier rerun copies of a job.
//! - [`Selection::plan`]: per job, rerun it, or skip it because its newest record is
//!   already at `>= G` (an earlier run of this rerun, or a later rerun, produced it) or
//!   because its `not_after` passed (the worker would only expire it).
//! - [`prepare`]: the rerun copy.
//! - [`check_row`]: what the job's row says just before producing (already ran at
//!   `>= G`, or a cancellation flag to clear or to leave).
//! - [`derive_id`]: the rerun id its resume points are saved under.
//!
//! # The rerun copy
//!
//! Same `job_id`, `generation = G`, a fresh attempt counter (`attempt` 0, `crash_count`
//! 0, `handoff_count` 0) and no failure bookkeeping (`not_before`, `last_error`, `last_failure_class`,
//! `first_failure_at` cleared: the worker reads those as facts about the *current* run,
//! see [`crate::core::replay`]). The submitter's contract is kept: tenant, job type,
//! pool, priority, payload, idempotency key, `execute_at`, `not_after`, `submitted_at`
//! (results of a rerun therefore report the original submission time).
//!
//! The replay provenance (`replay_count`, `replayed_from`) is left **untouched**: a
//! rerun is not a replay. The replay loop guard counts how often a *failing* job went
//! DLQ -> pool; bumping it on a rerun would make a later replay of a job that was merely
//! rerun need `--force`, and resetting it would let a job that keeps failing bypass the
//! guard. `replayed_from` keeps naming where the last replay read the job from.
//!
//! # Cancellation flags
//!
//! The `cancel_requested` flag of a job row has no generation. A flag on a row whose run
//! is over (terminal status) at a generation below `G` was consumed by that run: it is
//! stale and would make the worker cancel the rerun copy "before it started", so it is
//! cleared ([`CancelAction::Clear`]). A flag on a row that is still queued or running
//! was asked for the run in progress: it is left in place ([`CancelAction::Pending`]),
//! because clearing it would let that run go on against the request. The worker then
//! cancels the rerun copy too (it cannot tell whose flag it is); the report lists those
//! jobs so they can be rerun deliberately (`--job-id`) once they stopped.

use crate::model::{JobStatus, JobSubmitted, Millis, Pool};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Which (tenant, job type) pairs a rerun covers; at least one of the two is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RerunScope {
    /// None: every tenant.
    pub tenant: Option<String>,
    /// None: every job type.
    pub job_type: Option<String>,
}

impl RerunScope {
    pub fn validate(&self) -> Result<(), String> {
        if self.tenant.is_none() && self.job_type.is_none() {
            return Err("a rerun needs a tenant, a job type, or both (every job of every tenant is not a rerun \
                        fairway offers)"
                .into());
        }
        Ok(())
    }

    pub fn covers(&self, tenant: &str, job_type: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == tenant) && self.job_type.as_deref().is_none_or(|j| j == job_type)
    }

    /// `tenant/job_type`, `*` for "every".
    pub fn label(&self) -> String {
        format!("{}/{}", self.tenant.as_deref().unwrap_or("*"), self.job_type.as_deref().unwrap_or("*"))
    }
}

/// What a rerun selects. Every criterion that is set must match (AND).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RerunFilter {
    pub scope: RerunScope,
    /// Inclusive lower bound on the job's `submitted_at`.
    pub since: Option<Millis>,
    /// Exclusive upper bound on the job's `submitted_at`.
    pub until: Option<Millis>,
    /// Only these job ids (an empty set matches nothing).
    pub job_ids: Option<HashSet<String>>,
}

impl RerunFilter {
    pub fn matches(&self, job: &JobSubmitted) -> bool {
        self.scope.covers(&job.tenant, &job.job_type)
            && self.since.is_none_or(|s| job.submitted_at >= s)
            && self.until.is_none_or(|u| job.submitted_at < u)
            && self.job_ids.as_ref().is_none_or(|ids| ids.contains(&job.job_id))
    }

    /// A stable text form of the criteria beyond the scope (sorted job ids); empty when
    /// there are none. Part of the rerun id.
    pub fn canonical_extra(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.since {
            parts.push(format!("since={s}"));
        }
        if let Some(u) = self.until {
            parts.push(format!("until={u}"));
        }
        if let Some(ids) = &self.job_ids {
            let mut v: Vec<&str> = ids.iter().map(String::as_str).collect();
            v.sort_unstable();
            parts.push(format!("job_ids={}", v.join(",")));
        }
        parts.join("\u{1f}")
    }
}

/// Where a record sits on the pool topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub pool: Pool,
    pub partition: i32,
    pub offset: i64,
}

/// A record of the scan that passed the filter.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub pos: Position,
    /// Broker timestamp (ms), if the record has one.
    pub timestamp: Option<Millis>,
    pub job: JobSubmitted,
}

impl Seen {
    /// The order "newest" means: generation, then broker time, then offset (records of
    /// one job share a partition, as every producer keys by tenant).
    fn rank(&self) -> (i64, Millis, i64) {
        (self.job.generation, self.timestamp.unwrap_or(i64::MIN), self.pos.offset)
    }
}

/// The scan's filtered records, one per job id: the newest.
#[derive(Debug, Default)]
pub struct Selection {
    newest: HashMap<String, Seen>,
    /// Older records of a job already selected (or replaced by a newer one).
    pub duplicates: u64,
    /// Highest generation on any offered record (None: nothing offered).
    max_generation: Option<i64>,
    pairs: BTreeSet<(String, String)>,
}

impl Selection {
    /// Adds a record that passed the filter.
    pub fn offer(&mut self, seen: Seen) {
        self.max_generation = Some(self.max_generation.map_or(seen.job.generation, |g| g.max(seen.job.generation)));
        self.pairs.insert((seen.job.tenant.clone(), seen.job.job_type.clone()));
        match self.newest.get_mut(&seen.job.job_id) {
            None => {
                self.newest.insert(seen.job.job_id.clone(), seen);
            }
            Some(kept) => {
                self.duplicates += 1;
                if seen.rank() > kept.rank() {
                    *kept = seen;
                }
            }
        }
    }

    /// Distinct jobs.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }

    /// The highest generation on a selected record (None: nothing selected).
    pub fn max_generation(&self) -> Option<i64> {
        self.max_generation
    }

    /// The (tenant, job type) pairs of the selected records.
    pub fn pairs(&self) -> &BTreeSet<(String, String)> {
        &self.pairs
    }

    /// The decision for every selected job at generation `generation`, in position order
    /// (pool, partition, offset of its newest record): the order the rerun produces in
    /// and saves resume points by.
    pub fn plan(self, generation: i64, now: Millis) -> Vec<Planned> {
        let mut out: Vec<Planned> = self
            .newest
            .into_values()
            .map(|s| {
                let decision = if s.job.generation >= generation {
                    Decision::AtGeneration(s.job.generation)
                } else if s.job.not_after.is_some_and(|n| n < now) {
                    Decision::Expired
                } else {
                    Decision::Rerun(Box::new(prepare(&s.job, generation)))
                };
                Planned { pos: s.pos, job_id: s.job.job_id.clone(), newest: s.job, decision }
            })
            .collect();
        out.sort_by_key(|p| p.pos);
        out
    }
}

/// One selected job and what the rerun does with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Position of its newest record.
    pub pos: Position,
    pub job_id: String,
    /// Its newest record as scanned.
    pub newest: JobSubmitted,
    pub decision: Decision,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Produce this copy (already [`prepare`]d).
    Rerun(Box<JobSubmitted>),
    /// Its newest record already has this generation, `>=` the rerun's.
    AtGeneration(i64),
    /// Its `not_after` passed: the worker would only expire the copy.
    Expired,
}

impl Decision {
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Rerun(_) => "rerun",
            Decision::AtGeneration(_) => "at generation",
            Decision::Expired => "expired",
        }
    }
}

/// The rerun copy of `job` at `generation` (see the module documentation).
pub fn prepare(job: &JobSubmitted, generation: i64) -> JobSubmitted {
    JobSubmitted {
        generation,
        attempt: 0,
        crash_count: 0,
        handoff_count: 0,
        not_before: None,
        last_error: None,
        last_failure_class: None,
        first_failure_at: None,
        ..job.clone()
    }
}

/// Whether a run starts a new rerun or continues the latest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationMode {
    /// A new rerun: a generation above everything known.
    Bump,
    /// Continue the interrupted rerun: the current target generation.
    Resume,
}

/// The rerun's generation. `targets`: the current target of each pair it covers (None:
/// the pair has no row yet, i.e. 0); `max_seen`: the highest generation on a selected
/// record (producers may set generations themselves).
pub fn next_generation(mode: GenerationMode, targets: &[Option<i64>], max_seen: Option<i64>) -> Result<i64, String> {
    let target = targets.iter().map(|t| t.unwrap_or(0)).max().unwrap_or(0);
    match mode {
        GenerationMode::Bump => Ok(target.max(max_seen.unwrap_or(0)).saturating_add(1)),
        GenerationMode::Resume if target > 0 => Ok(target),
        GenerationMode::Resume => Err("there is no rerun to resume for this scope (its target generation is 0); \
                                       run without --resume to start one"
            .into()),
    }
}

/// The write that moves one pair's target generation to `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raise {
    /// No row yet: `INSERT ... IF NOT EXISTS`.
    Insert { to: i64 },
    /// `UPDATE ... IF generation = from`.
    Cas { from: i64, to: i64 },
}

/// None when the pair is already at or past `generation` (resuming, or a pair another
/// rerun raised further).
pub fn raise(current: Option<i64>, generation: i64) -> Option<Raise> {
    match current {
        None => Some(Raise::Insert { to: generation }),
        Some(c) if c < generation => Some(Raise::Cas { from: c, to: generation }),
        Some(_) => None,
    }
}

/// The pairs whose target generation a rerun raises: those of the selected records, plus
/// the scope's own pair when it names both (so "rerun acme/echo" takes a number even
/// when no job is on the topic).
pub fn pairs_to_raise(scope: &RerunScope, seen: &BTreeSet<(String, String)>) -> Vec<(String, String)> {
    let mut out: BTreeSet<(String, String)> = seen.iter().filter(|(t, j)| scope.covers(t, j)).cloned().collect();
    if let (Some(t), Some(j)) = (&scope.tenant, &scope.job_type) {
        out.insert((t.clone(), j.clone()));
    }
    out.into_iter().collect()
}

/// What the job row says, as far as a rerun cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowFacts {
    pub status: Option<String>,
    pub generation: Option<i64>,
    pub cancel_requested: Option<bool>,
}

impl RowFacts {
    /// Terminal statuses are exactly the result statuses.
    pub fn is_terminal(&self) -> bool {
        self.status.as_deref().is_some_and(|s| s.parse::<JobStatus>().is_ok())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAction {
    /// No flag, or one that belongs to generation `>= G`: nothing to do.
    Keep,
    /// A stale flag of a finished older run: clear it before producing the copy.
    Clear,
    /// A flag for the run still queued or in progress: left; the copy will be cancelled too.
    Pending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCheck {
    /// Produce the copy, after doing this about the cancellation flag.
    Produce(CancelAction),
    /// The row already records a run at this generation `>= G`: nothing to produce.
    AlreadyRan(i64),
}

/// Decides from the job's row (None: no row, the job never ran) just before producing.
pub fn check_row(row: Option<&RowFacts>, generation: i64) -> RowCheck {
    let Some(row) = row else { return RowCheck::Produce(CancelAction::Keep) };
    let row_gen = row.generation.unwrap_or(0);
    if row_gen >= generation && row.status.is_some() {
        return RowCheck::AlreadyRan(row_gen);
    }
    if row.cancel_requested != Some(true) {
        return RowCheck::Produce(CancelAction::Keep);
    }
    if row.is_terminal() {
        RowCheck::Produce(CancelAction::Clear)
    } else {
        RowCheck::Produce(CancelAction::Pending)
    }
}

/// The rerun id: scope and generation in clear, plus a hash (FNV-1a 64) of any further
/// criteria, so resuming the same command continues the same rerun.
pub fn derive_id(scope: &RerunScope, extra: &str, generation: i64) -> String {
    let base = format!(
        "rerun-{}-{}-g{generation}",
        scope.tenant.as_deref().unwrap_or("*"),
        scope.job_type.as_deref().unwrap_or("*")
    );
    if extra.is_empty() {
        return base;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in extra.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{base}-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FailureClass, Priority};

    fn job(id: &str, tenant: &str, jt: &str, generation: i64) -> JobSubmitted {
        JobSubmitted {
            job_id: id.into(),
            tenant: tenant.into(),
            job_type: jt.into(),
            pool: Some(Pool::Short),
            priority: Priority::Low,
            payload: b"{\"img\":1}".to_vec(),
            idempotency_key: Some("k".into()),
            execute_at: Some(50),
            not_after: None,
            attempt: 3,
            crash_count: 1,
            generation,
            submitted_at: 1_000,
            not_before: Some(9_000),
            last_error: Some("boom".into()),
            last_failure_class: Some(FailureClass::AppError),
            first_failure_at: Some(2_000),
            replay_count: 2,
            replayed_from: Some("x.dlq".into()),
            traceparent: None,
            tracestate: None,
            flow_key: None,
            user_key: None,
            handoff_count: 2,
        }
    }

    fn seen(j: JobSubmitted, partition: i32, offset: i64, ts: Millis) -> Seen {
        Seen { pos: Position { pool: Pool::Short, partition, offset }, timestamp: Some(ts), job: j }
    }

    fn scope(t: Option<&str>, j: Option<&str>) -> RerunScope {
        RerunScope { tenant: t.map(Into::into), job_type: j.map(Into::into) }
    }

    #[test]
    fn scope_needs_a_tenant_or_a_job_type() {
        assert!(scope(None, None).validate().is_err());
        for s in [scope(Some("a"), None), scope(None, Some("e")), scope(Some("a"), Some("e"))] {
            assert!(s.validate().is_ok());
        }
        assert!(scope(Some("a"), None).covers("a", "anything"));
        assert!(!scope(Some("a"), None).covers("b", "anything"));
        assert!(scope(None, Some("e")).covers("any", "e"));
        assert!(!scope(Some("a"), Some("e")).covers("a", "f"));
        assert_eq!(scope(Some("a"), None).label(), "a/*");
    }

    #[test]
    fn filter_by_scope_time_and_ids() {
        let j = job("j1", "acme", "echo", 0);
        let f = |f: RerunFilter| f.matches(&j);
        let acme = scope(Some("acme"), Some("echo"));
        assert!(f(RerunFilter { scope: acme.clone(), ..Default::default() }));
        assert!(!f(RerunFilter { scope: scope(Some("globex"), None), ..Default::default() }));
        assert!(!f(RerunFilter { scope: scope(None, Some("report")), ..Default::default() }));
        // submitted_at 1_000: since inclusive, until exclusive
        assert!(f(RerunFilter { scope: acme.clone(), since: Some(1_000), ..Default::default() }));
        assert!(!f(RerunFilter { scope: acme.clone(), since: Some(1_001), ..Default::default() }));
        assert!(f(RerunFilter { scope: acme.clone(), until: Some(1_001), ..Default::default() }));
        assert!(!f(RerunFilter { scope: acme.clone(), until: Some(1_000), ..Default::default() }));
        let ids = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<HashSet<_>>());
        assert!(f(RerunFilter { scope: acme.clone(), job_ids: ids(&["j1", "j2"]), ..Default::default() }));
        assert!(!f(RerunFilter { scope: acme.clone(), job_ids: ids(&["j2"]), ..Default::default() }));
        assert!(!f(RerunFilter { scope: acme, job_ids: ids(&[]), ..Default::default() }));
    }

    #[test]
    fn dedupe_keeps_the_newest_record_of_each_job() {
        let mut s = Selection::default();
        s.offer(seen(job("a", "acme", "echo", 0), 0, 1, 100));
        // A relayed retry of the same job, later on the topic.
        let mut retry = job("a", "acme", "echo", 0);
        retry.attempt = 4;
        s.offer(seen(retry, 0, 7, 200));
        // An earlier rerun copy (generation 2), then a stale generation-1 record after it.
        s.offer(seen(job("b", "acme", "echo", 2), 1, 3, 300));
        s.offer(seen(job("b", "acme", "echo", 1), 1, 9, 400));
        s.offer(seen(job("c", "acme", "report", 0), 2, 0, 50));
        assert_eq!((s.len(), s.duplicates), (3, 2));
        assert_eq!(s.max_generation(), Some(2));
        let pairs: Vec<_> = s.pairs().iter().cloned().collect();
        assert_eq!(pairs, vec![("acme".into(), "echo".into()), ("acme".into(), "report".into())]);
        let plan = s.plan(3, 0);
        let by: HashMap<&str, &Planned> = plan.iter().map(|p| (p.job_id.as_str(), p)).collect();
        assert_eq!(by["a"].pos.offset, 7, "the later record of the same generation");
        assert_eq!(by["a"].newest.attempt, 4);
        assert_eq!(by["b"].pos.offset, 3, "the higher generation wins over a later offset");
        assert_eq!(by["b"].newest.generation, 2);
    }

    #[test]
    fn same_generation_ties_break_on_time_then_offset() {
        let mut s = Selection::default();
        s.offer(seen(job("a", "t", "e", 0), 0, 5, 100));
        s.offer(seen(job("a", "t", "e", 0), 0, 6, 100));
        s.offer(seen(job("a", "t", "e", 0), 0, 2, 50));
        let plan = s.plan(1, 0);
        assert_eq!(plan[0].pos.offset, 6);
    }

    #[test]
    fn plan_skips_jobs_already_at_the_generation_and_expired_ones_in_position_order() {
        let mut s = Selection::default();
        let mut late = job("late", "t", "e", 0);
        late.not_after = Some(500);
        s.offer(seen(late, 2, 0, 1));
        s.offer(seen(job("done", "t", "e", 4), 1, 8, 1));
        s.offer(seen(job("above", "t", "e", 9), 1, 9, 1));
        s.offer(seen(job("run2", "t", "e", 3), 0, 4, 1));
        s.offer(seen(job("run1", "t", "e", 0), 0, 3, 1));
        let plan = s.plan(4, 501);
        let order: Vec<&str> = plan.iter().map(|p| p.job_id.as_str()).collect();
        assert_eq!(order, vec!["run1", "run2", "done", "above", "late"]);
        assert!(matches!(&plan[0].decision, Decision::Rerun(j) if j.generation == 4));
        assert!(matches!(&plan[1].decision, Decision::Rerun(j) if j.generation == 4));
        assert_eq!(plan[2].decision, Decision::AtGeneration(4));
        assert_eq!(plan[3].decision, Decision::AtGeneration(9));
        assert_eq!(plan[4].decision, Decision::Expired);
        assert_eq!(plan[4].decision.label(), "expired");
        // not_after exactly now is still runnable
        let mut s = Selection::default();
        let mut edge = job("edge", "t", "e", 0);
        edge.not_after = Some(500);
        s.offer(seen(edge, 0, 0, 1));
        assert!(matches!(s.plan(1, 500)[0].decision, Decision::Rerun(_)));
    }

    #[test]
    fn the_rerun_copy() {
        let j = job("j1", "acme", "echo", 1);
        let p = prepare(&j, 5);
        assert_eq!((p.job_id.as_str(), p.generation, p.attempt, p.crash_count, p.handoff_count), ("j1", 5, 0, 0, 0));
        assert_eq!(p.not_before, None);
        assert_eq!((p.last_error.as_deref(), p.last_failure_class, p.first_failure_at), (None, None, None));
        // Replay provenance untouched; the submitter's contract kept.
        assert_eq!((p.replay_count, p.replayed_from.as_deref()), (2, Some("x.dlq")));
        let keep = |x: &JobSubmitted| {
            (
                x.tenant.clone(),
                x.job_type.clone(),
                x.pool,
                x.priority,
                x.payload.clone(),
                x.idempotency_key.clone(),
                x.execute_at,
                x.not_after,
                x.submitted_at,
            )
        };
        assert_eq!(keep(&p), keep(&j));
    }

    #[test]
    fn generations() {
        use GenerationMode::*;
        assert_eq!(next_generation(Bump, &[], None), Ok(1), "first rerun ever");
        assert_eq!(next_generation(Bump, &[None, None], Some(0)), Ok(1));
        assert_eq!(next_generation(Bump, &[Some(3), None, Some(1)], Some(0)), Ok(4), "above every pair");
        assert_eq!(next_generation(Bump, &[Some(1)], Some(6)), Ok(7), "above producer-set generations");
        assert_eq!(next_generation(Bump, &[Some(i64::MAX)], None), Ok(i64::MAX), "saturates");
        assert_eq!(next_generation(Resume, &[Some(3), Some(2)], Some(9)), Ok(3));
        let e = next_generation(Resume, &[None], Some(0)).unwrap_err();
        assert!(e.contains("--resume"), "{e}");
        assert!(next_generation(Resume, &[], None).is_err());

        assert_eq!(raise(None, 1), Some(Raise::Insert { to: 1 }));
        assert_eq!(raise(Some(2), 4), Some(Raise::Cas { from: 2, to: 4 }));
        assert_eq!(raise(Some(4), 4), None);
        assert_eq!(raise(Some(5), 4), None);
    }

    #[test]
    fn pairs_raised() {
        let seen: BTreeSet<(String, String)> = [("acme", "echo"), ("acme", "report"), ("globex", "echo")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let p = pairs_to_raise(&scope(Some("acme"), None), &seen);
        assert_eq!(p, vec![("acme".into(), "echo".into()), ("acme".into(), "report".into())]);
        let p = pairs_to_raise(&scope(None, Some("echo")), &seen);
        assert_eq!(p, vec![("acme".into(), "echo".into()), ("globex".into(), "echo".into())]);
        let p = pairs_to_raise(&scope(Some("initech"), Some("echo")), &BTreeSet::new());
        assert_eq!(p, vec![("initech".into(), "echo".into())], "an explicit pair takes a number even when empty");
    }

    #[test]
    fn rows_and_cancellation_flags() {
        let row = |status: Option<&str>, generation: Option<i64>, cancel: Option<bool>| RowFacts {
            status: status.map(Into::into),
            generation,
            cancel_requested: cancel,
        };
        use CancelAction::*;
        assert_eq!(check_row(None, 1), RowCheck::Produce(Keep), "never ran");
        assert_eq!(check_row(Some(&row(Some("succeeded"), Some(0), None)), 1), RowCheck::Produce(Keep));
        assert_eq!(check_row(Some(&row(Some("succeeded"), None, Some(false))), 1), RowCheck::Produce(Keep));
        // Stale: the cancelled (or otherwise finished) old run consumed it.
        for s in ["cancelled", "succeeded", "failed", "expired"] {
            assert_eq!(check_row(Some(&row(Some(s), Some(0), Some(true))), 1), RowCheck::Produce(Clear), "{s}");
        }
        // Asked for the run in progress (or a queued job: the row holds only the flag).
        assert_eq!(check_row(Some(&row(Some("running"), Some(0), Some(true))), 1), RowCheck::Produce(Pending));
        assert_eq!(check_row(Some(&row(Some("retrying"), Some(0), Some(true))), 1), RowCheck::Produce(Pending));
        assert_eq!(check_row(Some(&row(None, None, Some(true))), 1), RowCheck::Produce(Pending));
        // Already ran (or runs) at the rerun's generation or later: nothing to produce.
        assert_eq!(check_row(Some(&row(Some("succeeded"), Some(2), None)), 2), RowCheck::AlreadyRan(2));
        assert_eq!(check_row(Some(&row(Some("running"), Some(3), Some(true))), 2), RowCheck::AlreadyRan(3));
        assert!(row(Some("cancelled"), None, None).is_terminal());
        assert!(!row(Some("replayed"), None, None).is_terminal());
    }

    #[test]
    fn rerun_ids() {
        let s = scope(Some("acme"), Some("echo"));
        assert_eq!(derive_id(&s, "", 3), "rerun-acme-echo-g3");
        assert_eq!(derive_id(&scope(None, Some("echo")), "", 1), "rerun-*-echo-g1");
        let f = RerunFilter {
            scope: s.clone(),
            job_ids: Some(["b".to_string(), "a".to_string()].into()),
            since: Some(5),
            ..Default::default()
        };
        let g = RerunFilter { job_ids: Some(["a".to_string(), "b".to_string()].into()), ..f.clone() };
        assert_eq!(f.canonical_extra(), g.canonical_extra(), "job id order does not matter");
        let id = derive_id(&s, &f.canonical_extra(), 3);
        assert!(id.starts_with("rerun-acme-echo-g3-") && id.len() == "rerun-acme-echo-g3-".len() + 16, "{id}");
        assert_ne!(id, derive_id(&s, &f.canonical_extra(), 4));
        assert_eq!(RerunFilter::default().canonical_extra(), "");
    }
}
