//! The usage ledger over HTTP (`crate::ledger`; docs/usage.md).
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/usage?from=&to=&granularity=hour\|day[&tenant=]` | a tenant's usage per period (a tenant key: its own; an admin key names the tenant); at most 93 days, `from`/`to` within 1970 to 9999 (epoch ms, RFC 3339 or a date) |
//! | GET | `/v1/alerts[?state=open\|all][&tenant=]` | a tenant's alerts, newest first (a tenant key: its own; an admin key names the tenant); at most 200 |
//! | GET | `/v1/admin/usage?month=YYYY-MM[&format=ndjson\|csv][&granularity=day\|hour]` | every tenant's usage of a month, streamed day by day (admin only): what a billing system ingests |

use super::auth::{acting_tenant, Admin, Caller};
use super::error::{codes, ApiError};
use super::ApiState;
use crate::core::ledger::RowBudget;
use crate::core::ledger::{self as rules, Granularity, ReportLine};
use crate::ledger::{self, ReportQuery};
use crate::store::{LedgerReadError, LedgerStatements};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReportParams {
    tenant: Option<String>,
    from: String,
    to: String,
    granularity: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExportParams {
    month: String,
    format: Option<String>,
    granularity: Option<String>,
}

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, message)
}

fn granularity(g: Option<&str>, default: Granularity) -> Result<Granularity, ApiError> {
    g.map(Granularity::parse).transpose().map_err(invalid).map(|g| g.unwrap_or(default))
}

/// A budgeted ledger read's error: over the budget, `status` with `READ_TOO_LARGE` and
/// what to narrow (`narrow`); else the store's.
pub(crate) fn read_error(e: LedgerReadError, status: StatusCode, narrow: &str) -> ApiError {
    match e {
        LedgerReadError::Store(e) => e.into(),
        LedgerReadError::OverBudget(o) => ApiError::new(
            status,
            codes::READ_TOO_LARGE,
            format!(
                "this request would read more than {} usage-ledger rows, the most one request may read \
                 (api.limits.ledger_rows_per_request); {narrow}",
                o.limit
            ),
        ),
    }
}

pub(super) async fn statements(st: &ApiState) -> Result<&LedgerStatements, ApiError> {
    Ok(st.inner.ledger.get_or_try_init(|| st.store().ledger_statements()).await?)
}

/// `GET /v1/usage`: one tenant's usage per hour or day of `[from, to)`.
pub(super) async fn report(
    State(st): State<ApiState>,
    caller: Caller,
    Query(p): Query<ReportParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = acting_tenant(&caller, p.tenant)?;
    let from = rules::parse_instant(&p.from).map_err(|e| invalid(format!("from: {e}")))?;
    let to = rules::parse_instant(&p.to).map_err(|e| invalid(format!("to: {e}")))?;
    let period = rules::report_period(from, to).map_err(|e| invalid(e.to_string()))?;
    let g = granularity(p.granularity.as_deref(), Granularity::Hour)?;
    let q = ReportQuery { tenant: tenant.clone(), period, granularity: g };
    let mut budget = RowBudget::new(st.limits().ledger_rows());
    let lines = ledger::report(statements(&st).await?, &q, &mut budget).await.map_err(|e| {
        read_error(
            e,
            StatusCode::UNPROCESSABLE_ENTITY,
            "narrow from/to to fewer days (and sum the parts), or ask the operator to raise the bound",
        )
    })?;
    Ok(Json(serde_json::json!({
        "tenant": tenant,
        "from": from,
        "to": to,
        "granularity": if g == Granularity::Hour { "hour" } else { "day" },
        "lines": lines,
        "total": rules::total(&lines),
    })))
}

/// `GET /v1/admin/usage`: every tenant's usage of one month, streamed a day at a time.
pub(super) async fn export(
    State(st): State<ApiState>,
    admin: Admin,
    key: Option<axum::Extension<super::limits::KeyId>>,
    Query(p): Query<ExportParams>,
) -> Result<Response, ApiError> {
    let _ = admin;
    // Held while the body streams: one heavy read for the whole export.
    let key = key.map(|k| k.0).unwrap_or_else(|| super::limits::KeyId("anonymous".into()));
    let slot = st.limits().heavy_slot(&key, None)?;
    let period = rules::month(&p.month).map_err(invalid)?;
    let g = granularity(p.granularity.as_deref(), Granularity::Day)?;
    let csv = match p.format.as_deref() {
        None | Some("ndjson") => false,
        Some("csv") => true,
        Some(other) => return Err(invalid(format!("format={other:?}: use ndjson or csv"))),
    };
    let stmts = statements(&st).await?.clone();
    let rows_per_tenant = st.limits().ledger_rows();
    let header_line = if csv { Some(Ok::<_, std::io::Error>(rules::CSV_HEADER.to_string())) } else { None };
    // One chunk of tenants' lines at a time; the heavy-read slot goes with the body.
    let chunks = futures::stream::iter(rules::days(&period))
        .flat_map(move |day| ledger::export_day(stmts.clone(), day, g, rows_per_tenant))
        .map(move |chunk| {
            let _held = &slot;
            let lines = chunk.map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>(lines.iter().map(|l| line(l, csv)).collect::<String>())
        });
    let body = futures::stream::iter(header_line).chain(chunks);
    let kind = if csv { "text/csv" } else { "application/x-ndjson" };
    Ok(([(header::CONTENT_TYPE, kind)], Body::from_stream(body)).into_response())
}

fn line(l: &ReportLine, csv: bool) -> String {
    if csv {
        rules::csv_line(l)
    } else {
        let mut s = serde_json::to_string(l).unwrap_or_default();
        s.push('\n');
        s
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AlertParams {
    tenant: Option<String>,
    state: Option<String>,
}

/// `GET /v1/alerts`: a tenant's alerts, open only (the default) or all kept.
pub(super) async fn alerts(
    State(st): State<ApiState>,
    caller: Caller,
    Query(p): Query<AlertParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = acting_tenant(&caller, p.tenant)?;
    let open_only = match p.state.as_deref() {
        None | Some("open") => true,
        Some("all") => false,
        Some(other) => return Err(invalid(format!("state={other:?}: use open or all"))),
    };
    let stmts = st.inner.alerts.get_or_try_init(|| st.store().alert_statements()).await?;
    let mut rows = stmts.recent(&tenant).await?;
    rows.retain(|a| !open_only || a.resolved_at.is_none());
    Ok(Json(serde_json::json!({ "tenant": tenant, "alerts": rows })))
}
