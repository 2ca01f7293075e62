//! `fairway region status|up|draining|down`: this deployment's region state for its API
//! (docs/regions.md). Draining refuses submissions (503 + `Retry-After`), down refuses
//! tenants' reads too; every API process picks the change up within
//! `api::regions::POLL` and `/readyz` says so.

use anyhow::bail;
use fairway::config::Config;
use fairway::core::regions::{RegionState, MAX_RETRY_AFTER_SECS};
use fairway::now_ms;
use fairway::store::{RegionStateRow, Store};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct RegionArgs {
    #[command(subcommand)]
    pub what: RegionCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum RegionCmd {
    /// This region's state (JSON).
    Status,
    /// Serve again.
    Up,
    /// Refuse submissions (503); reads are served.
    Draining(Outage),
    /// Refuse submissions and tenants' reads (503).
    Down(Outage),
}

#[derive(clap::Args, Debug)]
pub struct Outage {
    /// Seconds refused clients are told to wait (default: region.retry_after_secs).
    #[arg(long)]
    pub retry_after: Option<u64>,
    /// Why, shown in 503 answers and /readyz.
    #[arg(long)]
    pub reason: Option<String>,
}

pub async fn run(cfg: &Config, a: RegionArgs) -> anyhow::Result<ExitCode> {
    let Some(name) = cfg.region.name.as_deref() else {
        bail!("this deployment has no region: set [region] name = \"...\" in its config (docs/regions.md)");
    };
    let store = Store::open(cfg).await?;
    let (state, outage) = match a.what {
        RegionCmd::Status => {
            let row = store.region_state().await?;
            println!("{}", status_json(name, &row));
            return Ok(ExitCode::SUCCESS);
        }
        RegionCmd::Up => (RegionState::Up, None),
        RegionCmd::Draining(o) => (RegionState::Draining, Some(o)),
        RegionCmd::Down(o) => (RegionState::Down, Some(o)),
    };
    let (retry_after_secs, reason) = outage.map(|o| (o.retry_after, o.reason)).unwrap_or_default();
    if retry_after_secs.is_some_and(|s| s == 0 || s > MAX_RETRY_AFTER_SECS) {
        bail!("--retry-after must be 1 to {MAX_RETRY_AFTER_SECS} seconds");
    }
    let row = RegionStateRow { state, retry_after_secs, reason, at: Some(now_ms()) };
    store.set_region_state(&row).await?;
    println!("{}", status_json(name, &row));
    Ok(ExitCode::SUCCESS)
}

fn status_json(name: &str, row: &RegionStateRow) -> serde_json::Value {
    serde_json::json!({
        "region": name, "state": row.state.as_str(), "retry_after_secs": row.retry_after_secs,
        "reason": row.reason, "at": row.at,
    })
}
