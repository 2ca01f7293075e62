//! Job search and detail. `?id=` shows one job (what `GET /v1/jobs/{id}` answers, with
//! its event timeline, attempts and errors, progress, checkpoint size and output, and a
//! cancel button that goes through `api::cancel`). Without an id, the search looks
//! through the job events this server saw recently (tenant, job type, latest state,
//! time); a tenant key finds only its tenant's jobs.

use super::gate;
use super::html::{self, esc};
use super::session::{require_admin, Actor, Viewer};
use crate::api::{cancel as api_cancel, job_status, ApiError, ApiState};
use crate::core::console::JobQuery;
use crate::model::EventKind;
use crate::now_ms;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Json;
use std::fmt::Write as _;

/// Jobs listed by one search.
const MAX_HITS: usize = 200;

#[derive(serde::Deserialize, Default)]
pub(super) struct JobsQuery {
    id: Option<String>,
    tenant: Option<String>,
    job_type: Option<String>,
    state: Option<String>,
    since: Option<String>,
}

use super::some;

/// `GET /console/jobs`.
pub(super) async fn page(
    State(st): State<ApiState>,
    v: Result<Viewer, ApiError>,
    Query(q): Query<JobsQuery>,
) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body = match some(&q.id) {
        Some(id) => detail(&st, &v, &id).await,
        None => search(&st, &v, &q).await,
    };
    match body {
        Ok(body) => html::page(&v, "jobs", "Jobs", &body),
        Err(e) => {
            html::page(&v, "jobs", "Jobs", &format!("{}<p class=\"error\">{}</p>", form(&v, &q), esc(&e.message)))
        }
    }
}

fn form(v: &Viewer, q: &JobsQuery) -> String {
    // Kinds of a job's life (a pool reclassification is about a job type, a dependency's
    // breaker about a dependency, not a job).
    let states: Vec<&str> = EventKind::ALL.iter().filter(|k| !k.is_about_no_job()).map(|k| k.as_str()).collect();
    let tenant = match v.tenant() {
        Some(t) => format!("<input type=\"hidden\" name=\"tenant\" value=\"{}\">", esc(t)),
        None => html::input("tenant", "Tenant", q.tenant.as_deref(), ""),
    };
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/jobs\">{}{tenant}{}{}{}<button id=\"search\">Search</button></form>",
        html::input("id", "Job id", q.id.as_deref(), "exact id"),
        html::input("job_type", "Type", q.job_type.as_deref(), ""),
        html::select("state", "State", q.state.as_deref(), &states),
        html::input("since", "Active since", q.since.as_deref(), "30m or 2026-11-23T14:00:00Z"),
    )
}

async fn search(st: &ApiState, v: &Viewer, q: &JobsQuery) -> Result<String, ApiError> {
    let since = some(&q.since).map(|s| html::parse_since("since", &s, now_ms())).transpose()?;
    let query = JobQuery {
        // A tenant key searches its own tenant, whatever the form says.
        tenant: v.tenant().map(str::to_string).or_else(|| some(&q.tenant)),
        job_type: some(&q.job_type),
        state: some(&q.state),
        since,
    };
    st.console().live.samples(st).await;
    let hits = st.console().live.search(&query, MAX_HITS);
    let mut rows = String::new();
    for h in &hits {
        rows.push_str(&html::row(&[
            format!("<a class=\"job\" href=\"/console/jobs?id={}\">{}</a>", html::url(&h.job_id), esc(&h.job_id)),
            esc(&h.tenant),
            esc(&h.job_type),
            format!("<span class=\"state {0}\">{0}</span>", h.state),
            h.attempt.to_string(),
            html::time(h.last_at),
            esc(h.message.as_deref().unwrap_or("")),
        ]));
    }
    Ok(format!(
        "{}<p class=\"hint\">{} job(s) among the job events this server has seen since the console started \
         (the newest {MAX_HITS}); any job by exact id.</p>{}",
        form(v, q),
        hits.len(),
        html::table("jobs", &["Job", "Tenant", "Type", "State", "Attempts", "Last event", "Message"], &rows)
    ))
}

/// The submission's facts in a job's status JSON (`api::status_json`), if it has them all.
fn submitted_state<'a>(id: &'a str, status: &'a serde_json::Value) -> Option<crate::core::events::SubmittedState<'a>> {
    Some(crate::core::events::SubmittedState {
        job_id: id,
        tenant: status["tenant"].as_str()?,
        job_type: status["job_type"].as_str()?,
        generation: status["generation"].as_i64()?,
        submitted_at: status["submitted_at"].as_i64()?,
        status: status["status"].as_str()?,
    })
}

async fn detail(st: &ApiState, v: &Viewer, id: &str) -> Result<String, ApiError> {
    let Json(status) = job_status(State(st.clone()), v.caller.clone(), Path(id.to_string())).await?;
    let history = st.event_statements().await?.events(id, None).await.unwrap_or_default();
    let history = crate::core::events::with_submission(history, submitted_state(id, &status));
    let generation = status["generation"].as_i64().unwrap_or(0);
    let checkpoint = st.store().checkpoint(id, generation).await.ok().flatten().map(|c| c.len());
    let field = |k: &str| match &status[k] {
        serde_json::Value::Null => "–".to_string(),
        serde_json::Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    };
    let mut facts = String::new();
    for (label, key) in [
        ("State", "state"),
        ("Status", "status"),
        ("Tenant", "tenant"),
        ("Type", "job_type"),
        ("Pool", "pool"),
        ("Attempts", "attempts"),
        ("Worker", "worker"),
        ("Progress", "progress"),
        ("Progress message", "progress_message"),
        ("Failure class", "failure_class"),
        ("Last error", "error"),
        ("Waits because", "wait_reason"),
        ("Cancel requested", "cancel_requested"),
    ] {
        let _ = write!(facts, "<dt>{label}</dt><dd id=\"job-{key}\">{}</dd>", field(key));
    }
    let _ = write!(facts, "<dt>Checkpoint</dt><dd id=\"job-checkpoint\">{}</dd>", opt_bytes(checkpoint));
    let mut timeline = String::new();
    for e in &history {
        timeline.push_str(&html::row(&[
            html::time(e.at),
            format!("<span class=\"state {0}\">{0}</span>", e.kind.as_str()),
            e.attempt.to_string(),
            e.progress.map(|p| format!("{:.0}%", p * 100.0)).unwrap_or_default(),
            esc(e.worker.as_deref().unwrap_or("")),
            esc(e.message.as_deref().unwrap_or("")),
        ]));
    }
    let cancel = if v.caller.is_admin() && !is_final(&status) {
        format!("<button id=\"cancel\" data-job=\"{}\">Cancel job</button>", esc(id))
    } else {
        String::new()
    };
    Ok(format!(
        "{}<h2 id=\"job-id\">{}</h2>{cancel}<p id=\"action-result\"></p><dl class=\"facts\">{facts}</dl>\
         <h3>Output</h3><pre id=\"job-output\">{}</pre><h3>Timeline (attempts, errors, progress)</h3>{}",
        form(v, &JobsQuery::default()),
        esc(id),
        field("output"),
        html::table("timeline", &["Time", "Event", "Attempt", "Progress", "Worker", "Message"], &timeline)
    ))
}

fn is_final(status: &serde_json::Value) -> bool {
    matches!(status["state"].as_str(), Some("succeeded" | "failed" | "cancelled" | "expired"))
}

fn opt_bytes(n: Option<usize>) -> String {
    n.map_or_else(|| "none".to_string(), |n| format!("{n} bytes"))
}

/// `POST /console/api/jobs/{id}/cancel` (admin): as `DELETE /v1/jobs/{id}`.
pub(super) async fn cancel(
    State(st): State<ApiState>,
    Actor(v): Actor,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&v, "cancelling a job")?;
    let body = api_cancel(&st, &v.caller, &id).await?;
    tracing::info!(caller = %v.caller, job_id = %id, "console: cancel requested");
    Ok(Json(body))
}
