//! Demo handlers used by `fairway demo`, the tests and the benchmarks.
//! Payloads are small JSON objects; every field is optional.

use super::{Handler, HandlerError, HandlerResult, JobContext};
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::Deserialize;
use std::io::Write;
use std::time::Duration;

/// With `FAIRWAY_RUN_LOG=<path>` in a worker's environment the sleep handler appends a
/// line per execution to that file: `start <job id> <unix ms> <pid>` when it starts,
/// `done <job id> <unix ms> <pid>` when it ends (returns, or is stopped: its future
/// dropped, as a fenced or aborted run's is), each in one O_APPEND write, so several
/// worker processes can share the file (`fairway-bench bench faults` counts jobs run twice from
/// it, `netlab::scenario` also runs on two workers at once).
pub const RUN_LOG_ENV: &str = "FAIRWAY_RUN_LOG";

fn log_run(phase: &str, job_id: &str) {
    static FILE: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os(RUN_LOG_ENV)?;
        let opened = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        opened.map_err(|e| tracing::warn!("{RUN_LOG_ENV}={}: {e}", path.to_string_lossy())).ok()
    });
    if let Some(mut f) = file.as_ref() {
        let _ = f.write_all(format!("{phase} {job_id} {} {}\n", crate::now_ms(), std::process::id()).as_bytes());
    }
}

/// Writes a run's `done` line when dropped: when the run returns, and when it is stopped.
struct RunLogged<'a>(&'a str);

impl Drop for RunLogged<'_> {
    fn drop(&mut self) {
        log_run("done", self.0);
    }
}

fn params<T: for<'a> Deserialize<'a> + Default>(payload: &[u8]) -> Result<T, HandlerError> {
    if payload.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    serde_json::from_slice(payload)
        .map_err(|e| HandlerError::permanent(format!("payload is not the expected JSON object: {e}")))
}

/// Returns the payload as output.
pub struct Echo;
impl Handler for Echo {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        async move { Ok(ctx.job.payload.clone()) }.boxed()
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SleepParams {
    /// Total run time in milliseconds.
    ms: u64,
    /// Save a checkpoint every this many steps (0 = never).
    checkpoint_every: u32,
}

/// Sleeps `ms` in 20 steps, reporting progress, honouring cancellation and resuming
/// from its checkpoint (the last finished step) when re-dispatched.
pub struct Sleep;
impl Handler for Sleep {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        async move {
            let p: SleepParams = params(&ctx.job.payload)?;
            log_run("start", &ctx.job.job_id);
            let _ended = RunLogged(&ctx.job.job_id);
            const STEPS: u32 = 20;
            let mut start = 0;
            if p.checkpoint_every > 0 {
                if let Ok(Some(cp)) = ctx.load_checkpoint().await {
                    start = std::str::from_utf8(&cp).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
                }
            }
            let step = Duration::from_millis(p.ms) / STEPS;
            for i in start..STEPS {
                if ctx.is_cancelled() {
                    return Err(HandlerError::app(format!("cancelled at step {i}")));
                }
                tokio::time::sleep(step).await;
                ctx.progress(f64::from(i + 1) / f64::from(STEPS), format!("step {} of {STEPS}", i + 1));
                if p.checkpoint_every > 0 && (i + 1) % p.checkpoint_every == 0 {
                    ctx.checkpoint((i + 1).to_string().as_bytes())
                        .await
                        .map_err(|e| HandlerError::dependency(e.to_string()))?;
                }
            }
            Ok(format!("{{\"slept_ms\":{},\"resumed_from_step\":{start}}}", p.ms).into_bytes())
        }
        .boxed()
    }
}

/// Always fails with an application error (for retry and DLQ demos).
pub struct Fail;
impl Handler for Fail {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        async move { Err(HandlerError::app("the fail handler always fails")) }.boxed()
    }
}

#[derive(Deserialize)]
#[serde(default)]
struct FlakyParams {
    /// Attempts that fail before one succeeds.
    fail_attempts: i32,
    /// Failure class of the failing attempts: "app_error" or "dependency".
    class: String,
}
impl Default for FlakyParams {
    fn default() -> Self {
        FlakyParams { fail_attempts: 1, class: "app_error".into() }
    }
}

/// Fails its first `fail_attempts` attempts, then succeeds.
pub struct Flaky;
impl Handler for Flaky {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        async move {
            let p: FlakyParams = params(&ctx.job.payload)?;
            if ctx.attempt < p.fail_attempts {
                let msg = format!("flaky: attempt {} of {} planned failures", ctx.attempt + 1, p.fail_attempts);
                return Err(if p.class == "dependency" {
                    HandlerError::dependency(msg)
                } else {
                    HandlerError::app(msg)
                });
            }
            Ok(b"ok".to_vec())
        }
        .boxed()
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StepsParams {
    steps: u32,
    step_ms: u64,
}

/// A long job done right: `steps` steps of `step_ms`, a checkpoint after every step,
/// progress reported, and between steps it honours a stop request (cancelled: ends
/// cancelled; worker shutting down: returns, and another worker resumes from the last
/// checkpoint). Output: `{"steps": N, "resumed_at": K, "ran": R}` (steps this attempt ran).
pub struct Steps;
impl Handler for Steps {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        async move {
            let p: StepsParams = params(&ctx.job.payload)?;
            let start: u32 = match ctx.load_checkpoint().await {
                Ok(Some(cp)) => std::str::from_utf8(&cp).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
                Ok(None) => 0,
                Err(e) => return Err(HandlerError::dependency(format!("cannot read the checkpoint: {e}"))),
            };
            for i in start..p.steps {
                if let Some(why) = ctx.stop_reason() {
                    return Err(HandlerError::app(format!("stopped before step {} ({why:?})", i + 1)));
                }
                tokio::time::sleep(Duration::from_millis(p.step_ms)).await;
                ctx.checkpoint((i + 1).to_string().as_bytes())
                    .await
                    .map_err(|e| HandlerError::dependency(format!("cannot checkpoint: {e}")))?;
                ctx.progress(f64::from(i + 1) / f64::from(p.steps.max(1)), format!("step {} of {}", i + 1, p.steps));
            }
            let ran = p.steps.saturating_sub(start);
            Ok(serde_json::to_vec(&serde_json::json!({"steps": p.steps, "resumed_at": start, "ran": ran}))
                .expect("json"))
        }
        .boxed()
    }
}
