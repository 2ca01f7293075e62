//! The HTTP API (axum): submit jobs (one or a batch) with per-tenant rate limits,
//! read a job's state, request cancellation, health and Prometheus metrics.
//!
//! | method + path            | answer |
//! |--------------------------|--------|
//! | `POST /v1/jobs`          | 201 `{job_id, pool, duplicate}` (+ `Location`); 400/413/422 invalid; 429 + `Retry-After` over the tenant's or end user's rate or queue depth; 503 + `Retry-After` circuit open ([`crate::admission`]) |
//! | `POST /v1/jobs:batch`    | 201 `[{job_id, pool, duplicate}, ...]`; every job is validated before any is produced |
//! | `GET /v1/jobs/{id}`      | 200 job state + heartbeat (progress, heartbeat_age_ms); 404 no state |
//! | `DELETE /v1/jobs/{id}`   | 202 cooperative cancel requested; 409 already finished |
//! | `GET /v1/jobs/{id}/events` | the job's event history; `?follow=1`: Server-Sent Events until it ends ([`events`]) |
//! | `GET /v1/events?follow=1` | Server-Sent Events of the caller's tenant |
//! | `/v1/schedules[/{name}]` | recurring schedules ([`schedules`]) |
//! | `GET /v1/openapi.json`   | the API's OpenAPI 3.1 description (no key needed; [`openapi`]) |
//! | `GET /healthz`           | 200 `ok` (no key needed) |
//! | `GET /console`           | the operator console (HTML; API key or login form; see [`console`]) |
//!
//! Every `/v1` route needs `Authorization: Bearer <API key>` ([`auth`]): 401 without a
//! valid key; a tenant key submits only for its tenant (403 otherwise) and sees only its
//! tenant's jobs (another tenant's job answers 404, like an unknown id). The router is
//! built from [`ROUTES`]: a new `/v1` route there gets the same check (unless its guard
//! is [`Guard::Open`]) and must be described in `openapi/openapi.json`, or the tests of
//! [`openapi`] fail; admin-only handlers take
//! [`auth::Admin`]. `/metrics` and `/healthz` are served by [`ops_router`] on a separate
//! listener (`api.metrics_listen`), with `/readyz` and `/livez` (`crate::observe::probes`);
//! `fairway serve` opens that listener before the state exists ([`Starting`]).
//!
//! Every error is JSON `{"error": "<what is wrong and how to fix it>", "code": "<CODE>"}`
//! (see [`codes`]).

mod admin;
pub mod auth;
pub mod connection;
pub mod console;
mod drain;
mod error;
mod events;
pub mod limits;
pub mod listener;
pub mod openapi;
mod regions;
pub mod replays;
mod schedules;
mod starting;
mod usage;

pub use auth::{Admin, Caller};
pub use error::{codes, retry_after_secs, ApiError, JOB_FIELDS};
pub use starting::Starting;

use crate::config::Config;
use crate::now_ms;
use crate::store::{HeartbeatRow, JobRow, Store};
use crate::submit::{NewJob, SubmitError, Submitted, Submitter};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::{API_JOBS_SUBMITTED, API_RATE_LIMITED, API_REQUESTS, API_REQUEST_SECONDS};

/// Installs a global Prometheus recorder (no HTTP listener of its own: the API serves
/// `/metrics`) and registers every metric description. Call once per process.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    let handle = crate::metrics::with_buckets(PrometheusBuilder::new())
        .set_buckets_for_metric(Matcher::Full(API_REQUEST_SECONDS.into()), &crate::metrics::LATENCY_BUCKETS)?
        .install_recorder()?;
    crate::metrics::describe();
    Ok(handle)
}

/// Most jobs in one `POST /v1/jobs:batch`.
pub const MAX_BATCH_JOBS: usize = 1000;

/// Shared state of the API handlers (cheap to clone).
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: Arc<Config>,
    submitter: Submitter,
    store: Store,
    /// The front door: queue depth, rates, breakers, quota alerts.
    admission: Arc<crate::admission::Admission>,
    metrics: Option<PrometheusHandle>,
    /// API keys: who is calling.
    keys: auth::Keys,
    /// The live tenants registry (None: the config file's tenants, fixed).
    tenants: Option<crate::ops::tenants::LiveTenants>,
    /// Keeps the registry poller running for the life of the state.
    _registry_stop: Option<tokio::sync::watch::Sender<bool>>,
    /// Job watching: history statements (prepared on first use) and the live feed.
    event_stmts: tokio::sync::OnceCell<crate::store::EventStatements>,
    feed: Option<crate::watch::events::Feed>,
    /// The operator console's sessions, live sampler and replays.
    console: console::Console,
    /// Set once the server drains: SSE streams end with a final event ([`drain`]).
    draining: tokio::sync::watch::Sender<bool>,
    /// Recurring schedules' statements (prepared on first use).
    schedules: tokio::sync::OnceCell<crate::ops::schedules::Schedules>,
    /// The usage ledger's statements (prepared on first use).
    ledger: tokio::sync::OnceCell<crate::store::LedgerStatements>,
    /// Tenant alerts' statements (prepared on first use).
    alerts: tokio::sync::OnceCell<crate::store::AlertStatements>,
    /// The refusal counts' statements (a tenant's console page), prepared once.
    refusals: tokio::sync::OnceCell<crate::store::RefusalStatements>,
    /// What each API key holds of this process (`[api.limits]`).
    front: limits::Limits,
    /// The listener's open connections (`[api.limits]`; read by `/readyz`).
    connections: Arc<listener::Connections>,
    /// This region's state (with `[region] name` set): [`regions`].
    regions: Option<regions::Regions>,
    /// The fleet's ledger days folded for the console's tenant pages.
    fleet_days: crate::ledger::FleetDays,
    /// Dead-letter replays started here (API and console).
    replays: replays::Replays,
}

impl Inner {
    /// The state without a live registry or events feed (API keys from the config).
    fn new(
        cfg: Arc<Config>,
        submitter: Submitter,
        store: Store,
        admission: Arc<crate::admission::Admission>,
        metrics: Option<PrometheusHandle>,
    ) -> Inner {
        let keys = auth::Keys::new(cfg.api.auth, cfg.api.key_refresh, &cfg.api.limits);
        let front = limits::Limits::new(&cfg.api.limits, cfg.worker.max_payload_bytes);
        Inner {
            front,
            connections: listener::Connections::new(&cfg.api.limits),
            cfg,
            submitter,
            store,
            admission,
            metrics,
            keys,
            tenants: None,
            _registry_stop: None,
            event_stmts: Default::default(),
            feed: None,
            console: Default::default(),
            draining: tokio::sync::watch::Sender::new(false),
            schedules: Default::default(),
            ledger: Default::default(),
            regions: None,
            alerts: Default::default(),
            refusals: Default::default(),
            fleet_days: Default::default(),
            replays: Default::default(),
        }
    }
}

impl ApiState {
    /// Starts draining: every Server-Sent Events stream sends its final event and ends.
    pub fn drain(&self) {
        self.inner.draining.send_replace(true);
    }

    fn draining(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.draining.subscribe()
    }

    /// The only way to build the API's state: opens the store, a producer and the live
    /// tenants registry for `cfg`, with every front-door protection on (queue depth,
    /// rates, breakers following the workers' outcomes, `[api.limits]`); limits follow
    /// registry changes.
    pub async fn connect(cfg: Arc<Config>, metrics: Option<PrometheusHandle>) -> Result<Self, SubmitError> {
        Self::connect_reporting(cfg, metrics, &Starting::default()).await
    }

    /// [`ApiState::connect`], telling `starting` (which `fairway serve`'s metrics listener
    /// answers from meanwhile) each try to reach the database.
    pub async fn connect_reporting(
        cfg: Arc<Config>,
        metrics: Option<PrometheusHandle>,
        starting: &Starting,
    ) -> Result<Self, SubmitError> {
        let store = crate::store::open_waiting(&cfg, cfg.scylla.connect_wait, |w| {
            let line = w.describe();
            tracing::warn!("{line}");
            starting.waiting(line);
        })
        .await?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let live = crate::ops::tenants::LiveTenants::start(cfg.clone(), &store, stopped.clone()).await?;
        let submitter = Submitter::new(cfg.clone(), Some(store.clone()))?.with_tenants(live.clone());
        let admission = Arc::new(crate::admission::Admission::connect(cfg.clone(), &store, Some(live.clone())).await?);
        admission.start_breakers(stopped.clone());
        // Job watching: the live feed for SSE, and the history recorder (same lifetime).
        let feed = crate::watch::events::Feed::start(&cfg, stopped.clone())?;
        let recorder = crate::watch::events::record(cfg.clone(), store.clone(), stopped.clone());
        tokio::spawn(async move {
            if let Err(e) = recorder.await {
                tracing::error!("job events recorder stopped: {e:#}; GET /v1/jobs/{{id}}/events shows no new history");
            }
        });
        // The usage ledger (one writer in the deployment, by lease), same lifetime.
        let ledger = crate::ledger::run(cfg.clone(), store.clone(), stopped.clone());
        tokio::spawn(async move {
            if let Err(e) = ledger.await {
                tracing::error!("usage ledger stopped: {e:#}; GET /v1/usage shows no new usage");
            }
        });
        // Result callbacks (job types with a webhook_url), same lifetime.
        let webhooks = crate::watch::webhooks::deliver(cfg.clone(), stopped.clone());
        tokio::spawn(async move {
            if let Err(e) = webhooks.await {
                tracing::error!("webhook delivery loop stopped: {e:#}; results are not POSTed to callbacks");
            }
        });
        let regions = match cfg.region.name {
            Some(_) => Some(regions::Regions::start(store.clone(), stopped.clone()).await?),
            None => None,
        };
        let inner = Inner {
            tenants: Some(live.clone()),
            regions,
            _registry_stop: Some(stop),
            feed: Some(feed),
            ..Inner::new(cfg, submitter, store, admission, metrics)
        };
        Ok(ApiState { inner: Arc::new(inner) })
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.inner.cfg
    }
    pub fn store(&self) -> &Store {
        &self.inner.store
    }
    /// `fairway serve`'s readiness: the store and a broker answer, each within 2 s (every
    /// connection taken is busy, not unready: see `ops_router`).
    pub fn readiness_check(&self) -> crate::observe::probes::ReadyCheck {
        let st = self.clone();
        Arc::new(move || {
            let st = st.clone();
            Box::pin(async move {
                st.region_ready()?;
                let wait = std::time::Duration::from_secs(2);
                match tokio::time::timeout(wait, st.store().ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(format!("the store does not answer: {e}")),
                    Err(_) => return Err("the store did not answer within 2 s".into()),
                }
                crate::kafka::ping(st.inner.submitter.producer(), wait).await.map_err(|e| e.to_string())
            })
        })
    }
    /// The live tenants registry (None when built from parts without one).
    pub fn live_tenants(&self) -> Option<&crate::ops::tenants::LiveTenants> {
        self.inner.tenants.as_ref()
    }
    pub fn admission(&self) -> &crate::admission::Admission {
        &self.inner.admission
    }
    async fn event_statements(&self) -> Result<&crate::store::EventStatements, ApiError> {
        Ok(self.inner.event_stmts.get_or_try_init(|| self.inner.store.event_statements()).await?)
    }
    fn feed(&self) -> Option<&crate::watch::events::Feed> {
        self.inner.feed.as_ref()
    }
    fn console(&self) -> &console::Console {
        &self.inner.console
    }

    fn limits(&self) -> &limits::Limits {
        &self.inner.front
    }

    pub(crate) fn replays(&self) -> &replays::Replays {
        &self.inner.replays
    }

    /// Checks a submitted job (`Submitter::validate`), and that its results can be
    /// delivered: a job type with a `webhook_url` needs the tenant's signing secret in
    /// this process (`serve` delivers the webhooks), else 422 `WEBHOOK_SECRET_MISSING`
    /// (an unsigned callback is never sent, so the job is refused before it runs).
    fn validate(&self, job: &NewJob) -> Result<crate::model::Pool, ApiError> {
        let pool = self.inner.submitter.validate(job, job.payload_bytes().len())?;
        crate::watch::webhooks::require_secret(&self.inner.cfg, &job.tenant, &job.job_type)
            .map_err(|m| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::WEBHOOK_SECRET_MISSING, m))?;
        Ok(pool)
    }

    /// Front-door admission of validated jobs (`pools[i]` is `jobs[i]`'s pool): all or none.
    async fn admit(&self, jobs: &[NewJob], pools: &[crate::model::Pool]) -> Result<crate::admission::Ticket, ApiError> {
        let asks = jobs
            .iter()
            .zip(pools)
            .map(|(j, p)| crate::admission::Ask {
                tenant: j.tenant.clone(),
                user_key: j.user_key.clone(),
                pool: *p,
                job_type: j.job_type.clone(),
            })
            .collect();
        self.inner.admission.admit(asks).await.map_err(|r| {
            if let crate::admission::Refused::Limit(crate::core::admission::Refusal::Rate { tenant, .. }) = &r {
                let tier = match &self.inner.tenants {
                    Some(live) => live.current().tenants.get(tenant).map(|t| t.tier).unwrap_or_default(),
                    None => self.inner.cfg.tenants.get(tenant).map(|t| t.tier).unwrap_or_default(),
                };
                metrics::counter!(API_RATE_LIMITED, "tier" => tier_label(tier)).increment(1);
            }
            ApiError::refused(&r)
        })
    }
}

fn tier_label(t: crate::config::Tier) -> &'static str {
    use crate::config::Tier;
    match t {
        Tier::Free => "free",
        Tier::Standard => "standard",
        Tier::Pro => "pro",
        Tier::Enterprise => "enterprise",
    }
}

/// Serves the API on `listener` until `shutdown` completes, then finishes the requests
/// in flight and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let conns = state.inner.connections.clone();
    let limits = state.config().api.limits.clone();
    listener::serve(listener, router(state), conns, &limits, shutdown).await
}

/// How a `/v1` route is guarded, beyond what [`router`] puts around every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A submission: an API key; its body bounded by `limits::bodies` (the tenant's
    /// rate is the front door's `admission.tenant_rate`, not a request bucket).
    Submission(limits::BodyRoute),
    /// An API key and a request from the key's and tenant's buckets (`limits::throttled`);
    /// `body`: the route takes a bounded body; `region_reads`: a tenant key's read of its
    /// job goes through the region gate (`regions::reads`); `heavy`: a heavy read, bounded
    /// in flight per tenant or admin key and in total (`limits::heavy`).
    Keyed { body: Option<limits::BodyRoute>, region_reads: bool, heavy: bool },
    /// No API key: the API's description.
    Open,
}

/// One `/v1` route: the [`router`] is built from [`ROUTES`], and the OpenAPI description
/// (`openapi/openapi.json`) is checked against the same table.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub guard: Guard,
    /// The handler, routed for the method given.
    handler: fn(MethodFilter) -> MethodRouter<ApiState>,
}

const fn keyed(body: Option<limits::BodyRoute>) -> Guard {
    Guard::Keyed { body, region_reads: false, heavy: false }
}
const fn heavy(body: Option<limits::BodyRoute>) -> Guard {
    Guard::Keyed { body, region_reads: false, heavy: true }
}
const fn route(
    method: Method,
    path: &'static str,
    guard: Guard,
    handler: fn(MethodFilter) -> MethodRouter<ApiState>,
) -> Route {
    Route { method, path, guard, handler }
}
const READ: Guard = Guard::Keyed { body: None, region_reads: true, heavy: false };
const CONTROL: Guard = keyed(Some(limits::BodyRoute::Control));

/// Every `/v1` route of the API (`/healthz` and the console are added by [`router`]).
pub const ROUTES: &[Route] = &[
    route(Method::POST, "/v1/jobs", Guard::Submission(limits::BodyRoute::Job), |m| on(m, submit_one)),
    route(Method::POST, "/v1/jobs:batch", Guard::Submission(limits::BodyRoute::Batch), |m| on(m, submit_batch)),
    route(Method::GET, "/v1/jobs/{id}", READ, |m| on(m, job_status)),
    route(Method::DELETE, "/v1/jobs/{id}", READ, |m| on(m, cancel_job)),
    route(Method::GET, "/v1/jobs/{id}/events", READ, |m| on(m, events::job_events)),
    route(Method::GET, "/v1/events", keyed(None), |m| on(m, events::tenant_events)),
    route(Method::GET, "/v1/schedules", heavy(Some(limits::BodyRoute::Control)), |m| on(m, schedules::list)),
    route(Method::POST, "/v1/schedules", CONTROL, |m| on(m, schedules::add)),
    route(Method::GET, "/v1/schedules/{name}", CONTROL, |m| on(m, schedules::get_one)),
    route(Method::PUT, "/v1/schedules/{name}", CONTROL, |m| on(m, schedules::replace)),
    route(Method::DELETE, "/v1/schedules/{name}", CONTROL, |m| on(m, schedules::remove)),
    route(Method::POST, "/v1/schedules/{name}", CONTROL, |m| on(m, schedules::action)),
    route(Method::GET, "/v1/admin/schedules", heavy(None), |m| on(m, schedules::list_all)),
    route(Method::GET, "/v1/usage", heavy(None), |m| on(m, usage::report)),
    route(Method::GET, "/v1/alerts", keyed(None), |m| on(m, usage::alerts)),
    route(Method::POST, "/v1/replays", CONTROL, |m| on(m, replays::post)),
    route(Method::GET, "/v1/replays/{run}", keyed(None), |m| on(m, replays::get)),
    route(Method::GET, "/v1/admin/usage", keyed(None), |m| on(m, usage::export)),
    route(Method::GET, "/v1/admin/tenants", heavy(Some(limits::BodyRoute::Control)), |m| on(m, admin::list)),
    route(Method::POST, "/v1/admin/tenants", CONTROL, |m| on(m, admin::add)),
    route(Method::PUT, "/v1/admin/tenants/{name}", CONTROL, |m| on(m, admin::replace)),
    route(Method::DELETE, "/v1/admin/tenants/{name}", CONTROL, |m| on(m, admin::remove)),
    route(Method::POST, "/v1/admin/tenants/{name}", CONTROL, |m| on(m, admin::action)),
    route(Method::GET, "/v1/openapi.json", Guard::Open, |m| on(m, openapi::serve)),
];

/// The API's routes (for embedding in another axum server): [`ROUTES`], `/healthz` and
/// the console.
pub fn router(state: ApiState) -> Router {
    // Bodies: bounded per key and in total, read by `limits::bodies`.
    let body = |kind: limits::BodyRoute, route: MethodRouter<ApiState>| {
        route
            .layer(DefaultBodyLimit::max(state.limits().body_limit(kind)))
            .layer(axum::middleware::from_fn_with_state((state.clone(), kind), limits::bodies))
    };
    let (mut submissions, mut others, mut open) = (Router::new(), Router::new(), Router::new());
    for r in ROUTES {
        let filter = MethodFilter::try_from(r.method.clone()).expect("ROUTES names only methods axum routes");
        let route = (r.handler)(filter);
        match r.guard {
            Guard::Submission(kind) => submissions = submissions.route(r.path, body(kind, route)),
            Guard::Keyed { body: kind, region_reads, heavy } => {
                let route = if region_reads {
                    route.route_layer(axum::middleware::from_fn_with_state(state.clone(), regions::reads))
                } else {
                    route
                };
                // Heavy reads: bounded in flight per tenant or admin key and in total.
                let route = if heavy {
                    route.route_layer(axum::middleware::from_fn_with_state(state.clone(), limits::heavy))
                } else {
                    route
                };
                let route = match kind {
                    Some(kind) => body(kind, route),
                    None => route,
                };
                others = others.route(r.path, route);
            }
            Guard::Open => open = open.route(r.path, route),
        }
    }
    // Everything but submissions: a request bucket per key and per tenant.
    let others = others.route_layer(axum::middleware::from_fn_with_state(state.clone(), limits::throttled));
    // Every route of these needs an API key.
    let v1 = submissions
        .merge(others)
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_caller));
    let console = console::router().layer(DefaultBodyLimit::max(state.limits().body_limit(limits::BodyRoute::Control)));
    Router::new()
        .merge(v1)
        .merge(open)
        .merge(console)
        .route("/healthz", get(healthz))
        .route("/region", get(regions::state))
        .route_layer(axum::middleware::from_fn(track))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The metrics listener's routes (`api.metrics_listen`, `fairway serve
/// --metrics-listen`): `/metrics` (Prometheus text), `/readyz` (the store and a broker
/// answer; `ready (busy: ...)` while every connection is taken), `/livez` and `/healthz`,
/// without API keys; operators choose where this listens and so who can scrape it.
pub fn ops_router(state: ApiState) -> Router {
    let (starting, metrics) = (Arc::new(Starting::default()), state.inner.metrics.clone());
    starting.up(state);
    starting.router(metrics)
}

/// Counts requests by route template (bounded), method and status.
async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "other".into());
    let method = method_label(req.method());
    let start = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::histogram!(API_REQUEST_SECONDS, "route" => route.clone()).record(start.elapsed().as_secs_f64());
    metrics::counter!(API_REQUESTS, "route" => route, "method" => method, "status" => status).increment(1);
    resp
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        _ => "other",
    }
}

const ENDPOINTS: &str = "POST /v1/jobs, POST /v1/jobs:batch, GET /v1/jobs/{id}, DELETE /v1/jobs/{id}, \
     GET /v1/jobs/{id}/events[?follow=1], GET /v1/events?follow=1, GET|POST /v1/schedules, \
     GET|PUT|DELETE /v1/schedules/{name}, GET /v1/openapi.json (the full list), GET /healthz, GET /console \
     (GET /metrics is on the metrics listener, api.metrics_listen)";

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    metrics::counter!(API_REQUESTS, "route" => "unmatched", "method" => method_label(&method), "status" => "404")
        .increment(1);
    ApiError::new(
        StatusCode::NOT_FOUND,
        codes::NO_SUCH_ROUTE,
        format!("no endpoint {method} {}; the API has {ENDPOINTS}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        codes::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}; the API has {ENDPOINTS}", uri.path()),
    )
}

fn body_error(r: BytesRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::BODY_TOO_LARGE,
            "request body is above the API's size limit (about 6x worker.max_payload_bytes for one job); \
             store large inputs elsewhere and submit a reference",
        )
    } else {
        ApiError::new(r.status(), codes::INVALID_JSON, format!("cannot read the request body: {}", r.body_text()))
    }
}

fn submitted_json(s: &Submitted) -> serde_json::Value {
    let mut v = serde_json::json!({ "job_id": s.job_id, "pool": s.pool.as_str(), "duplicate": s.duplicate });
    if let Some(row) = &s.original {
        // A duplicate: the original job's current state, and its result once finished.
        let state = row.status.as_deref().and_then(crate::core::events::JobState::from_status);
        v["state"] = state.map(|s| s.as_str()).into();
        if row.is_terminal() {
            v["result"] = serde_json::json!({
                "status": row.status, "output": row.output.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
                "error": row.error, "failure_class": row.failure_class, "attempts": row.attempts,
                "finished_at": row.finished_at, "peak_memory_bytes": row.peak_memory_bytes, "cpu_ms": row.cpu_ms,
            });
        }
    }
    v
}

fn count_submitted(s: &Submitted) {
    metrics::counter!(API_JOBS_SUBMITTED, "pool" => s.pool.as_str(), "duplicate" => if s.duplicate { "true" } else { "false" })
        .increment(1);
}

/// A job object of `caller`'s request (its JSON text; the payload is kept as text, not
/// parsed into a tree): a tenant key may omit `tenant` (it is the key's) and may not
/// name another (403).
fn job_of(caller: &Caller, trace: &TraceHeaders, item: &str) -> Result<NewJob, ApiError> {
    let mut job: NewJob = serde_json::from_str(item).map_err(|e| ApiError::from_json(&e, "a job object"))?;
    if let (true, Some(t)) = (job.tenant.is_empty(), caller.tenant()) {
        job.tenant = t.to_string();
    }
    if let Some(key) = &job.idempotency_key {
        crate::core::unique::check_caller_key(key)
            .map_err(|message| crate::submit::SubmitError::Invalid { field: "idempotency_key", message })?;
    }
    if job.traceparent.is_none() {
        job.traceparent = trace.traceparent.clone();
        job.tracestate = trace.tracestate.clone();
    }
    auth::check_tenant(caller, &job.tenant)?;
    Ok(job)
}

/// The W3C Trace Context a request came with. A `traceparent` header that does not
/// parse is ignored (the trace restarts, as the W3C spec asks of every participant); a
/// job object's own `traceparent` field takes precedence and is validated strictly.
struct TraceHeaders {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl TraceHeaders {
    fn of(headers: &axum::http::HeaderMap) -> TraceHeaders {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string());
        let traceparent = text("traceparent").filter(|tp| match crate::core::trace::check_traceparent(tp) {
            Ok(()) => true,
            Err(why) => {
                tracing::debug!("traceparent header ignored, trace restarted: {why}");
                false
            }
        });
        let tracestate =
            traceparent.as_ref().and(text("tracestate")).filter(|ts| crate::core::trace::check_tracestate(ts).is_ok());
        TraceHeaders { traceparent, tracestate }
    }
}

/// Records which tenant submitted each accepted job whose `queued` row could not be
/// written (that row names the tenant), before answering, so a tenant can read and
/// cancel its job as soon as it has the id, before any worker wrote its row. The jobs
/// are accepted either way: a failure is logged, and the job becomes visible to its
/// tenant once a worker records it.
async fn record_owners(st: &ApiState, owners: &[(&str, &str)]) {
    if owners.is_empty() {
        return;
    }
    let written = async {
        let keys = st.inner.keys.statements(&st.inner.store).await?;
        futures::future::try_join_all(owners.iter().map(|(id, t)| keys.put_owner(id, t))).await?;
        Ok::<_, ApiError>(())
    };
    if let Err(e) = written.await {
        tracing::warn!(
            "accepted jobs' owners not recorded (their tenant sees them once a worker starts them): {}",
            e.message
        );
    }
}

async fn submit_one(
    State(st): State<ApiState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let item = std::str::from_utf8(&body).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_JSON, format!("request body is not UTF-8 JSON ({e})"))
    })?;
    let job = job_of(&caller, &TraceHeaders::of(&headers), item)?;
    if let Some(elsewhere) = st.region_gate(&job.tenant, true, &headers).await {
        return Ok(elsewhere);
    }
    st.inner.submitter.refresh_classes().await;
    let pool = st.validate(&job)?;
    let ticket = st.admit(std::slice::from_ref(&job), &[pool]).await?;
    let submitted = st.inner.submitter.submit(&job).await;
    let accepted = submitted.as_ref().ok().filter(|s| !s.duplicate).map(|s| s.job_id.clone());
    st.inner.admission.settle(ticket, &[accepted]).await;
    let s = submitted?;
    if !s.queued_row {
        record_owners(&st, &[(s.job_id.as_str(), job.tenant.as_str())]).await;
    }
    count_submitted(&s);
    let location = format!("/v1/jobs/{}", s.job_id);
    // Joined a job that exists (unique key held, debounce window open): 200 with its id.
    let status = if s.joined { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, [(header::LOCATION, location)], Json(submitted_json(&s))).into_response())
}

async fn submit_batch(
    State(st): State<ApiState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let items = limits::read_batch(&body, MAX_BATCH_JOBS)?;
    if items.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::EMPTY_BATCH,
            "the batch is an empty array; send at least one job object",
        ));
    }
    let trace = TraceHeaders::of(&headers);
    st.inner.submitter.refresh_classes().await;
    // All-or-nothing: every job must be valid before any is produced.
    let mut jobs = Vec::with_capacity(items.len());
    let mut pools = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let job = job_of(&caller, &trace, item.get()).map_err(|e| e.context(format!("job [{i}]")))?;
        if let Some(elsewhere) = st.region_gate(&job.tenant, true, &headers).await {
            return Ok(elsewhere);
        }
        let pool = st.validate(&job).map_err(|e| e.context(format!("job [{i}]")))?;
        jobs.push(job);
        pools.push(pool);
    }
    let ticket = st.admit(&jobs, &pools).await?;
    let results = st.inner.submitter.submit_many(&jobs).await;
    let accepted: Vec<Option<String>> =
        results.iter().map(|r| r.as_ref().ok().filter(|s| !s.duplicate).map(|s| s.job_id.clone())).collect();
    st.inner.admission.settle(ticket, &accepted).await;
    let owners: Vec<(&str, &str)> = results
        .iter()
        .zip(&jobs)
        .filter_map(|(r, j)| Some((r.as_ref().ok().filter(|s| !s.queued_row)?.job_id.as_str(), j.tenant.as_str())))
        .collect();
    record_owners(&st, &owners).await;
    if results.iter().all(Result::is_ok) {
        let out: Vec<serde_json::Value> =
            results.into_iter().flatten().inspect(count_submitted).map(|s| submitted_json(&s)).collect();
        return Ok((StatusCode::CREATED, Json(serde_json::Value::Array(out))).into_response());
    }
    // Some were produced, some not: report each so the client resubmits only the failed
    // ones (or all of them, if it set idempotency keys).
    let mut first: Option<ApiError> = None;
    let mut failed = 0usize;
    let out: Vec<serde_json::Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(s) => {
                count_submitted(&s);
                submitted_json(&s)
            }
            Err(e) => {
                failed += 1;
                let e = ApiError::from(e);
                let v = e.body();
                first.get_or_insert(e);
                v
            }
        })
        .collect();
    let first = first.unwrap_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL, ""));
    let total = out.len();
    let body = serde_json::json!({
        "error": format!(
            "{failed} of {total} jobs could not be submitted (first error: {}); the others were accepted: resubmit \
             only the entries of `results` that carry an error, or all of them if they have idempotency keys",
            first.message
        ),
        "code": codes::PARTIAL_SUBMIT,
        "results": out,
    });
    tracing::warn!(failed, total, "batch partly submitted: {}", first.message);
    let mut resp = (first.status, Json(body)).into_response();
    if let Some(s) = first.retry_after_secs {
        resp.headers_mut().insert(header::RETRY_AFTER, s.into());
    }
    Ok(resp)
}

fn check_job_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 200 || id.chars().any(char::is_control) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_JOB_ID,
            "a job id is 1 to 200 printable characters (the job_id returned by POST /v1/jobs)",
        ));
    }
    Ok(())
}

/// A job's state as JSON: the same fields as `fairway status --json`.
pub fn status_json(row: &JobRow, hb: Option<&HeartbeatRow>, now: crate::model::Millis) -> serde_json::Value {
    serde_json::json!({
        "job_id": row.job_id, "tenant": row.tenant, "job_type": row.job_type, "pool": row.pool,
        "status": row.status, "attempts": row.attempts, "crash_count": row.crash_count,
        "generation": row.generation, "submitted_at": row.submitted_at, "started_at": row.started_at,
        "finished_at": row.finished_at, "worker": row.worker, "error": row.error,
        "failure_class": row.failure_class, "cancel_requested": row.cancel_requested.unwrap_or(false),
        "peak_memory_bytes": row.peak_memory_bytes, "cpu_ms": row.cpu_ms,
        "output": row.output.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
        "progress": hb.and_then(|h| h.progress),
        "progress_message": hb.and_then(|h| h.message.clone()),
        "heartbeat_age_ms": hb.and_then(|h| h.at).map(|t| (now - t).max(0)),
    })
}

/// Whether `caller` may see job `id` (row: its state row, if any). The owner is the
/// row's tenant, else the tenant that submitted it through the API; a job whose owner is
/// unknown is visible to admins only. Not visible answers exactly like an unknown id.
async fn may_see(st: &ApiState, caller: &Caller, id: &str, row: Option<&JobRow>) -> Result<bool, ApiError> {
    if caller.is_admin() {
        return Ok(true);
    }
    let owner = match row.and_then(|r| r.tenant.clone()) {
        Some(t) => Some(t),
        None => st.inner.keys.statements(&st.inner.store).await?.owner(id).await?,
    };
    Ok(caller.may_see(owner.as_deref()))
}

async fn job_status(
    State(st): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_job_id(&id)?;
    let store = st.store();
    let (row, hb) = tokio::try_join!(store.job(&id), store.heartbeat(&id))?;
    let Some(row) = row else { return events::status_from_history(&st, &caller, &id).await };
    if !may_see(&st, &caller, &id, Some(&row)).await? {
        return Err(ApiError::not_found(&id));
    }
    let mut out = status_json(&row, hb.as_ref(), now_ms());
    events::add_state(&st, &row, &mut out).await;
    Ok(Json(out))
}

async fn cancel_job(State(st): State<ApiState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let body = cancel(&st, &caller, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Requests cancellation of job `id` for `caller` (`DELETE /v1/jobs/{id}` and the
/// console's cancel button): 404 when the caller may not see it, 409 when it finished.
async fn cancel(st: &ApiState, caller: &Caller, id: &str) -> Result<serde_json::Value, ApiError> {
    let id = id.to_string();
    check_job_id(&id)?;
    let row = st.store().job(&id).await?;
    let known = match &row {
        Some(_) => may_see(st, caller, &id, row.as_ref()).await?,
        // No state yet: cancellable if it was submitted through the API (by this
        // caller's tenant, for a tenant key); an id nobody knows answers 404.
        None => {
            let owner = st.inner.keys.statements(&st.inner.store).await?.owner(&id).await?;
            owner.is_some() && caller.may_see(owner.as_deref())
        }
    };
    if !known {
        return Err(ApiError::not_found(&id).context(
            "nothing to cancel (a job submitted straight to Kafka and not started yet can be flagged with `fairway cancel`)",
        ));
    }
    if let Some(r) = row.as_ref().filter(|r| r.is_terminal()) {
        let status = r.status.clone().unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::JOB_ALREADY_FINISHED,
            format!("job {id} already finished ({status}); there is nothing to cancel"),
        ));
    }
    // A job without state yet is still queued: the flag makes the worker skip it.
    st.store().request_cancel(&id, now_ms()).await?;
    let body = serde_json::json!({
        "job_id": id,
        "cancel_requested": true,
        "status": row.and_then(|r| r.status),
        "message": "cancellation requested: a queued job is skipped, a running one is told through its heartbeat",
    });
    Ok(body)
}

async fn healthz() -> &'static str {
    "ok"
}
