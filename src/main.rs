//! The `fairway` command: a thin edge over the library (see `cli`).
mod cli;

/// mimalloc instead of glibc's malloc: the hot path allocates per job (records, futures,
/// librdkafka's messages) and glibc's free lists cost ~17 % of the CPU per job.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
