//! Job handlers: the `Handler` trait for embedding fairway in a Rust binary, the job
//! context a handler sees (progress, checkpoints, cancellation), the built-in HTTP
//! executor (jobs in any language) and the demo handlers.

mod demo;
pub mod http;
pub mod process;

pub use demo::{Echo, Fail, Flaky, Sleep, RUN_LOG_ENV};
pub use http::HttpExecutor;
pub use process::ProcessExecutor;

use crate::model::{FailureClass, JobSubmitted};
use crate::store::{Store, StoreError};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a handler failed; the class decides the retry topic and policy.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerError {
    pub class: FailureClass,
    pub message: String,
    /// A dependency asked us to wait (HTTP Retry-After): the next attempt is not earlier.
    pub retry_after: Option<Duration>,
}

impl HandlerError {
    pub fn app(message: impl Into<String>) -> Self {
        HandlerError { class: FailureClass::AppError, message: message.into(), retry_after: None }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        HandlerError { class: FailureClass::Permanent, message: message.into(), retry_after: None }
    }
    pub fn dependency(message: impl Into<String>) -> Self {
        HandlerError { class: FailureClass::Dependency, message: message.into(), retry_after: None }
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

pub type HandlerResult = Result<Vec<u8>, HandlerError>;

/// A job implementation. Handlers should be idempotent keyed by `ctx.job.job_id`:
/// delivery is at-least-once.
pub trait Handler: Send + Sync + 'static {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult>;
}

/// Live state shared between a running job and its worker's heartbeat loop.
#[derive(Debug, Default)]
pub struct JobLive {
    progress: Mutex<(f64, String)>,
    cancelled: AtomicBool,
    /// Its `not_after` passed while it ran: cancelled, and it ends as expired.
    expired: AtomicBool,
    /// The worker is shutting down: the job should checkpoint and return (hand-off).
    stopping: AtomicBool,
    abort: tokio::sync::Notify,
    /// Where progress reports also go as `progress` events (set by the worker).
    events: std::sync::OnceLock<crate::watch::events::ProgressSink>,
    /// When the job last showed life of its own (progress, checkpoint, heartbeat), epoch
    /// ms; 0 until the worker starts it (`started`). Read by the stuck detector.
    last_advance: AtomicI64,
    /// The stuck detector gave up on it (`core::stuck`): the reason for its dead letter.
    stuck: std::sync::OnceLock<String>,
    /// Its child was killed or ended abnormally (counts toward the recycling cap).
    abnormal: AtomicBool,
    /// What its process tree used (process jobs; set once the attempt's child ended).
    usage: Mutex<Option<crate::model::ProcessUsage>>,
    /// When the newest heartbeat of this run that the store acknowledged was sent (its
    /// running mark's or the heartbeat loop's): the start of its lease.
    last_beat: Mutex<Option<tokio::time::Instant>>,
    /// It stopped itself: no heartbeat acknowledged for `worker::liveness::fence_after`,
    /// so another worker may take the job over (it publishes nothing).
    fenced: AtomicBool,
}

/// Why a running job is asked to stop (`JobContext::stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `fairway cancel` / `DELETE /v1/jobs/{id}`: the job ends as cancelled.
    Cancelled,
    /// The worker is going away (deploy, scale-down): checkpoint and return; another
    /// worker resumes the job at once from its checkpoint, attempts unchanged.
    ShuttingDown,
    /// No progress, checkpoint or heartbeat for `stuck_after`: the job is dead-lettered.
    Stuck,
}

impl JobLive {
    pub fn progress(&self) -> (f64, String) {
        self.progress.lock().map(|p| p.clone()).unwrap_or_default()
    }
    /// Publishes this job's progress reports as `progress` events (throttled).
    pub fn publish_progress(&self, sink: crate::watch::events::ProgressSink) {
        let _ = self.events.set(sink);
    }
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst)
    }
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
    /// Its deadline (`not_after`) passed while it ran: asks it to stop like a cancel;
    /// it ends as expired.
    pub fn expire(&self) {
        self.expired.store(true, Ordering::SeqCst);
        self.cancel();
    }
    pub fn is_expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }
    /// Asks the job to stop for a hand-off (the worker is shutting down).
    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst)
    }
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
    /// Hard stop after the cancellation grace period: the worker drops the handler.
    pub fn abort(&self) {
        self.abort.notify_one()
    }
    pub async fn aborted(&self) {
        self.abort.notified().await
    }
    /// The store acknowledged a heartbeat of this run sent at `sent`.
    pub fn beat_acknowledged(&self, sent: tokio::time::Instant) {
        if let Ok(mut last) = self.last_beat.lock() {
            *last = Some(last.map_or(sent, |l| l.max(sent)));
        }
    }
    /// When the newest acknowledged heartbeat of this run was sent (None before its mark).
    pub fn last_beat(&self) -> Option<tokio::time::Instant> {
        self.last_beat.lock().ok().and_then(|l| *l)
    }
    /// Stops the run at once because its lease is about to lapse: aborted, and its
    /// outcome is dropped (`worker::liveness::fence_watch`).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        self.abort();
    }
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }
    /// The job showed life at `now` (epoch ms).
    pub fn advanced(&self, now: crate::model::Millis) {
        self.last_advance.fetch_max(now, Ordering::Relaxed);
    }
    pub fn last_advance(&self) -> crate::model::Millis {
        self.last_advance.load(Ordering::Relaxed)
    }
    /// Marks the job stuck (first reason wins); it is then asked to stop.
    pub fn mark_stuck(&self, reason: String) {
        let _ = self.stuck.set(reason);
    }
    pub fn stuck_reason(&self) -> Option<&str> {
        self.stuck.get().map(String::as_str)
    }
    /// Its child was killed or ended abnormally (a signal, a limit, the stuck detector).
    pub fn mark_abnormal(&self) {
        self.abnormal.store(true, Ordering::SeqCst)
    }
    pub fn is_abnormal(&self) -> bool {
        self.abnormal.load(Ordering::SeqCst)
    }
    /// Records what the attempt's process tree used (carried on the job's result).
    pub fn record_usage(&self, u: crate::model::ProcessUsage) {
        if let Ok(mut slot) = self.usage.lock() {
            *slot = Some(u);
        }
    }
    /// What the attempt's process tree used, if a process handler recorded it.
    pub fn usage(&self) -> Option<crate::model::ProcessUsage> {
        self.usage.lock().ok().and_then(|u| *u)
    }
    /// Why the job should stop now, if it should (see `JobContext::stop_reason`).
    pub fn stop_reason(&self) -> Option<StopReason> {
        if self.is_cancelled() {
            Some(StopReason::Cancelled)
        } else if self.stuck.get().is_some() {
            Some(StopReason::Stuck)
        } else if self.is_stopping() {
            Some(StopReason::ShuttingDown)
        } else {
            None
        }
    }
}

/// The job's W3C trace context as far as it follows the grammar (`core::trace`): a record
/// produced straight to Kafka is not validated at submission, so a bad `traceparent` or
/// `tracestate` is dropped here with a warning (the trace restarts) rather than reaching
/// a handler's request headers and failing the job.
fn valid_trace_context(job: &JobSubmitted) -> (Option<String>, Option<String>) {
    use crate::core::trace::{check_traceparent, check_tracestate};
    let keep = |v: &Option<String>, check: fn(&str) -> Result<(), String>| match v.as_deref().map(check) {
        Some(Err(why)) => {
            tracing::warn!(job_id = %job.job_id, tenant = %job.tenant, "trace context dropped: {why}");
            None
        }
        _ => v.clone(),
    };
    let traceparent = keep(&job.traceparent, check_traceparent);
    let tracestate = traceparent.as_ref().and(keep(&job.tracestate, check_tracestate));
    (traceparent, tracestate)
}

/// What a handler sees of its job and of the platform.
#[derive(Clone)]
pub struct JobContext {
    pub job: Arc<JobSubmitted>,
    /// Attempts used before this one (0 on the first attempt).
    pub attempt: i32,
    pub deadline: tokio::time::Instant,
    live: Arc<JobLive>,
    store: Option<Store>,
    /// The W3C `traceparent` the handler runs under: the worker's `process` span when
    /// spans are exported (`telemetry`), else the one the job carries.
    traceparent: Option<String>,
    /// The job's `tracestate`, if it follows the W3C grammar (else dropped).
    tracestate: Option<String>,
}

impl JobContext {
    pub fn new(
        job: Arc<JobSubmitted>,
        deadline: tokio::time::Instant,
        live: Arc<JobLive>,
        store: Option<Store>,
    ) -> Self {
        let attempt = job.attempt;
        let (traceparent, tracestate) = valid_trace_context(&job);
        JobContext { job, attempt, deadline, live, store, traceparent, tracestate }
    }
    /// Runs the handler under `traceparent` (a span of this worker's) instead of the
    /// job's own context.
    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        if traceparent.is_some() {
            self.traceparent = traceparent;
        }
        self
    }
    /// The W3C trace context to hand on (`traceparent`, `tracestate`) to what the
    /// handler calls, so its spans join the job's trace.
    pub fn trace_context(&self) -> (Option<&str>, Option<&str>) {
        let tracestate = self.traceparent.as_ref().and(self.tracestate.as_deref());
        (self.traceparent.as_deref(), tracestate)
    }
    /// Whether this is the first dispatch ever of the job's generation: no attempt used,
    /// no crash re-dispatch (a worker died running it), no hand-off (a draining worker
    /// stopped it), not a DLQ replay. A rerun's first dispatch is the first of its
    /// generation. Anything else may find the side effects of an earlier dispatch.
    pub fn first_attempt(&self) -> bool {
        self.job.first_dispatch()
    }
    /// Times a worker died running this job (crash re-dispatches), all attempts together.
    pub fn crash_count(&self) -> i32 {
        self.job.crash_count
    }
    /// Times a draining worker handed this job (this generation) to the next worker.
    pub fn handoff_count(&self) -> i32 {
        self.job.handoff_count
    }
    /// Times this job was replayed from the DLQ.
    pub fn replay_count(&self) -> i32 {
        self.job.replay_count
    }
    /// Reports progress (0..1) and a short message; sent with the next heartbeat.
    pub fn progress(&self, fraction: f64, message: impl Into<String>) {
        self.live.advanced(crate::now_ms());
        let message = message.into();
        if let Some(sink) = self.live.events.get() {
            sink.report(fraction.clamp(0.0, 1.0), &message);
        }
        if let Ok(mut p) = self.live.progress.lock() {
            *p = (fraction.clamp(0.0, 1.0), message);
        }
    }
    /// True once `fairway cancel` reached this job (seen through the heartbeat round trip).
    /// Long handlers should check it between units of work and return early.
    pub fn is_cancelled(&self) -> bool {
        self.live.is_cancelled()
    }
    /// Why the job should stop now, if it should: cancelled by the user, or the worker
    /// is shutting down (checkpoint, then return any error: the job is handed off and
    /// resumes elsewhere without using an attempt).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.live.stop_reason()
    }
    /// Tells the stuck detector the job is alive without a progress report.
    pub fn heartbeat(&self) {
        self.live.advanced(crate::now_ms());
    }
    /// The job's live state (for executors that relay a child's reports).
    pub fn live(&self) -> &Arc<JobLive> {
        &self.live
    }
    /// Saves resumable state; a re-dispatched attempt of the same generation (a retry, a
    /// crash re-dispatch, a hand-off) gets it from `load_checkpoint`; a rerun starts clean.
    pub async fn checkpoint(&self, state: &[u8]) -> Result<(), StoreError> {
        self.live.advanced(crate::now_ms());
        match &self.store {
            Some(s) => s.put_checkpoint(&self.job.job_id, self.job.generation, state, crate::now_ms()).await,
            None => Ok(()),
        }
    }
    pub async fn load_checkpoint(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.store {
            Some(s) => s.checkpoint(&self.job.job_id, self.job.generation).await,
            None => Ok(None),
        }
    }
}

/// Handlers by job type name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// Builds handlers for every configured job type; `custom` supplies the ones an
    /// embedding binary registers under `handler = "custom"`.
    pub fn from_config(
        cfg: &crate::config::Config,
        mut custom: HashMap<String, Arc<dyn Handler>>,
    ) -> Result<Self, String> {
        use crate::config::HandlerKind as K;
        if cfg.job_types.values().any(|jt| jt.handler == K::Process) {
            let unavailable = process::Enforcement::current().unavailable();
            let missing = crate::core::sandbox::missing(&cfg.sandbox.require, &unavailable);
            if !missing.is_empty() {
                let said: Vec<String> = missing.iter().map(|(c, why)| format!("{}: {why}", c.name())).collect();
                return Err(format!(
                    "sandbox.require: this worker cannot confine process jobs as required ({}); run it where these are available or remove them from sandbox.require",
                    said.join("; ")
                ));
            }
        }
        let mut handlers: HashMap<String, Arc<dyn Handler>> = HashMap::new();
        for (name, jt) in &cfg.job_types {
            let h: Arc<dyn Handler> = match jt.handler {
                K::Echo => Arc::new(Echo),
                K::Sleep => Arc::new(Sleep),
                K::Fail => Arc::new(Fail),
                K::Flaky => Arc::new(Flaky),
                K::Steps => Arc::new(demo::Steps),
                K::Http => Arc::new(
                    HttpExecutor::new(&http::ExecutorSettings {
                        url: jt.url.as_deref().unwrap_or_default(),
                        ca_file: jt.ca_file.as_deref(),
                        follow_redirects: jt.follow_redirects,
                        max_body: cfg.worker.max_payload_bytes,
                    })
                    .map_err(|e| match e {
                        http::BuildError::CaFile(m) => format!("job_types.{name}.ca_file: {m}"),
                        e => format!("job_types.{name}: {e}"),
                    })?,
                ),
                K::Process => Arc::new(ProcessExecutor::new(process::Spec::from_config(cfg, name)?)),
                K::Custom => custom.remove(name).ok_or_else(|| {
                    format!("job_types.{name}.handler is \"custom\" but no Rust handler was registered under {name:?}")
                })?,
            };
            handlers.insert(name.clone(), h);
        }
        Ok(Registry { handlers })
    }

    pub fn get(&self, job_type: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(job_type).cloned()
    }

    pub fn insert(&mut self, job_type: impl Into<String>, h: Arc<dyn Handler>) {
        self.handlers.insert(job_type.into(), h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(attempt: i32, crash_count: i32, replay_count: i32, generation: i64) -> JobContext {
        handed_off(attempt, crash_count, replay_count, generation, 0)
    }

    fn handed_off(attempt: i32, crash_count: i32, replay_count: i32, generation: i64, handoffs: i32) -> JobContext {
        let mut job = JobSubmitted::original("j".into(), "acme".into(), "echo".into(), Vec::new(), 0);
        (job.attempt, job.crash_count, job.replay_count, job.generation, job.handoff_count) =
            (attempt, crash_count, replay_count, generation, handoffs);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        JobContext::new(Arc::new(job), deadline, Default::default(), None)
    }

    #[tokio::test]
    async fn first_attempt_is_the_first_dispatch_of_the_generation_only() {
        assert!(ctx(0, 0, 0, 0).first_attempt());
        assert!(ctx(0, 0, 0, 3).first_attempt(), "a rerun's first dispatch is the first of its generation");
        assert!(!ctx(1, 0, 0, 0).first_attempt(), "a retry");
        assert!(!ctx(0, 1, 0, 0).first_attempt(), "a crash re-dispatch");
        assert!(!ctx(0, 0, 1, 0).first_attempt(), "a DLQ replay");
        assert!(!handed_off(0, 0, 0, 0, 1).first_attempt(), "a hand-off");
        let c = handed_off(0, 2, 1, 0, 3);
        assert_eq!((c.crash_count(), c.replay_count(), c.handoff_count()), (2, 1, 3));
    }
}
