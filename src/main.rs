//! The `fairway` command: a thin edge over the library (see `cli`). The benchmarks are a
//! binary of their own, `fairway-bench` (src/bench/main.rs).
mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::enter(cli::run(cli))
}
