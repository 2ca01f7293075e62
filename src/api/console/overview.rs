//! The overview page and its live feed. One sampler per server (started by the first
//! console request) reads the fleet's scheduler snapshots every second (what `fairway
//! stats` reads) and tails the job events feed (finished attempts for throughput and
//! failure rate; the recent events the job search looks through). Each open page gets
//! its caller's view of the latest sample over SSE (`/console/api/overview`).

use super::charts::{figure, Chart, Kind, Series};
use super::gate;
use super::html::{self, esc};
use super::session::Viewer;
use crate::api::{ApiError, ApiState};
use crate::core::console::{self as cc, JobHit, JobQuery, Outcomes};
use crate::core::fleet::FleetStats;
use crate::core::recent_events::RecentEvents;
use crate::model::{JobEvent, Pool};
use crate::now_ms;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// How often the fleet's snapshots are read while a page watches.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Snapshots older than this are stale (the workers' row TTL).
const MAX_AGE_MS: i64 = crate::worker::usage::STATS_TTL_SECS as i64 * 1000;
/// Job events kept for the job search, all tenants (`core::recent_events`).
const RECENT_EVENTS: usize = 20_000;

/// The latest fleet sample, or why there is none.
#[derive(Debug, Clone, Default)]
pub(super) struct Sample {
    pub fleet: FleetStats,
    pub error: Option<String>,
}

struct Recent {
    outcomes: Outcomes,
    events: RecentEvents,
}

impl Default for Recent {
    fn default() -> Self {
        Recent { outcomes: Outcomes::default(), events: RecentEvents::new(RECENT_EVENTS) }
    }
}

/// The sampler's outputs (started once, stops with the server's state).
#[derive(Default)]
pub(super) struct Live {
    sample: tokio::sync::OnceCell<Arc<watch::Sender<Arc<Sample>>>>,
    recent: Arc<Mutex<Recent>>,
}

impl Live {
    /// The latest samples (starting the sampler and the events tail on first use).
    pub(super) async fn samples(&self, st: &ApiState) -> watch::Receiver<Arc<Sample>> {
        let tx = self
            .sample
            .get_or_init(|| async {
                let tx = Arc::new(watch::channel(Arc::new(Sample::default())).0);
                tokio::spawn(sample((st.config().clone(), st.store().clone()), Arc::downgrade(&tx)));
                if let Some(rx) = st.feed().map(|f| f.subscribe()) {
                    tokio::spawn(tail(rx, st.config().clone(), Arc::downgrade(&self.recent)));
                }
                tx
            })
            .await;
        tx.subscribe()
    }

    /// The jobs among the recently seen events that match `q` (newest first).
    pub(super) fn search(&self, q: &JobQuery, max: usize) -> Vec<JobHit> {
        let r = self.recent.lock().expect("console recent");
        cc::search(r.events.iter(), q, max)
    }

    fn view(&self, s: &Sample, tenant: Option<&str>) -> serde_json::Value {
        let now = now_ms();
        let pools = {
            let mut r = self.recent.lock().expect("console recent");
            r.outcomes.evict(now);
            cc::overview(&s.fleet, &r.outcomes, tenant, now)
        };
        serde_json::json!({ "at": now, "pools": pools, "workers": s.fleet.snapshots, "error": s.error })
    }
}

/// Reads the fleet every [`SAMPLE_EVERY`] while someone watches; ends with the state.
async fn sample(parts: (Arc<crate::config::Config>, crate::store::Store), tx: Weak<watch::Sender<Arc<Sample>>>) {
    let (cfg, store) = parts;
    let mut stmts = None;
    loop {
        let Some(tx) = tx.upgrade() else { return };
        if tx.receiver_count() > 0 {
            if stmts.is_none() {
                stmts = store.fleet_statements().await.ok();
            }
            let s = match &stmts {
                Some(f) => match f.fleet(&cfg, &Pool::ALL, MAX_AGE_MS).await {
                    Ok(fleet) => Sample { fleet, error: None },
                    Err(e) => {
                        Sample { error: Some(format!("cannot read the workers' stats: {e}")), ..Default::default() }
                    }
                },
                None => Sample { error: Some("the store is unavailable".into()), ..Default::default() },
            };
            tx.send_replace(Arc::new(s));
        }
        drop(tx);
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Tails the job events feed into the outcome window and the recent events.
async fn tail(mut rx: broadcast::Receiver<Arc<JobEvent>>, cfg: Arc<crate::config::Config>, to: Weak<Mutex<Recent>>) {
    loop {
        let e = match rx.recv().await {
            Ok(e) => e,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::debug!(skipped = n, "console: events tail lagged");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let Some(recent) = to.upgrade() else { return };
        let mut r = recent.lock().expect("console recent");
        if let Some(jt) = cfg.job_types.get(&e.job_type) {
            r.outcomes.record(&e, jt.pool.as_str(), now_ms());
        }
        r.events.push(e);
    }
}

/// `GET /console`.
pub(super) async fn page(State(st): State<ApiState>, v: Result<Viewer, ApiError>) -> Response {
    let v = match gate(v) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut rx = st.console().live.samples(&st).await;
    // The first sample, if it comes quickly; the live feed fills in the rest.
    let _ = tokio::time::timeout(Duration::from_secs(2), rx.changed()).await;
    let sample = rx.borrow().clone();
    let view = st.console().live.view(&sample, v.tenant());
    let scope = match v.tenant() {
        Some(t) => format!("Tenant {}'s jobs in each pool", esc(t)),
        None => "Every pool of the fleet".into(),
    };
    let top = if v.tenant().is_none() {
        match st.limits().heavy_slot(&v.key(), Some(&v.caller)) {
            Ok(_heavy) => top_tenants(&st).await,
            Err(e) => format!("<p class=\"error\">top tenants: {}</p>", esc(&e.message)),
        }
    } else {
        String::new()
    };
    let body = format!(
        "<p class=\"hint\">{scope}, live (every second). Throughput: attempts finished per second over 10 s; \
         failure rate: failed attempts of those finished in the last minute.</p>\
         <p id=\"live-status\" class=\"hint\">connecting…</p>\
         <div id=\"pools\" data-initial=\"{}\"></div>{top}",
        esc(&view.to_string())
    );
    html::page(&v, "overview", "Overview", &body)
}

/// `GET /console/api/overview`: the caller's view of each new sample, as SSE `sample` events.
pub(super) async fn stream(State(st): State<ApiState>, v: Viewer) -> Response {
    let slot = match st.limits().stream_slot(&v.key(), Some(&v.caller)) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let rx = st.console().live.samples(&st).await;
    let tenant = v.tenant().map(str::to_string);
    let drain_state = st.clone();
    let state = (rx, st.clone(), tenant, slot);
    let stream = futures::stream::unfold(state, |(mut rx, st, tenant, slot)| async move {
        rx.changed().await.ok()?;
        let s = rx.borrow_and_update().clone();
        let data = st.console().live.view(&s, tenant.as_deref()).to_string();
        Some((Ok::<_, Infallible>(Event::default().event("sample").data(data)), (rx, st, tenant, slot)))
    });
    crate::api::limits::live_stream(crate::api::drain::ending(&drain_state, stream), &st, v.auth)
}

/// Tenants on the overview's top-tenants chart.
pub(super) const TOP_TENANTS: usize = 10;

/// The top tenants by worker time over the last 24 hours, as a bar chart (admin's
/// overview; reads `ledger::top_tenants`).
async fn top_tenants(st: &ApiState) -> String {
    let read = async {
        let stmts = crate::api::usage::statements(st).await?;
        Ok::<_, ApiError>(crate::ledger::top_tenants(stmts, now_ms(), TOP_TENANTS).await?)
    };
    let (top, cut) = match read.await {
        Ok(t) => t,
        Err(e) => return format!("<p class=\"error\">top tenants: {}</p>", esc(&e.message)),
    };
    let note = if cut {
        format!(" (of the first {} tenants of each day's index)", crate::ledger::TOP_SCAN_TENANTS)
    } else {
        String::new()
    };
    let chart = Chart {
        id: "chart-top-tenants".into(),
        title: format!("Top tenants by worker time, last 24 h{note}"),
        unit: "s".into(),
        labels: top.iter().map(|(t, _)| t.clone()).collect(),
        kind: Kind::Bars,
        series: vec![Series {
            name: "run time".into(),
            color: "#3b7dd8",
            values: top.iter().map(|(_, ms)| *ms as f64 / 1000.0).collect(),
        }],
    };
    let links: String =
        top.iter().map(|(t, _)| format!("<a href=\"/console/tenants/{}\">{}</a> ", html::url(t), esc(t))).collect();
    format!("<h2>Top tenants</h2><div class=\"charts\">{}</div><p class=\"hint\">{links}</p>", figure(&chart))
}
