//! Fleet-wide limits, the exchange (one task per pool of a worker): every
//! [`PASS_INTERVAL`] it reads the pool's rows of the `quotas` table, lets
//! `core::quota::Quotas` (shared with the pool loop, which reports its demand into it
//! and applies the caps it yields) recompute this worker's caps, and writes this
//! worker's rows back with a short TTL. A failed read or write leaves the caps as they
//! are until they go stale (`core::quota::STALE_MS`): then nothing of a limited scope
//! starts here until the store answers again.
//!
//! The same pass exchanges the failure counts of `core::fleet_counts` (`fleet_counts`
//! table): it reads the pool's count rows into the retry budgets and poison detectors
//! of `Health`, then writes this worker's presence, its changed budget counts and its
//! poison windows.

use super::Shared;
use crate::core::fleet_counts::{self, CountRow};
use crate::core::quota::ROW_TTL_SECS;
use crate::store::QuotaStatements;
use crate::{metrics as m, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a worker exchanges its quota rows (per pool).
pub const PASS_INTERVAL: Duration = Duration::from_millis(500);

pub async fn quota_loop(sh: Arc<Shared>, store: crate::store::Store, mut shutdown: watch::Receiver<bool>) {
    let key = sh.route.cfg.pool_topic(sh.route.pool);
    let mut stmts: Option<QuotaStatements> = None;
    let mut tick = tokio::time::interval(PASS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
        }
        if stmts.is_none() {
            stmts = store.quota_statements().await.map_err(|e| failed(&sh, "prepare", &e)).ok();
        }
        let Some(st) = &stmts else { continue };
        if !sh.quotas.lock().expect("quotas lock").is_empty() {
            if let Err(e) = pass(&sh, st, &key).await {
                failed(&sh, "exchange", &e);
            }
        }
        if let Err(e) = counts_pass(&sh, st, &key).await {
            failed(&sh, "counts", &e);
        }
    }
}

/// One read-plan-write round.
async fn pass(sh: &Shared, st: &QuotaStatements, key: &str) -> Result<(), crate::store::StoreError> {
    let rows = st.rows(key).await?;
    let planned = sh.quotas.lock().expect("quotas lock").plan(&rows, &sh.route.worker_id, now_ms());
    tracing::debug!(pool = sh.route.pool.as_str(), read = ?rows, written = ?planned, "quota exchange");
    st.put(key, &planned, ROW_TTL_SECS).await?;
    sh.quotas.lock().expect("quotas lock").written(&planned, now_ms());
    Ok(())
}

/// One read-then-write round of the failure counts (`core::fleet_counts`).
async fn counts_pass(sh: &Shared, st: &QuotaStatements, key: &str) -> Result<(), crate::store::StoreError> {
    let rows = st.counts(key).await?;
    let now = now_ms();
    let mine = {
        let mut h = sh.route.health.lock().expect("health lock");
        if let Some(f) = h.budget.fleet_mut() {
            f.read(&rows, now);
        }
        for (job_type, q) in h.poison.set_fleet(fleet_counts::poison_counts(&rows, &sh.route.worker_id), now) {
            tracing::warn!(job_type, quarantined = q, "poison quarantine changed (the pool's outcomes)");
        }
        let mut mine = vec![fleet_counts::presence(&sh.route.worker_id, now)];
        mine.extend(h.budget.fleet_rows(now));
        mine.extend(fleet_counts::poison_rows(&h.poison.own_counts(now), &sh.route.worker_id, now));
        mine
    };
    let cfg = &sh.route.cfg.worker;
    let secs = |ms: i64| (ms / 1000).clamp(60, 86_400) as i32;
    let (budget_ttl, poison_ttl) = (secs(cfg.retry_budget.window.0.saturating_mul(3)), secs(cfg.poison.window.0));
    let ttl = |r: &CountRow| match r.scope.split_once(':') {
        Some(("retry", _)) => budget_ttl,
        Some(("poison", _)) => poison_ttl,
        _ => ROW_TTL_SECS,
    };
    if let Err(e) = st.put_counts(key, &mine, ttl).await {
        if let Some(f) = sh.route.health.lock().expect("health lock").budget.fleet_mut() {
            f.unwritten(&mine);
        }
        return Err(e);
    }
    Ok(())
}

fn failed(sh: &Shared, step: &'static str, e: &dyn std::fmt::Display) {
    tracing::warn!(pool = sh.route.pool.as_str(), step, error = %e, "fleet-wide limits: exchange failed; limited jobs wait here once the caps go stale");
    metrics::counter!(m::QUOTA_PASS_FAILURES, "pool" => sh.route.pool.as_str(), "step" => step).increment(1);
}
