//! Fleet-wide limits, the exchange (one task per pool of a worker): every
//! [`PASS_INTERVAL`] it reads the pool's rows of the `quotas` table, lets
//! `core::quota::Quotas` (shared with the pool loop, which reports its demand into it
//! and applies the caps it yields) recompute this worker's caps, and writes this
//! worker's rows back with a short TTL. A failed read or write leaves the caps as they
//! are until they go stale (`core::quota::STALE_MS`): then nothing of a limited scope
//! starts here until the store answers again.

use super::Shared;
use crate::core::quota::ROW_TTL_SECS;
use crate::store::QuotaStatements;
use crate::{metrics as m, now_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a worker exchanges its quota rows (per pool).
pub const PASS_INTERVAL: Duration = Duration::from_millis(500);

pub async fn quota_loop(sh: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let key = sh.cfg.pool_topic(sh.pool);
    let mut stmts: Option<QuotaStatements> = None;
    let mut tick = tokio::time::interval(PASS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
        }
        if sh.quotas.lock().expect("quotas lock").is_empty() {
            continue;
        }
        if stmts.is_none() {
            stmts = sh.store.quota_statements().await.map_err(|e| failed(&sh, "prepare", &e)).ok();
        }
        let Some(st) = &stmts else { continue };
        if let Err(e) = pass(&sh, st, &key).await {
            failed(&sh, "exchange", &e);
        }
    }
}

/// One read-plan-write round.
async fn pass(sh: &Shared, st: &QuotaStatements, key: &str) -> Result<(), crate::store::StoreError> {
    let rows = st.rows(key).await?;
    let planned = sh.quotas.lock().expect("quotas lock").plan(&rows, &sh.worker_id, now_ms());
    st.put(key, &planned, ROW_TTL_SECS).await?;
    sh.quotas.lock().expect("quotas lock").written(&planned, now_ms());
    Ok(())
}

fn failed(sh: &Shared, step: &'static str, e: &dyn std::fmt::Display) {
    tracing::warn!(pool = sh.pool.as_str(), step, error = %e, "fleet-wide limits: exchange failed; limited jobs wait here once the caps go stale");
    metrics::counter!(m::QUOTA_PASS_FAILURES, "pool" => sh.pool.as_str(), "step" => step).increment(1);
}
