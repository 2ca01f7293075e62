//! The tenants page: each tenant's share of each pool against its entitlement (in
//! slot-seconds), running jobs, backlog, why its next job waits, tier and limits, from
//! the live registry and the fleet sample. Admins change a tier or suspend / resume a
//! tenant through `api::admin::update` (the admin API's code path).

use super::gate;
use super::html::{self, esc};
use super::session::{require_admin, Actor, Viewer};
use crate::api::{admin, codes, ApiError, ApiState};
use crate::config::Tier;
use crate::core::console::tenant_rows;
use crate::core::fleet::TenantSummary;
use crate::core::tenants::TenantRecord;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use std::collections::BTreeMap;
use std::fmt::Write as _;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".to_string(), |v| v.to_string())
}

fn limits(t: &TenantRecord) -> String {
    format!(
        "weight {} · max running {} · rate {}/s · reserved {} · max queued {}",
        opt(t.weight),
        opt(t.max_concurrency),
        opt(t.rate_per_sec),
        t.reserved_slots,
        opt(t.max_queued)
    )
}

/// Per pool: actual vs entitled share, slot-seconds, running, backlog, why it waits.
fn pools(rows: &[&TenantSummary]) -> String {
    let mut s = String::new();
    for t in rows {
        let why =
            t.wait_reason.as_deref().unwrap_or(if t.backlog.total > 0 { "next in line" } else { "nothing waits" });
        let _ = write!(
            s,
            "<div class=\"pool-line\" data-pool=\"{pool}\"><b>{pool}</b> share {:.0}% of entitled {:.0}% · \
             {:.1} slot-s · running {} · backlog {} ({} spilled) · oldest {} · <span class=\"wait\">{}</span></div>",
            t.actual_share * 100.0,
            t.entitled_share * 100.0,
            t.slot_seconds_used,
            t.running,
            t.backlog.total,
            t.backlog.spilled,
            t.oldest_wait_ms.map_or("–".to_string(), html::age),
            esc(why),
            pool = esc(&t.pool),
        );
    }
    if s.is_empty() {
        s.push_str("<span class=\"hint\">idle</span>");
    }
    s
}

fn actions(t: &TenantRecord) -> String {
    let mut s = format!("<select class=\"tier\" data-tenant=\"{}\">", esc(&t.name));
    for tier in Tier::ALL {
        let sel = if tier == t.tier { " selected" } else { "" };
        let _ = write!(s, "<option{sel}>{}</option>", tier.as_str());
    }
    let (label, to) = if t.suspended { ("Resume", "false") } else { ("Suspend", "true") };
    let _ = write!(
        s,
        "</select> <button class=\"set-tier\" data-tenant=\"{n}\">Set tier</button> \
         <button class=\"suspend\" data-tenant=\"{n}\" data-suspended=\"{to}\">{label}</button>",
        n = esc(&t.name)
    );
    s
}

/// `GET /console/tenants`.
pub(super) async fn page(State(st): State<ApiState>, v: Result<Viewer, ApiError>) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let sample = st.console().live.samples(&st).await.borrow().clone();
    // Read from the store, not the polled copy: a change made here shows on the next load.
    let registry: BTreeMap<String, TenantRecord> = match st.live_tenants().map(|l| l.statements().list()) {
        Some(read) => match read.await {
            Ok(all) => all.into_iter().filter(|(n, _)| v.caller.may_see(Some(n))).collect(),
            Err(e) => return html::error_page(&ApiError::from(e)),
        },
        None => BTreeMap::new(),
    };
    let active = tenant_rows(&sample.fleet, v.tenant());
    let mut names: Vec<&str> = registry.keys().map(String::as_str).chain(active.keys().copied()).collect();
    names.sort_unstable();
    names.dedup();
    let mut rows = String::new();
    for name in names {
        let rec = registry.get(name);
        let tier = rec.map_or("unregistered".to_string(), |t| t.tier.as_str().to_string());
        let status = match rec {
            Some(t) if t.suspended => "<span class=\"bad\">suspended</span>",
            Some(_) => "active",
            None => "–",
        };
        let mut cells = vec![
            format!(
                "<a class=\"tenant-page\" href=\"/console/tenants/{}\">{}</a> · <a href=\"/console/jobs?tenant={}\">jobs</a>",
                html::url(name),
                esc(name),
                html::url(name)
            ),
            esc(&tier),
            status.to_string(),
            rec.map(limits).unwrap_or_default(),
            pools(active.get(name).map(Vec::as_slice).unwrap_or_default()),
        ];
        if v.caller.is_admin() {
            cells.push(rec.map(actions).unwrap_or_default());
        }
        let _ = write!(rows, "<tr data-tenant=\"{}\">{}</tr>", esc(name), cells_html(&cells));
    }
    let mut head =
        vec!["Tenant", "Tier", "Status", "Limits", "Per pool: share vs entitlement, running, backlog, why it waits"];
    if v.caller.is_admin() {
        head.push("Change");
    }
    let note = sample.error.as_deref().map(|e| format!("<p class=\"error\">{}</p>", esc(e))).unwrap_or_default();
    let body = format!(
        "{note}<p class=\"hint\">Shares are of each pool's slot-time (slot-seconds) over the recent window; \
         the entitlement follows the tier's weight. Reload for fresh figures.</p><p id=\"action-result\"></p>{}",
        html::table("tenants", &head, &rows)
    );
    html::page(&v, "tenants", "Tenants", &body)
}

fn cells_html(cells: &[String]) -> String {
    cells.iter().map(|c| format!("<td>{c}</td>")).collect()
}

/// What an admin changes: a tier, or suspended.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Change {
    tier: Option<Tier>,
    suspended: Option<bool>,
}

/// `POST /console/api/tenants/{name}` `{tier?, suspended?}` (admin).
pub(super) async fn change(
    State(st): State<ApiState>,
    Actor(v): Actor,
    Path(name): Path<String>,
    Json(c): Json<Change>,
) -> Result<Json<TenantRecord>, ApiError> {
    require_admin(&v, "changing a tenant")?;
    if c.tier.is_none() && c.suspended.is_none() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "nothing to change: send {\"tier\": \"pro\"} or {\"suspended\": true}",
        ));
    }
    let t = admin::update(&st, &name, |t| {
        if let Some(tier) = c.tier {
            t.tier = tier;
        }
        if let Some(s) = c.suspended {
            t.suspended = s;
        }
    })
    .await?;
    tracing::info!(caller = %v.caller, tenant = %name, tier = ?c.tier, suspended = ?c.suspended, "console: tenant changed");
    Ok(Json(t))
}
