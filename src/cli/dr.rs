//! `fairway backup` and `fairway restore` (I/O shell: `fairway::ops::backup`;
//! docs/disaster-recovery.md).

use fairway::core::dr::{BackupKey, MAX_KEY_BYTES};
use fairway::ops::backup::{self, BackupOptions, RestoreOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The environment variable holding the backup key itself.
pub const KEY_ENV: &str = "FAIRWAY_BACKUP_KEY";

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Directory to write the backup to (created; an unfinished backup there is resumed).
    #[arg(long)]
    pub out: PathBuf,
    /// Results and events of this window before the backup point are copied (e.g. 24h, 90m).
    #[arg(long, default_value = "24h")]
    pub results_window: String,
    /// File holding the backup key (32 to 4096 bytes) that signs the manifest; else the
    /// key is read from the environment variable FAIRWAY_BACKUP_KEY.
    #[arg(long, env = "FAIRWAY_BACKUP_KEY_FILE", hide_env_values = true)]
    pub key_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Directory of a finished backup (`fairway backup --out`).
    #[arg(long)]
    pub from: PathBuf,
    /// File holding the backup key the backup was taken with; else the key is read from
    /// the environment variable FAIRWAY_BACKUP_KEY.
    #[arg(long, env = "FAIRWAY_BACKUP_KEY_FILE", hide_env_values = true)]
    pub key_file: Option<PathBuf>,
}

/// The operator's backup key: from `--key-file` (or `FAIRWAY_BACKUP_KEY_FILE`), else from
/// `FAIRWAY_BACKUP_KEY`. Errors name the source, never the key.
fn backup_key(file: Option<&Path>) -> anyhow::Result<BackupKey> {
    use std::io::Read;
    let (bytes, from) = match file {
        Some(path) => {
            let f = std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot read the backup key file {}: {e}", path.display()))?;
            let mut bytes = Vec::new();
            f.take(MAX_KEY_BYTES as u64 + 2)
                .read_to_end(&mut bytes)
                .map_err(|e| anyhow::anyhow!("cannot read the backup key file {}: {e}", path.display()))?;
            (bytes, format!("the key file {}", path.display()))
        }
        None => match std::env::var_os(KEY_ENV) {
            Some(v) => (v.into_encoded_bytes(), KEY_ENV.to_string()),
            None => anyhow::bail!(
                "a backup's manifest is signed with the operator's backup key: give it with --key-file <file> \
                 (or FAIRWAY_BACKUP_KEY_FILE), or in the environment variable {KEY_ENV} (32 to 4096 bytes, \
                 e.g. `openssl rand -hex 32`); restore needs the same key"
            ),
        },
    };
    Ok(BackupKey::new(&bytes, &from)?)
}

fn say(line: String) {
    eprintln!("{line}");
}

/// Takes a backup; prints its summary as JSON on stdout (progress on stderr).
pub async fn backup(cfg: &fairway::config::Config, a: BackupArgs) -> anyhow::Result<ExitCode> {
    let results_window_ms = fairway::core::dr::parse_window(&a.results_window).map_err(anyhow::Error::msg)?;
    let key = backup_key(a.key_file.as_deref())?;
    let m = backup::backup(cfg, &BackupOptions { out: a.out.clone(), results_window_ms, key }, &mut say).await?;
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
    let key = backup_key(a.key_file.as_deref())?;
    let s = backup::restore(cfg, &RestoreOptions { from: a.from, key }, &mut say).await?;
    println!("{}", serde_json::to_string(&s)?);
    Ok(ExitCode::SUCCESS)
}
