//! `fairway serve`: the HTTP API (submit, status, cancel) until SIGTERM or SIGINT, and
//! `/metrics` + `/readyz`, `/livez`, `/healthz` on a separate listener (`--metrics-listen` /
//! `api.metrics_listen`), which answers from the process's start on (`api::Starting`). On
//! either signal it drains (`api::drain`): no new connections, requests in flight finish,
//! event streams end with a final event, within `--drain-grace`.

use anyhow::Context;
use fairway::api::{self, ApiState};
use fairway::config::{AuthMode, Config};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /metrics, /readyz, /livez and /healthz (host:port, or "off"); default api.metrics_listen
    /// (127.0.0.1:9464). No API key is asked there: expose it only to operators.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Do not install the Prometheus recorder (GET /metrics then answers 404).
    #[arg(long)]
    pub no_metrics: bool,
    /// After SIGTERM/SIGINT, how long requests in flight may take to finish before the
    /// server exits anyway (keep it below the orchestrator's stop grace).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_grace: std::time::Duration,
    /// How many `serve` processes share the front door (each admits 1/N of every rate);
    /// default api.replicas (1).
    #[arg(long, env = "FAIRWAY_API_REPLICAS")]
    pub replicas: Option<u32>,
}

pub async fn run(cfg: Arc<Config>, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let metrics = if a.no_metrics {
        None
    } else {
        Some(api::install_prometheus().context("installing the Prometheus recorder")?)
    };
    let ops_listen = a.metrics_listen.clone().unwrap_or_else(|| cfg.api.metrics_listen.clone());
    if cfg.api.auth == AuthMode::Off {
        eprintln!("WARNING: api.auth = \"off\": every caller is admin. Use this only for a local demo.");
    }
    for unbounded in cfg.admission.unbounded() {
        tracing::warn!("{unbounded}");
    }
    let cfg = match a.replicas {
        Some(0) => anyhow::bail!("--replicas must be at least 1"),
        Some(n) => {
            Arc::new(Config { api: fairway::config::ApiConfig { replicas: n, ..cfg.api.clone() }, ..(*cfg).clone() })
        }
        None => cfg,
    };
    // The metrics listener first: its probes answer while the start waits (for the
    // database, up to `scylla.connect_wait`), `/livez` live and `/readyz` saying why not.
    let starting = Arc::new(api::Starting::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let ops = if ops_listen.eq_ignore_ascii_case("off") {
        None
    } else {
        let at: SocketAddr = ops_listen.parse().with_context(|| {
            format!("--metrics-listen / api.metrics_listen {ops_listen:?} is not host:port (or \"off\")")
        })?;
        let l = tokio::net::TcpListener::bind(at).await.with_context(|| {
            format!("cannot listen on {at} for /metrics (in use? pick another with --metrics-listen)")
        })?;
        eprintln!("metrics and probes on http://{}/metrics, /readyz, /livez, /healthz (no API key)", l.local_addr()?);
        let mut stopped = stopped.clone();
        let router = starting.clone().router(metrics.clone());
        Some(tokio::spawn(async move {
            axum::serve(l, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }))
    };
    let state = ApiState::connect_reporting(cfg, metrics, &starting)
        .await
        .context("connecting to Kafka and the CQL database")?;
    starting.up(state.clone());
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {} (in use? pick another with --listen)", a.listen))?;
    let addr = listener.local_addr()?;
    eprintln!(
        "fairway API on http://{addr} (POST /v1/jobs, GET|DELETE /v1/jobs/{{id}}, /healthz); SIGTERM or Ctrl-C to stop"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let (signalled, grace_starts) = tokio::sync::oneshot::channel();
    let draining = state.clone();
    let shutdown = async move {
        let sig = tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        };
        eprintln!("{sig}: draining: no new connections, finishing requests in flight, ending event streams");
        draining.drain();
        let _ = stop.send(true);
        let _ = signalled.send(());
    };
    let serving = api::serve(listener, state, shutdown);
    let grace = a.drain_grace;
    tokio::select! {
        r = serving => r.context("serving the HTTP API")?,
        _ = async move {
            let _ = grace_starts.await;
            tokio::time::sleep(grace).await;
        } => {
            eprintln!("requests still in flight after the drain grace ({grace:?}); exiting without them");
            return Ok(ExitCode::SUCCESS);
        }
    }
    if let Some(ops) = ops {
        match tokio::time::timeout(grace, ops).await {
            Ok(r) => r.context("metrics listener")?.context("serving /metrics")?,
            Err(_) => eprintln!("/metrics scrapes still in flight after the drain grace ({grace:?}); exiting"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
