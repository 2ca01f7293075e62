//! `fairway-bench bench process`: no-op jobs of a `handler = "process"` job type end to end
//! on the local services: one child process per job (`--mode one-shot`, `cat` by default:
//! the payload back as the output) or long-lived pooled children (`--mode pooled`,
//! examples/python/pooled.py by default: a word count of the payload); prints jobs/s,
//! latency, and CPU per job of fairway itself and of its children, last line JSON.

use super::bench::{collect_latencies, start_workers, submit_noops};
use super::Global;
use anyhow::Context;
use fairway::config::JobTypeConfig;
use fairway::kafka::{self, Consumer};
use fairway::model::Pool;
use fairway::now_ms;
use fairway::submit::{Payload, Submitter};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct ProcessArgs {
    #[arg(long, default_value_t = 2_000)]
    pub jobs: usize,
    /// Slots of the short pool (children running at once).
    #[arg(long, default_value_t = 32)]
    pub slots: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// `one-shot` (a child per job) or `pooled` (long-lived children, `mode = "pooled"`).
    #[arg(long, default_value = "one-shot")]
    pub mode: Mode,
    /// The job's command (argv, space separated). Default: `cat` one-shot, the pooled
    /// example (`python3 examples/python/pooled.py`) pooled.
    #[arg(long)]
    pub command: Option<String>,
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    OneShot,
    Pooled,
}

const JOB_TYPE: &str = "bench_process_noop";

pub async fn run(g: &Global, a: ProcessArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("benchproc{}.", now_ms());
    cfg.kafka.partitions = a.partitions;
    cfg.scylla.keyspace = "fairway_bench".into();
    if let Some(p) = cfg.pools.get_mut(&Pool::Short) {
        p.slots = a.slots;
    }
    let command = a.command.clone().unwrap_or_else(|| match a.mode {
        Mode::OneShot => "cat".into(),
        // The system's interpreter: one the children's own uids can run (a pyenv under
        // /root is private).
        Mode::Pooled => format!(
            "{} {}/examples/python/pooled.py",
            if std::path::Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" },
            env!("CARGO_MANIFEST_DIR")
        ),
    });
    let argv: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    let mode = if a.mode == Mode::Pooled { "mode = \"pooled\"\n" } else { "" };
    let jt: JobTypeConfig = toml::from_str(&format!(
        "pool = \"short\"\nhandler = \"process\"\ncommand = {}\nenv = [\"PATH\"]\n{mode}",
        serde_json::to_string(&argv)?
    ))?;
    cfg.job_types.insert(JOB_TYPE.into(), jt);
    let cfg = Arc::new(cfg);
    kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let reader = kafka::reader(&cfg, &cfg.group("bench-results"), false)?;
    reader.subscribe(&[&cfg.results_topic()])?;
    let sub = Submitter::new(cfg.clone(), None)?;
    let workers = start_workers(&cfg, 1).await?;
    let (self_before, children_before) = (cpu_secs(libc::RUSAGE_SELF), cpu_secs(libc::RUSAGE_CHILDREN));
    let (t0, payload) = (Instant::now(), Payload::default());
    let (submitted, seen) = tokio::join!(
        submit_noops(&cfg, &sub, (JOB_TYPE, &payload), a.jobs, t0),
        collect_latencies(&reader, a.jobs, a.timeout, t0)
    );
    let (self_used, children_used) =
        (cpu_secs(libc::RUSAGE_SELF) - self_before, cpu_secs(libc::RUSAGE_CHILDREN) - children_before);
    for w in workers {
        w.stop().await;
    }
    let submitted = submitted?;
    let done = seen.done.max(1) as f64;
    let hist = &seen.latency_ms;
    let rate = seen.done as f64 / seen.elapsed.as_secs_f64();
    let enforcement = fairway::handlers::process::Enforcement::current();
    println!(
        "jobs {}/{}  slots {}  mode {:?}  command {:?}  limits enforced with {}",
        seen.done,
        a.jobs,
        a.slots,
        a.mode,
        argv,
        enforcement.name()
    );
    println!(
        "submitted in {:.2}s; end to end {rate:.0} jobs/s; processing {:.0} jobs/s",
        submitted.as_secs_f64(),
        seen.processing_rate()
    );
    // Pooled children still running are not reaped yet: their CPU is not counted.
    let children_ms = (a.mode == Mode::OneShot).then(|| (children_used * 1e6 / done).round() / 1000.0);
    println!("cpu ms per job: fairway {:.3}, children {children_ms:?}", self_used * 1000.0 / done);
    println!(
        "{}",
        serde_json::json!({
            "bench": "process", "mode": if a.mode == Mode::Pooled { "pooled" } else { "one_shot" },
            "jobs": seen.done, "slots": a.slots, "command": argv,
            "enforcement": enforcement.name(),
            "jobs_per_sec": rate.round(), "process_jobs_per_sec": seen.processing_rate().round(),
            "p50_ms": hist.value_at_quantile(0.5), "p99_ms": hist.value_at_quantile(0.99),
            "fairway_cpu_ms_per_job": (self_used * 1e6 / done).round() / 1000.0,
            "children_cpu_ms_per_job": children_ms,
        })
    );
    Ok(if seen.done == a.jobs { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// User + system CPU seconds of this process (`RUSAGE_SELF`) or its reaped children.
fn cpu_secs(who: i32) -> f64 {
    // SAFETY: getrusage fills the struct we pass; zeroed is a valid `rusage`.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(who, &mut r) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(r.ru_utime) + secs(r.ru_stime)
}
