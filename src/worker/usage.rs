//! Fleet usage reporter: one task per pool of a worker (spawned by `Worker::start`).
//!
//! Every [`PASS_INTERVAL`] it
//! 1. drains the slot-seconds per tenant the pool loop accumulated in
//!    `Shared::local_usage` into this worker's cells of the current [`BUCKET_MS`] bucket
//!    and writes the changed cells to the `usage` table (cumulative value per bucket, one
//!    cell per worker, `USING TTL` [`USAGE_TTL_SECS`], unlogged batches of one partition);
//! 2. publishes the pool's scheduler snapshot (`Shared::stats`) to `worker_stats` (TTL
//!    [`STATS_TTL_SECS`]) for `fairway stats` / `top`, and sets the per-tier gauges;
//! 3. reads the recent buckets of **every** pool ([`WINDOW_MS`]; buckets that settled are
//!    cached, so a pass reads about two partitions per pool), computes per tenant the
//!    decayed slot-seconds used elsewhere (all cells but this worker's own in this pool,
//!    each bucket decayed by age with the scheduler's `fleet_half_life_ms`) and publishes
//!    it on `Shared::fleet_usage`, which the pool loop folds into its scheduler.
//!
//! Rows are keyed by the pool's topic name (`Config::pool_topic`), so deployments that
//! share a keyspace keep separate accounts. The pure parts live in `core::fleet`.

use super::Shared;
use crate::core::fleet::{self, OwnUsage, UsageView};
use crate::core::scheduler::SchedulerConfig;
use crate::model::Pool;
use crate::store::FleetStatements;
use crate::{metrics as m, now_ms};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a worker exchanges usage with the fleet (per pool).
pub const PASS_INTERVAL: Duration = Duration::from_secs(5);
/// Width of one usage bucket (one partition per pool and bucket).
pub const BUCKET_MS: i64 = 60_000;
/// How far back usage is read: three half-lives of the default 5-minute fleet decay
/// (older use would weigh at most 1/8).
pub const WINDOW_MS: i64 = 15 * 60_000;
/// A bucket is final this long after it ended (every worker flushed it), and is then
/// cached instead of re-read.
pub const SETTLE_MS: i64 = 30_000;
/// Usage cells expire after this; well beyond the window.
pub const USAGE_TTL_SECS: i32 = 3600;
/// Snapshots of a worker that stopped reporting vanish after this.
pub const STATS_TTL_SECS: i32 = 30;
/// Partitions read concurrently in one pass.
const READ_CONCURRENCY: usize = 8;
/// The final flush at shutdown gives up after this.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

struct Reporter {
    sh: Arc<Shared>,
    /// Where fleet usage and stats are written and read.
    store: crate::store::Store,
    /// This pool's key (its topic name) and every pool's.
    key: String,
    keys: Vec<String>,
    half_life_ms: f64,
    own: OwnUsage,
    view: UsageView,
    stmts: Option<FleetStatements>,
}

pub async fn usage_loop(sh: Arc<Shared>, store: crate::store::Store, mut shutdown: watch::Receiver<bool>) {
    let half_life_ms =
        SchedulerConfig::for_pool(sh.route.pool, sh.route.cfg.pool(sh.route.pool).slots).fleet_half_life_ms;
    let mut r = Reporter {
        key: sh.route.cfg.pool_topic(sh.route.pool),
        keys: Pool::ALL.iter().map(|p| sh.route.cfg.pool_topic(*p)).collect(),
        half_life_ms,
        own: OwnUsage::default(),
        view: UsageView::new(BUCKET_MS, WINDOW_MS, SETTLE_MS),
        stmts: None,
        sh,
        store,
    };
    let mut tick = tokio::time::interval(PASS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
        }
        r.pass().await;
    }
    // Record the last seconds of use too (bounded: shutdown must not hang on the store).
    let _ = tokio::time::timeout(FINAL_FLUSH, r.write_own()).await;
}

impl Reporter {
    fn pool(&self) -> &'static str {
        self.sh.route.pool.as_str()
    }

    async fn pass(&mut self) {
        self.set_tier_gauges();
        if !self.write_own().await {
            return;
        }
        self.write_stats().await;
        self.read_and_publish().await;
    }

    async fn statements(&mut self) -> Option<FleetStatements> {
        if self.stmts.is_none() {
            match self.store.fleet_statements().await {
                Ok(s) => self.stmts = Some(s),
                Err(e) => {
                    tracing::warn!(pool = self.pool(), error = %e, "fleet usage: cannot prepare statements (run `fairway init` to create missing tables); local fairness only");
                    metrics::counter!(m::USAGE_PASS_FAILURES, "pool" => self.pool(), "step" => "prepare").increment(1);
                }
            }
        }
        self.stmts.clone()
    }

    /// Step 1: this worker's cells. False when the store is unusable (skip the pass).
    async fn write_own(&mut self) -> bool {
        let now = now_ms();
        let drained = self.sh.local_usage.lock().map(|mut u| std::mem::take(&mut *u)).unwrap_or_default();
        self.own.add(&drained, now, BUCKET_MS);
        self.own.evict(now, BUCKET_MS, WINDOW_MS);
        let Some(stmts) = self.statements().await else { return false };
        let pending = self.own.pending();
        if pending.is_empty() {
            return true;
        }
        match stmts.put_usage(&self.key, &self.sh.route.worker_id, &pending, USAGE_TTL_SECS).await {
            Ok(()) => self.own.written(&pending),
            Err(e) => {
                // Values are cumulative per bucket: the next pass writes them again.
                tracing::warn!(pool = self.pool(), error = %e, "fleet usage: write failed");
                metrics::counter!(m::USAGE_PASS_FAILURES, "pool" => self.pool(), "step" => "write").increment(1);
            }
        }
        true
    }

    /// Step 2: the scheduler snapshot for `fairway stats` / `top`.
    async fn write_stats(&mut self) {
        let mut stats = self.sh.stats.lock().map(|s| s.clone()).unwrap_or_default();
        if stats.is_null() {
            return;
        }
        let Some(stmts) = self.stmts.clone() else { return };
        // Idle tenants are left out: the row stays small however many tenants exist.
        fleet::compact_snapshot(&mut stats);
        let text = stats.to_string();
        if let Err(e) =
            stmts.put_worker_stats(&self.key, &self.sh.route.worker_id, now_ms(), &text, STATS_TTL_SECS).await
        {
            tracing::debug!(pool = self.pool(), error = %e, "fleet usage: stats write failed");
            metrics::counter!(m::USAGE_PASS_FAILURES, "pool" => self.pool(), "step" => "stats").increment(1);
        }
    }

    /// Step 3: read what changed, publish the usage elsewhere.
    async fn read_and_publish(&mut self) {
        let Some(stmts) = self.stmts.clone() else { return };
        let now = now_ms();
        self.view.evict(now);
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let wanted = self.view.wanted(&keys, now);
        let results: Vec<_> = futures::stream::iter(wanted)
            .map(|(key, bucket)| {
                let stmts = &stmts;
                async move {
                    let r = stmts.usage_bucket(&key, bucket).await;
                    (key, bucket, r)
                }
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        let mut failed = 0usize;
        for (key, bucket, r) in results {
            match r {
                Ok(cells) => self.view.put(&key, bucket, cells, now),
                Err(e) => {
                    // Keep the previous read of that partition; try again next pass.
                    failed += 1;
                    tracing::debug!(pool = self.pool(), error = %e, "fleet usage: read failed");
                }
            }
        }
        if failed > 0 {
            tracing::warn!(pool = self.pool(), failed, "fleet usage: some reads failed");
            metrics::counter!(m::USAGE_PASS_FAILURES, "pool" => self.pool(), "step" => "read").increment(1);
        }
        let usage = self.view.elsewhere(&self.key, &self.sh.route.worker_id, now_ms(), self.half_life_ms);
        self.set_fleet_gauges(&usage);
        self.sh.fleet_usage.send_replace(usage);
    }

    fn set_tier_gauges(&self) {
        let stats = self.sh.stats.lock().map(|s| s.clone()).unwrap_or_default();
        let Some(tiers) = fleet::tier_totals(&stats) else { return };
        for (tier, t) in tiers {
            let pool = self.pool();
            metrics::gauge!(m::TIER_BACKLOG, "pool" => pool, "tier" => tier).set(t.backlog as f64);
            metrics::gauge!(m::TIER_RUNNING, "pool" => pool, "tier" => tier).set(t.running as f64);
            metrics::gauge!(m::TIER_SLOT_SECONDS_USED, "pool" => pool, "tier" => tier).set(t.slot_seconds_used);
            metrics::gauge!(m::TIER_ENTITLED_SHARE, "pool" => pool, "tier" => tier).set(t.entitled_share);
            metrics::gauge!(m::TIER_ACTUAL_SHARE, "pool" => pool, "tier" => tier).set(t.actual_share);
        }
    }

    fn set_fleet_gauges(&self, usage: &HashMap<String, f64>) {
        for (tier, v) in by_tier(&self.sh.tenants.current(), usage) {
            metrics::gauge!(m::TIER_FLEET_USAGE, "pool" => self.pool(), "tier" => tier).set(v);
        }
    }
}

/// Sums per-tenant values by registered tier (unknown tenants count as free, the
/// scheduler's default), every tier present.
fn by_tier(tenants: &crate::core::tenants::TenantSet, usage: &HashMap<String, f64>) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = fleet::TIERS.iter().map(|t| (*t, 0.0)).collect();
    for (tenant, v) in usage {
        let tier = match tenants.tenants.get(tenant).map(|t| t.tier) {
            Some(crate::config::Tier::Standard) => "standard",
            Some(crate::config::Tier::Pro) => "pro",
            Some(crate::config::Tier::Enterprise) => "enterprise",
            Some(crate::config::Tier::Free) | None => "free",
        };
        *out.entry(tier).or_default() += v;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_buckets_keep_reads_bounded() {
        // A pass in steady state re-reads only the unsettled buckets: the open one and,
        // for SETTLE_MS after a boundary, the previous one - per pool.
        let mut v = UsageView::new(BUCKET_MS, WINDOW_MS, SETTLE_MS);
        let keys = ["p.short", "p.medium", "p.long"];
        let t0 = 1_000 * BUCKET_MS + 5_000;
        let first = v.wanted(&keys, t0);
        assert_eq!(first.len(), 3 * (WINDOW_MS / BUCKET_MS + 1) as usize);
        for (k, b) in first {
            v.put(&k, b, Vec::new(), t0);
        }
        let mut t = t0;
        let mut most = 0;
        for _ in 0..100 {
            t += PASS_INTERVAL.as_millis() as i64;
            v.evict(t);
            let w = v.wanted(&keys, t);
            most = most.max(w.len());
            for (k, b) in w {
                v.put(&k, b, Vec::new(), t);
            }
        }
        assert!(most <= 6, "at most two partitions per pool per pass, saw {most}");
        assert!(WINDOW_MS / 1000 < i64::from(USAGE_TTL_SECS), "cells outlive the window");
    }

    #[test]
    fn fleet_usage_sums_by_configured_tier() {
        let cfg = crate::config::Config::builtin();
        let mut set = crate::core::tenants::TenantSet::default();
        for (name, t) in &cfg.tenants {
            set.tenants.insert(name.clone(), crate::core::tenants::TenantRecord::from_config(name, t));
        }
        let usage =
            HashMap::from([("acme".to_string(), 2.0), ("piedpiper".to_string(), 1.0), ("stranger".to_string(), 0.5)]);
        let m = by_tier(&set, &usage);
        assert_eq!(m.len(), 4);
        assert_eq!(m["enterprise"], 2.0);
        assert_eq!(m["free"], 1.5);
        assert_eq!(m["pro"], 0.0);
    }
}
