//! `fairway-bench`: the `fairway` command plus `fairway-bench bench ...`, the benchmarks
//! on the local services (numbers in docs/performance.md). A binary of its own, so the
//! production `fairway` (`cargo build --release --bin fairway`, the Docker image) carries
//! none of them. It keeps every `fairway` subcommand (`src/cli/`) because the benches
//! start workers, `fairway serve` and the CQL bridge from their own executable.
//!
//! `cargo build --release --bin fairway-bench`, then e.g.
//! `target/release/fairway-bench bench throughput --jobs 20000`.

#[path = "../cli/mod.rs"]
mod cli;

mod bench;
mod bench_blast;
mod bench_cpu;
mod bench_delayed;
mod bench_faults;
mod bench_fleet;
mod bench_flood;
mod bench_limits;
mod bench_ownership;
mod bench_partitions;
mod bench_process;
mod bench_registry;
mod bench_slo;
mod bench_submit;
mod bench_tenants;

use clap::{Parser, Subcommand};
use cli::Global;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "fairway-bench",
    version,
    about = "fairway's benchmarks on the local services, plus every fairway subcommand"
)]
struct BenchCli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Benchmarks on the local services (end-to-end throughput and latency).
    Bench(bench::BenchArgs),
    #[command(flatten)]
    Fairway(cli::Cmd),
}

fn main() -> ExitCode {
    let BenchCli { global, cmd } = BenchCli::parse();
    cli::enter(async move {
        match cmd {
            BenchCmd::Bench(a) => bench::run(&global, a).await,
            BenchCmd::Fairway(cmd) => cli::run(cli::Cli { global, cmd }).await,
        }
    })
}
