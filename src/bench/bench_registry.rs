//! `fairway-bench bench registry`: the tenants registry at scale. Registers `--tenants` tenants
//! in a fresh deployment scope, then measures how long a process takes to load them
//! all, how long a change takes to reach a live view (the poll plus the change feed's
//! read), `--changes` times, and what the view read to follow them. Last line JSON.

use super::Global;
use fairway::config::Tier;
use fairway::core::tenants::TenantRecord;
use fairway::now_ms;
use fairway::ops::tenants::LiveTenants;
use fairway::store::Store;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct RegistryArgs {
    #[arg(long, default_value_t = 10_000)]
    pub tenants: usize,
    #[arg(long, default_value_t = 10)]
    pub changes: usize,
}

pub async fn run(g: &Global, a: RegistryArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("registrybench{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    let cfg = Arc::new(cfg);
    fairway::store::ensure_schema(&cfg).await?;
    let store = Store::open(&cfg).await?;
    let stmts = store.tenant_statements().await?;

    let t = Instant::now();
    let tiers = [Tier::Free, Tier::Standard, Tier::Pro];
    let recs: Vec<TenantRecord> =
        (0..a.tenants).map(|i| TenantRecord::new(&format!("t{i:05}"), tiers[i % 3])).collect();
    for chunk in recs.chunks(1_000) {
        stmts.register(chunk, now_ms()).await?;
    }
    let register_s = t.elapsed().as_secs_f64();
    eprintln!("registered {} tenants in {register_s:.1}s", a.tenants);

    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let t = Instant::now();
    let live = LiveTenants::start(cfg.clone(), &store, stopped).await?;
    let load_ms = t.elapsed().as_millis() as u64;
    anyhow::ensure!(live.current().tenants.len() == a.tenants, "loaded {} tenants", live.current().tenants.len());

    let mut delays = Vec::new();
    let mut changes = live.subscribe();
    for i in 0..a.changes {
        let mut rec = live.current().tenants[&format!("t{:05}", i)].clone();
        rec.max_concurrency = Some(i + 1);
        let t = Instant::now();
        stmts.put(&rec, now_ms()).await?;
        let deadline = t + Duration::from_secs(30);
        loop {
            tokio::time::timeout_at(deadline.into(), changes.changed()).await??;
            let seen = changes.borrow_and_update().tenants[&rec.name].max_concurrency == Some(i + 1);
            if seen {
                break;
            }
        }
        delays.push(t.elapsed().as_millis() as u64);
    }
    delays.sort_unstable();
    let reads = live.reads();
    let load = std::sync::atomic::Ordering::Relaxed;
    let json = serde_json::json!({
        "bench": "registry", "tenants": a.tenants, "register_s": (register_s * 10.0).round() / 10.0,
        "load_ms": load_ms, "change_p50_ms": delays.get(delays.len() / 2), "change_max_ms": delays.last(),
        "poll_interval_ms": cfg.registry.poll_interval.as_millis() as u64,
        "full_reloads": reads.full_reloads.load(load), "rows_read": reads.rows_read.load(load),
        "changes_read": reads.changes_read.load(load),
    });
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}
