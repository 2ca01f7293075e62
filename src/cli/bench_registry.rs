//! `fairway bench registry`: the tenants registry at scale. Registers `--tenants` tenants
//! in a fresh deployment scope, then measures how long a process takes to load them
//! all, and how long a change takes to reach a live view (the poll plus the reload of
//! every row), `--changes` times. Last line JSON.

use super::Global;
use fairway::config::Tier;
use fairway::core::tenants::TenantRecord;
use fairway::now_ms;
use fairway::store::Store;
use fairway::tenants::LiveTenants;
use futures::StreamExt;
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
    let adds: Vec<anyhow::Result<bool>> = futures::stream::iter((0..a.tenants).map(|i| {
        let stmts = stmts.clone();
        async move {
            // Lightweight transactions can time out under this burst: retry (an add that
            // did land answers "exists" the second time, which counts as registered).
            let rec = TenantRecord::new(&format!("t{i:05}"), tiers[i % 3]);
            let mut tries = 0;
            loop {
                match stmts.add(&rec, now_ms()).await {
                    Ok(_) => return anyhow::Ok(true),
                    Err(e) if tries >= 4 => return Err(e.into()),
                    Err(_) => tries += 1,
                }
            }
        }
    }))
    .buffer_unordered(16)
    .collect()
    .await;
    let failed = adds.iter().filter(|r| !matches!(r, Ok(true))).count();
    anyhow::ensure!(failed == 0, "{failed} tenants could not be registered");
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
    let json = serde_json::json!({
        "bench": "registry", "tenants": a.tenants, "register_s": (register_s * 10.0).round() / 10.0,
        "load_ms": load_ms, "change_p50_ms": delays.get(delays.len() / 2), "change_max_ms": delays.last(),
        "poll_interval_ms": cfg.registry.poll_interval.as_millis() as u64,
    });
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}
