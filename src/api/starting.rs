//! `fairway serve`'s metrics listener from the moment the process starts: while the
//! API's state is still being built (the store waited for up to `scylla.connect_wait`,
//! the tenants registry read, the producer made), `/livez` answers 200, `/readyz` 503
//! with what the start waits for, and `/metrics` what is recorded so far; once the state
//! exists, the probes answer from it ([`ApiState::readiness_check`], busy while every
//! connection is taken). So an orchestrator's liveness probe does not kill a `serve`
//! that is waiting for its database, and its readiness probe keeps traffic away.

use super::{codes, ApiError, ApiState};
use crate::observe::probes::{probe_router, BusyCheck, Probes, ReadyCheck};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::{Arc, Mutex};

/// What `/readyz` says before the start's first report.
const CONNECTING: &str = "starting: connecting to Kafka and the CQL database";

/// Where `serve`'s start is: still connecting (with the last thing it said), or up.
pub struct Starting {
    phase: Mutex<Phase>,
}

enum Phase {
    Connecting(String),
    Up(ApiState),
}

impl Default for Starting {
    fn default() -> Self {
        Starting { phase: Mutex::new(Phase::Connecting(CONNECTING.into())) }
    }
}

impl Starting {
    /// The start's latest report (e.g. a try to reach the database), for `/readyz`.
    pub fn waiting(&self, line: String) {
        let mut phase = self.phase.lock().expect("start phase lock");
        if let Phase::Connecting(last) = &mut *phase {
            *last = line;
        }
    }

    /// The API's state exists: the probes answer from it from now on.
    pub fn up(&self, state: ApiState) {
        *self.phase.lock().expect("start phase lock") = Phase::Up(state);
    }

    fn state(&self) -> Result<ApiState, String> {
        match &*self.phase.lock().expect("start phase lock") {
            Phase::Up(st) => Ok(st.clone()),
            Phase::Connecting(last) => Err(last.clone()),
        }
    }

    /// `/metrics` (from `metrics`, the recorder installed before the start), `/readyz`,
    /// `/livez` and `/healthz`, without API keys.
    pub fn router(self: Arc<Self>, metrics: Option<PrometheusHandle>) -> Router {
        let ready = self.clone();
        let check: ReadyCheck = Arc::new(move || {
            let state = ready.state();
            Box::pin(async move { (state?.readiness_check())().await })
        });
        let busy: BusyCheck = Arc::new(move || self.state().ok().and_then(|st| st.inner.connections.saturated()));
        let probes = Probes::checked(check, Some(busy));
        Router::new().route("/metrics", get(metrics_text)).with_state(metrics).merge(probe_router(probes))
    }
}

async fn metrics_text(State(metrics): State<Option<PrometheusHandle>>) -> Result<Response, ApiError> {
    let Some(h) = &metrics else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::METRICS_DISABLED,
            "this server has no Prometheus recorder; start it with one (fairway serve installs it unless --no-metrics)",
        ));
    };
    h.run_upkeep();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;

    async fn get(router: &Router, path: &str) -> (u16, String) {
        let req = Request::get(path).body(Body::empty()).unwrap();
        let resp = tower::ServiceExt::oneshot(router.clone(), req).await.unwrap();
        let status = resp.status().as_u16();
        (status, String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    }

    /// Before the state exists: live, not ready with the start's latest report, and
    /// `/metrics` answers (404 with its code when no recorder was installed).
    #[tokio::test]
    async fn a_starting_server_is_live_and_not_ready_with_what_it_waits_for() {
        let starting = Arc::new(Starting::default());
        let router = starting.clone().router(None);
        assert_eq!(get(&router, "/readyz").await, (503, format!("not ready: {CONNECTING}\n")));
        starting.waiting("waiting for the CQL database (try 2, 0 s so far)".into());
        assert_eq!(
            get(&router, "/readyz").await,
            (503, "not ready: waiting for the CQL database (try 2, 0 s so far)\n".into())
        );
        assert_eq!(get(&router, "/livez").await, (200, "ok\n".into()));
        assert_eq!(get(&router, "/healthz").await, (200, "ok\n".into()));
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, 404);
        assert!(body.contains(codes::METRICS_DISABLED), "{body}");
    }
}
