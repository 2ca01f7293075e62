//! Command-line interface. Each subcommand lives in its own file; this one holds the
//! shared options (config file, broker and CQL overrides), the dispatch and the process
//! set-up around it ([`enter`]). Both binaries are built on it: `fairway` (src/main.rs)
//! and `fairway-bench` (src/bench/main.rs: this plus the benchmarks).

mod demo;
mod dr;
mod keys;
pub(crate) mod ops;
mod region;
mod replay;
mod rerun;
mod schedules;
mod serve;
mod stats;
mod tenants;
mod usage;
mod watch;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fairway::config::Config;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// mimalloc instead of glibc's malloc: the hot path allocates per job (records, futures,
/// librdkafka's messages) and glibc's free lists cost ~17 % of the CPU per job.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "fairway", version, about = "Multi-tenant job processing on Kafka and ScyllaDB, fair in worker time")]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Global {
    /// Configuration file (TOML). Without it the bundled fairway.toml is used.
    #[arg(long, global = true, env = "FAIRWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers (overrides kafka.brokers).
    #[arg(long, global = true, env = "FAIRWAY_BROKERS")]
    pub brokers: Option<String>,
    /// CQL contact points, comma separated (overrides scylla.contact_points).
    #[arg(long, global = true, env = "FAIRWAY_CQL")]
    pub cql: Option<String>,
    /// Keyspace (overrides scylla.keyspace).
    #[arg(long, global = true, env = "FAIRWAY_KEYSPACE")]
    pub keyspace: Option<String>,
    /// Topic prefix (overrides kafka.topic_prefix).
    #[arg(long, global = true, env = "FAIRWAY_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
}

impl Global {
    pub fn load(&self) -> anyhow::Result<Arc<Config>> {
        let mut cfg = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::builtin(),
        };
        if let Some(b) = &self.brokers {
            cfg.kafka.brokers = b.clone();
        }
        if let Some(c) = &self.cql {
            cfg.scylla.contact_points = c.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        }
        if let Some(k) = &self.keyspace {
            cfg.scylla.keyspace = k.clone();
        }
        if let Some(t) = &self.topic_prefix {
            cfg.kafka.topic_prefix = t.clone();
        }
        // FAIRWAY_KAFKA_<NAME> client properties and FAIRWAY_SCYLLA_* credentials.
        cfg.apply_env(std::env::vars());
        cfg.validate().context("after applying command-line and environment overrides")?;
        Ok(Arc::new(cfg))
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create the topics and the keyspace/tables (idempotent).
    Init,
    /// Submit one job from flags, or many from NDJSON.
    Submit(ops::SubmitArgs),
    /// Run a worker for one or more pools until Ctrl-C.
    Worker(ops::WorkerArgs),
    /// Show a job's state.
    Status(ops::StatusArgs),
    /// Request cooperative cancellation of a job.
    Cancel(ops::CancelArgs),
    /// Print decoded records from the results topic.
    Results(ops::ResultsArgs),
    /// Run the demo: local services, workers, a mixed multi-tenant workload, a summary.
    Demo(demo::DemoArgs),
    /// Send dead letters (or retry records) back to their pool: filters, dry run, rate limit, resumable.
    Replay(replay::ReplayArgs),
    Rerun(rerun::RerunArgs),
    /// Serve the HTTP API (submit, status, cancel, /metrics) until Ctrl-C.
    Serve(serve::ServeArgs),
    /// Fleet-wide scheduling state per pool and tenant: backlog, running, share vs entitlement, why jobs wait.
    Stats(stats::StatsArgs),
    /// `stats` as a live view, redrawn every --interval until Ctrl-C.
    Top(stats::TopArgs),
    /// The live tenants registry: add, set, list, suspend, resume, remove.
    Tenants(tenants::TenantsArgs),
    /// Recurring schedules per tenant: add, set, list (next fire times), pause, resume, remove.
    Schedules(schedules::SchedulesArgs),
    /// HTTP API keys: create (per tenant or admin), list, revoke.
    Keys(keys::KeysArgs),
    /// The usage ledger: a tenant's usage per hour or day, or every tenant's of a month (NDJSON or CSV).
    Usage(usage::UsageArgs),
    /// A consistent online copy of the control plane, unfinished jobs, DLQ/retry records and recent results, to a directory.
    Backup(dr::BackupArgs),
    /// Restore a backup onto an empty Kafka cluster and keyspace (idempotent).
    Restore(dr::RestoreArgs),
    /// This region's state for its API: status, up, draining (503 to submissions), down.
    Region(region::RegionArgs),
}

/// How long the exit waits for blocking work the command left running.
const SHUTDOWN_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `work` (a parsed command) as the process: logging to stderr (`FAIRWAY_LOG`),
/// span export around the async runtime, errors printed; the exit code.
pub fn enter(work: impl Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FAIRWAY_LOG").unwrap_or_else(|_| "warn,fairway=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // Span export (off unless OTEL_EXPORTER_OTLP_ENDPOINT is set) starts before the
    // runtime and flushes after it: its HTTP client blocks, on its own thread.
    let spans = match fairway::observe::telemetry::init() {
        Ok(spans) => spans,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Blocking work still running (a consumer closing towards a broker it cannot
    // reach) does not hold the exit past this.
    rt.shutdown_timeout(SHUTDOWN_WITHIN);
    if let Some(spans) = spans {
        spans.shutdown();
    }
    code
}

/// Runs one `fairway` subcommand.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let g = cli.global;
    match cli.cmd {
        Cmd::Init => ops::init(&*g.load()?).await,
        Cmd::Submit(a) => ops::submit(&g.load()?, a).await,
        Cmd::Worker(a) => ops::worker(g.load()?, a).await,
        Cmd::Status(a) => ops::status(&*g.load()?, a).await,
        Cmd::Cancel(a) => ops::cancel(&*g.load()?, a).await,
        Cmd::Results(a) => ops::results(&*g.load()?, a).await,
        Cmd::Demo(a) => demo::run(&g, a).await,
        Cmd::Replay(a) => replay::run(g.load()?, a).await,
        Cmd::Rerun(a) => rerun::run(g.load()?, a).await,
        Cmd::Serve(a) => serve::run(g.load()?, a).await,
        Cmd::Keys(a) => keys::run(&*g.load()?, a).await,
        Cmd::Stats(a) => stats::stats(g.load()?, a).await,
        Cmd::Top(a) => stats::top(g.load()?, a).await,
        Cmd::Tenants(a) => tenants::run(&*g.load()?, a).await,
        Cmd::Schedules(a) => schedules::run(&*g.load()?, a).await,
        Cmd::Usage(a) => usage::run(&*g.load()?, a).await,
        Cmd::Backup(a) => dr::backup(&*g.load()?, a).await,
        Cmd::Restore(a) => dr::restore(&*g.load()?, a).await,
        Cmd::Region(a) => region::run(&*g.load()?, a).await,
    }
}
