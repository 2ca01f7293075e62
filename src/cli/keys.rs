//! `fairway keys create|list|revoke`: HTTP API keys, each bound to one tenant or to the
//! admin role. A key is printed once, at creation; the store keeps only its SHA-256.

use anyhow::{bail, Context};
use fairway::config::Config;
use fairway::core::auth::{new_key, Caller};
use fairway::now_ms;
use fairway::store::Store;
use rand::TryRngCore;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub what: KeysCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum KeysCmd {
    /// Make a key for one tenant (--tenant T) or an admin key (--admin); prints it once.
    Create(CreateArgs),
    /// Every key of this deployment: id, role, tenant, label, created, revoked (never the key).
    List(ListArgs),
    /// Revoke a key by id; the API refuses it within api.key_refresh (2 s).
    Revoke(RevokeArgs),
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("role").required(true).args(["tenant", "admin"])))]
pub struct CreateArgs {
    /// The tenant the key acts for (it can submit, read and cancel only this tenant's jobs).
    #[arg(long)]
    pub tenant: Option<String>,
    /// An admin key: every tenant and every admin endpoint.
    #[arg(long)]
    pub admin: bool,
    /// A note shown by `keys list` (who or what uses the key).
    #[arg(long)]
    pub label: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// The key's id (the 16 hex digits after `fwk_`, as `keys list` shows).
    pub id: String,
}

pub async fn run(cfg: &Config, a: KeysArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(cfg).await.context("opening the store")?;
    let keys = store.key_statements().await?;
    match a.what {
        KeysCmd::Create(c) => {
            let caller = match c.tenant {
                Some(t) if t.trim().is_empty() => bail!("--tenant is empty; name the tenant the key is for"),
                Some(t) => Caller::Tenant(t),
                None => Caller::Admin,
            };
            for _ in 0..3 {
                let mut random = [0u8; 40];
                rand::rngs::OsRng.try_fill_bytes(&mut random).context("reading the OS random source")?;
                let key = new_key(random);
                if keys.insert(&key.id, &key.hash, &caller, c.label.as_deref(), now_ms()).await? {
                    eprintln!(
                        "created key {} for {caller}; it is shown only now (the store keeps its SHA-256): \
                         send it as `Authorization: Bearer <key>`",
                        key.id
                    );
                    println!("{}", key.token);
                    return Ok(ExitCode::SUCCESS);
                }
            }
            bail!("could not draw an unused key id in 3 tries (is the store answering LWTs?)")
        }
        KeysCmd::List(l) => {
            let rows = keys.list().await?;
            if l.json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({"id": r.id, "role": r.role, "tenant": r.tenant, "label": r.label,
                            "created_at": r.created_at, "revoked_at": r.revoked_at})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{:<16}  {:<6}  {:<20}  {:<8}  LABEL", "ID", "ROLE", "TENANT", "STATE");
                for r in &rows {
                    let state = if r.revoked_at.is_some() { "revoked" } else { "active" };
                    println!(
                        "{:<16}  {:<6}  {:<20}  {:<8}  {}",
                        r.id,
                        r.role,
                        r.tenant.as_deref().unwrap_or("-"),
                        state,
                        r.label.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        KeysCmd::Revoke(r) => {
            if !keys.revoke(&r.id, now_ms()).await? {
                bail!("no key with id {:?} in this deployment; `fairway keys list` shows the ids", r.id);
            }
            eprintln!("revoked key {}; the API refuses it within {:?}", r.id, cfg.api.key_refresh);
            Ok(ExitCode::SUCCESS)
        }
    }
}
