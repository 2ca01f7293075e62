//! `fairway backup` and `fairway restore` (I/O shell: `fairway::ops::backup`;
//! docs/disaster-recovery.md).

use fairway::ops::backup::{self, BackupOptions, RestoreOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Directory to write the backup to (created; an unfinished backup there is resumed).
    #[arg(long)]
    pub out: PathBuf,
    /// Results and events of this window before the backup point are copied (e.g. 24h, 90m).
    #[arg(long, default_value = "24h")]
    pub results_window: String,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Directory of a finished backup (`fairway backup --out`).
    #[arg(long)]
    pub from: PathBuf,
}

fn say(line: String) {
    eprintln!("{line}");
}

/// Takes a backup; prints its summary as JSON on stdout (progress on stderr).
pub async fn backup(cfg: &fairway::config::Config, a: BackupArgs) -> anyhow::Result<ExitCode> {
    let results_window_ms = fairway::core::dr::parse_window(&a.results_window).map_err(anyhow::Error::msg)?;
    let m = backup::backup(cfg, &BackupOptions { out: a.out.clone(), results_window_ms }, &mut say).await?;
    let rows: u64 = m.tables.values().map(|f| f.items).sum();
    let records: u64 = m.topics.values().flat_map(|p| p.values()).map(|(_, f)| f.items).sum();
    let bytes: u64 = m.files().map(|f| f.bytes).sum();
    let summary = serde_json::json!({
        "backup_id": m.backup_id, "t0": m.t0, "dir": a.out, "rows": rows, "records": records,
        "bytes": bytes, "ms": m.finished_at - m.started_at,
    });
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}

/// Restores a backup; prints its summary as JSON on stdout (progress on stderr).
pub async fn restore(cfg: &fairway::config::Config, a: RestoreArgs) -> anyhow::Result<ExitCode> {
    let s = backup::restore(cfg, &RestoreOptions { from: a.from }, &mut say).await?;
    println!("{}", serde_json::to_string(&s)?);
    Ok(ExitCode::SUCCESS)
}
