//! `fairway tenants add|set|list|suspend|resume|remove`: the live tenants registry.
//! Every change is validated first (the error names the field and the fix) and is
//! written whole or not at all; running workers and API processes pick it up within
//! `registry.poll_interval`.

use anyhow::{bail, Context};
use fairway::config::{Config, Tier};
use fairway::core::tenants::TenantRecord;
use fairway::now_ms;
use fairway::store::{Store, TenantStatements};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct TenantsArgs {
    #[command(subcommand)]
    pub what: TenantsCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum TenantsCmd {
    /// Register a tenant (refused if it exists: use `set`).
    Add(AddArgs),
    /// Change some of a tenant's settings; the others stay.
    Set(SetArgs),
    /// Every registered tenant.
    List(ListArgs),
    /// Hold a tenant's jobs (queued jobs wait; nothing is dead-lettered).
    Suspend(NameArg),
    /// Let a suspended tenant's jobs run again.
    Resume(NameArg),
    /// Unregister a tenant (its later jobs count as an unknown tenant's).
    Remove(NameArg),
}

#[derive(clap::Args, Debug)]
pub struct NameArg {
    pub name: String,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

/// Settings of `add` and `set`.
#[derive(clap::Args, Debug, Default)]
pub struct Settings {
    #[arg(long, value_enum)]
    pub tier: Option<TierArg>,
    /// Weight instead of the tier's (paid tiers only).
    #[arg(long)]
    pub weight: Option<f64>,
    /// Running jobs per pool, across all its workers (worker.fleet_limits).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Dispatches per second per pool (across its workers with worker.fleet_limits).
    #[arg(long)]
    pub rate: Option<u32>,
    /// Enterprise only: slots per pool reserved for the tenant.
    #[arg(long)]
    pub reserved_slots: Option<usize>,
    /// Queued jobs before submissions are refused.
    #[arg(long)]
    pub max_queued: Option<usize>,
    /// A label, key=value (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// The region whose API serves the tenant (a region of `[region]`); others answer 421.
    #[arg(long)]
    pub home_region: Option<String>,
    /// Where the tenant's client fails over to when its home region is down.
    #[arg(long)]
    pub secondary_region: Option<String>,
    /// Clear a setting back to its default (repeatable): weight, max-concurrency, rate,
    /// reserved-slots, max-queued, labels, home-region (and the secondary), secondary-region.
    #[arg(long = "unset", value_enum)]
    pub unset: Vec<Field>,
}

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    pub name: String,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(clap::Args, Debug)]
pub struct SetArgs {
    pub name: String,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TierArg {
    Free,
    Standard,
    Pro,
    Enterprise,
}

impl From<TierArg> for Tier {
    fn from(t: TierArg) -> Tier {
        match t {
            TierArg::Free => Tier::Free,
            TierArg::Standard => Tier::Standard,
            TierArg::Pro => Tier::Pro,
            TierArg::Enterprise => Tier::Enterprise,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Field {
    Weight,
    MaxConcurrency,
    Rate,
    ReservedSlots,
    MaxQueued,
    Labels,
    HomeRegion,
    SecondaryRegion,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("label {s:?} must be key=value")),
    }
}

impl Settings {
    /// Applies these settings to a record (unset first, then the values given).
    pub fn apply(&self, t: &mut TenantRecord) {
        for f in &self.unset {
            match f {
                Field::Weight => t.weight = None,
                Field::MaxConcurrency => t.max_concurrency = None,
                Field::Rate => t.rate_per_sec = None,
                Field::ReservedSlots => t.reserved_slots = 0,
                Field::MaxQueued => t.max_queued = None,
                Field::Labels => t.labels.clear(),
                Field::HomeRegion => (t.home_region, t.secondary_region) = (None, None),
                Field::SecondaryRegion => t.secondary_region = None,
            }
        }
        if let Some(tier) = self.tier {
            t.tier = tier.into();
        }
        if self.weight.is_some() {
            t.weight = self.weight;
        }
        if self.max_concurrency.is_some() {
            t.max_concurrency = self.max_concurrency;
        }
        if self.rate.is_some() {
            t.rate_per_sec = self.rate;
        }
        if let Some(r) = self.reserved_slots {
            t.reserved_slots = r;
        }
        if self.max_queued.is_some() {
            t.max_queued = self.max_queued;
        }
        for (k, v) in &self.labels {
            t.labels.insert(k.clone(), v.clone());
        }
        if self.home_region.is_some() {
            t.home_region = self.home_region.clone();
        }
        if self.secondary_region.is_some() {
            t.secondary_region = self.secondary_region.clone();
        }
    }
}

pub async fn run(cfg: &Config, a: TenantsArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(cfg).await?;
    let stmts = store.tenant_statements().await?;
    match a.what {
        TenantsCmd::Add(a) => {
            let mut t = TenantRecord::new(&a.name, Tier::Free);
            a.settings.apply(&mut t);
            t.validate()?;
            fits(cfg, &stmts, &t).await?;
            if !stmts.add(&t, now_ms()).await? {
                bail!("tenant {} already exists; change it with `fairway tenants set {} ...`", a.name, a.name);
            }
            println!("added tenant {} ({})", t.name, t.tier);
        }
        TenantsCmd::Set(a) => change(cfg, &stmts, &a.name, |t| a.settings.apply(t)).await?,
        TenantsCmd::Suspend(a) => change(cfg, &stmts, &a.name, |t| t.suspended = true).await?,
        TenantsCmd::Resume(a) => change(cfg, &stmts, &a.name, |t| t.suspended = false).await?,
        TenantsCmd::Remove(a) => {
            existing(&stmts, &a.name).await?;
            stmts.remove(&a.name, now_ms()).await?;
            println!("removed tenant {}", a.name);
        }
        TenantsCmd::List(a) => list(&stmts, a.json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses a change whose reserved slots would not fit a pool with the others', or whose
/// home region this deployment does not know.
async fn fits(cfg: &Config, stmts: &TenantStatements, t: &TenantRecord) -> anyhow::Result<()> {
    fairway::core::tenants::check_regions(t, &cfg.region)?;
    let all = stmts.list().await.context("reading the tenants registry")?;
    fairway::core::tenants::check_reservations(&all, t, &fairway::ops::tenants::pool_rooms(cfg))?;
    Ok(())
}

async fn existing(stmts: &TenantStatements, name: &str) -> anyhow::Result<TenantRecord> {
    let all = stmts.list().await.context("reading the tenants registry")?;
    match all.get(name) {
        Some(t) => Ok(t.clone()),
        None => bail!("no tenant {name:?} is registered; add it with `fairway tenants add {name} --tier <tier>`"),
    }
}

/// Read, change, validate, write: an invalid change is refused whole.
async fn change(
    cfg: &Config,
    stmts: &TenantStatements,
    name: &str,
    f: impl FnOnce(&mut TenantRecord),
) -> anyhow::Result<()> {
    let mut t = existing(stmts, name).await?;
    f(&mut t);
    t.validate()?;
    fits(cfg, stmts, &t).await?;
    stmts.put(&t, now_ms()).await?;
    println!("updated tenant {name}: {}", describe(&t));
    Ok(())
}

fn describe(t: &TenantRecord) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    format!(
        "tier {}, weight {}, max-concurrency {}, rate {}, reserved {}, max-queued {}, home region {}{}",
        t.tier,
        opt(t.weight.map(|w| w.to_string())),
        opt(t.max_concurrency.map(|v| v.to_string())),
        opt(t.rate_per_sec.map(|v| format!("{v}/s"))),
        t.reserved_slots,
        opt(t.max_queued.map(|v| v.to_string())),
        match (&t.home_region, &t.secondary_region) {
            (Some(h), Some(s)) => format!("{h} (secondary {s})"),
            (h, _) => opt(h.clone()),
        },
        if t.suspended { ", SUSPENDED" } else { "" }
    )
}

async fn list(stmts: &TenantStatements, json: bool) -> anyhow::Result<()> {
    let version = stmts.version().await?;
    let all = stmts.list().await?;
    if json {
        println!("{}", serde_json::json!({ "version": version, "tenants": all.values().collect::<Vec<_>>() }));
        return Ok(());
    }
    println!(
        "{:<24} {:<10} {:>7} {:>8} {:>7} {:>8} {:>10}  STATE",
        "TENANT", "TIER", "WEIGHT", "MAX-RUN", "RATE", "RESERVED", "MAX-QUEUED"
    );
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for t in all.values() {
        println!(
            "{:<24} {:<10} {:>7} {:>8} {:>7} {:>8} {:>10}  {}",
            t.name,
            t.tier.as_str(),
            dash(t.weight.map(|w| w.to_string())),
            dash(t.max_concurrency.map(|v| v.to_string())),
            dash(t.rate_per_sec.map(|v| v.to_string())),
            t.reserved_slots,
            dash(t.max_queued.map(|v| v.to_string())),
            if t.suspended { "suspended" } else { "active" }
        );
    }
    println!("{} tenants, registry version {version}", all.len());
    Ok(())
}
