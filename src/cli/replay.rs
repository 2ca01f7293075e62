//! `fairway replay`: send dead letters (or stuck retry records) back to their pool.

use anyhow::Context;
use fairway::config::Config;
use fairway::core::bounds;
use fairway::core::replay::{derive_id, ReplayFilter, ReplaySource, DEFAULT_MAX_REPLAYS};
use fairway::model::FailureClass;
use fairway::now_ms;
use fairway::ops::replay::{self, Progress, ReplayOptions, ReplayReport, Stopped};
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Topic to read: dlq, retry.app_error, retry.timeout, retry.dependency, retry.worker_crash.
    #[arg(long)]
    pub from: ReplaySource,
    /// Only jobs of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only jobs of this job type.
    #[arg(long = "job-type", alias = "type")]
    pub job_type: Option<String>,
    /// Only this failure class (app_error, timeout, dependency, worker_crash, poison, permanent).
    #[arg(long)]
    pub class: Option<FailureClass>,
    /// Failed at or after: epoch ms, or relative like -1h, -30min, -2d.
    #[arg(long, value_parser = check_time, allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Failed before: epoch ms, or relative like -10min ("now" is allowed).
    #[arg(long, value_parser = check_time, allow_hyphen_values = true)]
    pub until: Option<String>,
    /// Only records whose last error or dead-letter reason contains this text (any case).
    #[arg(long)]
    pub error_contains: Option<String>,
    /// Only this job id (repeatable).
    #[arg(long = "job-id")]
    pub job_ids: Vec<String>,
    /// Count and show a sample of what would be replayed; produce nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Jobs produced per second, e.g. 100 or 100/s.
    #[arg(long, default_value = "100", value_parser = parse_rate)]
    pub rate: u32,
    /// Stop after this many jobs (re-running the same command continues after them).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Replay jobs even if they were already replayed --max-replays times.
    #[arg(long)]
    pub force: bool,
    /// Loop guard: replays of one job allowed without --force.
    #[arg(long, default_value_t = DEFAULT_MAX_REPLAYS)]
    pub max_replays: i32,
    /// Replay id for resuming. Default: derived from --from and the filters, so running
    /// the same command again continues where the last run stopped.
    #[arg(long)]
    pub id: Option<String>,
    /// The scan ends when no record arrived for this long.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
}

pub(super) fn check_time(s: &str) -> Result<String, String> {
    resolve_time(s, now_ms()).map(|_| s.to_string())
}

/// Epoch ms, `now`, or `-<duration>` before `now`: an instant from 1970 to the year 9999
/// (`core::bounds`).
pub(super) fn resolve_time(s: &str, now: i64) -> Result<i64, String> {
    let t = s.trim();
    if t == "now" {
        return Ok(now);
    }
    if let Some(d) = t.strip_prefix('-') {
        if let Ok(d) = humantime::parse_duration(d) {
            return bounds::ago("time", now, d).map_err(|e| format!("{s:?}: {e}"));
        }
    }
    let ms = t
        .parse::<i64>()
        .map_err(|_| format!("{s:?} is neither epoch milliseconds nor a relative time like -1h or -30min"))?;
    bounds::instant("time", ms).map_err(|e| format!("{s:?}: {e}"))
}

pub(super) fn parse_rate(s: &str) -> Result<u32, String> {
    let n = s.trim().strip_suffix("/s").unwrap_or(s.trim());
    match n.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("{s:?}: write a number of jobs per second of at least 1, e.g. 100 or 100/s")),
        Ok(v) => Ok(v),
    }
}

impl ReplayArgs {
    fn options(&self, now: i64) -> anyhow::Result<ReplayOptions> {
        let mut filter = ReplayFilter {
            tenant: self.tenant.clone(),
            job_type: self.job_type.clone(),
            class: self.class,
            since: None,
            until: None,
            error_contains: self.error_contains.clone(),
            job_ids: (!self.job_ids.is_empty()).then(|| self.job_ids.iter().cloned().collect::<HashSet<_>>()),
        };
        // The id uses the times as typed: `--since -1h` names the same replay on every run.
        let mut canonical = filter.canonical();
        for (k, v) in [("since", &self.since), ("until", &self.until)] {
            if let Some(v) = v {
                canonical.push_str(&format!("\u{1f}{k}={}", v.trim()));
            }
        }
        let id = self.id.clone().unwrap_or_else(|| derive_id(self.from, &canonical));
        let t = |v: &Option<String>| v.as_deref().map(|s| resolve_time(s, now)).transpose();
        filter.since = t(&self.since).map_err(anyhow::Error::msg)?;
        filter.until = t(&self.until).map_err(anyhow::Error::msg)?;
        Ok(ReplayOptions {
            source: self.from,
            filter,
            dry_run: self.dry_run,
            rate_per_sec: self.rate,
            limit: self.limit,
            max_scanned: None,
            force: self.force,
            max_replays: self.max_replays,
            id: Some(id),
            idle_timeout: self.idle_timeout,
            stop: None,
            requested_by: format!("the CLI (user {})", std::env::var("USER").unwrap_or_else(|_| "unknown".into())),
        })
    }
}

pub async fn run(cfg: Arc<Config>, a: ReplayArgs) -> anyhow::Result<ExitCode> {
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
    let label = if opts.dry_run { "would replay" } else { "replayed" };
    if live {
        eprintln!(
            "replay {} from {}{}",
            opts.replay_id(),
            replay::source_topic(&cfg, opts.source),
            if opts.dry_run { " (dry run: nothing is produced)" } else { "" }
        );
    }
    let report = replay::run(&cfg, opts, |p: &Progress| {
        if live {
            eprint!(
                "\r  scanned {}  matched {}  {label} {}  skipped {}  partitions {}/{} done  {:.1}s   ",
                p.scanned,
                p.matched,
                p.replayed,
                p.skipped,
                p.partitions_done,
                p.partitions,
                p.elapsed.as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    })
    .await;
    ctrl_c.abort();
    if live {
        eprintln!();
    }
    let report = report.context("replay failed")?;
    print_report(&report, &a);
    Ok(if report.stopped == Stopped::Interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

fn print_report(r: &ReplayReport, a: &ReplayArgs) {
    let s = &r.skipped;
    println!("replay {} from {}{}", r.replay_id, r.topic, if r.dry_run { " (dry run)" } else { "" });
    println!("  scanned       {}", r.scanned);
    println!("  matched       {}", r.matched);
    if r.dry_run {
        println!("  would replay  {}", r.would_replay);
    } else {
        println!("  replayed      {}", r.replayed);
    }
    println!(
        "  skipped       {} (other tenants {}, filter {}, loop guard {}, undecodable {}, duplicate {}, expired {})",
        s.total(),
        s.other_tenants,
        s.filter,
        s.loop_guard,
        s.undecodable,
        s.duplicate,
        s.expired
    );
    println!(
        "  ended         {} after {:.1}s ({:.1}s of it waiting for more records)",
        r.stopped.describe(),
        r.elapsed.as_secs_f64(),
        (r.elapsed.saturating_sub(r.active)).as_secs_f64()
    );
    let limit = if r.dry_run { "dry run: not rate limited".to_string() } else { format!("--rate {}/s", a.rate) };
    println!("  rate          {:.1} jobs/s over {:.1}s ({limit})", r.rate(), r.active.as_secs_f64());
    if !r.resumed_from.is_empty() {
        let parts: Vec<String> = r.resumed_from.iter().map(|(p, o)| format!("{p}@{o}")).collect();
        println!("  resumed from  partition@offset {}", parts.join(" "));
    }
    if r.dry_run && !r.sample.is_empty() {
        println!();
        println!(
            "  {:<36}  {:<12}  {:<14}  {:<12}  {:>8}  {:>7}  {:<11}  LAST ERROR",
            "JOB ID", "TENANT", "JOB TYPE", "CLASS", "ATTEMPTS", "REPLAYS", "DECISION"
        );
        for row in &r.sample {
            println!(
                "  {:<36}  {:<12}  {:<14}  {:<12}  {:>8}  {:>7}  {:<11}  {}",
                row.job_id,
                row.tenant,
                row.job_type,
                row.class.map(|c| c.as_str()).unwrap_or("-"),
                row.attempts,
                row.replay_count,
                row.decision,
                row.last_error.replace('\n', " ")
            );
        }
        if r.matched > r.sample.len() as u64 {
            println!("  ... {} more", r.matched - r.sample.len() as u64);
        }
    }
    if s.loop_guard > 0 {
        println!();
        println!(
            "loop guard: {} job(s) were not replayed, having been replayed {} or more times already, e.g. {}",
            s.loop_guard,
            a.max_replays,
            r.refused.join(", ")
        );
        let ids: Vec<String> = r.refused.iter().map(|i| format!("--job-id {i}")).collect();
        println!("  after fixing the cause: fairway replay --from {} --force {}", r.source, ids.join(" "));
    }
    for w in r.operator_notes.iter().chain(&r.warnings) {
        println!("warning: {w}");
    }
    match r.stopped {
        Stopped::Limit | Stopped::ScanLimit | Stopped::Interrupted if !r.dry_run => {
            println!("run the same command again to continue (replay id {})", r.replay_id)
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: ReplayArgs,
    }

    fn parse(args: &[&str]) -> Result<ReplayArgs, clap::Error> {
        T::try_parse_from(std::iter::once("fairway-replay").chain(args.iter().copied())).map(|t| t.a)
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--from",
            "retry.timeout",
            "--tenant",
            "acme",
            "--class",
            "timeout",
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
        ])
        .unwrap();
        assert_eq!(a.from, ReplaySource::Retry(FailureClass::Timeout));
        assert_eq!(a.rate, 20);
        let o = a.options(10_000_000).unwrap();
        assert_eq!(o.filter.since, Some(10_000_000 - 3_600_000));
        assert_eq!(o.filter.until, Some(10_000_000));
        assert_eq!(o.filter.job_ids.as_ref().map(|s| s.len()), Some(2));
        assert!(o.dry_run && o.limit == Some(5) && o.max_replays == 3);
        // Relative times keep naming the same replay.
        assert_eq!(o.id, a.options(99_000_000).unwrap().id);
        assert!(parse(&["--from", "dlq", "--rate", "0"]).is_err());
        assert!(parse(&["--from", "retry.poison"]).is_err());
        assert!(parse(&["--from", "dlq", "--since", "yesterday"]).is_err());
        assert_eq!(parse(&["--from", "dlq"]).unwrap().rate, 100);
    }

    #[test]
    fn times() {
        assert_eq!(resolve_time("1700000000000", 5), Ok(1_700_000_000_000));
        assert_eq!(resolve_time("-30min", 3_600_000), Ok(1_800_000));
        assert_eq!(resolve_time("now", 7), Ok(7));
        assert!(resolve_time("-1 fortnight", 7).is_err());
        // Outside 1970 to 9999, or a duration that would wrap: refused with the range.
        for t in ["-2h", "-1000000000years", "9223372036854775807", "-5"] {
            let e = resolve_time(t, 1_000).unwrap_err();
            assert!(e.contains("253402300799999"), "{t}: {e}");
        }
    }
}
