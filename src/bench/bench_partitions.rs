//! `fairway-bench bench partitions`: what a network partition costs. For each kind asked
//! (`--kinds broker:60s,store:5s,...`) a fresh lab (`fairway::netlab`: a network
//! namespace, veth pairs, its own Apache Kafka broker and a TCP forwarder in front of the local database)
//! runs two workers, one cut off for that long while sleep jobs run; counted per kind:
//! jobs stuck and lost, duplicate results, jobs run twice and on two workers at once,
//! time to recover after the link returned, the cut-off worker's exits and producer
//! rebuilds, and probe jobs over every partition afterwards. One JSON line per kind, then a summary line. Needs root and `ip`.

use super::Global;
use anyhow::Context;
use fairway::netlab::scenario::{self, Cut, Plan};
use fairway::netlab::{Lab, LabSetup, Link};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct PartitionsArgs {
    /// Partitions to run, comma separated: LINKS:DURATION, LINKS one of broker, store,
    /// both (e.g. `broker:5s,broker:60s,store:60s,both:30s`).
    #[arg(long, value_delimiter = ',', default_value = "broker:5s,broker:30s,store:5s,store:30s,both:30s")]
    pub kinds: Vec<String>,
    #[arg(long, default_value_t = 3_000)]
    pub jobs: usize,
    #[arg(long, default_value_t = 300)]
    pub job_ms: u64,
    /// Share of the jobs finished when the cut starts.
    #[arg(long, default_value_t = 0.1)]
    pub cut_after: f64,
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    pub store_outage_limit: Duration,
    #[arg(long, default_value_t = 32)]
    pub slots: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Most time per kind from the first submission until every job has a result.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// `scripts/services`: it runs the lab's own Apache Kafka broker.
    #[arg(long, default_value = "scripts/services")]
    pub services: PathBuf,
    /// The CQL database the lab's forwarder fronts (the local Cassandra).
    #[arg(long, env = "FAIRWAY_CQL", default_value = "127.0.0.1:19042")]
    pub cql: String,
}

/// `broker:30s` -> (links, duration), naming the field and the fix on bad input.
fn parse_kind(s: &str) -> anyhow::Result<(Vec<Link>, Duration)> {
    let (links, d) =
        s.split_once(':').with_context(|| format!("--kinds: {s:?} is not LINKS:DURATION, e.g. broker:30s"))?;
    let links = match links {
        "broker" => vec![Link::Broker],
        "store" => vec![Link::Store],
        "both" => vec![Link::Broker, Link::Store],
        other => anyhow::bail!("--kinds: unknown link {other:?} in {s:?}; use broker, store or both"),
    };
    let d = humantime::parse_duration(d).with_context(|| format!("--kinds: bad duration in {s:?}, e.g. 30s"))?;
    Ok((links, d))
}

pub async fn run(g: &Global, a: PartitionsArgs) -> anyhow::Result<ExitCode> {
    let kinds: Vec<(Vec<Link>, Duration)> = a.kinds.iter().map(|k| parse_kind(k)).collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        a.services.exists(),
        "--services: no {} (run from the repository, or give its path)",
        a.services.display()
    );
    let base = g.load()?;
    let mut reports = Vec::new();
    for (links, cut_for) in kinds {
        let dir = std::env::temp_dir().join(format!("fairway-partitions-{}-{}", fairway::now_ms(), std::process::id()));
        let setup = LabSetup {
            services: a.services.clone(),
            fairway: std::env::current_exe().context("locating the fairway binary")?,
            cql: a.cql.clone(),
            dir: dir.clone(),
        };
        let plan = Plan {
            jobs: a.jobs,
            job_ms: a.job_ms,
            cuts: vec![Cut { links, duration: cut_for }],
            cut_after: a.cut_after,
            cut_delay: std::time::Duration::ZERO,
            session_timeout: a.session_timeout,
            slots: a.slots,
            partitions: a.partitions,
            keyspace: format!("{}_partitions", base.scylla.keyspace),
            store_outage_limit: a.store_outage_limit,
            timeout: a.timeout,
            probes: 60,
        };
        let mut lab = Lab::start(&setup)?;
        let phases = scenario::run(&mut lab, &plan).await;
        drop(lab);
        let report = phases?.pop().context("the scenario ran no phase")?;
        let line = serde_json::to_value(&report)?;
        println!("{line}");
        if report.fine() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            eprintln!("partitions: kept the lab's logs in {}", dir.display());
        }
        reports.push(line);
    }
    let ok = reports.iter().all(|r| r["lost"] == 0 && r["stuck"] == 0 && r["probes_finished"] == r["probes"]);
    println!("{}", serde_json::json!({ "bench": "partitions", "ok": ok, "kinds": reports }));
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
