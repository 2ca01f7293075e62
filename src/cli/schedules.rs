//! `fairway schedules add|set|list|pause|resume|remove`: recurring schedules per tenant
//! (`fairway::ops::schedules`). Every change is validated whole first (the error names the
//! field and the fix); running workers' promoter leader picks it up within a second.

use anyhow::Context;
use fairway::config::Config;
use fairway::core::recurring::{CatchUp, ScheduleSpec};
use fairway::model::{Millis, Pool, Priority};
use fairway::now_ms;
use fairway::ops::schedules::{Listed, Schedules};
use fairway::store::Store;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct SchedulesArgs {
    #[command(subcommand)]
    pub what: SchedulesCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum SchedulesCmd {
    /// Add a schedule: NAME --tenant T --type TYPE (--cron EXPR | --every DURATION) [...].
    Add(Definition),
    /// Change some of a schedule's settings; the others stay. Its next fire is computed afresh.
    Set(Definition),
    /// Schedules with their next fire times.
    List(ListArgs),
    /// Stop firing a schedule (it stays defined).
    Pause(Target),
    /// Fire a paused schedule again, from now on (fires missed while paused are skipped).
    Resume(Target),
    /// Remove a schedule (jobs it already submitted run).
    Remove(Target),
}

#[derive(clap::Args, Debug)]
pub struct Target {
    pub name: String,
    #[arg(long)]
    pub tenant: String,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this tenant's schedules.
    #[arg(long)]
    pub tenant: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// A schedule's settings (`add` needs --type and one of --cron / --every).
#[derive(clap::Args, Debug)]
pub struct Definition {
    pub name: String,
    #[arg(long)]
    pub tenant: String,
    /// The job type each fire submits.
    #[arg(long = "type")]
    pub job_type: Option<String>,
    /// Cron expression, 5 fields or 6 with seconds first, e.g. "0 2 * * *".
    #[arg(long, conflicts_with = "every")]
    pub cron: Option<String>,
    /// Fixed interval instead of a cron expression, e.g. 30s, 15m, 1h.
    #[arg(long)]
    pub every: Option<String>,
    /// IANA time zone of the cron expression (default UTC), e.g. Europe/Berlin.
    #[arg(long)]
    pub tz: Option<String>,
    /// The jobs' payload: JSON (an object, array, number...) or, if not JSON, the text itself.
    #[arg(long)]
    pub payload: Option<String>,
    #[arg(long)]
    pub priority: Option<Priority>,
    #[arg(long)]
    pub pool: Option<Pool>,
    #[arg(long)]
    pub flow_key: Option<String>,
    /// No fire before this time: RFC 3339 (2026-12-01T02:00:00Z) or epoch ms.
    #[arg(long, value_parser = parse_time)]
    pub start: Option<Millis>,
    /// No fire after this time: RFC 3339 or epoch ms.
    #[arg(long, value_parser = parse_time)]
    pub end: Option<Millis>,
    /// Fires missed while no worker ran: none (skip), one (one job now), all (every one
    /// of the last day, at the promoter's pace).
    #[arg(long)]
    pub catch_up: Option<CatchUp>,
    /// Each fire's job starts up to this much later (fixed per fire), e.g. 30s.
    #[arg(long)]
    pub jitter: Option<String>,
}

fn parse_time(s: &str) -> Result<Millis, String> {
    if let Ok(ms) = s.parse::<Millis>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{s:?} is neither RFC 3339 (2026-12-01T02:00:00Z) nor epoch milliseconds ({e})"))
}

impl Definition {
    /// Applies the flags given to `spec`.
    fn apply(&self, spec: &mut ScheduleSpec) {
        if let Some(t) = &self.job_type {
            spec.job_type = t.clone();
        }
        if self.cron.is_some() {
            spec.cron = self.cron.clone();
            spec.every = None;
        }
        if self.every.is_some() {
            spec.every = self.every.clone();
            spec.cron = None;
            spec.tz = None;
        }
        if self.tz.is_some() {
            spec.tz = self.tz.clone();
        }
        if let Some(p) = &self.payload {
            spec.payload = serde_json::from_str(p).unwrap_or_else(|_| serde_json::Value::String(p.clone()));
        }
        set(&mut spec.priority, self.priority);
        set(&mut spec.catch_up, self.catch_up);
        if self.pool.is_some() {
            spec.pool = self.pool;
        }
        if self.flow_key.is_some() {
            spec.flow_key = self.flow_key.clone();
        }
        if self.start.is_some() {
            spec.start_at = self.start;
        }
        if self.end.is_some() {
            spec.end_at = self.end;
        }
        if self.jitter.is_some() {
            spec.jitter = self.jitter.clone();
        }
    }
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

pub async fn run(cfg: &Config, a: SchedulesArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(cfg).await?;
    let schedules = Schedules::connect(Arc::new(cfg.clone()), &store).await.context("preparing the schedules table")?;
    let now = now_ms();
    match a.what {
        SchedulesCmd::Add(d) => {
            let mut spec = ScheduleSpec { name: d.name.clone(), tenant: d.tenant.clone(), ..Default::default() };
            d.apply(&mut spec);
            if spec.job_type.is_empty() {
                anyhow::bail!("--type is required: the job type each fire submits");
            }
            let s = schedules.add(spec, now).await?;
            println!("added schedule {}/{}: {}", s.spec.tenant, s.spec.name, describe(&s));
        }
        SchedulesCmd::Set(d) => {
            let s = schedules.set(&d.tenant, &d.name, |spec| d.apply(spec), now).await?;
            println!("updated schedule {}/{}: {}", s.spec.tenant, s.spec.name, describe(&s));
        }
        SchedulesCmd::Pause(t) => {
            schedules.pause(&t.tenant, &t.name, true, now).await?;
            println!("paused schedule {}/{}", t.tenant, t.name);
        }
        SchedulesCmd::Resume(t) => {
            let s = schedules.pause(&t.tenant, &t.name, false, now).await?;
            println!("resumed schedule {}/{}: {}", t.tenant, t.name, describe(&s));
        }
        SchedulesCmd::Remove(t) => {
            schedules.remove(&t.tenant, &t.name).await?;
            println!("removed schedule {}/{}", t.tenant, t.name);
        }
        SchedulesCmd::List(l) => {
            let all = schedules.list(l.tenant.as_deref()).await?;
            if l.json {
                println!("{}", serde_json::to_string(&all)?);
            } else {
                print_table(&all);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn when(s: &Listed) -> String {
    match (&s.spec.cron, &s.spec.every) {
        (Some(c), _) => format!("cron \"{c}\" {}", s.spec.tz.as_deref().unwrap_or("UTC")),
        (_, Some(e)) => format!("every {e}"),
        _ => "-".into(),
    }
}

fn time(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

fn describe(s: &Listed) -> String {
    let next: Vec<String> = s.next_fires.iter().map(|t| time(*t)).collect();
    let next = if s.paused {
        "paused".to_string()
    } else if next.is_empty() {
        "no more fires".into()
    } else {
        next.join(", ")
    };
    format!("{}, type {}, next {next}", when(s), s.spec.job_type)
}

fn print_table(all: &[Listed]) {
    println!("{:<16} {:<24} {:<36} {:<16} {:<9}  NEXT FIRES (UTC)", "TENANT", "NAME", "WHEN", "TYPE", "CATCH-UP");
    for s in all {
        let next: Vec<String> = s.next_fires.iter().map(|t| time(*t)).collect();
        println!(
            "{:<16} {:<24} {:<36} {:<16} {:<9}  {}",
            s.spec.tenant,
            s.spec.name,
            when(s),
            s.spec.job_type,
            format!("{:?}", s.spec.catch_up).to_lowercase(),
            if s.paused { "paused".to_string() } else { next.join(", ") }
        );
    }
    println!("{} schedules", all.len());
}
