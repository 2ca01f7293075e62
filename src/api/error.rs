//! API errors: one JSON shape for every failure, `{"error": "<what is wrong and how to
//! fix it>", "code": "<STABLE_CODE>"}`, and the mapping from library errors to HTTP
//! statuses. Pure: no I/O, unit-tested below.

use crate::admission::Refused;
use crate::core::admission::{Limit, Rate, Refusal};
use crate::submit::SubmitError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// Stable machine-readable error codes (the `code` field of error bodies).
pub mod codes {
    pub const INVALID_JSON: &str = "INVALID_JSON";
    pub const TOO_MANY_CONNECTIONS: &str = "TOO_MANY_CONNECTIONS";
    pub const INVALID_JOB: &str = "INVALID_JOB";
    pub const UNKNOWN_TENANT: &str = "UNKNOWN_TENANT";
    pub const UNKNOWN_JOB_TYPE: &str = "UNKNOWN_JOB_TYPE";
    pub const PAYLOAD_TOO_LARGE: &str = "PAYLOAD_TOO_LARGE";
    pub const BODY_TOO_LARGE: &str = "BODY_TOO_LARGE";
    pub const NEVER_RUNNABLE: &str = "NEVER_RUNNABLE";
    pub const TIME_OUT_OF_RANGE: &str = "TIME_OUT_OF_RANGE";
    pub const BAD_TRACE_CONTEXT: &str = "BAD_TRACE_CONTEXT";
    pub const BAD_FLOW_KEY: &str = "BAD_FLOW_KEY";
    pub const BAD_USER_KEY: &str = "BAD_USER_KEY";
    pub const WEBHOOK_SECRET_MISSING: &str = "WEBHOOK_SECRET_MISSING";
    pub const EMPTY_BATCH: &str = "EMPTY_BATCH";
    pub const BATCH_TOO_LARGE: &str = "BATCH_TOO_LARGE";
    pub const BATCH_EXCEEDS_BURST: &str = "BATCH_EXCEEDS_BURST";
    pub const TENANT_RATE_LIMIT_EXCEEDED: &str = "TENANT_RATE_LIMIT_EXCEEDED";
    pub const USER_RATE_LIMIT_EXCEEDED: &str = "USER_RATE_LIMIT_EXCEEDED";
    pub const TOO_MANY_DEBOUNCE_WINDOWS: &str = "TOO_MANY_DEBOUNCE_WINDOWS";
    pub const TENANT_QUEUE_FULL: &str = "TENANT_QUEUE_FULL";
    pub const CIRCUIT_OPEN: &str = "CIRCUIT_OPEN";
    pub const JOB_NOT_FOUND: &str = "JOB_NOT_FOUND";
    pub const INVALID_QUERY: &str = "INVALID_QUERY";
    pub const INVALID_JOB_ID: &str = "INVALID_JOB_ID";
    pub const JOB_ALREADY_FINISHED: &str = "JOB_ALREADY_FINISHED";
    pub const NO_SUCH_ROUTE: &str = "NO_SUCH_ROUTE";
    pub const METHOD_NOT_ALLOWED: &str = "METHOD_NOT_ALLOWED";
    pub const METRICS_DISABLED: &str = "METRICS_DISABLED";
    pub const KAFKA_UNAVAILABLE: &str = "KAFKA_UNAVAILABLE";
    pub const STORE_UNAVAILABLE: &str = "STORE_UNAVAILABLE";
    pub const PARTIAL_SUBMIT: &str = "PARTIAL_SUBMIT";
    pub const INTERNAL: &str = "INTERNAL";
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    pub const FORBIDDEN: &str = "FORBIDDEN";
    pub const INVALID_TENANT: &str = "INVALID_TENANT";
    pub const TENANT_EXISTS: &str = "TENANT_EXISTS";
    pub const TOO_MANY_SESSIONS: &str = "TOO_MANY_SESSIONS";
    pub const REPLAY_FAILED: &str = "REPLAY_FAILED";
    pub const TOO_MANY_REPLAYS: &str = "TOO_MANY_REPLAYS";
    pub const REPLAY_NOT_FOUND: &str = "REPLAY_NOT_FOUND";
    pub const JOB_TYPE_NOT_ALLOWED: &str = "JOB_TYPE_NOT_ALLOWED";
    pub const SCHEDULE_TOO_FAR_AHEAD: &str = "SCHEDULE_TOO_FAR_AHEAD";
    pub const TOO_MANY_SUBMISSIONS: &str = "TOO_MANY_SUBMISSIONS";
    pub const TOO_MANY_STREAMS: &str = "TOO_MANY_STREAMS";
    pub const TOO_MANY_SCANS: &str = "TOO_MANY_SCANS";
    pub const TOO_MANY_HEAVY_READS: &str = "TOO_MANY_HEAVY_READS";
    pub const READ_TOO_LARGE: &str = "READ_TOO_LARGE";
    pub const BODY_TIMEOUT: &str = "BODY_TIMEOUT";
    pub const TOO_MANY_REQUESTS: &str = "TOO_MANY_REQUESTS";
    pub const TOO_MANY_REQUESTS_WITH_BODIES: &str = "TOO_MANY_REQUESTS_WITH_BODIES";
    pub const MISDIRECTED_REGION: &str = "MISDIRECTED_REGION";
    pub const REGION_UNAVAILABLE: &str = "REGION_UNAVAILABLE";
}

/// The fields a job object accepts, quoted in error messages.
pub const JOB_FIELDS: &str =
    "tenant, job_type, payload, priority (urgent|normal|low), pool (short|medium|long), idempotency_key, execute_at, not_after (epoch ms), flow_key, user_key, unique_key, unique_scope, unique_window, debounce_key, debounce_delay, debounce_max_delay, debounce_mode";

/// Seconds a client refused for a full queue is told to wait (the queue drains at the
/// workers' pace, which the front door does not know).
pub const QUEUE_FULL_RETRY_SECS: u64 = 5;

/// An error answer: status, stable code, human message, and for 429 the wait.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for the `Retry-After` header (429 and 503 only).
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), retry_after_secs: None }
    }

    /// 429 for a tenant over its submission rate; `wait` comes from the rate limiter.
    pub fn rate_limited(tenant: &str, rate: Rate, wait: Duration) -> Self {
        let secs = retry_after_secs(wait);
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: codes::TENANT_RATE_LIMIT_EXCEEDED,
            message: format!(
                "tenant {tenant:?} is over its submission rate of {rate}; retry after {secs}s \
                 (honour Retry-After), spread submissions out, or raise its rate (`fairway tenants set {tenant} \
                 --rate-per-sec N`, or admission.tenant_rate of its tier)"
            ),
            retry_after_secs: Some(secs),
        }
    }

    /// The answer to a submission the front door refused (`crate::admission`).
    pub fn refused(r: &Refused) -> Self {
        let ms = |ms: i64| Duration::from_millis(ms.max(0) as u64);
        match r {
            Refused::Limit(Refusal::Rate { scope: Limit::TenantRate, tenant, rate, wait_ms, .. }) => {
                ApiError::rate_limited(tenant, *rate, ms(*wait_ms))
            }
            Refused::Limit(Refusal::Rate { tenant, key, rate, wait_ms, .. }) => {
                let secs = retry_after_secs(ms(*wait_ms));
                let key = key.as_deref().unwrap_or_default();
                ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    code: codes::USER_RATE_LIMIT_EXCEEDED,
                    message: format!(
                        "end user {key:?} (user_key) of tenant {tenant:?} is over its rate of {rate}; retry after \
                         {secs}s (honour Retry-After); other users of the tenant are not affected; the per-user rate \
                         is admission.user_rate of the tenant's tier"
                    ),
                    retry_after_secs: Some(secs),
                }
            }
            Refused::Limit(Refusal::QueueFull { tenant, queued, n, max }) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: codes::TENANT_QUEUE_FULL,
                message: format!(
                    "tenant {tenant:?} has {queued} jobs queued and its limit is max_queued = {max}, so {n} more \
                     cannot be accepted; nothing was written: retry once workers have taken some (see its backlog \
                     with `fairway stats`), or raise it with `fairway tenants set {tenant} --max-queued N`"
                ),
                retry_after_secs: Some(QUEUE_FULL_RETRY_SECS),
            },
            Refused::Limit(Refusal::AboveBurst { scope, tenant, key, n, most }) => {
                let whose = match key {
                    Some(k) if *scope == Limit::UserRate => format!("end user {k:?} of tenant {tenant:?}"),
                    _ => format!("tenant {tenant:?}"),
                };
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    codes::BATCH_EXCEEDS_BURST,
                    format!(
                        "{n} jobs for {whose} in one request exceed its burst of {most} ({}); split the batch into \
                         requests of at most {most} jobs for it",
                        scope.as_str()
                    ),
                )
            }
            Refused::DependencyOpen { dependency: name, wait_ms } => {
                let secs = retry_after_secs(ms(*wait_ms));
                let until = std::time::SystemTime::now() + Duration::from_secs(secs);
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: codes::CIRCUIT_OPEN,
                    message: format!(
                        "new submissions of job types that need {name:?} are paused: that dependency is failing for \
                         several tenants, so its fleet-wide breaker is open until {} (Retry-After: {secs}); nothing \
                         was written: retry then; jobs already queued are held without using an attempt",
                        httpdate::fmt_http_date(until)
                    ),
                    retry_after_secs: Some(secs),
                }
            }
            // The counts stay out of the answer: a pool's or job type's breaker counts
            // every tenant's attempts, which are not the caller's to know (metrics and the
            // log have them).
            Refused::CircuitOpen { scope, wait_ms, counts: _, ratio } => {
                let secs = retry_after_secs(ms(*wait_ms));
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: codes::CIRCUIT_OPEN,
                    message: format!(
                        "new submissions for {scope} are paused: more than {:.0} % of recent attempts failed, so \
                         the circuit breaker is open; nothing was written: retry after {secs}s (honour Retry-After), \
                         when one probe job is let through to test recovery; check the failing jobs' errors \
                         (`fairway results`, the DLQ)",
                        ratio * 100.0
                    ),
                    retry_after_secs: Some(secs),
                }
            }
            Refused::Store(why) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: codes::STORE_UNAVAILABLE,
                message: format!("cannot read the tenant's queue depth: {why}; retry shortly"),
                retry_after_secs: Some(5),
            },
        }
    }

    pub fn not_found(job_id: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            codes::JOB_NOT_FOUND,
            format!(
                "no state for job {job_id:?}: it was never submitted, its record expired (retention.results), or it \
                 was produced straight to Kafka and no worker has seen it yet; check the id returned by POST /v1/jobs"
            ),
        )
    }

    /// A request body that is not JSON at all (syntax) or not a job (shape).
    pub fn from_json(e: &serde_json::Error, what: &str) -> Self {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_JSON,
                format!("request body is not valid JSON ({e}); send {what} with Content-Type: application/json"),
            ),
            Category::Data => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_JOB,
                format!(
                    "request body is not {what}: {e}; a job has the fields {JOB_FIELDS} (tenant and job_type required)"
                ),
            ),
        }
    }

    /// Prefixes the message (e.g. with the index of a job in a batch).
    pub fn context(mut self, prefix: impl std::fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "error": self.message, "code": self.code });
        if let Some(s) = self.retry_after_secs {
            v["retry_after_secs"] = s.into();
        }
        v
    }
}

/// Seconds for a `Retry-After` header: the wait rounded up, never below 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let ms = wait.as_millis() as u64;
    ms.div_ceil(1000).max(1)
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            SubmitError::UnknownTenant(..) => (StatusCode::BAD_REQUEST, codes::UNKNOWN_TENANT),
            SubmitError::UnknownJobType(..) => (StatusCode::BAD_REQUEST, codes::UNKNOWN_JOB_TYPE),
            SubmitError::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, codes::PAYLOAD_TOO_LARGE),
            SubmitError::NeverRunnable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, codes::NEVER_RUNNABLE),
            SubmitError::OutOfRange(_) => (StatusCode::BAD_REQUEST, codes::TIME_OUT_OF_RANGE),
            SubmitError::BadTraceContext(_) => (StatusCode::BAD_REQUEST, codes::BAD_TRACE_CONTEXT),
            SubmitError::BadFlowKey(_) => (StatusCode::BAD_REQUEST, codes::BAD_FLOW_KEY),
            SubmitError::BadUserKey(_) => (StatusCode::BAD_REQUEST, codes::BAD_USER_KEY),
            SubmitError::TooManyWindows { .. } => (StatusCode::TOO_MANY_REQUESTS, codes::TOO_MANY_DEBOUNCE_WINDOWS),
            SubmitError::Invalid { .. } => (StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_JOB),
            SubmitError::JobTypeNotAllowed { .. } => (StatusCode::FORBIDDEN, codes::JOB_TYPE_NOT_ALLOWED),
            SubmitError::TooFarAhead { .. } => (StatusCode::TOO_MANY_REQUESTS, codes::SCHEDULE_TOO_FAR_AHEAD),
            SubmitError::Kafka(_) => (StatusCode::SERVICE_UNAVAILABLE, codes::KAFKA_UNAVAILABLE),
            SubmitError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, codes::STORE_UNAVAILABLE),
            SubmitError::Codec(_) => (StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL),
        };
        let retry_after_secs = match &e {
            // Acceptable once its time is within the horizon.
            SubmitError::TooFarAhead { ahead_ms, horizon } => {
                Some(retry_after_secs(Duration::from_millis((ahead_ms - horizon.0).max(0) as u64)))
            }
            _ => (status == StatusCode::SERVICE_UNAVAILABLE).then_some(5),
        };
        ApiError { status, code, message, retry_after_secs }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: codes::STORE_UNAVAILABLE,
            message: e.to_string(),
            retry_after_secs: Some(5),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, code = self.code, "API error: {}", self.message);
        }
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(s) = self.retry_after_secs {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.code == codes::BODY_TOO_LARGE {
            // The body was refused unread, so the server closes the connection after this
            // answer; saying so keeps a keep-alive client from sending its next request on it.
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::submit::{validate, NewJob};

    fn job(t: &str, jt: &str) -> NewJob {
        NewJob { tenant: t.into(), job_type: jt.into(), ..Default::default() }
    }

    #[test]
    fn validation_errors_map_to_client_statuses_with_codes() {
        let cfg = Config::builtin();
        let e: ApiError = validate(&cfg, &job("nobody", "echo"), 1).unwrap_err().into();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, codes::UNKNOWN_TENANT));
        assert!(e.message.contains("nobody") && e.message.contains("[tenants.nobody]"), "{}", e.message);
        let e: ApiError = validate(&cfg, &job("acme", "nope"), 1).unwrap_err().into();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, codes::UNKNOWN_JOB_TYPE));
        let e: ApiError = validate(&cfg, &job("acme", "echo"), 10 << 20).unwrap_err().into();
        assert_eq!((e.status, e.code), (StatusCode::PAYLOAD_TOO_LARGE, codes::PAYLOAD_TOO_LARGE));
        let mut j = job("acme", "echo");
        j.execute_at = Some(2000);
        j.not_after = Some(1000);
        let e: ApiError = validate(&cfg, &j, 1).unwrap_err().into();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, codes::NEVER_RUNNABLE));
        assert_eq!(e.retry_after_secs, None);
        for (at, not_after, field) in [(Some(i64::MIN), None, "execute_at"), (None, Some(i64::MAX), "not_after")] {
            let mut j = job("acme", "echo");
            (j.execute_at, j.not_after) = (at, not_after);
            let e: ApiError = validate(&cfg, &j, 1).unwrap_err().into();
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, codes::TIME_OUT_OF_RANGE));
            assert!(e.message.contains(field) && e.message.contains("253402300799999"), "{}", e.message);
        }
    }

    #[test]
    fn infrastructure_errors_are_503_with_retry_after() {
        let e: ApiError = SubmitError::Store(crate::store::StoreError::Query {
            what: "claim idempotency key",
            message: "timeout".into(),
        })
        .into();
        assert_eq!((e.status, e.code), (StatusCode::SERVICE_UNAVAILABLE, codes::STORE_UNAVAILABLE));
        assert_eq!(e.retry_after_secs, Some(5));
        let e: ApiError = crate::store::StoreError::Query { what: "get job", message: "x".into() }.into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn json_errors_separate_syntax_from_shape() {
        let syntax = serde_json::from_str::<NewJob>("{not json").unwrap_err();
        let e = ApiError::from_json(&syntax, "a job object");
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, codes::INVALID_JSON));
        let shape = serde_json::from_str::<NewJob>(r#"{"tenant":"acme"}"#).unwrap_err();
        let e = ApiError::from_json(&shape, "a job object");
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_JOB));
        assert!(e.message.contains("job_type"), "{}", e.message);
        let unknown = serde_json::from_str::<NewJob>(r#"{"tenant":"a","job_type":"b","colour":1}"#).unwrap_err();
        let e = ApiError::from_json(&unknown, "a job object");
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("colour"), "{}", e.message);
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(7)), 7);
        let e = ApiError::rate_limited("acme", Rate::per_second(2), Duration::from_millis(400));
        assert_eq!(
            (e.status, e.code, e.retry_after_secs),
            (StatusCode::TOO_MANY_REQUESTS, codes::TENANT_RATE_LIMIT_EXCEEDED, Some(1))
        );
        assert!(e.message.contains("fairway tenants set acme"), "{}", e.message);
    }

    #[test]
    fn admission_and_limit_refusals_say_what_why_and_how_to_fix() {
        let q = Refusal::QueueFull { tenant: "acme".into(), queued: 10, n: 1, max: 10 };
        let e = ApiError::refused(&Refused::Limit(q));
        assert_eq!(
            (e.status, e.code, e.retry_after_secs),
            (StatusCode::TOO_MANY_REQUESTS, codes::TENANT_QUEUE_FULL, Some(5))
        );
        assert!(e.message.contains("max_queued = 10") && e.message.contains("--max-queued"), "{}", e.message);
        let rate = Rate { count: 3, per_ms: 60_000 };
        let u = Refusal::Rate {
            scope: Limit::UserRate,
            tenant: "acme".into(),
            key: Some("u1".into()),
            rate,
            wait_ms: 19_001,
        };
        let e = ApiError::refused(&Refused::Limit(u));
        assert_eq!((e.code, e.retry_after_secs), (codes::USER_RATE_LIMIT_EXCEEDED, Some(20)));
        assert!(e.message.contains("3/min") && e.message.contains("\"u1\""), "{}", e.message);
        let t = Refusal::Rate { scope: Limit::TenantRate, tenant: "acme".into(), key: None, rate, wait_ms: 20_000 };
        let e = ApiError::refused(&Refused::Limit(t));
        assert_eq!((e.code, e.retry_after_secs), (codes::TENANT_RATE_LIMIT_EXCEEDED, Some(20)));
        let counts = crate::core::window::Counts { ok: 7, failed: 5 };
        let c = Refused::CircuitOpen { scope: "pool:short".into(), wait_ms: 29_500, counts, ratio: 0.2 };
        let e = ApiError::refused(&c);
        assert_eq!(
            (e.status, e.code, e.retry_after_secs),
            (StatusCode::SERVICE_UNAVAILABLE, codes::CIRCUIT_OPEN, Some(30))
        );
        assert!(e.message.contains("more than 20 %"), "{}", e.message);
        assert!(!e.message.contains("5 of") && !e.message.contains("12"), "no fleet counts to a tenant: {}", e.message);
        // A dependency's fleet-wide breaker: Retry-After in seconds, the end as an HTTP-date.
        let d = Refused::DependencyOpen { dependency: "payments".into(), wait_ms: 42_100 };
        let e = ApiError::refused(&d);
        assert_eq!(
            (e.status, e.code, e.retry_after_secs),
            (StatusCode::SERVICE_UNAVAILABLE, codes::CIRCUIT_OPEN, Some(43))
        );
        let date = e.message.split("open until ").nth(1).and_then(|r| r.split(" (Retry-After").next()).unwrap();
        assert!(httpdate::parse_http_date(date).is_ok(), "an HTTP-date: {date:?} in {}", e.message);
        assert!(e.message.contains("\"payments\"") && e.message.contains("Retry-After: 43"), "{}", e.message);
    }

    #[test]
    fn response_carries_code_and_retry_after_header() {
        let resp = ApiError::rate_limited("acme", Rate::per_second(2), Duration::from_millis(2500)).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers().get(header::RETRY_AFTER).unwrap(), "3");
        let resp = ApiError::not_found("x").into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }
}
