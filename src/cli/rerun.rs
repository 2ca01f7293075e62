//! `fairway rerun`: "rerun all" of a tenant's jobs of a job type (or of every job type of
//! the tenant, or of a job type across tenants) by generation numbers.

use super::replay::{check_time, parse_rate, resolve_time};
use anyhow::Context;
use fairway::config::Config;
use fairway::core::rerun::{RerunFilter, RerunScope};
use fairway::model::Pool;
use fairway::now_ms;
use fairway::ops::rerun::{self, Phase, RerunEnd, RerunEvent, RerunOptions, RerunReport};
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// "Rerun all" of a tenant's jobs by generation numbers: dry run, rate limit, resumable.
#[derive(clap::Args, Debug, Clone)]
pub struct RerunArgs {
    /// Rerun this tenant's jobs (with --job-type, or --all-job-types).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Rerun jobs of this job type (with --tenant, or --all-tenants).
    #[arg(long = "job-type", alias = "type")]
    pub job_type: Option<String>,
    /// With --tenant: every job type of the tenant.
    #[arg(long, requires = "tenant", conflicts_with = "job_type")]
    pub all_job_types: bool,
    /// With --job-type: that job type of every tenant.
    #[arg(long, requires = "job_type", conflicts_with = "tenant")]
    pub all_tenants: bool,
    /// Pool topic to scan (repeatable): short, medium, long. Default: the job type's
    /// pool, or every pool with --all-job-types.
    #[arg(long = "pool")]
    pub pools: Vec<Pool>,
    /// Only jobs submitted at or after: epoch ms, or relative like -1h, -30min, -2d.
    #[arg(long, value_parser = check_time, allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Only jobs submitted before: epoch ms, or relative like -10min ("now" is allowed).
    #[arg(long, value_parser = check_time, allow_hyphen_values = true)]
    pub until: Option<String>,
    /// Only this job id (repeatable).
    #[arg(long = "job-id")]
    pub job_ids: Vec<String>,
    /// Scan, count and show a sample with the generation it would take; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Rerun copies produced per second, e.g. 100 or 100/s.
    #[arg(long, default_value = "100", value_parser = parse_rate)]
    pub rate: u32,
    /// Stop after this many jobs (continue with the same command and --resume).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Continue the latest rerun of this scope (same filters) instead of starting a new
    /// one: no new generation is drawn.
    #[arg(long)]
    pub resume: bool,
    /// The scan ends when no record arrived for this long.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
}

impl RerunArgs {
    fn scope(&self) -> anyhow::Result<RerunScope> {
        match (&self.tenant, &self.job_type) {
            (Some(_), Some(_)) => {}
            (Some(_), None) if self.all_job_types => {}
            (None, Some(_)) if self.all_tenants => {}
            (Some(t), None) => anyhow::bail!(
                "--tenant {t} without --job-type: name the job type, or pass --all-job-types to rerun every job \
                 type of {t}"
            ),
            (None, Some(j)) => anyhow::bail!(
                "--job-type {j} without --tenant: name the tenant, or pass --all-tenants to rerun {j} jobs of \
                 every tenant"
            ),
            (None, None) => anyhow::bail!(
                "name what to rerun: --tenant T --job-type J, --tenant T --all-job-types, or --job-type J \
                 --all-tenants"
            ),
        }
        Ok(RerunScope { tenant: self.tenant.clone(), job_type: self.job_type.clone() })
    }

    fn options(&self, now: i64) -> anyhow::Result<RerunOptions> {
        let t = |v: &Option<String>| v.as_deref().map(|s| resolve_time(s, now)).transpose();
        let filter = RerunFilter {
            scope: self.scope()?,
            since: t(&self.since).map_err(anyhow::Error::msg)?,
            until: t(&self.until).map_err(anyhow::Error::msg)?,
            job_ids: (!self.job_ids.is_empty()).then(|| self.job_ids.iter().cloned().collect::<HashSet<_>>()),
        };
        Ok(RerunOptions {
            filter,
            pools: self.pools.clone(),
            dry_run: self.dry_run,
            rate_per_sec: self.rate,
            limit: self.limit,
            resume: self.resume,
            idle_timeout: self.idle_timeout,
            stop: None,
        })
    }
}

pub async fn run(cfg: Arc<Config>, a: RerunArgs) -> anyhow::Result<ExitCode> {
    if a.resume
        && (a.since.as_deref().is_some_and(|s| s.trim_start().starts_with('-'))
            || a.until.as_deref().is_some_and(|s| s.trim_start().starts_with('-') || s.trim() == "now"))
    {
        // Relative times move between runs, so the resumed rerun would select other jobs.
        anyhow::bail!("--resume needs the same filters as the run it continues: give --since/--until as epoch ms");
    }
    let mut opts = a.options(now_ms())?;
    let stop = Arc::new(AtomicBool::new(false));
    opts.stop = Some(stop.clone());
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.store(true, Ordering::Relaxed);
            eprintln!("\nstopping after the current batch (Ctrl-C again to abort at once)");
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    let live = std::io::stderr().is_terminal();
    let topics: Vec<String> = opts.pools(&cfg).iter().map(|p| cfg.pool_topic(*p)).collect();
    if live {
        eprintln!(
            "rerun {} scanning {}{}",
            opts.filter.scope.label(),
            topics.join(", "),
            if opts.dry_run { " (dry run: nothing is written)" } else { "" }
        );
    }
    let label = if opts.dry_run { "would rerun" } else { "rerun" };
    let report = rerun::run(&cfg, opts, |e: &RerunEvent| match e {
        RerunEvent::Progress(p) if live => {
            match p.phase {
                Phase::Scanning => eprint!(
                    "\r  scanning: {} records  matched {}  jobs {}  partitions {}/{} done  {:.1}s   ",
                    p.scanned,
                    p.matched,
                    p.selected,
                    p.partitions_done,
                    p.partitions,
                    p.elapsed.as_secs_f64()
                ),
                Phase::Producing => {
                    eprint!(
                        "\r  {label} {} of {} jobs  {:.1}s                        ",
                        p.rerun,
                        p.selected,
                        p.elapsed.as_secs_f64()
                    )
                }
            }
            let _ = std::io::stderr().flush();
        }
        RerunEvent::Progress(_) => {}
        RerunEvent::Generation { generation, rerun_id, pairs, dry_run, resumed } => {
            if live {
                eprintln!();
            }
            match (dry_run, resumed) {
                (false, false) => println!("generation {generation}: drawn for rerun {rerun_id}"),
                (false, true) => println!("generation {generation}: continuing rerun {rerun_id}"),
                (true, false) => {
                    println!("generation {generation}: what a rerun would draw now (dry run: not written)")
                }
                (true, true) => println!("generation {generation}: the rerun --resume would continue (dry run)"),
            }
            for p in pairs {
                match p.previous {
                    Some(prev) if prev >= p.target => {
                        println!("  {}/{}  target generation {prev}", p.tenant, p.job_type)
                    }
                    prev => println!(
                        "  {}/{}  target generation {} -> {}",
                        p.tenant,
                        p.job_type,
                        prev.map_or("none".to_string(), |g| g.to_string()),
                        p.target
                    ),
                }
            }
        }
    })
    .await;
    ctrl_c.abort();
    if live {
        eprintln!();
    }
    let report = report.context("rerun failed")?;
    print_report(&report, &a);
    Ok(if report.ended == RerunEnd::Interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

fn print_report(r: &RerunReport, a: &RerunArgs) {
    let s = &r.skipped;
    println!(
        "rerun {} of {}{}",
        r.rerun_id.as_deref().unwrap_or("(no generation drawn)"),
        r.topics.join(", "),
        if r.dry_run { " (dry run)" } else { "" }
    );
    println!("  scanned       {} records, {} matched, {} distinct jobs", r.scanned, r.matched, r.selected);
    if r.dry_run {
        println!("  would rerun   {}", r.would_rerun);
    } else {
        println!("  rerun         {}", r.rerun);
    }
    let generation = r.generation.map_or("the generation".to_string(), |g| format!("generation {g}"));
    let reasons: Vec<String> = [
        (s.at_generation, format!("already at {generation} or later")),
        (s.already_ran, format!("already ran at {generation} or later")),
        (s.done_before, "done by an earlier run of this rerun".to_string()),
        (s.expired, "past not_after".to_string()),
        (s.duplicate, "older records of a selected job".to_string()),
        (s.filter, "records of other tenants/job types/times".to_string()),
        (s.undecodable, "undecodable records".to_string()),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    println!("  skipped       {}", if reasons.is_empty() { "none".to_string() } else { reasons.join(", ") });
    if r.cancel_cleared > 0 {
        let verb = if r.dry_run { "would clear" } else { "cleared" };
        println!("  cancellation  {verb} {} stale flag(s) of finished earlier runs", r.cancel_cleared);
    }
    println!(
        "  ended         {} after {:.1}s (scan: {})",
        match r.ended {
            RerunEnd::Done => "every selected job decided",
            RerunEnd::Nothing => "nothing to rerun",
            RerunEnd::Limit => "reached --limit",
            RerunEnd::Interrupted => "interrupted",
        },
        r.elapsed.as_secs_f64(),
        r.scan_ended.describe()
    );
    if !r.resumed_from.is_empty() {
        let parts: Vec<String> = r.resumed_from.iter().map(|((t, p), o)| format!("{t}:{p}@{o}")).collect();
        println!("  resumed from  {}", parts.join(" "));
    }
    if r.dry_run && !r.sample.is_empty() {
        println!();
        println!(
            "  {:<36}  {:<12}  {:<14}  {:<6}  {:>4}  {:>7}  DECISION",
            "JOB ID", "TENANT", "JOB TYPE", "POOL", "GEN", "ATTEMPT"
        );
        for row in &r.sample {
            println!(
                "  {:<36}  {:<12}  {:<14}  {:<6}  {:>4}  {:>7}  {}",
                row.job_id, row.tenant, row.job_type, row.pool, row.generation, row.attempt, row.decision
            );
        }
        if r.selected > r.sample.len() as u64 {
            println!("  ... {} more", r.selected - r.sample.len() as u64);
        }
    }
    if r.cancel_pending_count > 0 {
        println!();
        println!(
            "cancellation pending: {} job(s) were rerun while a cancellation of their current run was pending; the \
             worker cancels their new copy too, e.g. {}",
            r.cancel_pending_count,
            r.cancel_pending.join(", ")
        );
        let ids: Vec<String> = r.cancel_pending.iter().map(|i| format!("--job-id {i}")).collect();
        println!("  once they stopped: fairway rerun {} {}", scope_flags(a), ids.join(" "));
    }
    for w in &r.warnings {
        println!("warning: {w}");
    }
    if matches!(r.ended, RerunEnd::Limit | RerunEnd::Interrupted) && !r.dry_run && r.generation.is_some() {
        println!("continue with the same command plus --resume (rerun id {})", r.rerun_id.as_deref().unwrap_or(""));
    }
}

fn scope_flags(a: &RerunArgs) -> String {
    let mut v = Vec::new();
    if let Some(t) = &a.tenant {
        v.push(format!("--tenant {t}"));
    }
    if let Some(j) = &a.job_type {
        v.push(format!("--job-type {j}"));
    }
    if a.all_job_types {
        v.push("--all-job-types".into());
    }
    if a.all_tenants {
        v.push("--all-tenants".into());
    }
    v.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: RerunArgs,
    }

    fn parse(args: &[&str]) -> Result<RerunArgs, clap::Error> {
        T::try_parse_from(std::iter::once("fairway-rerun").chain(args.iter().copied())).map(|t| t.a)
    }

    #[test]
    fn scopes() {
        let a = parse(&["--tenant", "acme", "--job-type", "echo"]).unwrap();
        assert_eq!(a.scope().unwrap(), RerunScope { tenant: Some("acme".into()), job_type: Some("echo".into()) });
        let a = parse(&["--tenant", "acme", "--all-job-types"]).unwrap();
        assert_eq!(a.scope().unwrap(), RerunScope { tenant: Some("acme".into()), job_type: None });
        let a = parse(&["--type", "echo", "--all-tenants"]).unwrap();
        assert_eq!(a.scope().unwrap(), RerunScope { tenant: None, job_type: Some("echo".into()) });
        let e = parse(&["--tenant", "acme"]).unwrap().scope().unwrap_err().to_string();
        assert!(e.contains("--all-job-types"), "{e}");
        let e = parse(&["--job-type", "echo"]).unwrap().scope().unwrap_err().to_string();
        assert!(e.contains("--all-tenants"), "{e}");
        assert!(parse(&[]).unwrap().scope().is_err());
        assert!(parse(&["--all-tenants"]).is_err(), "needs --job-type");
        assert!(parse(&["--tenant", "a", "--job-type", "e", "--all-tenants"]).is_err(), "conflicts");
        assert!(parse(&["--tenant", "a", "--job-type", "e", "--all-job-types"]).is_err(), "conflicts");
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--tenant",
            "acme",
            "--job-type",
            "echo",
            "--pool",
            "short",
            "--pool",
            "medium",
            "--since",
            "-1h",
            "--until",
            "now",
            "--job-id",
            "a",
            "--job-id",
            "b",
            "--rate",
            "20/s",
            "--limit",
            "5",
            "--dry-run",
            "--resume",
        ])
        .unwrap();
        let o = a.options(10_000_000).unwrap();
        assert_eq!(o.pools, vec![Pool::Short, Pool::Medium]);
        assert_eq!((o.filter.since, o.filter.until), (Some(10_000_000 - 3_600_000), Some(10_000_000)));
        assert_eq!(o.filter.job_ids.as_ref().map(|s| s.len()), Some(2));
        assert!(o.dry_run && o.resume && o.limit == Some(5) && o.rate_per_sec == 20);
        assert!(parse(&["--tenant", "a", "--job-type", "e", "--rate", "0"]).is_err());
        assert!(parse(&["--tenant", "a", "--job-type", "e", "--pool", "huge"]).is_err());
        let d = parse(&["--tenant", "a", "--job-type", "e"]).unwrap();
        assert_eq!((d.rate, d.resume, d.dry_run), (100, false, false));
    }
}
