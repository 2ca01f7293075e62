//! `fairway-sim`: the deterministic fleet simulator's runner (docs/simulation.md).
//!
//! `fairway-sim --seed S` replays one seed and prints its trace summary (JSON);
//! `fairway-sim --seeds N --budget 60s` runs seeds 0.. until N or the budget and prints
//! JSON: seeds run, seeds per second, the coverage table (how often each fault struck
//! each job state), and every failing seed with its violations and the one-line command
//! that replays it; `fairway-sim --hours H --first F` is a long campaign (seeds from F
//! for H hours, a progress line a minute). With `--route`, the seeds run the shipping
//! pool loop, route and heartbeat loop (`sim::fleet`; `cargo build --features sim-route`)
//! instead of the modelled fleet. Exits non-zero
//! when a seed broke an invariant.

use clap::Parser;
use fairway::sim::{self, Config};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "fairway-sim", about = "Deterministic simulation of a fairway fleet from seeds")]
struct Args {
    /// Replay one seed and print its trace summary.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// With --seed: note every step of this job in the report.
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
    /// Run the seeds on the shipping pool loop, route and heartbeat loop (`sim::fleet`;
    /// built with `--features sim-route`).
    #[cfg(feature = "sim-route")]
    #[arg(long)]
    route: bool,
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
    #[cfg(feature = "sim-route")]
    if args.route {
        route_seeds(&args);
    }
    let cfg = Config::default().watch(args.watch_job);
    if let Some(seed) = args.seed {
        let report = sim::run(seed, &cfg);
        replayed(&report, report.violations.is_empty());
    }
    let (count, budget) = args.campaign();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let (mut ran, mut failing, mut jobs, mut sim_ms) = (0u64, Vec::new(), 0usize, 0i64);
    let mut coverage: BTreeMap<String, u64> = BTreeMap::new();
    // Recoveries summed over the seeds: take-overs, runs fenced, outcomes not durable.
    let (mut takeovers, mut runs_fenced, mut not_durable) = (0usize, 0u64, 0u64);
    for seed in args.first..args.first.saturating_add(count) {
        if started.elapsed() >= budget {
            break;
        }
        let report = sim::run(seed, &cfg);
        ran += 1;
        jobs += report.jobs;
        sim_ms = sim_ms.saturating_add(report.simulated_ms);
        takeovers += report.takeovers;
        runs_fenced += report.runs_fenced;
        not_durable += report.not_durable;
        for (k, n) in &report.coverage {
            *coverage.entry(k.clone()).or_default() += n;
        }
        if args.hours.is_some() && last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            eprintln!(
                "{ran} seeds ({}..={seed}), {} failing, {:.0} s",
                args.first,
                failing.len(),
                started.elapsed().as_secs_f64()
            );
        }
        if !report.violations.is_empty() {
            eprintln!(
                "seed {seed} broke {} invariant(s); replay: {}",
                report.violations.len(),
                report.replay_command()
            );
            failing.push(serde_json::json!({
                "seed": seed,
                "replay": report.replay_command(),
                "violations": report.violations,
            }));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let out = serde_json::json!({
        "seeds": ran,
        "seconds": (secs * 100.0).round() / 100.0,
        "seeds_per_sec": (ran as f64 / secs.max(1e-9) * 10.0).round() / 10.0,
        "jobs": jobs,
        "simulated_seconds": sim_ms / 1000,
        "takeovers": takeovers,
        "runs_fenced": runs_fenced,
        "not_durable": not_durable,
        "coverage": coverage,
        "failing_seeds": failing.len(),
        "failing": failing,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("summary as JSON"));
    std::process::exit(if failing.is_empty() { 0 } else { 1 });
}

/// `--route`: seeds on the shipping route; one seed's report, or a summary of many.
#[cfg(feature = "sim-route")]
fn route_seeds(args: &Args) -> ! {
    if let Some(seed) = args.seed {
        let report = sim::fleet::run_watching(seed, args.watch_job.map(|j| j as usize));
        replayed(&report, report.violations.is_empty());
    }
    let (count, budget) = args.campaign();
    let started = Instant::now();
    let mut sums: BTreeMap<&str, usize> = BTreeMap::new();
    let mut coverage: BTreeMap<String, usize> = BTreeMap::new();
    let mut failing = Vec::new();
    for seed in args.first..args.first.saturating_add(count) {
        if started.elapsed() >= budget {
            break;
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
                "seed {seed} broke {} invariant(s); replay: fairway-sim --route --seed {seed}",
                r.violations.len()
            );
            failing.push(serde_json::json!({"seed": seed, "violations": r.violations}));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let seeds = sums.get("seeds").copied().unwrap_or(0);
    let out = serde_json::json!({
        "route": true,
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
