//! One tenant's page (`GET /console/tenants/{name}`): charts of the last 24 hours (hourly)
//! and 30 days (daily) from the usage ledger (its share of the fleet's worker time against
//! its entitlement, jobs by outcome, run time and CPU, queue waits p50/p99), and its open
//! and recent alerts. Reads: `ledger::tenant_charts` (the tenant's rows of each day of
//! 30, within `api.limits.ledger_rows_per_request`; the fleet's days folded once a
//! minute for every page, `ledger::FleetDays`), the tenant's alerts (at most
//! `store::alerts::MAX_RECENT` rows, [`SHOWN_ALERTS`] shown, and its open rows, at most
//! `store::alerts::MAX_OPEN_OF_TENANT`); the registry is the
//! process's live copy. One heavy read of the caller's (`api::limits::Limits::heavy_slot`).

use super::charts::{figure, Chart, Kind, Series};
use super::gate;
use super::html::{self, esc};
use super::session::Viewer;
use crate::api::{codes, ApiError, ApiState};
use crate::core::ledger::{ChartPoint, RowBudget, TypeOutcomes};
use crate::core::tenants::TenantRecord;
use crate::ledger::{self, ChartsQuery};
use crate::model::Millis;
use crate::now_ms;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Alerts listed on the page at most (open ones first, then the newest resolved).
pub(super) const SHOWN_ALERTS: usize = 50;

const OK: &str = "#2e8540";
const BAD: &str = "#c0392b";
const GREY: &str = "#8e8e8e";
const AMBER: &str = "#d68910";
const BLUE: &str = "#3b7dd8";

/// A period's label: `14:00` (hours) or `11-28` (days).
fn label(start: Millis, daily: bool) -> String {
    let t = chrono::DateTime::from_timestamp_millis(start).unwrap_or_default();
    t.format(if daily { "%m-%d" } else { "%H:00" }).to_string()
}

/// The four charts of one span (`span`: `24h` or `30d`).
fn charts(points: &[ChartPoint], span: &str, daily: bool) -> String {
    let labels: Vec<String> = points.iter().map(|p| label(p.start, daily)).collect();
    let values = |f: &dyn Fn(&ChartPoint) -> f64| points.iter().map(f).collect::<Vec<f64>>();
    let chart = |id: &str, title: &str, unit: &str, kind: Kind, series: Vec<Series>| {
        figure(&Chart {
            id: format!("chart-{id}-{span}"),
            title: title.into(),
            unit: unit.into(),
            labels: labels.clone(),
            kind,
            series,
        })
    };
    let s = |name: &str, color: &'static str, values: Vec<f64>| Series { name: name.into(), color, values };
    [
        chart(
            "share",
            "Share of the fleet's worker time vs entitlement",
            "%",
            Kind::Lines,
            vec![
                s("share", BLUE, values(&|p| p.share() * 100.0)),
                s("entitled", GREY, values(&|p| p.entitled * 100.0)),
            ],
        ),
        chart(
            "outcomes",
            "Jobs by outcome",
            "jobs",
            Kind::Bars,
            vec![
                s("succeeded", OK, values(&|p| p.usage.succeeded as f64)),
                s("failed (dead-lettered)", BAD, values(&|p| p.usage.failed as f64)),
                s("cancelled", GREY, values(&|p| p.usage.cancelled as f64)),
                s("expired", AMBER, values(&|p| p.usage.expired as f64)),
            ],
        ),
        chart(
            "usage",
            "Usage: run time and CPU",
            "s",
            Kind::Lines,
            vec![
                s("run time", BLUE, values(&|p| p.usage.run_ms as f64 / 1000.0)),
                s("cpu (process jobs)", AMBER, values(&|p| p.usage.cpu_ms as f64 / 1000.0)),
            ],
        ),
        chart(
            "waits",
            "Queue wait (submitted to started)",
            "ms",
            Kind::Lines,
            vec![
                s("p50", OK, values(&|p| p.usage.waits.quantile(500) as f64)),
                s("p99", BAD, values(&|p| p.usage.waits.quantile(990) as f64)),
            ],
        ),
    ]
    .concat()
}

/// The tenant's alerts: open first, then the newest; at most [`SHOWN_ALERTS`].
fn alerts_table(mut rows: Vec<crate::store::AlertRow>) -> String {
    rows.sort_by_key(|a| (a.resolved_at.is_some(), std::cmp::Reverse(a.opened_at)));
    let mut body = String::new();
    for a in rows.iter().take(SHOWN_ALERTS) {
        let state = match a.resolved_at {
            None => "<span class=\"bad\">open</span>".to_string(),
            Some(t) => format!("resolved {}", html::time(t)),
        };
        let _ = write!(
            body,
            "<tr data-alert=\"{}\" data-state=\"{}\"><td>{}</td><td>{state}</td><td>{}</td><td>{} (threshold {})</td></tr>",
            esc(&a.alert_id),
            if a.resolved_at.is_none() { "open" } else { "resolved" },
            esc(&a.rule),
            html::time(a.opened_at),
            a.value,
            a.threshold
        );
    }
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"4\" class=\"hint\">no alerts kept</td></tr>");
    }
    html::table("alerts", &["Rule", "State", "Opened", "Value"], &body)
}

/// The kind and subject of the breaker, quarantine or cap an alert's rule is about
/// (None: the rule is about something else).
fn breaker_of(rule: &str) -> Option<(&'static str, String)> {
    use crate::core::refusals::{limit_code, parse, Holder};
    if let Some(dep) = crate::core::dependency::alert_dependency(rule) {
        return Some(("dependency breaker (fleet-wide)", dep.to_string()));
    }
    let (mark, limit, pool) = parse(limit_code(rule)?)?;
    Some(match Holder::of(mark, limit)? {
        Holder::SubmissionBreaker => ("submission breaker", pool.to_string()),
        Holder::JobTypeBreaker(t) => ("job type breaker", format!("{t} ({pool})")),
        Holder::Quarantine(t) => ("quarantine", format!("{t} ({pool})")),
        Holder::RecyclingCap => ("recycling cap", pool.to_string()),
    })
}

/// The breakers, quarantines and recycling caps that held the tenant's work, each in its
/// latest state (open since, or closed when), open ones first: from its open alerts
/// (so an open one shows however many alerts came after it) and its recent ones.
fn breakers_table(open: &[crate::store::AlertRow], recent: &[crate::store::AlertRow]) -> String {
    let mut latest: BTreeMap<&str, &crate::store::AlertRow> = BTreeMap::new();
    for a in open.iter().chain(recent).filter(|a| breaker_of(&a.rule).is_some()) {
        let e = latest.entry(a.rule.as_str()).or_insert(a);
        if (a.opened_at, a.resolved_at.is_some()) > (e.opened_at, e.resolved_at.is_some()) {
            *e = a;
        }
    }
    let mut shown: Vec<_> = latest.into_values().collect();
    shown.sort_by_key(|a| (a.resolved_at.is_some(), std::cmp::Reverse(a.opened_at)));
    let mut body = String::new();
    for a in &shown {
        let Some((kind, subject)) = breaker_of(&a.rule) else { continue };
        let state = match a.resolved_at {
            None => format!("<span class=\"bad\">open</span> since {}", html::time(a.opened_at)),
            Some(t) => format!("closed {} (opened {})", html::time(t), html::time(a.opened_at)),
        };
        let _ = write!(
            body,
            "<tr data-breaker=\"{}\" data-state=\"{}\"><td>{kind}</td><td>{}</td><td>{state}</td></tr>",
            esc(&a.rule),
            if a.resolved_at.is_none() { "open" } else { "closed" },
            esc(&subject),
        );
    }
    if shown.is_empty() {
        body.push_str("<tr><td colspan=\"3\" class=\"hint\">none held its work</td></tr>");
    }
    html::table("breakers", &["Kind", "What", "State"], &body)
}

/// Refusals and near-limit admissions per hour by code (rows: every process's apart).
fn refusals_chart(rows: &[(Millis, String, i64)], hours: &[Millis]) -> String {
    let per_code = crate::core::refusals::hourly(rows, hours);
    if per_code.is_empty() {
        return "<p class=\"hint\" id=\"refusals-none\">Nothing refused or near a limit.</p>".into();
    }
    const COLORS: [&str; 5] = [BAD, AMBER, BLUE, GREY, OK];
    let series = per_code
        .into_iter()
        .enumerate()
        .map(|(i, (code, values))| Series { name: code, color: COLORS[i % COLORS.len()], values })
        .collect();
    figure(&Chart {
        id: "chart-refusals-24h".into(),
        title: "Refused and near-limit submissions per hour".into(),
        unit: "jobs".into(),
        labels: hours.iter().map(|h| label(*h, false)).collect(),
        kind: Kind::Bars,
        series,
    })
}

/// Dead letters per job type over two spans (most first): finished, dead-lettered, rate.
fn dead_letters_table(day: &[TypeOutcomes], month: &[TypeOutcomes]) -> String {
    let mut body = String::new();
    for t in month {
        let last_day = day.iter().find(|d| d.pool == t.pool && d.job_type == t.job_type);
        let (r24, f24, rate24) = last_day.map_or((0, 0, 0.0), |d| (d.results, d.failed, d.dlq_rate()));
        let _ = write!(
            body,
            "<tr data-type=\"{}\"><td>{}</td><td>{}</td><td>{r24}</td><td>{f24}</td><td>{:.1} %</td><td>{}</td>\
             <td>{}</td><td>{:.1} %</td></tr>",
            esc(&t.job_type),
            esc(&t.job_type),
            t.pool.as_str(),
            rate24 * 100.0,
            t.results,
            t.failed,
            t.dlq_rate() * 100.0
        );
    }
    if month.is_empty() {
        body.push_str("<tr><td colspan=\"8\" class=\"hint\">nothing finished in 30 days</td></tr>");
    }
    let head = [
        "Job type",
        "Pool",
        "Finished 24 h",
        "Dead-lettered 24 h",
        "DLQ rate 24 h",
        "Finished 30 d",
        "Dead-lettered 30 d",
        "DLQ rate 30 d",
    ];
    html::table("dead-letters", &head, &body)
}

/// `GET /console/tenants/{name}`.
pub(super) async fn page(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    v: Result<Viewer, ApiError>,
) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !v.caller.may_see(Some(&name)) {
        // Another tenant's page answers like an unknown one.
        return html::error_page(&ApiError::new(StatusCode::NOT_FOUND, codes::UNKNOWN_TENANT, "no such tenant"));
    }
    match body(&st, &v, &name).await {
        Ok(body) => html::page(&v, "tenants", &format!("Tenant {name}"), &body),
        Err(e) => html::error_page(&e),
    }
}

async fn body(st: &ApiState, v: &Viewer, name: &str) -> Result<String, ApiError> {
    let _heavy = st.limits().heavy_slot(&v.key(), Some(&v.caller))?;
    // The registry as this process holds it (no store read).
    let live = st.live_tenants().map(|l| l.current());
    let empty = BTreeMap::new();
    let registry: &BTreeMap<String, TenantRecord> = live.as_ref().map_or(&empty, |l| &l.tenants);
    let stmts = crate::api::usage::statements(st).await?;
    let now = now_ms();
    let q = ChartsQuery { tenant: name, registry, default_tier: st.config().registry.default_tier, now };
    let mut budget = RowBudget::new(st.limits().ledger_rows());
    let data = ledger::tenant_charts(stmts, &q, &st.inner.fleet_days, &mut budget).await.map_err(|e| {
        crate::api::usage::read_error(
            e,
            StatusCode::SERVICE_UNAVAILABLE,
            "the page's 30 days hold more: read them in parts with GET /v1/usage, or ask the operator to raise the bound",
        )
    })?;
    let alert_stmts = st.inner.alerts.get_or_try_init(|| st.store().alert_statements()).await?;
    let alerts = alert_stmts.recent(name).await?;
    let refusal_stmts = st.inner.refusals.get_or_try_init(|| st.store().refusal_statements()).await?;
    let hours = crate::core::refusals::hours_until(now, 24);
    let refused = refusal_stmts.tenant(name, &hours).await?;
    let tier = registry.get(name).map_or_else(|| "unregistered".to_string(), |t| t.tier.as_str().to_string());
    let breakers = breakers_table(&alert_stmts.open_of(name).await?, &alerts);
    Ok(format!(
        "<p class=\"hint\">Tier <b id=\"tenant-tier\">{}</b>. From the usage ledger (15-minute windows, written every \
         few seconds): share is the tenant's run time over every tenant's; the entitlement is its weight over the \
         weights of the tenants that used the fleet that day. <a href=\"/console/jobs?tenant={}\">its jobs</a></p>\
         <h2>Alerts</h2>{}\
         <h2>Breakers, quarantines and caps</h2><p class=\"hint\">Each in its latest state, from the alerts \
         kept: a breaker open holds the tenant's jobs of that type (or its submissions) until it closes.</p>{}\
         <h2>What held its work (last 24 hours)</h2><p class=\"hint\">Per hour: submissions the front door \
         refused, by limit and pool (<code>refused:&lt;limit&gt;:&lt;pool&gt;</code>), admissions that found the \
         tenant at 80 % or more of a limit (<code>near:...</code>), and jobs workers held for its breakers, \
         quarantines or the recycling cap (<code>held:...</code>). Dependency breakers: the table \
         above.</p>{}\
         <h2>Dead letters per job type</h2><p class=\"hint\">Dead-lettered: jobs that failed for good (their \
         dead letters are on the <a href=\"/console/dlq\">DLQ page</a>, to replay).</p>{}\
         <h2>Last 24 hours (hourly)</h2><div class=\"charts\" id=\"charts-24h\">{}</div>\
         <h2>Last 30 days (daily)</h2><div class=\"charts\" id=\"charts-30d\">{}</div>",
        esc(&tier),
        html::url(name),
        alerts_table(alerts),
        breakers,
        refusals_chart(&refused, &hours),
        dead_letters_table(&data.types_24h, &data.types_30d),
        charts(&data.hours, "24h", false),
        charts(&data.days, "30d", true),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ledger::Usage;

    #[test]
    fn a_span_draws_four_charts_from_its_points() {
        let mut u = Usage { succeeded: 3, failed: 1, run_ms: 4_000, ..Usage::default() };
        u.waits.add(100);
        let pts: Vec<ChartPoint> = (0..24)
            .map(|h| ChartPoint { start: h * 3_600_000, usage: u, fleet_run_ms: 16_000, entitled: 0.5 })
            .collect();
        let html = charts(&pts, "24h", false);
        for id in ["share", "outcomes", "usage", "waits"] {
            assert!(html.contains(&format!("id=\"chart-{id}-24h\"")), "{id}");
        }
        assert_eq!(html.matches("<rect class=\"bar\"").count(), 48, "succeeded and failed each hour");
        assert!(html.contains("<title>00:00 · share: 25 %</title>"), "share of the fleet");
        assert!(html.contains("<title>23:00 · entitled: 50 %</title>"));
        assert!(html.contains("<title>05:00 · p99: 128 ms</title>"), "wait p99 (bucket bound)");
    }

    #[test]
    fn dead_letters_show_each_job_types_rate_over_both_spans() {
        let t = |job_type: &str, results, failed| TypeOutcomes {
            pool: crate::model::Pool::Short,
            job_type: job_type.into(),
            results,
            failed,
        };
        let html = dead_letters_table(&[t("resize", 10, 5)], &[t("resize", 40, 10), t("<b>x", 3, 0)]);
        assert!(
            html.contains(
                "<tr data-type=\"resize\"><td>resize</td><td>short</td><td>10</td><td>5</td><td>50.0 %</td>\
                               <td>40</td><td>10</td><td>25.0 %</td></tr>"
            ),
            "{html}"
        );
        assert!(html.contains("<td>0</td><td>0</td><td>0.0 %</td><td>3</td>"), "no run in 24 h: zeros: {html}");
        assert!(html.contains("&lt;b&gt;x") && !html.contains("<b>x"), "a job type's name is escaped");
        assert!(dead_letters_table(&[], &[]).contains("nothing finished in 30 days"));
    }

    #[test]
    fn refusals_chart_one_series_per_code_over_the_hours() {
        let hours = crate::core::refusals::hours_until(5 * 3_600_000 + 1, 2);
        let rows = vec![
            (4 * 3_600_000, "refused:tenant_rate:short".to_string(), 3),
            (5 * 3_600_000, "refused:tenant_rate:short".to_string(), 2),
            (5 * 3_600_000, "near:max_queued:short".to_string(), 1),
        ];
        let html = refusals_chart(&rows, &hours);
        assert!(html.contains("chart-refusals-24h"), "{html}");
        assert!(html.contains("refused:tenant_rate:short") && html.contains("near:max_queued:short"), "{html}");
        assert!(refusals_chart(&[], &hours).contains("refusals-none"));
    }

    #[test]
    fn alerts_list_open_ones_first() {
        let a = |id: &str, opened_at, resolved_at| crate::store::AlertRow {
            tenant: "t".into(),
            alert_id: id.into(),
            rule: "queue_wait".into(),
            opened_at,
            resolved_at,
            value: 2.0,
            threshold: 1.0,
        };
        let t = alerts_table(vec![a("old", 1, Some(5)), a("open", 2, None), a("new", 3, Some(9))]);
        let order: Vec<&str> = t.match_indices("data-alert=\"").map(|(i, _)| &t[i + 12..i + 15]).collect();
        assert_eq!(order, ["ope", "new", "old"]);
        assert!(alerts_table(vec![]).contains("no alerts kept"));
    }

    /// An alert row of tenant "t" for the breakers table's tests.
    fn alert(rule: &str, opened_at: Millis, resolved_at: Option<Millis>) -> crate::store::AlertRow {
        crate::store::AlertRow {
            tenant: "t".into(),
            alert_id: format!("{rule}@{opened_at}"),
            rule: rule.into(),
            opened_at,
            resolved_at,
            value: 1.0,
            threshold: 1.0,
        }
    }

    /// One row per breaker in its latest state (a breaker that opened again shows open),
    /// open first; other rules are not breakers.
    #[test]
    fn breakers_show_each_in_its_latest_state() {
        let a = alert;
        let rows = vec![
            a("queue_wait", 1, None),
            a("limit:held:breaker/charge:short", 1, Some(2)),
            a("dependency_circuit:payments", 3, Some(4)),
            a("limit:held:breaker/charge:short", 5, None),
            a("limit:held:quarantine/parse:long", 6, Some(7)),
            a("limit:refused:tenant_rate:short", 6, None),
        ];
        let t = breakers_table(&[], &rows);
        let states: Vec<&str> =
            t.match_indices("data-state=\"").map(|(i, _)| &t[i + 12..]).map(|r| &r[..r.find('"').unwrap()]).collect();
        assert_eq!(states, ["open", "closed", "closed"], "{t}");
        let first = t.find("data-breaker=\"limit:held:breaker/charge:short\" data-state=\"open\"");
        assert!(first.is_some_and(|i| i < t.find("quarantine").unwrap()), "{t}");
        assert!(t.contains("dependency breaker (fleet-wide)</td><td>payments"), "{t}");
        assert!(!t.contains("queue_wait") && !t.contains("tenant_rate"), "{t}");
        assert!(breakers_table(&[], &[]).contains("none held its work"));
        assert!(t.contains("job type breaker</td><td>charge (short)"), "{t}");
    }

    /// An open breaker shows open from its open row when the recent alerts no longer hold
    /// it, and a resolution in either source wins over the same opening left open.
    #[test]
    fn an_open_breaker_past_the_recent_alerts_still_shows_open() {
        let a = alert;
        let recent: Vec<_> = (10..210).map(|i| a("queue_wait", i, Some(i + 1))).collect();
        let open = [a("limit:refused:circuit_open:short", 1, None)];
        let t = breakers_table(&open, &recent);
        assert!(t.contains("data-breaker=\"limit:refused:circuit_open:short\" data-state=\"open\""), "{t}");
        assert!(t.contains("submission breaker</td><td>short"), "{t}");
        let closed = [a("limit:held:recycling_cap:long", 3, Some(4))];
        let t = breakers_table(&[a("limit:held:recycling_cap:long", 3, None)], &closed);
        assert!(t.contains("data-state=\"closed\"") && !t.contains("data-state=\"open\""), "{t}");
        assert!(t.contains("recycling cap</td><td>long"), "{t}");
    }
}
