//! OpenTelemetry spans of a job's life, exported over OTLP/HTTP: **off** unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and
//! configured by the standard `OTEL_*` variables (`OTEL_EXPORTER_OTLP_PROTOCOL`
//! `http/protobuf` (default) or `http/json`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_SCHEDULE_DELAY`, ...;
//! `OTEL_SDK_DISABLED=true` turns it off again).
//!
//! A job's trace (its W3C `traceparent`, see `core::trace`) gets four spans, with the
//! OpenTelemetry messaging attributes:
//! - `send {topic}` (producer): the submission, API or CLI; the job then carries this
//!   span's context, so everything after is its child;
//! - `fairway.dispatch_wait` (internal): from submission (or its scheduled time) to the
//!   slot the fair scheduler gave it, with the broker hop and the fair queue;
//! - `process {topic}` (consumer): the handler's run; the handler receives *this* span's
//!   context (HTTP executor `traceparent` header), so its own spans nest under it;
//! - `fairway.outcome` (internal): recording the outcome (result, state, retry or dead
//!   letter).
//!
//! Spans are built with explicit start and end times (the batch exporter runs on its own
//! thread), so the hot path pays nothing when export is off: [`job`] returns `None`.

use crate::model::{JobSubmitted, Millis};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The exporter of this process; flushes its last spans when [`Exporter::shutdown`] runs.
pub struct Exporter(SdkTracerProvider);

impl Exporter {
    /// Sends what is still queued (bounded by 5 s) and stops the export thread.
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "OpenTelemetry: the last spans could not be exported");
        }
    }
}

/// Whether the environment asks for span export (an OTLP endpoint set, SDK not disabled).
pub fn wanted(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Starts span export if the environment asks for it. Must run outside the async
/// runtime (the exporter's HTTP client is a blocking one, on the export thread).
/// An endpoint that is set but unusable is an error, not a silent "no traces".
pub fn init() -> Result<Option<Exporter>, String> {
    if !wanted(|k| std::env::var(k).ok()) {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build().map_err(|e| {
        format!(
            "OpenTelemetry export is on (OTEL_EXPORTER_OTLP_ENDPOINT is set) but its exporter cannot be built: {e}; \
             fix the OTEL_EXPORTER_OTLP_* variables (endpoint http://host:4318, protocol http/protobuf or \
             http/json) or unset OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    })?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name("fairway");
    }
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    let _ = TRACER.set(opentelemetry::trace::TracerProvider::tracer(&provider, "fairway"));
    Ok(Some(Exporter(provider)))
}

/// Whether this process exports spans (checked before building anything for them).
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Whether spans are exported (a tracer was installed).
pub fn exporting() -> bool {
    tracer().is_some()
}

fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

fn at(ms: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn context_of(traceparent: Option<&str>, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::new();
    if let Some(tp) = traceparent {
        carrier.insert("traceparent".to_string(), tp.to_string());
        if let Some(ts) = tracestate {
            carrier.insert("tracestate".to_string(), ts.to_string());
        }
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// A started span: its context goes into the job (submission) or to the handler (run).
pub struct Live {
    cx: Context,
}

impl Live {
    /// This span's W3C `traceparent`, for what runs under it.
    pub fn traceparent(&self) -> Option<String> {
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&self.cx, &mut carrier);
        carrier.remove("traceparent")
    }

    /// Ends the span at `end` (epoch ms); `error`: why it failed, if it did.
    pub fn end(self, end: Millis, error: Option<&str>, attributes: Vec<KeyValue>) {
        let span = self.cx.span();
        span.set_attributes(attributes);
        if let Some(why) = error {
            span.set_status(Status::error(why.to_string()));
        }
        span.end_with_timestamp(at(end));
    }
}

fn start(parent: &Context, name: String, kind: SpanKind, start: Millis, attributes: Vec<KeyValue>) -> Option<Live> {
    let tracer = tracer()?;
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_start_time(at(start))
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    Some(Live { cx: parent.with_span(span) })
}

/// The attributes every span of a job carries.
fn job_attributes(job: &JobSubmitted) -> Vec<KeyValue> {
    vec![
        KeyValue::new("messaging.system", "kafka"),
        KeyValue::new("messaging.message.id", job.job_id.clone()),
        KeyValue::new("messaging.kafka.message.key", job.tenant.clone()),
        KeyValue::new("fairway.tenant", job.tenant.clone()),
        KeyValue::new("fairway.job_type", job.job_type.clone()),
        KeyValue::new("fairway.attempt", i64::from(job.attempt)),
    ]
}

/// The `send {topic}` span of a submission (None when export is off). Start it before
/// the job is produced and give the job its [`Live::traceparent`].
pub fn submit(job: &JobSubmitted, topic: &str, start_ms: Millis) -> Option<Live> {
    tracer()?;
    let parent = context_of(job.traceparent.as_deref(), job.tracestate.as_deref());
    let mut attributes = job_attributes(job);
    attributes.extend([
        KeyValue::new("messaging.operation.type", "send"),
        KeyValue::new("messaging.operation.name", "send"),
        KeyValue::new("messaging.destination.name", topic.to_string()),
        KeyValue::new("messaging.message.body.size", job.payload.len() as i64),
    ]);
    start(&parent, format!("send {topic}"), SpanKind::Producer, start_ms, attributes)
}

/// Where a consumed job came from, for its spans.
pub struct Delivery<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub group: &'a str,
}

/// The spans of one dispatch of a job on a worker (None when export is off).
pub struct JobSpans {
    parent: Context,
    base: Vec<KeyValue>,
}

/// The worker side of a job's trace: a child of the context the job carries.
pub fn job(job: &JobSubmitted, from: &Delivery) -> Option<JobSpans> {
    tracer()?;
    let parent = context_of(job.traceparent.as_deref(), job.tracestate.as_deref());
    let mut base = job_attributes(job);
    base.extend([
        KeyValue::new("messaging.destination.name", from.topic.to_string()),
        KeyValue::new("messaging.destination.partition.id", from.partition.to_string()),
        KeyValue::new("messaging.kafka.offset", from.offset),
        KeyValue::new("messaging.consumer.group.name", from.group.to_string()),
    ]);
    Some(JobSpans { parent, base })
}

impl JobSpans {
    /// `fairway.dispatch_wait`: `from` (submission or scheduled time) to `dispatched`.
    pub fn dispatch_wait(&self, from: Millis, received: Millis, dispatched: Millis) {
        let mut attributes = self.base.clone();
        attributes.push(KeyValue::new("fairway.received_at_ms", received));
        if let Some(span) = start(&self.parent, "fairway.dispatch_wait".into(), SpanKind::Internal, from, attributes) {
            span.end(dispatched.max(from), None, Vec::new());
        }
    }

    /// `process {topic}`, started when the handler starts; the handler runs under it.
    pub fn process(&self, started: Millis) -> Option<Live> {
        let mut attributes = self.base.clone();
        attributes.extend([
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
        ]);
        let topic = self.base.iter().find(|kv| kv.key.as_str() == "messaging.destination.name");
        let name = topic.map_or_else(|| "process".to_string(), |kv| format!("process {}", kv.value.as_str()));
        start(&self.parent, name, SpanKind::Consumer, started, attributes)
    }

    /// `fairway.outcome`: recording what the run ended with (`outcome` e.g. succeeded,
    /// retry, dead_letter); `error` for outcomes that are failures.
    pub fn outcome(&self, start_ms: Millis, end_ms: Millis, outcome: &str, error: Option<&str>) {
        let mut attributes = self.base.clone();
        attributes.push(KeyValue::new("fairway.outcome", outcome.to_string()));
        if let Some(span) = start(&self.parent, "fairway.outcome".into(), SpanKind::Internal, start_ms, attributes) {
            span.end(end_ms.max(start_ms), error, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn export_is_off_unless_an_endpoint_is_set() {
        assert!(!wanted(env(&[])));
        assert!(!wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")])));
        assert!(wanted(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")])));
        assert!(!wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE")
        ])));
    }

    #[test]
    fn spans_cost_nothing_when_export_is_off() {
        let job = JobSubmitted::original("j".into(), "t".into(), "echo".into(), Vec::new(), 0);
        assert!(submit(&job, "topic", 0).is_none());
        assert!(super::job(&job, &Delivery { topic: "t", partition: 0, offset: 0, group: "g" }).is_none());
    }

    #[test]
    fn a_traceparent_round_trips_through_a_context() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let live = Live { cx: context_of(Some(tp), None) };
        assert_eq!(live.traceparent().as_deref(), Some(tp));
    }
}
