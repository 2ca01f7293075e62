//! `fairway serve`: the HTTP API (submit, status, cancel, /healthz, /metrics) until Ctrl-C.

use anyhow::Context;
use fairway::api::{self, ApiState};
use fairway::config::Config;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Do not install the Prometheus recorder (GET /metrics then answers 404).
    #[arg(long)]
    pub no_metrics: bool,
}

pub async fn run(cfg: Arc<Config>, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let metrics = if a.no_metrics {
        None
    } else {
        Some(api::install_prometheus().context("installing the Prometheus recorder")?)
    };
    let state = ApiState::connect(cfg, metrics).await.context("connecting to Kafka and the CQL database")?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {} (in use? pick another with --listen)", a.listen))?;
    let addr = listener.local_addr()?;
    eprintln!(
        "fairway API on http://{addr} (POST /v1/jobs, GET|DELETE /v1/jobs/{{id}}, /healthz, /metrics); Ctrl-C to stop"
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("stopping: finishing requests in flight");
    };
    api::serve(listener, state, shutdown).await.context("serving the HTTP API")?;
    Ok(ExitCode::SUCCESS)
}
