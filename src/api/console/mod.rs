//! The operator console at `/console`: server-rendered pages with a little JavaScript
//! (`assets/`, embedded in the binary), live parts over Server-Sent Events. Pure parts
//! (rates, what a tenant may see, job search) are in `core::console`.
//!
//! | route | what |
//! |---|---|
//! | `GET /console` | overview: per pool throughput, running/slots, backlog (spilled), oldest wait, failure rate, open breakers; live |
//! | `GET /console` (admin) | also: the top tenants by worker time over the last 24 h (from the usage ledger) |
//! | `GET /console/tenants` | share vs entitlement, running, backlog, why the next job waits, tier, limits; admin: tier, suspend |
//! | `GET /console/tenants/{name}` | one tenant's charts from the usage ledger (24 h hourly, 30 d daily: share vs entitlement, jobs by outcome, run time and CPU, waits p50/p99) and its alerts |
//! | `GET /console/jobs` | job search (`id`, `tenant`, `job_type`, `state`, `since`) and detail (timeline, attempts, progress, checkpoint, output; cancel) |
//! | `GET /console/schedules` | recurring schedules: timing, next fire times, paused; admin: pause / resume |
//! | `GET /console/dlq` | DLQ and retry topics: filters, reason, payload; replay selected/filtered with a dry-run preview, a rate, a confirmation; live progress |
//! | `GET/POST /console/login`, `POST /console/logout` | the session cookie (see [`session`]) |
//! | `/console/api/...` | the JSON and SSE endpoints the pages use |
//!
//! Access: an admin key sees and does everything; a tenant key sees its own tenant only
//! and cannot act. Every action goes through the code the HTTP API and the CLI use
//! (`api::admin::update`, `api::cancel`, `replay::run`, `Schedules::pause`) and is logged (who, what;
//! never a key).

mod charts;
mod dlq;
mod html;
mod jobs;
mod overview;
mod schedules;
mod session;
mod tenant;
mod tenants;

use super::{ApiError, ApiState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use session::{Sessions, Viewer};

/// A form field's value, trimmed; None when missing or blank.
fn some(s: &Option<String>) -> Option<String> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

/// The console's state inside the API's state: sessions and the live sampler (replays
/// are the API's: `api::replays`).
#[derive(Default)]
pub struct Console {
    sessions: Sessions,
    live: overview::Live,
}

/// The console's routes (merged into the API's router).
pub fn router() -> Router<ApiState> {
    Router::new()
        .route("/console", get(overview::page))
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/tenants", get(tenants::page))
        .route("/console/tenants/{name}", get(tenant::page))
        .route("/console/jobs", get(jobs::page))
        .route("/console/dlq", get(dlq::page))
        .route("/console/schedules", get(schedules::page))
        .route("/console/assets/console.js", get(|| asset("text/javascript", include_str!("assets/console.js"))))
        .route("/console/assets/console.css", get(|| asset("text/css", include_str!("assets/console.css"))))
        .route("/console/api/overview", get(overview::stream))
        .route("/console/api/tenants/{name}", post(tenants::change))
        .route("/console/api/jobs/{id}/cancel", post(jobs::cancel))
        .route("/console/api/schedules/{tenant}/{name}", post(schedules::change))
        .route("/console/api/replays", post(dlq::start))
        .route("/console/api/replays/{run}", get(dlq::progress))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}

/// A page's viewer, or the answer instead of the page: the login form for a request
/// without a key or session, an error page otherwise.
#[allow(clippy::result_large_err)] // the Err is the page answered instead, built once per request
fn gate(v: Result<Viewer, ApiError>) -> Result<Viewer, Response> {
    match v {
        Ok(v) => Ok(v),
        Err(e) if e.status == StatusCode::UNAUTHORIZED => Err(Redirect::to("/console/login").into_response()),
        Err(e) => Err(html::error_page(&e)),
    }
}

async fn login_page() -> Response {
    html::login(None, StatusCode::OK)
}

#[derive(serde::Deserialize)]
struct LoginForm {
    key: String,
}

async fn login(
    axum::extract::State(st): axum::extract::State<ApiState>,
    extensions: axum::http::Extensions,
    axum::Form(f): axum::Form<LoginForm>,
) -> Response {
    match st.console().sessions.login(&st, &f.key, &extensions).await {
        Ok((caller, token)) => {
            tracing::info!(caller = %caller, "console: login");
            let mut r = Redirect::to("/console").into_response();
            if let Ok(v) = session::set_cookie(&token).parse() {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), "console: login refused");
            html::login(Some(&e.message), e.status)
        }
    }
}

async fn logout(
    axum::extract::State(st): axum::extract::State<ApiState>,
    session::Actor(v): session::Actor,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(t) = session::cookie_token(&headers) {
        st.console().sessions.logout(&t);
    }
    tracing::info!(caller = %v.caller, "console: logout");
    let mut r = axum::Json(serde_json::json!({"ok": true})).into_response();
    if let Ok(v) = session::clear_cookie().parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
