//! `fairway-sim`: the deterministic fleet simulator's runner (docs/simulation.md).
//!
//! `fairway-sim --seed S` replays one seed and prints its trace summary (JSON);
//! `fairway-sim --seeds N --budget 60s` runs seeds 0.. until N or the budget and prints
//! JSON: seeds run, seeds per second, and every failing seed with its violations and the
//! one-line command that replays it. Exits non-zero when a seed broke an invariant.

use clap::Parser;
use fairway::sim::{self, Config};
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
}

fn main() {
    let args = Args::parse();
    let cfg = Config::default().watch(args.watch_job);
    if let Some(seed) = args.seed {
        let report = sim::run(seed, &cfg);
        println!("{}", serde_json::to_string_pretty(&report).expect("report as JSON"));
        std::process::exit(if report.violations.is_empty() { 0 } else { 1 });
    }
    let started = Instant::now();
    let (mut ran, mut failing, mut jobs, mut sim_ms) = (0u64, Vec::new(), 0usize, 0i64);
    for seed in args.first..args.first.saturating_add(args.seeds) {
        if started.elapsed() >= args.budget {
            break;
        }
        let report = sim::run(seed, &cfg);
        ran += 1;
        jobs += report.jobs;
        sim_ms += report.simulated_ms;
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
        "failing_seeds": failing.len(),
        "failing": failing,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("summary as JSON"));
    std::process::exit(if failing.is_empty() { 0 } else { 1 });
}
