//! Job handlers: the `Handler` trait for embedding fairway in a Rust binary, the job
//! context a handler sees (progress, checkpoints, cancellation), the built-in HTTP
//! executor (jobs in any language) and the demo handlers.

mod demo;
pub mod http;

pub use demo::{Echo, Fail, Flaky, Sleep, RUN_LOG_ENV};
pub use http::HttpExecutor;

use crate::model::{FailureClass, JobSubmitted};
use crate::store::{Store, StoreError};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The worker is shutting down: the job should checkpoint and return (hand-off).
    stopping: AtomicBool,
    abort: tokio::sync::Notify,
    /// Where progress reports also go as `progress` events (set by the worker).
    events: std::sync::OnceLock<crate::events::ProgressSink>,
}

/// Why a running job is asked to stop (`JobContext::stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `fairway cancel` / `DELETE /v1/jobs/{id}`: the job ends as cancelled.
    Cancelled,
    /// The worker is going away (deploy, scale-down): checkpoint and return; another
    /// worker resumes the job at once from its checkpoint, attempts unchanged.
    ShuttingDown,
}

impl JobLive {
    pub fn progress(&self) -> (f64, String) {
        self.progress.lock().map(|p| p.clone()).unwrap_or_default()
    }
    /// Publishes this job's progress reports as `progress` events (throttled).
    pub fn publish_progress(&self, sink: crate::events::ProgressSink) {
        let _ = self.events.set(sink);
    }
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst)
    }
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
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
    pub fn first_attempt(&self) -> bool {
        self.attempt == 0
    }
    /// Reports progress (0..1) and a short message; sent with the next heartbeat.
    pub fn progress(&self, fraction: f64, message: impl Into<String>) {
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
        if self.live.is_cancelled() {
            Some(StopReason::Cancelled)
        } else if self.live.is_stopping() {
            Some(StopReason::ShuttingDown)
        } else {
            None
        }
    }
    /// Saves resumable state; a re-dispatched attempt gets it from `load_checkpoint`.
    pub async fn checkpoint(&self, state: &[u8]) -> Result<(), StoreError> {
        match &self.store {
            Some(s) => s.put_checkpoint(&self.job.job_id, state, crate::now_ms()).await,
            None => Ok(()),
        }
    }
    pub async fn load_checkpoint(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.store {
            Some(s) => s.checkpoint(&self.job.job_id).await,
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
                    .map_err(|e| format!("job_types.{name}: {e}"))?,
                ),
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
