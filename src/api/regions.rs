//! Regions at the API (rules in `core::regions`, docs/regions.md): a tenant homed in
//! another region is answered 421 `MISDIRECTED_REGION` naming its home and that region's
//! endpoint (body fields and the `Fairway-Home-Region` / `Fairway-Home-Endpoint`
//! headers); while this region is draining or down (`fairway region ...`, polled from
//! the store every [`POLL`]) its tenants' submissions (and, when down, reads) answer 503
//! `REGION_UNAVAILABLE` with `Retry-After`.

use super::{codes, ApiError, ApiState, Caller};
use crate::core::regions::{self, Ask, RegionState, Route};
use crate::store::{RegionStateRow, Store, StoreError};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use tokio::sync::watch;

/// How often an API process reads its region's state.
pub const POLL: Duration = Duration::from_secs(1);

/// This process's view of its region's state (only with `[region] name` set).
pub(super) struct Regions {
    state: watch::Receiver<RegionStateRow>,
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
        Ok(Regions { state: rx })
    }

    pub(super) fn current(&self) -> RegionStateRow {
        self.state.borrow().clone()
    }
}

impl ApiState {
    /// None when this region serves `tenant`'s request, else the answer to send instead
    /// (421 to its home region, 503 while this region is draining or down).
    pub(super) fn region_gate(&self, tenant: &str, submission: bool, headers: &HeaderMap) -> Option<Response> {
        let regions = self.inner.regions.as_ref()?;
        let cfg = &self.inner.cfg.region;
        let row = regions.current();
        let record = self.inner.tenants.as_ref().and_then(|live| live.current().tenants.get(tenant).cloned());
        let homes = record.as_ref().map(|t| t.homes()).unwrap_or_default();
        let failover_from = headers.get(regions::FAILOVER_HEADER).and_then(|v| v.to_str().ok());
        match regions::route(cfg, row.state, homes, Ask { submission, failover_from }) {
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
    if let Some(elsewhere) = tenant.and_then(|t| st.region_gate(&t, false, req.headers())) {
        return elsewhere;
    }
    next.run(req).await
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
