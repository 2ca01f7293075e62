//! `fairway stats` and `fairway top`: the fleet's scheduling state per pool and tenant,
//! merged from the snapshots every live worker publishes to `worker_stats` every few
//! seconds (see `worker::usage`): backlog, running jobs, slot-seconds used, actual versus
//! entitled share of the pool, and why a tenant's next job waits.

use fairway::config::Config;
use fairway::core::fleet::{FleetStats, TenantSummary};
use fairway::model::Pool;
use fairway::store::{FleetStatements, Store};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Snapshots older than this are left out (workers refresh theirs every few seconds and
/// the rows expire on their own shortly after a worker stops).
const MAX_AGE_MS: i64 = fairway::worker::usage::STATS_TTL_SECS as i64 * 1000;

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Print JSON (every tenant the live workers report: queued, running or recently served).
    #[arg(long)]
    pub json: bool,
    /// Only this pool (short, medium, long).
    #[arg(long)]
    pub pool: Option<Pool>,
    /// Also list idle tenants in the table.
    #[arg(long)]
    pub all: bool,
}

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Redraw period.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Only this pool (short, medium, long).
    #[arg(long)]
    pub pool: Option<Pool>,
    /// Also list idle tenants.
    #[arg(long)]
    pub all: bool,
}

pub async fn stats(cfg: Arc<Config>, a: StatsArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(&cfg).await?;
    let st = store.fleet_statements().await?;
    let f = gather(&cfg, &st, a.pool).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        print!("{}", render(&f, a.all));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn top(cfg: Arc<Config>, a: TopArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(&cfg).await?;
    let st = store.fleet_statements().await?;
    let interval = a.interval.max(Duration::from_millis(100));
    let tty = std::io::stdout().is_terminal();
    let mut out = std::io::stdout();
    if tty {
        // Alternate screen, so the terminal's content comes back on exit.
        write!(out, "\x1b[?1049h")?;
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let body = match gather(&cfg, &st, a.pool).await {
            Ok(f) => render(&f, a.all),
            // The store may be briefly unreachable: keep trying rather than exit.
            Err(e) => format!("cannot read worker stats: {e:#}\n"),
        };
        let head = format!("fairway top - every {} - Ctrl-C to quit\n\n", humantime::format_duration(interval));
        if tty {
            write!(out, "\x1b[H\x1b[2J{head}{body}")?;
        } else {
            writeln!(out, "{head}{body}")?;
        }
        out.flush()?;
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
    if tty {
        write!(out, "\x1b[?1049l")?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads the live snapshots of the chosen pools (one partition each) and merges them.
async fn gather(cfg: &Config, st: &FleetStatements, only: Option<Pool>) -> anyhow::Result<FleetStats> {
    let pools: Vec<Pool> = match only {
        Some(p) => vec![p],
        None => Pool::ALL.to_vec(),
    };
    Ok(st.fleet(cfg, &pools, MAX_AGE_MS).await?)
}

/// The human view: one line per pool, then one per (pool, tenant).
fn render(f: &FleetStats, all: bool) -> String {
    let mut s = String::new();
    if f.pools.is_empty() {
        let _ = writeln!(s, "no live workers (none reported in the last {} s)", MAX_AGE_MS / 1000);
        for why in &f.skipped {
            let _ = writeln!(s, "  skipped {why}");
        }
        return s;
    }
    let mut pools = vec![row(&[
        "POOL",
        "WORKERS",
        "SLOTS",
        "RUNNING",
        "QUEUED",
        "SPILLED",
        "FREE",
        "IDLE-RESERVED",
        "FAST-LANES BUSY",
        "REGISTRY",
    ])];
    for p in &f.pools {
        let workers =
            if p.fifo_workers > 0 { format!("{} ({} fifo)", p.workers, p.fifo_workers) } else { p.workers.to_string() };
        pools.push(vec![
            p.pool.clone(),
            workers,
            p.slots.to_string(),
            p.running.to_string(),
            p.queued.to_string(),
            p.spilled.to_string(),
            p.free_shared.to_string(),
            p.idle_reserved.to_string(),
            format!("{}/{}", p.running_fast_lane, p.fast_lanes),
            match (p.registry_version, p.registry_version_max) {
                (Some(a), Some(b)) if a != b => format!("v{a}..v{b}"),
                (Some(a), _) => format!("v{a}"),
                _ => "-".into(),
            },
        ]);
    }
    table(&mut s, &pools, 1, false);
    let mut legend: Vec<&String> = Vec::new();
    for p in f.pools.iter().filter(|p| !p.process_enforcement.is_empty()) {
        let _ = writeln!(s, "pool {}: process job limits enforced with {}", p.pool, p.process_enforcement.join(", "));
        legend.extend(p.process_enforcement.iter().filter(|e| !legend.contains(e)).collect::<Vec<_>>());
    }
    for e in legend {
        let _ = writeln!(s, "  {e}: {}", fairway::core::sandbox::explain(e));
    }
    for p in f.pools.iter().filter(|p| p.unassigned_workers > 0) {
        let _ = writeln!(
            s,
            "warning: {} worker(s) of pool {} have owned no partition for up to {} (group {}): a stuck or \
             oversubscribed group, another deployment sharing it, or more workers than partitions",
            p.unassigned_workers,
            p.pool,
            secs(p.unassigned_ms_max as i64),
            p.groups.join(", ")
        );
    }
    s.push('\n');
    let shown: Vec<&TenantSummary> = f.tenants.iter().filter(|t| all || t.is_active()).collect();
    let mut ts = vec![row(&[
        "POOL",
        "TENANT",
        "TIER",
        "BACKLOG",
        "RUNNING",
        "SLOT-S",
        "SHARE",
        "ENTITLED",
        "OLDEST",
        "NEXT JOB WAITS ON",
    ])];
    let mut sorted = shown.clone();
    sorted.sort_by(|a, b| {
        a.pool
            .cmp(&b.pool)
            .then((b.backlog.total + b.running).cmp(&(a.backlog.total + a.running)))
            .then(a.tenant.cmp(&b.tenant))
    });
    for t in sorted {
        ts.push(vec![
            t.pool.clone(),
            t.tenant.clone(),
            t.tier.clone(),
            if t.backlog.spilled > 0 {
                format!("{} ({} spilled)", t.backlog.total, t.backlog.spilled)
            } else {
                t.backlog.total.to_string()
            },
            t.running.to_string(),
            format!("{:.1}", t.slot_seconds_used),
            pct(t.actual_share),
            pct(t.entitled_share),
            t.oldest_wait_ms.map_or("-".into(), secs),
            waits_on(t, f.at),
        ]);
    }
    table(&mut s, &ts, 3, true);
    let hidden = f.tenants.len() - shown.len();
    let _ = write!(s, "\n{} worker snapshot(s)", f.snapshots);
    if hidden > 0 {
        let _ = write!(s, "; {hidden} idle tenant(s) not shown (--all)");
    }
    s.push('\n');
    s
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Pads columns: the first `text_cols` left-aligned, numbers right-aligned, and the last
/// column unpadded free text when `free_last`.
fn table(s: &mut String, rows: &[Vec<String>], text_cols: usize, free_last: bool) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..n).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0)).collect();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let w = widths[i];
            if free_last && i + 1 == r.len() {
                let _ = write!(line, "{c}");
            } else if i < text_cols {
                let _ = write!(line, "{c:<w$}  ");
            } else {
                let _ = write!(line, "{c:>w$}  ");
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn secs(ms: i64) -> String {
    if ms >= 60_000 {
        format!("{:.1}m", ms as f64 / 60_000.0)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// Why the tenant's next job waits, in words (the worker holding most of its backlog
/// decides; other workers' differing reasons are listed after it).
fn waits_on(t: &TenantSummary, now: i64) -> String {
    if t.backlog.total == 0 {
        return "-".into();
    }
    let word = |r: &str| match r {
        "deficit" => "deficit (others are owed slot-time first)".to_string(),
        "concurrency_cap" => "concurrency cap".to_string(),
        "rate_limited" => match t.rate_limited_until {
            Some(u) if u > now => format!("rate limit (next in {})", secs(u - now)),
            _ => "rate limit".to_string(),
        },
        "reserved_slots" => "reserved slots (shared slots busy)".to_string(),
        "suspended" => "suspended (`fairway tenants resume` lets it run)".to_string(),
        "recycling_cap" => match t.recycling_until {
            Some(u) if u > now => {
                format!("recycling cap (its job processes were killed too often; {} left)", secs(u - now))
            }
            _ => "recycling cap (its job processes were killed too often)".to_string(),
        },
        other => other.to_string(),
    };
    let mut out = match &t.wait_reason {
        Some(r) => word(r),
        None => "a free slot (dispatching)".into(),
    };
    let others: Vec<String> = t
        .waits
        .iter()
        .filter(|(r, _)| Some(r.as_str()) != t.wait_reason.as_deref())
        .map(|(r, n)| format!("{} on {n}", r.replace('_', " ")))
        .collect();
    if !others.is_empty() {
        let _ = write!(out, "; also {}", others.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairway::core::fleet::{BacklogSum, PoolSummary};

    #[test]
    fn table_lists_active_tenants_with_their_wait_reason() {
        let t = |tenant: &str, backlog: usize, running: usize, reason: Option<&str>| TenantSummary {
            pool: "short".into(),
            tenant: tenant.into(),
            tier: "pro".into(),
            backlog: BacklogSum { total: backlog, normal: backlog, ..Default::default() },
            running,
            slot_seconds_used: if backlog + running > 0 { 12.5 } else { 0.0 },
            entitled_share: 0.25,
            actual_share: 0.125,
            wait_reason: reason.map(str::to_string),
            waits: reason.map(|r| [(r.to_string(), 1)].into_iter().collect()).unwrap_or_default(),
            oldest_wait_ms: (backlog > 0).then_some(1500),
            ..Default::default()
        };
        let f = FleetStats {
            at: 0,
            snapshots: 2,
            pools: vec![PoolSummary { pool: "short".into(), workers: 2, slots: 32, running: 3, ..Default::default() }],
            tenants: vec![
                t("acme", 4, 1, Some("concurrency_cap")),
                t("idle", 0, 0, None),
                t("globex", 9, 2, Some("deficit")),
            ],
            skipped: vec![],
        };
        let s = render(&f, false);
        assert!(s.contains("concurrency cap"), "{s}");
        assert!(s.contains("deficit"), "{s}");
        assert!(s.contains("12.5%") && s.contains("25.0%"), "{s}");
        assert!(!s.lines().any(|l| l.starts_with("short  idle")), "idle tenants hidden: {s}");
        assert!(s.contains("1 idle tenant(s) not shown"), "{s}");
        let globex = s.lines().position(|l| l.contains("globex")).unwrap();
        let acme = s.lines().position(|l| l.contains("acme")).unwrap();
        assert!(globex < acme, "busiest first: {s}");
        assert!(render(&f, true).lines().any(|l| l.starts_with("short  idle")));
        assert!(render(&FleetStats::default(), false).contains("no live workers"));
    }
}
