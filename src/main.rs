//! The `fairway` command: a thin edge over the library (see `cli`).
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
