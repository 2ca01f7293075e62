//! Regions at the API (rules in `core::regions`, docs/regions.md): a tenant homed in
//! another region is answered 421 `MISDIRECTED_REGION` naming its home and that region's
//! endpoint (body fields and the `Fairway-Home-Region` / `Fairway-Home-Endpoint`
//! headers); while this region is draining or down (`fairway region ...`, polled from
//! the store every [`POLL`]) its tenants' submissions (and, when down, reads) answer 503
//! `REGION_UNAVAILABLE` with `Retry-After`.
//!
//! A request with `Fairway-Failover-From: <home>` is served here (the tenant's secondary)
//! only when this region sees the home unable to serve it: it asks the home's API
//! (`GET /region` on its `[region.endpoints]` URL, at most once per [`PEER_FRESH`] per
//! region, [`PEER_TIMEOUT`] each) and believes the header only when the home answers
//! down (or draining, for submissions) or cannot be reached. Otherwise 421 to the home.

use super::{codes, ApiError, ApiState, Caller};
use crate::core::regions::{self, Ask, RegionState, Route, Seen};
use crate::store::{RegionStateRow, Store, StoreError};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use tokio::sync::watch;

/// How often an API process reads its region's state.
pub const POLL: Duration = Duration::from_secs(1);
/// How long what this region saw of another region's API is believed.
pub const PEER_FRESH: Duration = Duration::from_secs(1);
/// How long a look at another region's API may take (no answer: unreachable).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// What this process saw of the other regions' APIs, looked at on demand (a request
/// claiming a failover) and kept [`PEER_FRESH`]: one look per region at a time.
pub(super) struct Peers {
    http: reqwest::Client,
    seen: tokio::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, Seen)>>,
}

impl Peers {
    fn new() -> Peers {
        let http = reqwest::Client::builder()
            .timeout(PEER_TIMEOUT)
            .connect_timeout(PEER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Peers { http, seen: Default::default() }
    }

    /// Region `region`'s API at `endpoint` as last seen (looked at again when stale).
    async fn seen(&self, region: &str, endpoint: &str) -> Seen {
        let mut seen = self.seen.lock().await;
        if let Some((at, s)) = seen.get(region) {
            if at.elapsed() < PEER_FRESH {
                return *s;
            }
        }
        let s = self.look(region, endpoint).await;
        seen.insert(region.to_string(), (std::time::Instant::now(), s));
        s
    }

    async fn look(&self, region: &str, endpoint: &str) -> Seen {
        let url = format!("{}/region", endpoint.trim_end_matches('/'));
        let r = match self.http.get(&url).send().await {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(region, "region {region}'s API cannot be reached ({e}): failovers from it are served");
                return Seen::Unreachable;
            }
        };
        if r.status().is_server_error() {
            return Seen::Unreachable;
        }
        let Ok(body) = r.json::<serde_json::Value>().await else { return Seen::Unknown };
        if body["region"].as_str() != Some(region) {
            return Seen::Unknown;
        }
        body["state"].as_str().and_then(|s| RegionState::parse(s).ok()).map_or(Seen::Unknown, Seen::State)
    }
}

/// This process's view of its region's state (only with `[region] name` set).
pub(super) struct Regions {
    state: watch::Receiver<RegionStateRow>,
    peers: Peers,
}

impl Regions {
    /// Reads the state once, then every [`POLL`] until `stop`; a failed read keeps the
    /// last state (logged once per failure streak).
    pub(super) async fn start(store: Store, mut stop: watch::Receiver<bool>) -> Result<Regions, StoreError> {
        let (tx, rx) = watch::channel(store.region_state().await?);
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
                match store.region_state().await {
                    Ok(row) => {
                        failing = false;
                        tx.send_if_modified(|cur| std::mem::replace(cur, row.clone()) != row);
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!("cannot read this region's state (keeping the last one read): {e}");
                    }
                    Err(_) => {}
                }
            }
        });
        Ok(Regions { state: rx, peers: Peers::new() })
    }

    pub(super) fn current(&self) -> RegionStateRow {
        self.state.borrow().clone()
    }
}

impl ApiState {
    /// None when this region serves `tenant`'s request, else the answer to send instead
    /// (421 to its home region, 503 while this region is draining or down).
    pub(super) async fn region_gate(&self, tenant: &str, submission: bool, headers: &HeaderMap) -> Option<Response> {
        let regions = self.inner.regions.as_ref()?;
        let cfg = &self.inner.cfg.region;
        let row = regions.current();
        let record = self.inner.tenants.as_ref().and_then(|live| live.current().tenants.get(tenant).cloned());
        let homes = record.as_ref().map(|t| t.homes()).unwrap_or_default();
        let failover_from = headers.get(regions::FAILOVER_HEADER).and_then(|v| v.to_str().ok());
        // Only a claimed failover to this region, the tenant's secondary, is checked.
        let claimed = failover_from.is_some()
            && failover_from == homes.home
            && homes.secondary.is_some()
            && homes.secondary == cfg.name.as_deref();
        let home_seen = match (claimed, homes.home.and_then(|h| Some((h, cfg.endpoints.get(h)?)))) {
            (true, Some((home, endpoint))) => regions.peers.seen(home, endpoint).await,
            _ => Seen::Unknown,
        };
        match regions::route(cfg, row.state, homes, Ask { submission, failover_from, home_seen }) {
            Route::Serve => None,
            Route::Elsewhere { region, endpoint } => Some(misdirected(tenant, &region, endpoint.as_deref())),
            Route::Unavailable { state } => {
                let this = cfg.name.as_deref().unwrap_or_default();
                let why = row.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                let what = if state == RegionState::Down { "requests" } else { "submissions" };
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!(
                        "region {this} is {}{why} and takes no {what} now: retry after Retry-After seconds, or \
                         send to the tenant's secondary region with the header `Fairway-Failover-From: {this}`",
                        state.as_str()
                    ),
                );
                e.retry_after_secs = Some(row.retry_after_secs.unwrap_or(cfg.retry_after_secs));
                Some(e.into_response())
            }
        }
    }

    /// `/readyz`'s word on the region: Err while it is draining or down.
    pub(super) fn region_ready(&self) -> Result<(), String> {
        let Some(regions) = &self.inner.regions else { return Ok(()) };
        let row = regions.current();
        if row.state == RegionState::Up {
            return Ok(());
        }
        let this = self.inner.cfg.region.name.as_deref().unwrap_or_default();
        let why = row.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        Err(format!(
            "region {this} is {}{why}: its API answers submissions with 503; `fairway region up` ends it",
            row.state.as_str()
        ))
    }
}

/// The region gate of a tenant key's reads of its jobs (`GET|DELETE /v1/jobs/{id}`,
/// `/v1/jobs/{id}/events`); an admin key's are served here.
pub(super) async fn reads(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let tenant = req.extensions().get::<Caller>().and_then(|c| c.tenant()).map(str::to_string);
    if let Some(t) = tenant {
        if let Some(elsewhere) = st.region_gate(&t, false, req.headers()).await {
            return elsewhere;
        }
    }
    next.run(req).await
}

/// `GET /region` (no key): this region's name and state as its API answers them, what
/// the other regions look at before they believe a failover from it.
pub(super) async fn state(State(st): State<ApiState>) -> axum::Json<serde_json::Value> {
    let name = st.inner.cfg.region.name.clone();
    let state = st.inner.regions.as_ref().map_or(RegionState::Up, |r| r.current().state);
    axum::Json(serde_json::json!({ "region": name, "state": state.as_str() }))
}

/// 421 naming the tenant's home region and its endpoint.
fn misdirected(tenant: &str, region: &str, endpoint: Option<&str>) -> Response {
    let message = match endpoint {
        Some(url) => format!("tenant {tenant}'s home region is {region}: send its requests to {url}"),
        None => format!(
            "tenant {tenant}'s home region is {region}, which this deployment lists no endpoint for: send its \
             requests to region {region}'s API (an operator adds it to [region.endpoints])"
        ),
    };
    let mut body = ApiError::new(StatusCode::MISDIRECTED_REQUEST, codes::MISDIRECTED_REGION, message).body();
    body["home_region"] = region.into();
    body["endpoint"] = endpoint.into();
    let mut resp = (StatusCode::MISDIRECTED_REQUEST, axum::Json(body)).into_response();
    let headers = resp.headers_mut();
    for (name, value) in [(regions::HOME_REGION_HEADER, Some(region)), (regions::HOME_ENDPOINT_HEADER, endpoint)] {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name, v);
        }
    }
    resp
}
