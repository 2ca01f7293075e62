//! `fairway-bench bench limits`: limits never silent, at the seeds' scale. In a fresh
//! deployment scope on the local store, `--tenants` paying tenants are refused by
//! `--processes` front-door processes (two codes each: their rate and its 80 % mark) while
//! `--free` free accounts are refused beside them; each process counts its marks as the
//! front door does (`core::refusals::OwnRefusals`, its per-class budgets) and writes them.
//! Then measured: the leader's read of the hour (rows kept per class, time), one
//! limit-alerts step over it (openings, time, pairs tracked), a second step with nothing
//! new (no opening), and the dependency breaker's sum of a minute of outcome cells of the
//! same tenants (every tenant's job type needing one dependency, half of them failing on
//! it). Every paying tenant must get both its alerts however many free accounts are
//! refused. Last line JSON.

use super::Global;
use fairway::core::admission::breaker::ScopeCounts;
use fairway::core::dependency::{self as deps, Breaker, Cell, DependencyConfig};
use fairway::core::refusals::{Class, HourTotals, LimitAlerts, LimitChange, OwnRefusals, HOUR_MS};
use fairway::now_ms;
use fairway::store::Store;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args, Debug, Clone)]
pub struct LimitsArgs {
    #[arg(long, default_value_t = 10_000)]
    pub tenants: usize,
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// Free accounts refused beside them (each once, on every process).
    #[arg(long, default_value_t = 100_000)]
    pub free: usize,
}

pub async fn run(g: &Global, a: LimitsArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=200_000).contains(&a.tenants), "--tenants must be 1 to 200000");
    anyhow::ensure!((1..=64).contains(&a.processes), "--processes must be 1 to 64");
    anyhow::ensure!(a.free <= 1_000_000, "--free must be at most 1000000");
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("limitsbench{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    let cfg = Arc::new(cfg);
    fairway::store::ensure_schema(&cfg).await?;
    let store = Store::open(&cfg).await?;
    let stmts = store.refusal_statements().await?;
    let now = now_ms();
    let hour = now - now.rem_euclid(HOUR_MS);

    let t = Instant::now();
    let mut untracked = 0usize;
    for p in 0..a.processes {
        let mut own = OwnRefusals::default();
        for i in 0..a.free {
            untracked +=
                own.record(&format!("free-{i:07}"), Class::Free, "refused:tenant_rate:short", 1, now).is_err() as usize;
        }
        for i in (0..a.tenants).filter(|i| i % a.processes == p || i % 7 == 0) {
            for (code, n) in [("refused:tenant_rate:short", 3), ("near:tenant_rate:short", 10)] {
                untracked += own.record(&format!("t{i:06}"), Class::Paying, code, n, now).is_err() as usize;
            }
        }
        let cells = own.pending();
        for chunk in cells.chunks(2_000) {
            stmts.put_cells(&format!("bench-{p}"), chunk).await?;
        }
    }
    let write_s = t.elapsed().as_secs_f64();
    let class_of = |t: &str| if t.starts_with("free-") { Class::Free } else { Class::Paying };

    let t = Instant::now();
    let read = stmts.hour(hour, 1_000_000, class_of).await?;
    let read_ms = t.elapsed().as_millis() as u64;
    let mut totals: HourTotals = HashMap::new();
    for c in &read.cells {
        *totals.entry((c.tenant.clone(), c.code.clone())).or_default() += c.n;
    }
    let mut alerts = LimitAlerts::new(100_000);
    let t = Instant::now();
    let first = alerts.step(&[(hour, totals.clone())], 5, now, class_of);
    let step_ms = t.elapsed().as_secs_f64() * 1000.0;
    let opened_paying = first
        .iter()
        .filter(|c| matches!(c, LimitChange::Opened { tenant, .. } if !tenant.starts_with("free-")))
        .count();
    let opened_free = first.iter().filter(|c| matches!(c, LimitChange::Opened { .. })).count() - opened_paying;
    let again = alerts.step(&[(hour, totals)], 5, now + 60_000, class_of);
    let reopened = again.iter().filter(|c| matches!(c, LimitChange::Opened { .. })).count();

    let (dep_ms, opened_dep) = dependency_sum(a.tenants, now);
    let out = serde_json::json!({
        "bench": "limits",
        "tenants": a.tenants,
        "processes": a.processes,
        "free_accounts": a.free,
        "write_s": write_s,
        "marks_untracked": untracked,
        "hour_rows_kept": read.cells.len(),
        "hour_rows_dropped_free": read.dropped[0],
        "hour_rows_dropped_paying": read.dropped[1],
        "hour_read_ms": read_ms,
        "limit_step_ms": step_ms,
        "alerts_opened_paying": opened_paying,
        "alerts_opened_free": opened_free,
        "alerts_opened_again": reopened,
        "pairs_tracked": alerts.len(),
        "dependency_cells": a.tenants * 6,
        "dependency_sum_ms": dep_ms,
        "dependency_opened": opened_dep,
    });
    eprintln!("{}", serde_json::to_string_pretty(&out)?);
    println!("{out}");
    anyhow::ensure!(
        opened_paying == 2 * a.tenants,
        "{opened_paying} alerts opened for {} paying tenants x 2 codes beside {} free accounts",
        a.tenants,
        a.free
    );
    anyhow::ensure!(reopened == 0, "{reopened} opened again with nothing new");
    Ok(ExitCode::SUCCESS)
}

/// Sums six 10 s buckets of one cell per tenant (half failing on `payments`) and steps
/// its breaker: (time in ms, whether it opened).
fn dependency_sum(tenants: usize, now: i64) -> (f64, bool) {
    let names: Vec<String> = (0..tenants).map(|i| format!("t{i:06}")).collect();
    let needs = vec!["payments".to_string()];
    let cells: Vec<Cell<'_>> = (0..6)
        .flat_map(|b| {
            names.iter().enumerate().map(move |(i, t)| Cell {
                bucket: now - now.rem_euclid(10_000) - b * 10_000,
                job_type: "charge",
                tenant: t,
                attempts: 10,
                dependency: if i % 2 == 0 { 10 } else { 0 },
            })
        })
        .collect();
    let t = Instant::now();
    let sums = deps::window_counts(cells, |_| needs.as_slice(), now, 60_000, |_| i64::MIN);
    let mut b = Breaker::default();
    let sc: Option<&ScopeCounts> = sums.get("payments");
    let opened = b.step(sc, &DependencyConfig::default(), now).is_some();
    (t.elapsed().as_secs_f64() * 1000.0, opened)
}
