//! `fairway bench throughput`: end-to-end no-op jobs on the local services; prints
//! jobs/s and latency percentiles (submit -> terminal result), last line JSON.

use super::Global;
use anyhow::Context;
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::Pool;
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use fairway::{codec, now_ms};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchKind,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchKind {
    /// No-op jobs end to end: jobs/s and latency percentiles.
    Throughput(ThroughputArgs),
}

#[derive(clap::Args, Debug)]
pub struct ThroughputArgs {
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    /// In-process worker members.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Slots of the short pool per worker.
    #[arg(long, default_value_t = 256)]
    pub slots: usize,
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

pub async fn run(g: &Global, a: BenchArgs) -> anyhow::Result<ExitCode> {
    match a.what {
        BenchKind::Throughput(t) => throughput(g, t).await,
    }
}

async fn throughput(g: &Global, a: ThroughputArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("bench{}.", now_ms());
    cfg.kafka.group_prefix = format!("{}workers.", cfg.kafka.topic_prefix);
    cfg.kafka.partitions = a.partitions;
    cfg.scylla.keyspace = "fairway_bench".into();
    if let Some(p) = cfg.pools.get_mut(&Pool::Short) {
        p.slots = a.slots;
    }
    let cfg = Arc::new(cfg);
    kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    let reader = kafka::reader(&cfg, &format!("{}bench-results", cfg.kafka.topic_prefix), false)?;
    reader.subscribe(&[&cfg.results_topic()])?;
    let registry = Registry::from_config(&cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let mut workers = Vec::new();
    for _ in 0..a.workers.max(1) {
        workers.push(Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), Policy::Fair).await?);
    }
    for w in &workers {
        w.wait_assigned(Duration::from_secs(60)).await;
    }
    let sub = Submitter::new(cfg.clone(), None)?;
    let tenants: Vec<String> = cfg.tenants.keys().cloned().collect();
    let jobs: Vec<NewJob> = (0..a.jobs)
        .map(|i| NewJob { tenant: tenants[i % tenants.len()].clone(), job_type: "echo".into(), ..Default::default() })
        .collect();
    let t0 = Instant::now();
    let submit = async {
        for chunk in jobs.chunks(2000) {
            for r in futures::future::join_all(chunk.iter().map(|j| sub.submit(j))).await {
                r?;
            }
        }
        anyhow::Ok(t0.elapsed())
    };
    let collect = async {
        let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        let mut seen = std::collections::HashSet::new();
        let deadline = Instant::now() + a.timeout;
        while seen.len() < a.jobs && Instant::now() < deadline {
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await {
                if let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) {
                    if seen.insert(r.job_id) {
                        let _ = hist.record((r.finished_at - r.submitted_at).max(0) as u64);
                    }
                }
            }
        }
        (seen.len(), hist, t0.elapsed())
    };
    let (submitted, (done, hist, elapsed)) = tokio::join!(submit, collect);
    let submit_time = submitted?;
    for w in workers {
        w.stop().await;
    }
    let rate = done as f64 / elapsed.as_secs_f64();
    println!("jobs {done}/{}  workers {}  slots {}  partitions {}", a.jobs, a.workers, a.slots, a.partitions);
    println!("submitted in {:.2}s ({:.0}/s)", submit_time.as_secs_f64(), a.jobs as f64 / submit_time.as_secs_f64());
    println!("end to end: {:.0} jobs/s over {:.2}s", rate, elapsed.as_secs_f64());
    println!(
        "latency ms: p50 {}  p90 {}  p99 {}  max {}",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.9),
        hist.value_at_quantile(0.99),
        hist.max()
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "throughput", "jobs": done, "jobs_per_sec": rate.round(),
            "p50_ms": hist.value_at_quantile(0.5), "p99_ms": hist.value_at_quantile(0.99), "max_ms": hist.max(),
        })
    );
    Ok(if done == a.jobs { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
