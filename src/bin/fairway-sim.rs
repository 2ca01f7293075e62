//! `fairway-sim`: the deterministic fleet simulator's runner (docs/simulation.md), on
//! the shipping pool loop, route and heartbeat loop (`sim::fleet`; built with
//! `--features sim-route`).
//!
//! `fairway-sim --seed S` replays one seed and prints its report (JSON; `--watch-job J`
//! adds job J's row and runs as they changed, and every run of the seed);
//! `fairway-sim --seeds N --budget 60s` runs seeds from `--first` until N or the budget
//! and prints JSON: totals, seeds per second, the coverage table (how many jobs were in
//! each state when each fault began), and every failing seed with its violations;
//! `fairway-sim --hours H --first F` is a long campaign (seeds from F for H hours, a
//! progress line a minute). Exits non-zero when a seed broke an invariant.

use clap::Parser;
use fairway::sim;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "fairway-sim", about = "Deterministic simulation of a fairway fleet from seeds")]
struct Args {
    /// Replay one seed and print its report.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// With --seed: note every change of this job's row and runs in the report.
    #[arg(long, requires = "seed")]
    watch_job: Option<u32>,
    /// Run this many seeds (starting at --first).
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed of a --seeds run.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Stop a --seeds run after this long (e.g. 60s).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    budget: Duration,
    /// A long campaign: run seeds from --first for this many hours (at most 168),
    /// whatever --seeds and --budget say.
    #[arg(long, conflicts_with = "seed", value_parser = parse_hours)]
    hours: Option<f64>,
}

impl Args {
    /// How many seeds, within how long: a campaign's hours, else --seeds and --budget.
    fn campaign(&self) -> (u64, Duration) {
        match self.hours {
            Some(h) => (u64::MAX, Duration::from_secs_f64(h * 3600.0)),
            None => (self.seeds, self.budget),
        }
    }
}

/// Prints one replayed seed's report and exits: non-zero when it broke an invariant.
fn replayed(report: &impl serde::Serialize, kept: bool) -> ! {
    println!("{}", serde_json::to_string_pretty(report).expect("report as JSON"));
    std::process::exit(if kept { 0 } else { 1 });
}

/// Hours of a campaign: a positive number up to a week.
fn parse_hours(s: &str) -> Result<f64, String> {
    let h: f64 = s.parse().map_err(|_| format!("--hours takes a number of hours (e.g. 2 or 0.5), not {s:?}"))?;
    if !(h > 0.0 && h <= 168.0) {
        return Err(format!("--hours must be more than 0 and at most 168 (a week), not {h}"));
    }
    Ok(h)
}

fn main() {
    let args = Args::parse();
    seeds(&args);
}

/// One seed's report, or a summary of many.
fn seeds(args: &Args) -> ! {
    if let Some(seed) = args.seed {
        let report = sim::fleet::run_watching(seed, args.watch_job.map(|j| j as usize));
        replayed(&report, report.violations.is_empty());
    }
    let (count, budget) = args.campaign();
    let (started, mut last_progress) = (Instant::now(), Instant::now());
    let mut sums: BTreeMap<&str, usize> = BTreeMap::new();
    let mut coverage: BTreeMap<String, usize> = BTreeMap::new();
    let mut failing = Vec::new();
    for seed in args.first..args.first.saturating_add(count) {
        if started.elapsed() >= budget {
            break;
        }
        if args.hours.is_some() && last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            let (ran, secs) = (sums.get("seeds").copied().unwrap_or(0), started.elapsed().as_secs_f64());
            eprintln!("{ran} seeds ({}..{seed}), {} failing, {secs:.0} s", args.first, failing.len());
        }
        let r = sim::fleet::run(seed);
        for (k, n) in &r.coverage {
            *coverage.entry(k.clone()).or_default() += n;
        }
        let counts = [
            ("seeds", 1),
            ("jobs", r.jobs),
            ("runs", r.runs),
            ("results", r.results),
            ("jobs_repeated", r.repeated),
            ("partitions", r.partitions),
            ("crashes", r.crashes),
            ("ledger_restarts", r.ledger_restarts),
            ("outages", r.outages),
            ("cuts", r.cuts),
            ("broker_cuts", r.broker_cuts),
            ("dead_letters", r.dead_letters),
            ("relayed", r.relayed),
            ("jobs_with_failed_runs", r.failed_runs),
        ];
        for (k, n) in counts {
            *sums.entry(k).or_default() += n;
        }
        if !r.violations.is_empty() {
            eprintln!(
                "seed {seed} broke {} invariant(s); replay: fairway-sim --seed {seed} (cargo run --features sim-route --bin fairway-sim)",
                r.violations.len()
            );
            failing.push(serde_json::json!({"seed": seed, "violations": r.violations}));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let seeds = sums.get("seeds").copied().unwrap_or(0);
    let out = serde_json::json!({
        "totals": sums,
        "coverage": coverage,
        "seconds": (secs * 100.0).round() / 100.0,
        "seeds_per_sec": (seeds as f64 / secs.max(1e-9) * 10.0).round() / 10.0,
        "failing_seeds": failing.len(),
        "failing": failing,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("summary as JSON"));
    std::process::exit(if failing.is_empty() { 0 } else { 1 });
}
