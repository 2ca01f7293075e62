//! Replays of dead letters (and retry records) started through the API
//! (`POST /v1/replays`, `GET /v1/replays/{id}`) or the console, by an admin or by a
//! tenant for its own jobs only; each runs `ops::replay::run` (what `fairway replay`
//! runs: fresh attempts, the loop guard, resume points), a dry run first if asked.
//!
//! A tenant's replay is bound to its tenant (the filter's tenant is always the key's own),
//! and held to: one replay running at a time ([`TENANT_RUNNING`]; 429
//! `TOO_MANY_REPLAYS`), at most [`TENANT_MAX_JOBS`] jobs, [`TENANT_MAX_RATE`] jobs/s and
//! [`TENANT_MAX_SCANNED`] records read per replay (the topic holds every tenant's); it can follow only its own runs (another's id answers 404 as an unknown
//! one). A process runs at most [`RUNNING`] replays at once (429), and remembers the last
//! [`KEEP_RUNS`] finished ones for their progress, at most [`KEEP_PER_OWNER`] of one
//! tenant (or of the admins), so one tenant's many runs never push out another's report. A dry run holds one of the caller's
//! heavy reads (`api.limits.heavy_reads_per_key`, per tenant) while it scans.

use super::limits::KeyId;
use super::{codes, ApiError, ApiState, Caller};
use crate::core::replay::{ReplayFilter, ReplaySource};
use crate::ops::replay::{self, Progress, ReplayOptions, ReplayReport, Stopped};
use axum::http::StatusCode;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;

/// Replays one tenant may have running at once.
pub const TENANT_RUNNING: usize = 1;
/// Jobs one tenant's replay replays at most (a dry run counts as many).
pub const TENANT_MAX_JOBS: u64 = 10_000;
/// Records (every tenant's, matching or not) one tenant's replay reads at most; the same
/// replay asked again resumes after them.
pub const TENANT_MAX_SCANNED: u64 = 1_000_000;
/// Jobs per second a tenant's replay produces at most.
pub const TENANT_MAX_RATE: u32 = 100;
/// Replays running at once in one API process, every caller's.
pub const RUNNING: usize = 8;
/// Finished replays remembered for their progress.
pub const KEEP_RUNS: usize = 200;
/// Finished replays remembered of one owner (a tenant, or the admins together).
pub const KEEP_PER_OWNER: usize = 5;

/// What a caller asked to replay.
pub struct Ask {
    pub source: ReplaySource,
    pub filter: ReplayFilter,
    pub rate: Option<u32>,
    pub dry_run: bool,
}

/// The replays this process started: id -> its owner and progress.
#[derive(Default)]
pub struct Replays {
    runs: Mutex<HashMap<String, Run>>,
    /// Runs started so far (each run's `started`, to forget the oldest first).
    started: std::sync::atomic::AtomicU64,
}

struct Run {
    /// The tenant whose replay it is; None: an admin's.
    owner: Option<String>,
    progress: watch::Receiver<serde_json::Value>,
    started: u64,
}

impl Run {
    fn running(&self) -> bool {
        self.progress.borrow()["done"] != true
    }
}

fn refused(status: StatusCode, code: &'static str, msg: String) -> ApiError {
    let mut e = ApiError::new(status, code, msg);
    if status == StatusCode::TOO_MANY_REQUESTS {
        e.retry_after_secs = Some(5);
    }
    e
}

impl Replays {
    /// Starts `ask` for `caller`: a dry run answers its report when done; a real run
    /// answers `{"run": id}` at once, its progress at [`Replays::follow`].
    /// A dry run holds one of the caller's heavy reads while it scans (`key`: the key it
    /// came with).
    pub async fn start(
        &self,
        st: &ApiState,
        caller: &Caller,
        key: &KeyId,
        ask: Ask,
    ) -> Result<serde_json::Value, ApiError> {
        let owner = caller.tenant().map(str::to_string);
        let mut opts = ReplayOptions::new(ask.source, format!("{caller} (key {})", key.0));
        opts.filter = ask.filter;
        opts.dry_run = ask.dry_run;
        opts.rate_per_sec = ask.rate.unwrap_or(opts.rate_per_sec);
        if opts.rate_per_sec == 0 {
            return Err(refused(
                StatusCode::BAD_REQUEST,
                codes::INVALID_QUERY,
                "rate must be at least 1 job per second".into(),
            ));
        }
        if let Some(t) = &owner {
            opts.filter.tenant = Some(t.clone());
            opts.rate_per_sec = opts.rate_per_sec.min(TENANT_MAX_RATE);
            opts.limit = Some(TENANT_MAX_JOBS);
            opts.max_scanned = Some(TENANT_MAX_SCANNED);
        }
        tracing::info!(
            caller = %caller, source = %opts.source, filter = %opts.filter.canonical().replace('\u{1f}', " "),
            rate = opts.rate_per_sec, dry_run = opts.dry_run, "replay asked"
        );
        let cfg = st.config().clone();
        let failed =
            |e: replay::ReplayError| ApiError::new(StatusCode::BAD_GATEWAY, codes::REPLAY_FAILED, e.to_string());
        if opts.dry_run {
            let _heavy = st.limits().heavy_slot(key, Some(caller))?;
            let report = replay::run(&cfg, opts, |_| {}).await.map_err(failed)?;
            return Ok(report_json(&report, Audience::of(caller)));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = watch::channel(serde_json::json!({"done": false, "scanned": 0}));
        self.admit(&id, owner, rx)?;
        let (who, audience) = (caller.to_string(), Audience::of(caller));
        tokio::spawn(async move {
            let out = replay::run(&cfg, opts, |p| {
                tx.send_replace(progress_json(p, audience));
            })
            .await;
            let end = match out {
                Ok(r) => {
                    tracing::info!(caller = %who, replay_id = %r.replay_id, replayed = r.replayed, "replay finished");
                    report_json(&r, audience)
                }
                Err(e) => {
                    tracing::warn!(caller = %who, error = %e, "replay failed");
                    serde_json::json!({"done": true, "error": e.to_string()})
                }
            };
            tx.send_replace(end);
        });
        Ok(serde_json::json!({ "run": id }))
    }

    /// Registers a run within the bounds, or says which refused it.
    fn admit(
        &self,
        id: &str,
        owner: Option<String>,
        progress: watch::Receiver<serde_json::Value>,
    ) -> Result<(), ApiError> {
        let mut runs = self.runs.lock().expect("replays");
        let running = runs.values().filter(|r| r.running()).count();
        if running >= RUNNING {
            return Err(refused(
                StatusCode::TOO_MANY_REQUESTS,
                codes::TOO_MANY_REPLAYS,
                format!("this API process runs {RUNNING} replays, its limit; retry when one has finished"),
            ));
        }
        if let Some(t) = &owner {
            let own = runs.values().filter(|r| r.running() && r.owner.as_ref() == Some(t)).count();
            if own >= TENANT_RUNNING {
                return Err(refused(
                    StatusCode::TOO_MANY_REQUESTS,
                    codes::TOO_MANY_REPLAYS,
                    format!("tenant {t} has a replay running already (one at a time); follow it and retry when it has finished"),
                ));
            }
        }
        forget_finished(&mut runs, &owner);
        let started = self.started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        runs.insert(id.to_string(), Run { owner, progress, started });
        Ok(())
    }

    /// The progress of replay `id` for `caller` (404 for an unknown id or another
    /// tenant's).
    pub fn follow(&self, caller: &Caller, id: &str) -> Result<watch::Receiver<serde_json::Value>, ApiError> {
        let runs = self.runs.lock().expect("replays");
        match runs.get(id) {
            Some(r) if caller.is_admin() || r.owner.as_deref() == caller.tenant() => Ok(r.progress.clone()),
            _ => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                codes::REPLAY_NOT_FOUND,
                format!(
                    "no replay {id:?} of this caller on this API process (finished ones are kept: the last \
                     {KEEP_PER_OWNER} of each tenant, {KEEP_RUNS} in all)"
                ),
            )),
        }
    }
}

/// Who reads a replay's counts. The topics are shared, so a tenant's view counts only
/// its own records: of other tenants' (and of undecodable ones, whose tenant is unknown)
/// it says nothing, not even how many were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    Admin,
    Tenant,
}

impl Audience {
    pub fn of(caller: &Caller) -> Audience {
        if caller.tenant().is_some() {
            Audience::Tenant
        } else {
            Audience::Admin
        }
    }
}

/// Makes room for one more run of `owner`: forgets its oldest finished runs past
/// [`KEEP_PER_OWNER`] - 1, then, while [`KEEP_RUNS`] are kept, the oldest finished run of all.
fn forget_finished(runs: &mut HashMap<String, Run>, owner: &Option<String>) {
    let oldest = |runs: &HashMap<String, Run>, mine: bool| {
        runs.iter()
            .filter(|(_, r)| !r.running() && (!mine || r.owner == *owner))
            .min_by_key(|(_, r)| r.started)
            .map(|(id, _)| id.clone())
    };
    while runs.values().filter(|r| !r.running() && r.owner == *owner).count() >= KEEP_PER_OWNER {
        let Some(id) = oldest(runs, true) else { break };
        runs.remove(&id);
    }
    while runs.len() >= KEEP_RUNS {
        let Some(id) = oldest(runs, false) else { break };
        runs.remove(&id);
    }
}

/// A finished replay's report (`done: true`), as `audience` may read it.
pub fn report_json(r: &ReplayReport, audience: Audience) -> serde_json::Value {
    let sample: Vec<serde_json::Value> = r
        .sample
        .iter()
        .map(|s| {
            serde_json::json!({
                "job_id": s.job_id, "tenant": s.tenant, "job_type": s.job_type,
                "class": s.class.map(|c| c.as_str()), "attempts": s.attempts, "replay_count": s.replay_count,
                "last_error": s.last_error, "decision": s.decision,
            })
        })
        .collect();
    let s = &r.skipped;
    let mut skipped = serde_json::json!({
        "filter": s.filter, "loop_guard": s.loop_guard, "duplicate": s.duplicate, "expired": s.expired,
    });
    let admin = audience == Audience::Admin;
    let scanned = if admin { r.scanned } else { r.scanned.saturating_sub(s.foreign()) };
    let mut out = serde_json::json!({
        "replay_id": r.replay_id, "topic": r.topic, "dry_run": r.dry_run, "scanned": scanned,
        "matched": r.matched, "replayed": r.replayed, "would_replay": r.would_replay,
        "refused": r.refused, "sample": sample, "stopped": stopped(r.stopped, audience),
        "elapsed_ms": r.elapsed.as_millis() as u64, "done": true,
    });
    if admin {
        skipped["other_tenants"] = s.other_tenants.into();
        skipped["undecodable"] = s.undecodable.into();
    }
    let notes = r.operator_notes.iter().filter(|_| admin);
    out["warnings"] = notes.chain(&r.warnings).cloned().collect::<Vec<_>>().into();
    out["skipped"] = skipped;
    out
}

/// Why a replay stopped, as `audience` may read it: a tenant's replay that read its
/// bound of records (mostly other tenants') is told only that it stopped at a bound.
fn stopped(s: Stopped, audience: Audience) -> &'static str {
    match (s, audience) {
        (Stopped::ScanLimit, Audience::Tenant) => {
            "stopped at the bound of one tenant's replay (the same replay again continues where it stopped)"
        }
        _ => s.describe(),
    }
}

/// A running replay's progress (`done: false`), as `audience` may read it ([`Audience`]).
pub fn progress_json(p: &Progress, audience: Audience) -> serde_json::Value {
    let foreign = if audience == Audience::Admin { 0 } else { p.foreign };
    serde_json::json!({
        "scanned": p.scanned.saturating_sub(foreign), "matched": p.matched, "replayed": p.replayed,
        "skipped": p.skipped.saturating_sub(foreign),
        "partitions": p.partitions, "partitions_done": p.partitions_done,
        "elapsed_ms": p.elapsed.as_millis() as u64, "dry_run": p.dry_run, "done": false,
    })
}

/// Job ids one request may name.
pub const MAX_JOB_IDS: usize = 1_000;

/// `POST /v1/replays`'s body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// `dlq` (the default) or a retry topic's class.
    source: Option<String>,
    /// An admin key's filter; a tenant key's is always its own tenant.
    tenant: Option<String>,
    job_type: Option<String>,
    class: Option<String>,
    error: Option<String>,
    /// Dead-lettered at or after (ms since the epoch).
    since: Option<i64>,
    /// Dead-lettered before (ms since the epoch).
    until: Option<i64>,
    #[serde(default)]
    job_ids: Vec<String>,
    rate: Option<u32>,
    #[serde(default)]
    dry_run: bool,
}

impl ReplayBody {
    fn ask(self, caller: &Caller) -> Result<Ask, ApiError> {
        let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m);
        let source = self.source.as_deref().unwrap_or("dlq").parse::<ReplaySource>().map_err(bad)?;
        let class = self.class.as_deref().map(str::parse::<crate::model::FailureClass>).transpose().map_err(bad)?;
        if self.job_ids.len() > MAX_JOB_IDS {
            return Err(bad(format!("{} job ids: at most {MAX_JOB_IDS} per replay", self.job_ids.len())));
        }
        let since = crate::core::bounds::optional("since", self.since).map_err(|e| bad(e.to_string()))?;
        let until = crate::core::bounds::optional("until", self.until).map_err(|e| bad(e.to_string()))?;
        let tenant = match (caller.tenant(), self.tenant) {
            (Some(own), Some(asked)) if asked != own => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    codes::FORBIDDEN,
                    format!("a key of tenant {own} replays only its own jobs, not {asked}'s"),
                ))
            }
            (Some(own), _) => Some(own.to_string()),
            (None, asked) => asked,
        };
        let job_ids = (!self.job_ids.is_empty()).then(|| self.job_ids.into_iter().collect());
        let filter =
            ReplayFilter { tenant, job_type: self.job_type, class, since, until, error_contains: self.error, job_ids };
        Ok(Ask { source, filter, rate: self.rate, dry_run: self.dry_run })
    }
}

/// `POST /v1/replays`: a dry run answers its report (200); a real run starts and
/// answers `{"run": id}` (202).
pub(super) async fn post(
    axum::extract::State(st): axum::extract::State<ApiState>,
    caller: Caller,
    key: Option<axum::Extension<KeyId>>,
    axum::Json(body): axum::Json<serde_json::Value>,
) -> Result<(StatusCode, axum::Json<serde_json::Value>), ApiError> {
    let body: ReplayBody = serde_json::from_value(body).map_err(|e| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_JOB, format!("replay request: {e}"))
    })?;
    let ask = body.ask(&caller)?;
    let dry = ask.dry_run;
    let key = key.map_or_else(|| KeyId("anonymous".into()), |k| k.0);
    let out = st.replays().start(&st, &caller, &key, ask).await?;
    Ok((if dry { StatusCode::OK } else { StatusCode::ACCEPTED }, axum::Json(out)))
}

/// `GET /v1/replays/{run}`: the run's progress now (`done: true` with its report once
/// finished).
pub(super) async fn get(
    axum::extract::State(st): axum::extract::State<ApiState>,
    caller: Caller,
    axum::extract::Path(run): axum::extract::Path<String>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let progress = st.replays().follow(&caller, &run)?;
    let now = progress.borrow().clone();
    Ok(axum::Json(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished() -> watch::Receiver<serde_json::Value> {
        watch::channel(serde_json::json!({"done": true})).1
    }

    /// One tenant's many replays, one after another, forget only its own oldest reports.
    #[test]
    fn one_tenants_many_runs_never_push_out_anothers_report() {
        let r = Replays::default();
        r.admit("b-run", Some("b".into()), finished()).unwrap();
        for i in 0..(KEEP_RUNS * 2) {
            r.admit(&format!("a-{i}"), Some("a".into()), finished()).unwrap();
        }
        let b = Caller::Tenant("b".into());
        assert!(r.follow(&b, "b-run").is_ok(), "b's report is kept");
        let a = Caller::Tenant("a".into());
        let kept = (0..KEEP_RUNS * 2).filter(|i| r.follow(&a, &format!("a-{i}")).is_ok()).count();
        assert_eq!(kept, KEEP_PER_OWNER, "a keeps its newest {KEEP_PER_OWNER}");
        assert!(r.follow(&a, &format!("a-{}", KEEP_RUNS * 2 - 1)).is_ok(), "the newest among them");
    }
}
