//! The DLQ and retry topics browser: filters (tenant, type, class, error text, time), each
//! record's reason and payload, and replay of the selected or filtered jobs through
//! `replay::run` (what `fairway replay` runs): a dry-run preview first, a rate, an
//! explicit confirmation, then the replay's progress live over SSE.

use super::gate;
use super::html::{self, esc};
use super::session::{Actor, Viewer};
use crate::api::replays;
use crate::api::{codes, ApiError, ApiState};
use crate::core::replay::{ReplayFilter, ReplaySource};
use crate::model::FailureClass;
use crate::now_ms;
use crate::ops::replay::{self, Listed};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::Response;
use axum::Json;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

/// Records listed by one browse (the newest that match).
const MAX_LISTED: usize = 200;
/// Records one browse reads at most, each partition's newest share of them (a page load
/// is one bounded scan, one per key at a time: `api::limits`).
const MAX_SCANNED: u64 = 50_000;
/// Payload characters shown per record.
const PAYLOAD_CHARS: usize = 4_000;

/// The filter fields (page query and replay request alike).
#[derive(serde::Deserialize, Default, Clone)]
pub(super) struct Filters {
    source: Option<String>,
    tenant: Option<String>,
    job_type: Option<String>,
    class: Option<String>,
    error: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

use super::some;

fn bad(msg: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, msg)
}

impl Filters {
    /// The source and filter; a tenant key's filter is always its own tenant.
    fn parse(&self, v: &Viewer) -> Result<(ReplaySource, ReplayFilter), ApiError> {
        let source = some(&self.source).unwrap_or_else(|| "dlq".into()).parse::<ReplaySource>().map_err(bad)?;
        let class = some(&self.class).map(|c| c.parse::<FailureClass>().map_err(bad)).transpose()?;
        let now = now_ms();
        let filter = ReplayFilter {
            tenant: v.tenant().map(str::to_string).or_else(|| some(&self.tenant)),
            job_type: some(&self.job_type),
            class,
            since: some(&self.since).map(|s| html::parse_since("since", &s, now)).transpose()?,
            until: some(&self.until).map(|s| html::parse_since("until", &s, now)).transpose()?,
            error_contains: some(&self.error),
            job_ids: None,
        };
        Ok((source, filter))
    }
}

fn form(v: &Viewer, f: &Filters) -> String {
    let sources: Vec<String> = ReplaySource::all().iter().map(|s| s.to_string()).collect();
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let classes: Vec<&str> = FailureClass::ALL.iter().map(|c| c.as_str()).collect();
    let tenant = match v.tenant() {
        Some(_) => String::new(),
        None => html::input("tenant", "Tenant", f.tenant.as_deref(), ""),
    };
    let source = html::select("source", "Topic", f.source.as_deref(), &sources).replace(">any<", ">dlq<");
    format!(
        "<form class=\"filters\" id=\"dlq-filters\" method=\"get\" action=\"/console/dlq\">{source}{tenant}{}{}{}{}{}\
         <button id=\"browse\">Browse</button></form>",
        html::input("job_type", "Type", f.job_type.as_deref(), ""),
        html::select("class", "Class", f.class.as_deref(), &classes),
        html::input("error", "Error text", f.error.as_deref(), "substring"),
        html::input("since", "Since", f.since.as_deref(), "2h or 2026-11-23T14:00:00Z"),
        html::input("until", "Until", f.until.as_deref(), ""),
    )
}

/// One listed record. Its partition and offset only for an admin: the topic is shared, so
/// the gap between two of a tenant's offsets would count other tenants' records.
fn listed_row(l: &Listed, admin: bool) -> String {
    let c = &l.candidate;
    let Some(job) = &c.job else { return String::new() };
    let payload = String::from_utf8_lossy(&job.payload);
    let payload: String = payload.chars().take(PAYLOAD_CHARS).collect();
    let pick = format!("<input type=\"checkbox\" class=\"pick\" value=\"{}\">", esc(&job.job_id));
    let at =
        if admin { format!("<p><b>at</b> partition {} offset {}</p>", l.partition, l.offset) } else { String::new() };
    let mut cells = vec![
        pick,
        format!("<a class=\"job\" href=\"/console/jobs?id={}\">{}</a>", html::url(&job.job_id), esc(&job.job_id)),
        esc(&job.tenant),
        esc(&job.job_type),
        c.class.map(|c| c.as_str()).unwrap_or("").to_string(),
        c.attempts.to_string(),
        c.replay_count.to_string(),
        html::time(c.at),
    ];
    cells.push(format!(
        "<details><summary>{}</summary><p><b>reason</b> {}</p><p><b>last error</b> {}</p>\
         {at}<pre class=\"payload\">{}</pre></details>",
        esc(&crate::core::replay::truncate(c.last_error.as_deref().or(c.reason.as_deref()).unwrap_or(""), 80)),
        esc(c.reason.as_deref().unwrap_or("–")),
        esc(c.last_error.as_deref().unwrap_or("–")),
        esc(&payload)
    ));
    let mut tr = html::row(&cells);
    tr.insert_str(3, &format!(" data-job=\"{}\"", esc(&job.job_id)));
    tr
}

/// `GET /console/dlq`.
pub(super) async fn page(
    State(st): State<ApiState>,
    v: Result<Viewer, ApiError>,
    Query(f): Query<Filters>,
) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body = match browse(&st, &v, &f).await {
        Ok(b) => b,
        Err(e) => format!("{}<p class=\"error\">{}</p>", form(&v, &f), esc(&e.message)),
    };
    html::page(&v, "dlq", "DLQ & retry topics", &body)
}

async fn browse(st: &ApiState, v: &Viewer, f: &Filters) -> Result<String, ApiError> {
    let (source, filter) = f.parse(v)?;
    let _scan = st.limits().scan_slot(&v.key(), &v.caller)?;
    let replay::Browsed { listed, scanned, unread } =
        replay::browse(st.config(), source, &filter, MAX_LISTED, MAX_SCANNED)
            .await
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, codes::KAFKA_UNAVAILABLE, e.to_string()))?;
    // An admin replays any tenant's jobs, a tenant its own (`api::replays` bounds both).
    let admin = v.caller.is_admin();
    let rows: String = listed.iter().rev().map(|l| listed_row(l, admin)).collect();
    let head = ["", "Job", "Tenant", "Type", "Class", "Attempts", "Replays", "Failed at", "Error, reason, payload"];
    let mut out = form(v, f);
    // The topic is shared: a tenant is told nothing of the records that are not its own.
    let of = if admin { format!(" of {scanned}") } else { " of yours".to_string() };
    let _ = write!(
        out,
        "<p class=\"hint\" id=\"dlq-count\">{} matching record(s){of} on {} (newest {MAX_LISTED} shown, newest first).{}</p>",
        listed.len(),
        esc(&replay::source_topic(st.config(), source)),
        match (scanned >= MAX_SCANNED, admin) {
            (false, _) => String::new(),
            (true, true) => format!(" Only the newest {MAX_SCANNED} records were read (each partition's newest share): older ones need `fairway replay --dry-run`."),
            (true, false) => " Older records of yours may not be listed: a replay's dry run counts them all.".to_string(),
        },
    );
    if !unread.is_empty() {
        let _ = write!(
            out,
            "<p class=\"error\" id=\"dlq-partial\">Partial listing: the broker did not deliver {} up to its end in time. \
             Reload the page; if this persists, check the broker.</p>",
            esc(&unread.join(", "))
        );
    }
    {
        out.push_str(
            "<div class=\"replay\" id=\"replay-panel\"><label>Rate (jobs/s) <input id=\"rate\" type=\"number\" min=\"1\" \
             value=\"10\"></label> <button id=\"preview\">Preview replay (dry run)</button> \
             <span class=\"hint\">of the selected jobs, or of every job the filter matches if none is selected</span>\
             <div id=\"preview-result\"></div><div id=\"confirm\" hidden><button id=\"confirm-replay\" class=\"danger\">\
             Replay</button> <button id=\"cancel-replay\">Cancel</button></div><div id=\"replay-progress\"></div></div>",
        );
    }
    out.push_str(&html::table("dlq", &head, &rows));
    Ok(out)
}

/// A replay request: the filters, optional job ids, the rate, dry run or not.
#[derive(serde::Deserialize)]
pub(super) struct ReplayRequest {
    #[serde(flatten)]
    filters: Filters,
    #[serde(default)]
    job_ids: Vec<String>,
    rate: Option<u32>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /console/api/replays` (an admin, or a tenant for its own jobs within its
/// bounds: `api::replays`): a dry run answers its report; a real run starts and answers
/// `{run}`, whose progress streams from `/console/api/replays/{run}`.
pub(super) async fn start(
    State(st): State<ApiState>,
    Actor(v): Actor,
    Json(req): Json<ReplayRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (source, mut filter) = req.filters.parse(&v)?;
    if !req.job_ids.is_empty() {
        filter.job_ids = Some(req.job_ids.iter().cloned().collect());
    }
    let ask = replays::Ask { source, filter, rate: req.rate, dry_run: req.dry_run };
    Ok(Json(st.replays().start(&st, &v.caller, &v.key(), ask).await?))
}

/// `GET /console/api/replays/{run}` (its starter, or an admin): SSE `progress` events
/// until the run ends or the key is revoked; one of the caller's live streams.
pub(super) async fn progress(
    State(st): State<ApiState>,
    v: Viewer,
    Path(run): Path<String>,
) -> Result<Response, ApiError> {
    let rx = st.replays().follow(&v.caller, &run)?;
    let slot = st.limits().stream_slot(&v.key(), Some(&v.caller))?;
    let stream = futures::stream::unfold((rx, true, false, slot), |(mut rx, first, ended, slot)| async move {
        if ended {
            return None;
        }
        if !first {
            // The next change (or the run's end), at most every 200 ms.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = rx.changed().await;
        }
        let v = rx.borrow_and_update().clone();
        let done = v["done"] == true;
        Some((Ok::<_, Infallible>(Event::default().event("progress").data(v.to_string())), (rx, false, done, slot)))
    });
    Ok(crate::api::limits::live_stream(crate::api::drain::ending(&st, stream), &st, v.auth))
}
