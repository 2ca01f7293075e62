//! Readiness and liveness of a fairway process: the state behind `/readyz` and `/livez` on
//! the metrics listener, which orchestrators (Kubernetes probes, a rolling restart)
//! wait on.
//!
//! - *Ready* (`/readyz`) means "this process does its share now": a worker once every
//!   pool it serves got its first partition assignment from the consumer group (possibly
//!   empty: more members than partitions) and its store session is up, and not while it
//!   drains; `fairway serve` while the store and the broker answer. A rolling restart
//!   that waits for the replacement's readiness before stopping the old process never
//!   leaves a pool's group without an owner.
//! - *Live* (`/livez`) means "this process can still make progress": it fails once a part
//!   that cannot recover by itself has failed ([`Liveness::fail`]: a pool loop ended with
//!   an error, a fatal Kafka client error), and, for a worker, while its vitals say it
//!   cannot make progress ([`Liveness::watch`]: the store unreachable for over 10 s, a
//!   producer given up); the orchestrator then restarts the process.

use crate::model::Pool;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A check of the process's vitals asked on every `/livez`: Ok, or why it cannot make
/// progress now (a worker's `worker::watchdog::Watch::live`: the store unreachable for
/// long, a fatal client error).
pub type LiveCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Whether the process can still make progress. Shared by every part that can notice
/// it cannot: a failure (set once, never cleared: a failed process is restarted, not
/// healed), and the vitals check, asked each time (it clears when the store answers
/// again).
#[derive(Default)]
pub struct Liveness {
    failure: Mutex<Option<String>>,
    check: std::sync::OnceLock<LiveCheck>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness").field("failure", &self.failure()).finish()
    }
}

impl Liveness {
    /// Marks the process as unable to make progress, with the reason `/livez` shows (no
    /// secrets: it is served without authentication). The first reason is kept.
    pub fn fail(&self, reason: impl Into<String>) {
        let mut f = self.failure.lock().expect("liveness lock");
        if f.is_none() {
            let reason = reason.into();
            tracing::error!(%reason, "liveness failed: this process cannot make progress; /livez answers 503");
            *f = Some(reason);
        }
    }

    /// Asks `check` too on every liveness question (the first check set is kept).
    pub fn watch(&self, check: LiveCheck) {
        let _ = self.check.set(check);
    }

    /// Why the process cannot make progress; None while it can.
    pub fn failure(&self) -> Option<String> {
        if let Some(f) = self.failure.lock().expect("liveness lock").clone() {
            return Some(f);
        }
        self.check.get().and_then(|c| c().err())
    }
}

/// What a worker must have before it is ready: every served pool's first assignment,
/// the store session, and no drain under way.
#[derive(Debug)]
pub struct WorkerReadiness {
    /// Per served pool: has its consumer received its first assignment?
    assigned: Mutex<BTreeMap<Pool, bool>>,
    store_up: AtomicBool,
    /// While the start waits for an unreachable database: its last try (`store::reach`).
    store_waiting: Mutex<Option<String>>,
    draining: AtomicBool,
}

impl WorkerReadiness {
    pub fn new(pools: &[Pool]) -> Self {
        WorkerReadiness {
            assigned: Mutex::new(pools.iter().map(|p| (*p, false)).collect()),
            store_up: AtomicBool::new(false),
            store_waiting: Mutex::new(None),
            draining: AtomicBool::new(false),
        }
    }

    /// The pool's consumer got an assignment from its group (even an empty one).
    pub fn assigned(&self, pool: Pool) {
        self.assigned.lock().expect("readiness lock").insert(pool, true);
    }

    /// The store session is (or is no longer) up.
    pub fn set_store_up(&self, up: bool) {
        self.store_up.store(up, Ordering::SeqCst);
    }

    /// The start waits for the database: why, for `/readyz` until the session is up.
    pub fn set_store_waiting(&self, why: String) {
        *self.store_waiting.lock().expect("readiness lock") = Some(why);
    }

    /// The worker drains (SIGTERM): not ready any more, for good.
    pub fn draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Why the worker is not ready (empty: ready).
    pub fn not_ready(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.draining.load(Ordering::SeqCst) {
            why.push("draining (SIGTERM received)".to_string());
        }
        if !self.store_up.load(Ordering::SeqCst) {
            why.push(match self.store_waiting.lock().expect("readiness lock").as_deref() {
                Some(waiting) => format!("store session not up: {waiting}"),
                None => "store session not up".to_string(),
            });
        }
        let assigned = self.assigned.lock().expect("readiness lock");
        for (pool, _) in assigned.iter().filter(|(_, got)| !**got) {
            why.push(format!("pool {pool}: no partition assignment from its consumer group yet"));
        }
        why
    }
}

/// A readiness check that asks the backing services (`fairway serve`): Ok, or why not.
pub type ReadyCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// How a process decides its readiness.
#[derive(Clone)]
pub enum Readiness {
    Worker(Arc<WorkerReadiness>),
    /// Asked on every `/readyz` (one check at a time).
    Check(ReadyCheck, Arc<tokio::sync::Mutex<()>>),
}

/// Why a ready process is busy, if it is (`fairway serve`: every connection taken).
pub type BusyCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Everything the metrics listener's probe routes answer from (cheap to clone).
#[derive(Clone)]
pub struct Probes {
    pub readiness: Readiness,
    pub liveness: Arc<Liveness>,
    /// Busy is still ready: `/readyz` answers 200 `ready (busy: ...)`, so a load that
    /// fills every replica does not take them all out of their Service at once.
    pub busy: Option<BusyCheck>,
}

impl Probes {
    /// A worker's probes: ready once `pools` are assigned and the store is up.
    pub fn worker(pools: &[Pool]) -> Self {
        Probes {
            readiness: Readiness::Worker(Arc::new(WorkerReadiness::new(pools))),
            liveness: Default::default(),
            busy: None,
        }
    }

    /// Probes whose readiness is `check`, asked on each request, and whose busy state is
    /// `busy`.
    pub fn checked(check: ReadyCheck, busy: Option<BusyCheck>) -> Self {
        Probes { readiness: Readiness::Check(check, Default::default()), liveness: Default::default(), busy }
    }

    /// The worker readiness state, when these are a worker's probes.
    pub fn worker_readiness(&self) -> Option<&Arc<WorkerReadiness>> {
        match &self.readiness {
            Readiness::Worker(w) => Some(w),
            Readiness::Check(..) => None,
        }
    }

    /// Why the process is not ready (empty: ready).
    pub async fn not_ready(&self) -> Vec<String> {
        match &self.readiness {
            Readiness::Worker(w) => w.not_ready(),
            Readiness::Check(check, one_at_a_time) => {
                let _turn = one_at_a_time.lock().await;
                check().await.err().into_iter().collect()
            }
        }
    }
}

#[derive(Clone)]
struct ProbeState {
    probes: Probes,
    metrics: Option<PrometheusHandle>,
}

/// The worker's metrics listener: `/metrics` (when a recorder is given) and the probe
/// routes of [`probe_router`], without authentication.
pub fn router(probes: Probes, metrics: Option<PrometheusHandle>) -> Router {
    let st = ProbeState { probes: probes.clone(), metrics };
    Router::new().route("/metrics", get(metrics_text)).with_state(st).merge(probe_router(probes))
}

/// `/readyz`, `/livez` and `/healthz` (same as `/livez`), to merge into a listener.
pub fn probe_router(probes: Probes) -> Router {
    let st = ProbeState { probes, metrics: None };
    Router::new().route("/readyz", get(readyz)).route("/livez", get(livez)).route("/healthz", get(livez)).with_state(st)
}

fn plain(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn readyz(State(st): State<ProbeState>) -> Response {
    if let Some(why) = st.probes.liveness.failure() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: not live: {why}\n"));
    }
    let why = st.probes.not_ready().await;
    if why.is_empty() {
        match st.probes.busy.as_ref().and_then(|busy| busy()) {
            Some(busy) => plain(StatusCode::OK, format!("ready (busy: {busy})\n")),
            None => plain(StatusCode::OK, "ready\n".into()),
        }
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", why.join("; ")))
    }
}

async fn livez(State(st): State<ProbeState>) -> Response {
    match st.probes.liveness.failure() {
        None => plain(StatusCode::OK, "ok\n".into()),
        Some(why) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("not live: {why}\n")),
    }
}

async fn metrics_text(State(st): State<ProbeState>) -> Response {
    let Some(h) = &st.metrics else {
        return plain(StatusCode::NOT_FOUND, "no Prometheus recorder in this process\n".into());
    };
    h.run_upkeep();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response()
}

/// Binds `listen` (host:port; port 0 picks a free one) and serves [`router`] until
/// `shutdown` turns true; returns the bound address and the serving task.
pub async fn serve(
    listen: std::net::SocketAddr,
    router: Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let l = tokio::net::TcpListener::bind(listen).await?;
    let addr = l.local_addr()?;
    let task = tokio::spawn(async move {
        axum::serve(l, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .await
    });
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_ready_once_every_pool_is_assigned_and_the_store_is_up() {
        let r = WorkerReadiness::new(&[Pool::Short, Pool::Long]);
        assert_eq!(r.not_ready().len(), 3, "{:?}", r.not_ready());
        r.set_store_up(true);
        r.assigned(Pool::Long);
        assert_eq!(r.not_ready(), vec!["pool short: no partition assignment from its consumer group yet"]);
        r.assigned(Pool::Short);
        assert!(r.not_ready().is_empty());
        r.draining();
        assert_eq!(r.not_ready(), vec!["draining (SIGTERM received)"]);
    }

    /// Busy is ready: 200 with the reason, so a full process stays in its Service; a
    /// failing check is still 503.
    #[tokio::test]
    async fn a_busy_process_answers_ready_with_why() {
        let busy = Arc::new(AtomicBool::new(true));
        let b = busy.clone();
        let is_busy: BusyCheck = Arc::new(move || b.load(Ordering::SeqCst).then(|| "every connection taken".into()));
        let up = Arc::new(AtomicBool::new(true));
        let u = up.clone();
        let check: ReadyCheck = Arc::new(move || {
            let up = u.load(Ordering::SeqCst);
            Box::pin(async move {
                if up {
                    Ok(())
                } else {
                    Err("the store does not answer".to_string())
                }
            })
        });
        let st = ProbeState { probes: Probes::checked(check, Some(is_busy)), metrics: None };
        let answer = |st: ProbeState| async move {
            let r = readyz(State(st)).await;
            let status = r.status();
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        };
        assert_eq!(answer(st.clone()).await, (StatusCode::OK, "ready (busy: every connection taken)\n".into()));
        busy.store(false, Ordering::SeqCst);
        assert_eq!(answer(st.clone()).await, (StatusCode::OK, "ready\n".into()));
        up.store(false, Ordering::SeqCst);
        assert_eq!(answer(st).await.0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn liveness_keeps_the_first_reason() {
        let l = Liveness::default();
        assert_eq!(l.failure(), None);
        l.fail("pool long: loop ended");
        l.fail("later");
        assert_eq!(l.failure().as_deref(), Some("pool long: loop ended"));
    }

    #[test]
    fn liveness_asks_the_vitals_check_each_time() {
        let l = Liveness::default();
        let down = Arc::new(AtomicBool::new(false));
        let d = down.clone();
        l.watch(Arc::new(move || if d.load(Ordering::SeqCst) { Err("store unreachable".into()) } else { Ok(()) }));
        assert_eq!(l.failure(), None);
        down.store(true, Ordering::SeqCst);
        assert_eq!(l.failure().as_deref(), Some("store unreachable"));
        down.store(false, Ordering::SeqCst);
        assert_eq!(l.failure(), None, "the vitals heal: live again once the store answers");
        l.fail("pool short: loop ended");
        assert_eq!(l.failure().as_deref(), Some("pool short: loop ended"));
    }
}
