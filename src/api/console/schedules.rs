//! The schedules page: the viewer's recurring schedules (an admin's: every tenant's) with
//! their timing, next fire times and state. Admins pause and resume a schedule through
//! `Schedules::pause` (what `POST /v1/schedules/{name}:pause` and `fairway schedules
//! pause` run); tenant keys read only, as everywhere in the console.

use super::gate;
use super::html::{self, esc};
use super::session::{require_admin, Actor, Viewer};
use crate::api::{ApiError, ApiState};
use crate::now_ms;
use crate::ops::schedules::Listed;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::Json;

/// Schedules shown on one page (the first by tenant and name).
const MAX_ROWS: usize = 1_000;

fn when(s: &Listed) -> String {
    match (&s.spec.cron, &s.spec.every) {
        (Some(cron), _) => format!("cron <code>{}</code> {}", esc(cron), esc(s.spec.tz.as_deref().unwrap_or("UTC"))),
        (None, Some(every)) => format!("every {}", esc(every)),
        (None, None) => "–".to_string(),
    }
}

fn next_fires(s: &Listed) -> String {
    if s.paused {
        return "<span class=\"hint\">paused</span>".to_string();
    }
    let times: Vec<String> = s.next_fires.iter().map(|t| html::time(*t)).collect();
    if times.is_empty() {
        "<span class=\"hint\">never again</span>".to_string()
    } else {
        times.join("<br>")
    }
}

fn action(s: &Listed) -> String {
    let (label, to) = if s.paused { ("Resume", "false") } else { ("Pause", "true") };
    format!(
        "<button class=\"pause-schedule\" data-tenant=\"{}\" data-name=\"{}\" data-paused=\"{to}\">{label}</button>",
        esc(&s.spec.tenant),
        esc(&s.spec.name)
    )
}

fn row(s: &Listed, admin: bool) -> String {
    let state = if s.paused { "<span class=\"bad\">paused</span>" } else { "active" };
    let mut cells = vec![
        esc(&s.spec.tenant),
        esc(&s.spec.name),
        esc(&s.spec.job_type),
        when(s),
        next_fires(s),
        state.to_string(),
        s.spec.catch_up.as_str().to_string(),
    ];
    if admin {
        cells.push(action(s));
    }
    let td: String = cells.iter().map(|c| format!("<td>{c}</td>")).collect();
    format!(
        "<tr data-tenant=\"{}\" data-schedule=\"{}\" data-paused=\"{}\">{td}</tr>",
        esc(&s.spec.tenant),
        esc(&s.spec.name),
        s.paused
    )
}

/// `GET /console/schedules`.
pub(super) async fn page(State(st): State<ApiState>, v: Result<Viewer, ApiError>) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let listed = match crate::api::schedules::schedules(&st).await {
        Ok(s) => s.list(v.tenant()).await.map_err(ApiError::from),
        Err(e) => Err(e),
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            return html::page(&v, "schedules", "Schedules", &format!("<p class=\"error\">{}</p>", esc(&e.message)))
        }
    };
    let admin = v.caller.is_admin();
    let rows: String = listed.iter().take(MAX_ROWS).map(|s| row(s, admin)).collect();
    let mut head = vec!["Tenant", "Name", "Job type", "When", "Next fires (UTC)", "State", "Catch-up"];
    if admin {
        head.push("Change");
    }
    let shown = if listed.len() > MAX_ROWS { format!("the first {MAX_ROWS} of ") } else { String::new() };
    let body = format!(
        "<p class=\"hint\">{shown}{} schedule(s). Manage them with <code>fairway schedules</code> or \
         <code>/v1/schedules</code>; a resumed schedule goes on from now.</p><p id=\"action-result\"></p>{}",
        listed.len(),
        html::table("schedules", &head, &rows)
    );
    html::page(&v, "schedules", "Schedules", &body)
}

/// What an admin changes: paused or not.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Change {
    paused: bool,
}

/// `POST /console/api/schedules/{tenant}/{name}` `{paused}` (admin).
pub(super) async fn change(
    State(st): State<ApiState>,
    Actor(v): Actor,
    Path((tenant, name)): Path<(String, String)>,
    Json(c): Json<Change>,
) -> Result<Json<Listed>, ApiError> {
    require_admin(&v, "pausing or resuming a schedule")?;
    let s = crate::api::schedules::schedules(&st).await?;
    let listed = s.pause(&tenant, &name, c.paused, now_ms()).await?;
    tracing::info!(caller = %v.caller, %tenant, schedule = %name, paused = c.paused, "console: schedule changed");
    Ok(Json(listed))
}
