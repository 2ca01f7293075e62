//! The API process's own limits (rules: `core::api_limits`; settings `[api.limits]`):
//! what one API key, and all keys together, may hold of this process at once.
//!
//! Each budget below that is "per key" counts a tenant key against its tenant (all its
//! keys together: more keys buy no more of this process), and an admin key against itself
//! ([`holder`]).
//!
//! - **bodies** ([`bodies`], on every route that takes one): a request over its route's
//!   body limit by `Content-Length` is answered 413 before its body is read; otherwise it
//!   holds one request in flight and its body bytes (`Content-Length`, or the route's
//!   limit) of the tenant's (or admin key's) and the process's budgets, or gets 429 with `Retry-After`
//!   (`TOO_MANY_SUBMISSIONS` on `POST /v1/jobs` and `POST /v1/jobs:batch`,
//!   `TOO_MANY_REQUESTS_WITH_BODIES` on the others, which have budgets of their own);
//!   its body must arrive within `body_timeout` (408). Bodies are read into typed
//!   structs; a job's payload stays JSON text (`submit::Payload`), and a batch is split
//!   element by element and refused with 413 at the first job past the limit
//!   ([`read_batch`]): no body becomes a tree of values.
//! - **requests** ([`Limits::request`]): a token bucket per API key and one per tenant
//!   (all its keys) on every `/v1` and `/console` route but the two submission routes
//!   (whose rate is the tenant's `admission.tenant_rate`): 429 `TOO_MANY_REQUESTS`.
//! - **streams** ([`Limits::stream_slot`]): Server-Sent Event streams per key and in
//!   total (429 `TOO_MANY_STREAMS`); a stream ends when its key is revoked
//!   ([`until_revoked`]).
//! - **console DLQ scans** ([`Limits::scan_slot`]): one per tenant (or admin key) at a
//!   time, four in all for tenants and four more for admins (tenants cannot take theirs).
//! - **heavy reads** ([`Limits::heavy_slot`], [`heavy`]): usage reports and exports,
//!   the console's tenant and overview pages, listings of every schedule or tenant:
//!   `heavy_reads_per_key` in flight per tenant (all its keys) or admin key, and
//!   `heavy_reads` in all (429 `TOO_MANY_HEAVY_READS`); a ledger read within one is also
//!   bounded in rows (`ledger_rows_per_request`, `crate::core::ledger::RowBudget`).
//! - **connections**: per client address and in total, in [`super::listener`].

use super::{codes, ApiError, ApiState};
use crate::core::api_limits::{ApiLimits, Bound, Busy, Usage};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Seconds a caller refused for being busy is told to wait.
const BUSY_RETRY_SECS: u64 = 1;
/// A stream re-checks its key this often (a revoked key ends it within this plus
/// `api.key_refresh`).
const REVOKE_CHECK: Duration = Duration::from_secs(2);

/// The API key a request came with (its id; "anonymous" with `api.auth = "off"`), put in
/// the request's extensions by `auth::require_caller`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyId(pub String);

/// This process's counts of what each key holds.
pub struct Limits {
    limits: ApiLimits,
    single_body: u64,
    batch_body: u64,
    submissions: Arc<Mutex<Usage>>,
    /// Requests with bodies on the other routes (schedules, tenants, console actions).
    controls: Arc<Mutex<Usage>>,
    requests: Requests,
    streams: Arc<Mutex<Usage>>,
    /// Console DLQ scans: one per tenant at a time, a few in all.
    scans: Arc<Mutex<Usage>>,
    /// The admins' console DLQ scans, apart from the tenants'.
    admin_scans: Arc<Mutex<Usage>>,
    /// Heavy reads in flight: per tenant (or admin key), in all.
    heavy: Arc<Mutex<Usage>>,
}

/// Console DLQ scans at once, all tenants' (and as many more, all admins').
const MAX_SCANS: u64 = 4;

/// Who a budget counts a request against: a tenant key's tenant (all its keys together),
/// or an admin key (or, with `api.auth = "off"`, the anonymous key) itself.
pub fn holder(key: &KeyId, caller: Option<&super::Caller>) -> KeyId {
    match caller.and_then(|c| c.tenant()) {
        Some(t) => KeyId(format!("tenant:{t}")),
        None => KeyId(format!("key:{}", key.0)),
    }
}
/// Requests with bodies in flight on the other routes: per key, in all.
const CONTROLS: Bound = Bound { per_key: 4, total: 64 };

/// The kinds of route that take a body, each with its limit and budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRoute {
    /// `POST /v1/jobs`.
    Job,
    /// `POST /v1/jobs:batch`.
    Batch,
    /// Schedules, tenants, console actions.
    Control,
}

/// The request buckets: per key and per tenant.
struct Requests {
    keys: governor::DefaultKeyedRateLimiter<String>,
    tenants: governor::DefaultKeyedRateLimiter<String>,
    checks: std::sync::atomic::AtomicU32,
}

/// Checks between two sweeps of the buckets' idle keys.
const SWEEP_EVERY: u32 = 4096;

/// `per_s` a second, two seconds' worth of burst.
pub(super) fn quota(per_s: u32) -> governor::Quota {
    let n = std::num::NonZeroU32::new(per_s.max(1)).expect("at least 1");
    let burst = n.saturating_mul(std::num::NonZeroU32::new(2).expect("2"));
    governor::Quota::per_second(n).allow_burst(burst)
}

impl Requests {
    fn new(l: &ApiLimits) -> Requests {
        Requests {
            keys: governor::RateLimiter::keyed(quota(l.requests_per_key)),
            tenants: governor::RateLimiter::keyed(quota(l.requests_per_tenant)),
            checks: Default::default(),
        }
    }
}

impl Limits {
    pub fn new(limits: &ApiLimits, max_payload_bytes: usize) -> Self {
        let l = limits.clone();
        let submissions = Usage::new(
            "submissions",
            Bound { per_key: l.submissions_per_key, total: l.submissions },
            Bound { per_key: l.body_bytes_per_key, total: l.body_bytes },
        );
        let streams = Usage::new("streams", Bound { per_key: l.streams_per_key, total: l.streams }, Bound::NONE);
        Limits {
            single_body: ApiLimits::single_body_bytes(max_payload_bytes),
            batch_body: l.batch_body(max_payload_bytes),
            submissions: Arc::new(Mutex::new(submissions)),
            streams: Arc::new(Mutex::new(streams)),
            controls: Arc::new(Mutex::new(Usage::new(
                "requests with bodies",
                CONTROLS,
                Bound {
                    per_key: CONTROLS.per_key * l.control_body_bytes,
                    total: CONTROLS.total * l.control_body_bytes,
                },
            ))),
            requests: Requests::new(&l),
            heavy: Arc::new(Mutex::new(Usage::new(
                "heavy reads",
                Bound { per_key: l.heavy_reads_per_key, total: l.heavy_reads },
                Bound::NONE,
            ))),
            limits: l,
            scans: Arc::new(Mutex::new(Usage::new("DLQ scans", Bound { per_key: 1, total: MAX_SCANS }, Bound::NONE))),
            admin_scans: Arc::new(Mutex::new(Usage::new(
                "admins' DLQ scans",
                Bound { per_key: 1, total: MAX_SCANS },
                Bound::NONE,
            ))),
        }
    }

    /// Largest body of a route of `kind`.
    pub fn body_limit(&self, kind: BodyRoute) -> usize {
        (match kind {
            BodyRoute::Job => self.single_body,
            BodyRoute::Batch => self.batch_body,
            BodyRoute::Control => self.limits.control_body_bytes,
        }) as usize
    }

    /// One request of `key` (of `tenant`, for a tenant key) from the key's and the
    /// tenant's buckets, or 429 `TOO_MANY_REQUESTS` with the wait.
    pub fn request(&self, key: &KeyId, tenant: Option<&str>) -> Result<(), ApiError> {
        use governor::clock::{Clock, DefaultClock};
        let r = &self.requests;
        if r.checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            r.keys.retain_recent();
            r.tenants.retain_recent();
        }
        let refused = |scope: &'static str, most: u32, wait: Duration| {
            metrics::counter!(crate::metrics::API_REQUESTS_THROTTLED, "scope" => scope).increment(1);
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            ApiError {
                retry_after_secs: Some(secs),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    codes::TOO_MANY_REQUESTS,
                    format!(
                        "this {scope} made more than {most} requests per second (api.limits.requests_per_{scope}); \
                         retry after {secs}s, and poll less often (GET /v1/jobs/{{id}}/events?follow=1 streams a \
                         job's changes)"
                    ),
                )
            }
        };
        let now = DefaultClock::default().now();
        if let Err(n) = r.keys.check_key(&key.0) {
            return Err(refused("key", self.limits.requests_per_key, n.wait_time_from(now)));
        }
        if let Some(t) = tenant {
            if let Err(n) = r.tenants.check_key(&t.to_string()) {
                return Err(refused("tenant", self.limits.requests_per_tenant, n.wait_time_from(now)));
            }
        }
        Ok(())
    }

    /// One live stream for `caller` ([`holder`]), held until the returned slot is dropped.
    pub fn stream_slot(&self, key: &KeyId, caller: Option<&super::Caller>) -> Result<Slot, ApiError> {
        Slot::take(&self.streams, &holder(key, caller), 0)
            .map_err(|b| busy(b, codes::TOO_MANY_STREAMS, "close streams it no longer reads"))
    }

    /// One heavy read for `caller` ([`holder`]), held until the returned slot is dropped.
    pub fn heavy_slot(&self, key: &KeyId, caller: Option<&super::Caller>) -> Result<Slot, ApiError> {
        Slot::take(&self.heavy, &holder(key, caller), 0).map_err(|b| {
            busy(
                b,
                codes::TOO_MANY_HEAVY_READS,
                "wait for its usage reports, exports or console pages in flight (api.limits.heavy_reads_per_key)",
            )
        })
    }

    /// Ledger rows one request may read (`api.limits.ledger_rows_per_request`).
    pub fn ledger_rows(&self) -> u64 {
        self.limits.ledger_rows_per_request
    }

    /// One console DLQ scan for `caller` ([`holder`]; admins' apart from tenants'), held
    /// until the returned slot is dropped.
    pub fn scan_slot(&self, key: &KeyId, caller: &super::Caller) -> Result<Slot, ApiError> {
        let scans = if caller.is_admin() { &self.admin_scans } else { &self.scans };
        Slot::take(scans, &holder(key, Some(caller)), 0)
            .map_err(|b| busy(b, codes::TOO_MANY_SCANS, "wait for the page to load"))
    }
}

/// Something a key holds (a submission in flight and its bytes, or a stream); given back
/// when dropped.
pub struct Slot {
    usage: Arc<Mutex<Usage>>,
    key: String,
    bytes: u64,
}

impl Slot {
    fn take(usage: &Arc<Mutex<Usage>>, key: &KeyId, bytes: u64) -> Result<Slot, Busy> {
        usage.lock().expect("api limits").take(&key.0, bytes)?;
        Ok(Slot { usage: usage.clone(), key: key.0.clone(), bytes })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.usage.lock().expect("api limits").give_back(&self.key, self.bytes);
    }
}

/// 429 with `Retry-After` for a bound that refused.
fn busy(b: Busy, code: &'static str, fix: &str) -> ApiError {
    let message = match b {
        Busy::Key { what, held, most } => format!(
            "this API key holds {held} {what} in flight and may hold {most} at once ([api.limits]); wait for \
             them to finish (retry after {BUSY_RETRY_SECS}s) or {fix}"
        ),
        Busy::Total { what, most } => format!(
            "this API process holds its limit of {most} {what} in flight for all callers ([api.limits]); retry \
             after {BUSY_RETRY_SECS}s"
        ),
    };
    metrics::counter!(crate::metrics::ADMISSION_REFUSED, "reason" => code).increment(1);
    ApiError { retry_after_secs: Some(BUSY_RETRY_SECS), ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message) }
}

fn too_large(limit: u64, kind: BodyRoute) -> ApiError {
    let what = match kind {
        BodyRoute::Batch => "a batch is at most api.limits.batch_body_bytes",
        BodyRoute::Job => "one job is at most about 6x worker.max_payload_bytes",
        BodyRoute::Control => "this route's bodies are at most api.limits.control_body_bytes",
    };
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        codes::BODY_TOO_LARGE,
        format!(
            "request body is above the API's size limit of {limit} bytes ({what}); store large inputs elsewhere and \
             submit a reference, or split the batch"
        ),
    )
}

/// Middleware of the routes that take a body (see the module docs), with the route's
/// kind as its state. Runs after authentication; the handler gets the body already read.
pub async fn bodies(State((st, kind)): State<(ApiState, BodyRoute)>, req: Request, next: Next) -> Response {
    use axum::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS) {
        return next.run(req).await;
    }
    let fd = &st.inner.front;
    let limit = fd.body_limit(kind) as u64;
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large(limit, kind).into_response();
    }
    let key = req.extensions().get::<KeyId>().cloned().unwrap_or_else(|| super::auth::key_id(req.headers()));
    let key = holder(&key, req.extensions().get::<super::Caller>());
    let (budget, code) = match kind {
        BodyRoute::Job | BodyRoute::Batch => (&fd.submissions, codes::TOO_MANY_SUBMISSIONS),
        BodyRoute::Control => (&fd.controls, codes::TOO_MANY_REQUESTS_WITH_BODIES),
    };
    let _slot = match Slot::take(budget, &key, declared.unwrap_or(limit)) {
        Ok(s) => s,
        Err(b) => return busy(b, code, "send fewer requests at once").into_response(),
    };
    let (parts, body) = req.into_parts();
    let timeout = Duration::from_millis(fd.limits.body_timeout.0 as u64);
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit as usize)).await {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                codes::BODY_TIMEOUT,
                format!(
                    "the request body did not arrive within api.limits.body_timeout = {}; send it at once",
                    fd.limits.body_timeout
                ),
            )
            .into_response()
        }
        Ok(Err(_)) if declared.is_none() => return too_large(limit, kind).into_response(),
        Ok(Err(e)) => {
            return ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_JSON, format!("cannot read the body: {e}"))
                .into_response()
        }
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Middleware of the `/v1` routes but the submission ones: one request from the
/// caller's key's and tenant's buckets ([`Limits::request`]). Runs after authentication.
pub async fn throttled(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let key = req.extensions().get::<KeyId>().cloned().unwrap_or_else(|| super::auth::key_id(req.headers()));
    let tenant = req.extensions().get::<super::Caller>().and_then(|c| c.tenant().map(str::to_string));
    match st.inner.front.request(&key, tenant.as_deref()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware of the heavy read routes (see the module docs): a GET or HEAD holds one
/// heavy read of its caller's ([`Limits::heavy_slot`]) until its answer is built; other
/// methods pass. Runs after authentication.
pub async fn heavy(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    use axum::http::Method;
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let key = req.extensions().get::<KeyId>().cloned().unwrap_or_else(|| super::auth::key_id(req.headers()));
    let caller = req.extensions().get::<super::Caller>().cloned();
    let _slot = match st.inner.front.heavy_slot(&key, caller.as_ref()) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    next.run(req).await
}

/// Splits a batch body, a JSON array of at most `most` job objects, into its elements'
/// JSON texts (borrowed from `body`, checked but not built into values; 413
/// `BATCH_TOO_LARGE` at the first one past `most`, before reading the rest).
pub fn read_batch(body: &Bytes, most: usize) -> Result<Vec<&RawValue>, ApiError> {
    let too_many = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = AtMost { most, too_many: &too_many }.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(items) => Ok(items),
        Err(_) if too_many.get() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::BATCH_TOO_LARGE,
            format!("the batch has more than {most} jobs, above the limit of {most}; split it"),
        )),
        Err(e) => Err(ApiError::from_json(&e, "a JSON array of job objects")),
    }
}

/// A sequence of at most `most` JSON values.
struct AtMost<'a> {
    most: usize,
    too_many: &'a std::cell::Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for AtMost<'_> {
    type Value = Vec<&'de RawValue>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for AtMost<'_> {
    type Value = Vec<&'de RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a JSON array of at most {} job objects", self.most)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<&'de RawValue>()? {
            if out.len() == self.most {
                self.too_many.set(true);
                return Err(serde::de::Error::custom(format!("more than {} jobs", self.most)));
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// Completes when the key of `headers` is no longer valid (revoked, or its tenant
/// removed); never for a store that cannot be read (streams outlive short outages).
pub async fn until_revoked(st: ApiState, headers: axum::http::HeaderMap) {
    loop {
        tokio::time::sleep(REVOKE_CHECK).await;
        if let Err(e) = st.authenticate(&headers).await {
            if e.status == StatusCode::UNAUTHORIZED {
                tracing::info!("live stream closed: its API key is no longer valid");
                return;
            }
        }
    }
}

/// A Server-Sent Events answer that ends when `stream` does or when the key in `auth`
/// is revoked (hold the stream's [`Slot`] in `stream`).
pub fn live_stream(
    stream: impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>> + Send + 'static,
    st: &ApiState,
    auth: axum::http::HeaderMap,
) -> Response {
    use axum::response::sse::{KeepAlive, Sse};
    use futures::StreamExt;
    let stream = stream.take_until(Box::pin(until_revoked(st.clone(), auth)));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_refused_at_the_first_job_past_the_limit() {
        let body = Bytes::from_static(b"[{\"a\": [1, 2]}, 2]");
        let ok = read_batch(&body, 2).unwrap();
        assert_eq!(ok.iter().map(|v| v.get()).collect::<Vec<_>>(), ["{\"a\": [1, 2]}", "2"]);
        // Far more elements than the limit: refused without building them all.
        let huge = Bytes::from(format!("[{}0]", "0,".repeat(1_000_000)));
        let e = read_batch(&huge, 1000).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::PAYLOAD_TOO_LARGE, codes::BATCH_TOO_LARGE), "{e:?}");
        let e = read_batch(&Bytes::from_static(b"[1,"), 10).unwrap_err();
        assert_eq!(e.code, codes::INVALID_JSON);
        let e = read_batch(&Bytes::from_static(b"{}"), 10).unwrap_err();
        assert_eq!(e.code, codes::INVALID_JOB);
        let e = read_batch(&Bytes::from_static(b"[1] x"), 10).unwrap_err();
        assert_eq!(e.code, codes::INVALID_JSON);
    }

    #[test]
    fn console_dlq_scans_are_one_per_tenant_and_a_few_in_all_and_admins_keep_theirs() {
        use crate::api::Caller;
        let fd = Limits::new(&ApiLimits::default(), 1 << 20);
        let key = |k: &str| KeyId(k.to_string());
        let tenant = |t: &str| Caller::Tenant(t.to_string());
        let first = fd.scan_slot(&key("a1"), &tenant("acme")).expect("acme's first scan");
        let e = fd.scan_slot(&key("a2"), &tenant("acme")).err().expect("acme's second scan at once, another key");
        assert_eq!(
            (e.status, e.code, e.retry_after_secs),
            (StatusCode::TOO_MANY_REQUESTS, codes::TOO_MANY_SCANS, Some(BUSY_RETRY_SECS))
        );
        let others: Vec<Slot> = (1..MAX_SCANS)
            .map(|i| fd.scan_slot(&key(&format!("k{i}")), &tenant(&format!("t{i}"))).expect("room"))
            .collect();
        let e = fd.scan_slot(&key("late"), &tenant("late")).err().expect("all tenants' scans taken");
        assert_eq!(e.code, codes::TOO_MANY_SCANS);
        assert!(e.message.contains("for all callers"), "{}", e.message);
        let admin = fd.scan_slot(&key("root"), &Caller::Admin).expect("the tenants cannot take the admins' scans");
        drop(first);
        assert!(fd.scan_slot(&key("a2"), &tenant("acme")).is_ok(), "acme's scan ended: it may scan again");
        drop((others, admin));
    }

    #[test]
    fn a_tenants_keys_share_its_submission_bytes() {
        use crate::api::Caller;
        let l = ApiLimits::default();
        let fd = Limits::new(&l, 1 << 20);
        let acme = Caller::Tenant("acme".into());
        let per = l.body_bytes_per_key;
        let first = Slot::take(&fd.submissions, &holder(&KeyId("k1".into()), Some(&acme)), per).expect("acme's budget");
        let second = Slot::take(&fd.submissions, &holder(&KeyId("k2".into()), Some(&acme)), 1);
        assert!(second.is_err(), "another key of acme's buys no more of the budget");
        let globex = Caller::Tenant("globex".into());
        assert!(Slot::take(&fd.submissions, &holder(&KeyId("k3".into()), Some(&globex)), per).is_ok(), "globex's own");
        drop(first);
    }
}
