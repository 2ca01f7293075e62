//! Fleet-wide fairness and introspection, the pure parts (no I/O, `now` is an argument).
//!
//! **Usage exchange** (driven by `worker::usage`): every worker keeps, per pool it
//! serves, the slot-milliseconds each tenant used in the current time bucket
//! ([`OwnUsage`]) and writes them to the `usage` table as one cell per (pool, bucket,
//! tenant, worker) holding the cumulative value for that bucket (no counters, so a
//! retried write is harmless), for at most [`TOP_TENANTS`] tenants per (pool, bucket,
//! worker); the rest share one [`OTHERS`] cell, attributed to nobody. It reads back the recent buckets of every pool
//! ([`UsageView`]: buckets that can no longer change are cached, so a pass reads only
//! the newest bucket or two per pool) and computes, per tenant, the slot-seconds used
//! **elsewhere** (every cell except this worker's own cells of this pool), each bucket
//! decayed by its age with the scheduler's fleet half-life ([`usage_elsewhere`]). That is
//! exactly what `Scheduler::fold_fleet_usage` expects.
//!
//! **Introspection** (`fairway stats` / `top`): every worker publishes its schedulers'
//! snapshots (`SchedulerStats` as JSON) to `worker_stats`; [`aggregate`] merges the
//! live ones into per-(pool, tenant) figures for the whole fleet.

use crate::core::FastMap;
use crate::model::Millis;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The bucket (its start, epoch ms) that `at` falls into.
pub fn bucket_start(at: Millis, bucket_ms: i64) -> Millis {
    at - at.rem_euclid(bucket_ms)
}

/// Starts of the buckets overlapping the window `(now - window_ms, now]`, oldest first.
pub fn window_buckets(now: Millis, window_ms: i64, bucket_ms: i64) -> Vec<Millis> {
    let last = bucket_start(now, bucket_ms);
    let first = bucket_start(now - window_ms + 1, bucket_ms);
    (0..).map(|i| first + i * bucket_ms).take_while(|b| *b <= last).collect()
}

/// How much a bucket's slot-time still counts at `now`: halved every `half_life_ms` of
/// age, the age measured from the bucket's end (or `now` while it is still open). Usage
/// inside a bucket is thus treated as if it happened at the bucket's end, so within a
/// bucket old use is over-weighted by at most `2^(bucket_ms / half_life_ms)`.
pub fn decay_weight(bucket: Millis, bucket_ms: i64, now: Millis, half_life_ms: f64) -> f64 {
    let at = (bucket + bucket_ms).min(now);
    let age = (now - at).max(0) as f64;
    0.5f64.powf(age / half_life_ms.max(1.0))
}

/// One worker's cumulative slot-time of one tenant in one (pool, bucket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageCell {
    pub pool: String,
    pub bucket: Millis,
    pub tenant: String,
    pub worker: String,
    pub slot_ms: i64,
}

/// How usage cells are aged: their buckets' width, how far back they count, and the
/// half-life of their weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decay {
    pub bucket_ms: i64,
    pub window_ms: i64,
    pub half_life_ms: f64,
}

/// Decayed slot-seconds per tenant used everywhere except `own_worker`'s cells of
/// `own_pool` (which are this scheduler's own, already counted locally). Cells of
/// buckets that ended before `now - window_ms` are ignored.
pub fn usage_elsewhere<'a>(
    cells: impl IntoIterator<Item = &'a UsageCell>,
    own_pool: &str,
    own_worker: &str,
    now: Millis,
    decay: Decay,
) -> HashMap<String, f64> {
    let Decay { bucket_ms, window_ms, half_life_ms } = decay;
    let mut out: HashMap<String, f64> = HashMap::new();
    for c in cells {
        if c.slot_ms <= 0 || c.bucket + bucket_ms <= now - window_ms {
            continue;
        }
        if (c.pool == own_pool && c.worker == own_worker) || c.tenant == OTHERS {
            continue;
        }
        let w = decay_weight(c.bucket, bucket_ms, now, half_life_ms);
        *out.entry(c.tenant.clone()).or_default() += c.slot_ms as f64 / 1000.0 * w;
    }
    out
}

/// The tenant name of a worker's "others" cell: the slot-time of its tenants without a
/// cell of their own in the bucket (see [`OwnUsage`]). Readers attribute it to nobody.
pub const OTHERS: &str = "\u{1f}others";

/// Tenants per worker, pool and bucket with a usage cell of their own (the rest share the
/// worker's [`OTHERS`] cell).
pub const TOP_TENANTS: usize = 100;
/// Slot-ms a tenant must have used in a bucket on a worker before it gets a cell of its
/// own there: a light tenant's few short jobs stay in the remainder.
pub const MIN_CELL_MS: f64 = 1_000.0;

/// This worker's slot-time per tenant in one pool, per bucket, with what was written.
///
/// **Bounded cells.** In each bucket at most `top_k` tenants get a cell of their own:
/// those whose slot-time there reached `min_cell_ms`, biggest first, kept for the rest
/// of the bucket once given (values are cumulative, so a tenant's whole use of the bucket
/// moves into its cell). Everything else is one [`OTHERS`] cell holding the bucket's
/// total minus the own cells. A pass therefore writes at most `top_k + 1` cells per
/// bucket that changed (normally only the current one), whatever the number of tenants.
#[derive(Debug)]
pub struct OwnUsage {
    buckets: BTreeMap<Millis, OwnBucket>,
    top_k: usize,
    min_cell_ms: f64,
}

/// One bucket of [`OwnUsage`].
#[derive(Debug, Default)]
struct OwnBucket {
    /// Cumulative slot-ms per tenant.
    used: HashMap<String, f64>,
    total: f64,
    /// Tenants with a cell of their own -> slot-ms last written.
    own: HashMap<String, Option<i64>>,
    others_written: Option<i64>,
}

impl Default for OwnUsage {
    fn default() -> Self {
        OwnUsage::new(TOP_TENANTS, MIN_CELL_MS)
    }
}

impl OwnUsage {
    pub fn new(top_k: usize, min_cell_ms: f64) -> Self {
        OwnUsage { buckets: BTreeMap::new(), top_k, min_cell_ms }
    }

    /// Adds slot-**seconds** per tenant (as drained from the pool loop) to the bucket of `now`.
    pub fn add(&mut self, usage: &HashMap<String, f64>, now: Millis, bucket_ms: i64) {
        let b = self.buckets.entry(bucket_start(now, bucket_ms)).or_default();
        for (tenant, &secs) in usage {
            if secs.is_finite() && secs > 0.0 {
                *b.used.entry(tenant.clone()).or_default() += secs * 1000.0;
                b.total += secs * 1000.0;
            }
        }
    }

    /// Cells whose cumulative value changed since it was last written: (bucket, tenant,
    /// slot-ms), at most `top_k + 1` per bucket. Gives cells to the biggest tenants that
    /// reached `min_cell_ms` while a bucket has room.
    pub fn pending(&mut self) -> Vec<(Millis, String, i64)> {
        let mut out = Vec::new();
        for (&b, bk) in &mut self.buckets {
            bk.promote(self.top_k, self.min_cell_ms);
            let mut own_ms = 0.0;
            for (t, written) in &bk.own {
                let ms = bk.used.get(t).copied().unwrap_or(0.0);
                own_ms += ms;
                let v = ms.round() as i64;
                if v > 0 && *written != Some(v) {
                    out.push((b, t.clone(), v));
                }
            }
            let others = (bk.total - own_ms).max(0.0).round() as i64;
            // A remainder that shrank to 0 (its tenants got cells) is written as 0 once.
            if bk.others_written != Some(others) && (others > 0 || bk.others_written.is_some()) {
                out.push((b, OTHERS.to_string(), others));
            }
        }
        out
    }

    /// Records that these cells were stored.
    pub fn written(&mut self, cells: &[(Millis, String, i64)]) {
        for (b, t, v) in cells {
            let Some(bk) = self.buckets.get_mut(b) else { continue };
            if t == OTHERS {
                bk.others_written = Some(*v);
            } else if let Some(w) = bk.own.get_mut(t) {
                *w = Some(*v);
            }
        }
    }

    /// Forgets buckets that ended more than `keep_ms` before `now` (written or not: a
    /// cell that could not be stored for that long no longer matters for fairness).
    pub fn evict(&mut self, now: Millis, bucket_ms: i64, keep_ms: i64) {
        self.buckets.retain(|b, _| b + bucket_ms > now - keep_ms);
    }

    /// Every cell as last written (tests: what the store holds of this worker).
    #[cfg(test)]
    fn pending_all(&self) -> Vec<(Millis, String, i64)> {
        let mut out = Vec::new();
        for (&b, bk) in &self.buckets {
            out.extend(bk.own.iter().filter_map(|(t, w)| w.map(|v| (b, t.clone(), v))));
            out.extend(bk.others_written.map(|v| (b, OTHERS.to_string(), v)));
        }
        out
    }

    /// Cumulative slot-ms of `tenant` in `bucket` (tests, introspection).
    pub fn slot_ms(&self, bucket: Millis, tenant: &str) -> f64 {
        self.buckets.get(&bucket).and_then(|bk| bk.used.get(tenant)).copied().unwrap_or(0.0)
    }
}

impl OwnBucket {
    /// Gives cells to the biggest tenants at `min_ms` or more while fewer than `top_k` have one.
    fn promote(&mut self, top_k: usize, min_ms: f64) {
        let room = top_k.saturating_sub(self.own.len());
        if room == 0 {
            return;
        }
        let mut big: Vec<(&String, f64)> = self
            .used
            .iter()
            .filter(|(t, ms)| **ms >= min_ms && !self.own.contains_key(*t))
            .map(|(t, ms)| (t, *ms))
            .collect();
        big.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        let chosen: Vec<String> = big.into_iter().take(room).map(|(t, _)| t.clone()).collect();
        for t in chosen {
            self.own.insert(t, None);
        }
    }
}

/// The recent usage cells of every pool as last read, with the bookkeeping that keeps
/// reads few: a bucket read once it has *settled* (ended more than `settle_ms` ago, so
/// every worker has flushed its final value for it) is never read again.
#[derive(Debug)]
pub struct UsageView {
    pub bucket_ms: i64,
    pub window_ms: i64,
    pub settle_ms: i64,
    /// (pool, bucket) -> (cells, settled when read).
    parts: HashMap<(String, Millis), (Vec<UsageCell>, bool)>,
}

impl UsageView {
    pub fn new(bucket_ms: i64, window_ms: i64, settle_ms: i64) -> Self {
        UsageView { bucket_ms, window_ms, settle_ms, parts: HashMap::new() }
    }

    /// The (pool, bucket) partitions to read now: buckets of the window not read since
    /// they settled.
    pub fn wanted(&self, pools: &[&str], now: Millis) -> Vec<(String, Millis)> {
        let mut out = Vec::new();
        for b in window_buckets(now, self.window_ms, self.bucket_ms) {
            for p in pools {
                match self.parts.get(&(p.to_string(), b)) {
                    Some((_, true)) => {}
                    _ => out.push((p.to_string(), b)),
                }
            }
        }
        out
    }

    /// Stores a partition read at `now` (replacing the previous read).
    pub fn put(&mut self, pool: &str, bucket: Millis, cells: Vec<UsageCell>, now: Millis) {
        let settled = bucket + self.bucket_ms + self.settle_ms <= now;
        self.parts.insert((pool.to_string(), bucket), (cells, settled));
    }

    /// Drops partitions that left the window.
    pub fn evict(&mut self, now: Millis) {
        let (b, w) = (self.bucket_ms, self.window_ms);
        self.parts.retain(|(_, bucket), _| bucket + b > now - w);
    }

    /// Partitions held (tests, introspection).
    pub fn len(&self) -> usize {
        self.parts.len()
    }
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// See [`usage_elsewhere`].
    pub fn elsewhere(&self, own_pool: &str, own_worker: &str, now: Millis, half_life_ms: f64) -> HashMap<String, f64> {
        let cells = self.parts.values().flat_map(|(c, _)| c.iter());
        let decay = Decay { bucket_ms: self.bucket_ms, window_ms: self.window_ms, half_life_ms };
        usage_elsewhere(cells, own_pool, own_worker, now, decay)
    }
}

/// The recent buckets of one exchanged table (`outcome_counts`, `run_times`) as last
/// read, keyed by bucket: a bucket read once it has *settled* (ended more than
/// `settle_ms` ago, so every worker flushed its final cells) is never read again, so a
/// pass over a window of N buckets reads only the newest one or two.
#[derive(Debug)]
pub struct BucketReads<T> {
    pub bucket_ms: i64,
    pub window_ms: i64,
    pub settle_ms: i64,
    /// bucket -> (cells, settled when read).
    parts: BTreeMap<Millis, (Vec<T>, bool)>,
}

impl<T> BucketReads<T> {
    pub fn new(bucket_ms: i64, window_ms: i64, settle_ms: i64) -> Self {
        BucketReads { bucket_ms, window_ms, settle_ms, parts: BTreeMap::new() }
    }

    /// Drops the buckets that left the window and returns those to read now: the
    /// window's buckets not read since they settled, oldest first.
    pub fn wanted(&mut self, now: Millis) -> Vec<Millis> {
        let (b, w) = (self.bucket_ms, self.window_ms);
        self.parts.retain(|bucket, _| bucket + b > now - w);
        window_buckets(now, w, b).into_iter().filter(|b| !matches!(self.parts.get(b), Some((_, true)))).collect()
    }

    /// Stores a bucket read at `now` (replacing the previous read).
    pub fn put(&mut self, bucket: Millis, cells: Vec<T>, now: Millis) {
        let settled = bucket + self.bucket_ms + self.settle_ms <= now;
        self.parts.insert(bucket, (cells, settled));
    }

    /// Every cell held, with its bucket.
    pub fn cells(&self) -> impl Iterator<Item = (Millis, &T)> {
        self.parts.iter().flat_map(|(b, (cells, _))| cells.iter().map(move |c| (*b, c)))
    }
}

/// What joins the two parts of a key of [`OwnCells::update_joined`] (job type, tenant):
/// a control character, which names cannot hold, so no two pairs give one key.
pub const KEY_JOIN: char = '\u{1f}';

/// The two parts of a key joined by [`KEY_JOIN`].
pub fn split_joined(key: &str) -> Option<(&str, &str)> {
    key.split_once(KEY_JOIN)
}

/// One worker's cumulative cells per (bucket, key), with what was written: the worker
/// writes a changed cell whole (no counters, so a retried write is harmless) and the
/// readers sum the workers' cells.
#[derive(Debug)]
pub struct OwnCells<C> {
    bucket_ms: i64,
    /// bucket -> key -> (cell, written).
    buckets: BTreeMap<Millis, FastMap<String, (C, bool)>>,
    /// Where [`OwnCells::update_joined`] joins a key (reused: no allocation per update).
    scratch: String,
}

impl<C: Clone + PartialEq + Default> OwnCells<C> {
    pub fn new(bucket_ms: i64) -> Self {
        OwnCells { bucket_ms, buckets: BTreeMap::new(), scratch: String::new() }
    }

    /// Changes the cell of `key` in the bucket of `now` (the key is copied only when new
    /// to the bucket).
    pub fn update(&mut self, key: &str, now: Millis, change: impl FnOnce(&mut C)) {
        let b = self.buckets.entry(bucket_start(now, self.bucket_ms)).or_default();
        if !b.contains_key(key) {
            b.insert(key.to_string(), (C::default(), false));
        }
        let c = b.get_mut(key).expect("inserted above");
        change(&mut c.0);
        c.1 = false;
    }

    /// [`OwnCells::update_bounded`] (or [`OwnCells::update`] when `max_keys` is None) of
    /// the key `a`, [`KEY_JOIN`], `b`.
    pub fn update_joined(
        &mut self,
        (a, b): (&str, &str),
        now: Millis,
        max_keys: Option<usize>,
        change: impl FnOnce(&mut C),
    ) -> bool {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push_str(a);
        key.push(KEY_JOIN);
        key.push_str(b);
        let changed = match max_keys {
            Some(max) => self.update_bounded(&key, now, max, change),
            None => {
                self.update(&key, now, change);
                true
            }
        };
        self.scratch = key;
        changed
    }

    /// As [`OwnCells::update`], unless `key` is new to the bucket of `now` and that
    /// bucket already holds `max_keys` keys; returns whether the cell was changed.
    pub fn update_bounded(&mut self, key: &str, now: Millis, max_keys: usize, change: impl FnOnce(&mut C)) -> bool {
        let full = self
            .buckets
            .get(&bucket_start(now, self.bucket_ms))
            .is_some_and(|b| b.len() >= max_keys && !b.contains_key(key));
        if !full {
            self.update(key, now, change);
        }
        !full
    }

    /// Cells changed since written: (bucket, key, cell).
    pub fn pending(&self) -> Vec<(Millis, String, C)> {
        let mut out = Vec::new();
        for (b, cells) in &self.buckets {
            out.extend(cells.iter().filter(|(_, (_, w))| !w).map(|(k, (c, _))| (*b, k.clone(), c.clone())));
        }
        out
    }

    /// These cells were stored (unless they changed meanwhile).
    pub fn written(&mut self, cells: &[(Millis, String, C)]) {
        for (b, key, cell) in cells {
            if let Some(c) = self.buckets.get_mut(b).and_then(|m| m.get_mut(key)) {
                if c.0 == *cell {
                    c.1 = true;
                }
            }
        }
    }

    /// Forgets buckets older than `keep_ms`.
    pub fn evict(&mut self, now: Millis, keep_ms: i64) {
        let b = self.bucket_ms;
        self.buckets.retain(|start, _| start + b > now - keep_ms);
    }
}

// ----- fleet introspection -----------------------------------------------------------

/// One row of `worker_stats`: a worker's scheduler snapshot of one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub pool: String,
    pub worker: String,
    pub at: Millis,
    /// `SchedulerStats` as JSON (or the FIFO dispatcher's smaller object).
    pub stats: String,
}

/// The parts of a `SchedulerStats` JSON the fleet view reads (lenient: missing fields
/// default, so older or FIFO workers still parse).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct Snap {
    at: Millis,
    policy: Option<String>,
    pool: Option<PoolSnap>,
    tenants: Vec<TenantSnap>,
    running: Option<usize>,
    queued: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct PoolSnap {
    slots: usize,
    reserved_slots: usize,
    running: usize,
    queued: usize,
    free_shared: usize,
    idle_reserved: usize,
    fast_lanes: usize,
    running_fast_lane: usize,
    spilled: usize,
    registry_version: Option<i64>,
    unassigned_ms: u64,
    group: Option<String>,
    breakers_open: Vec<String>,
    process_enforcement: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct TenantSnap {
    tenant: String,
    tier: String,
    weight: f64,
    backlog: BacklogSum,
    oldest_wait_ms: Option<Millis>,
    running: usize,
    slot_seconds_used: f64,
    entitlement_share: f64,
    actual_share: f64,
    dispatched: u64,
    wait_reason: Option<WaitSnap>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct WaitSnap {
    reason: String,
    until: Option<Millis>,
}

/// Jobs queued per submitted priority, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BacklogSum {
    pub urgent: usize,
    pub normal: usize,
    pub low: usize,
    /// In memory plus spilled.
    pub total: usize,
    /// Of `total`, jobs spilled to the store's backlog (beyond the worker's buffer).
    pub spilled: usize,
}

/// One pool across the fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolSummary {
    pub pool: String,
    pub workers: usize,
    /// Of `workers`, how many run the FIFO baseline (no per-tenant figures).
    pub fifo_workers: usize,
    pub slots: usize,
    pub reserved_slots: usize,
    pub running: usize,
    pub queued: usize,
    pub free_shared: usize,
    pub idle_reserved: usize,
    /// Fast lanes beyond `slots` (light tenants' jobs) and how many are busy.
    pub fast_lanes: usize,
    pub running_fast_lane: usize,
    /// Of `queued`, jobs spilled to the store's backlog.
    pub spilled: usize,
    /// Oldest and newest tenants-registry version the pool's workers run.
    pub registry_version: Option<i64>,
    pub registry_version_max: Option<i64>,
    /// Workers of the pool that have owned no partition for a while (stuck or
    /// oversubscribed group, or more workers than partitions), with the longest wait
    /// and their consumer group.
    pub unassigned_workers: usize,
    pub unassigned_ms_max: u64,
    pub groups: Vec<String>,
    /// Job types whose circuit breaker is open (or half-open) on any of its workers.
    pub breakers_open: Vec<String>,
    /// How the pool's workers enforce `process` jobs' limits (`rlimit`, `cgroup`), each
    /// mode once; empty if the pool runs no `process` job type.
    pub process_enforcement: Vec<String>,
}

/// One tenant in one pool across the fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TenantSummary {
    pub pool: String,
    pub tenant: String,
    pub tier: String,
    /// Scheduling weight (as reported by the worker holding most of its backlog).
    pub weight: f64,
    pub backlog: BacklogSum,
    pub running: usize,
    /// Age (ms) of its oldest queued job anywhere.
    pub oldest_wait_ms: Option<Millis>,
    /// Slot-seconds used in this pool, summed over live workers (each since its start).
    pub slot_seconds_used: f64,
    /// Entitled share of the pool's slots fleet-wide: sum over workers of
    /// (entitled share x slots) / total slots.
    pub entitled_share: f64,
    /// Share of the pool's slot-time it actually got recently (same slot weighting).
    pub actual_share: f64,
    pub dispatched: u64,
    /// Why its next job waits, as seen by the worker holding most of its backlog:
    /// deficit, concurrency_cap, rate_limited, reserved_slots; None when nothing waits
    /// or a slot is about to take it.
    pub wait_reason: Option<String>,
    /// For `rate_limited`: the earliest time a worker allows its next dispatch.
    pub rate_limited_until: Option<Millis>,
    /// For `recycling_cap`: the latest time a worker holds its jobs until.
    pub recycling_until: Option<Millis>,
    /// How many workers report each wait reason.
    pub waits: BTreeMap<String, usize>,
    /// Live workers reporting this tenant with backlog or running jobs.
    pub active_workers: usize,
}

impl TenantSummary {
    /// Backlogged, running, or has used slot-time here.
    pub fn is_active(&self) -> bool {
        self.backlog.total > 0 || self.running > 0 || self.slot_seconds_used > 0.0
    }
}

/// The whole fleet's scheduling state (what `fairway stats --json` prints).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetStats {
    pub at: Millis,
    /// Live worker snapshots merged (one per worker and pool).
    pub snapshots: usize,
    pub pools: Vec<PoolSummary>,
    /// Sorted by pool, then tenant.
    pub tenants: Vec<TenantSummary>,
    /// Rows left out: stale or unreadable, with why.
    pub skipped: Vec<String>,
}

/// Merges the live workers' snapshots. Rows whose snapshot is older than `max_age_ms`
/// (by their own clock's `at`) are skipped as stale.
pub fn aggregate(rows: &[SnapshotRow], now: Millis, max_age_ms: i64) -> FleetStats {
    let mut out = FleetStats { at: now, ..Default::default() };
    let mut pools: BTreeMap<String, PoolSummary> = BTreeMap::new();
    // (pool, tenant) -> (summary, backlog of the worker chosen for reason/weight,
    // slot-weighted entitlement, slot-weighted actual).
    struct Acc {
        s: TenantSummary,
        lead_backlog: Option<usize>,
        ent: f64,
        act: f64,
    }
    let mut tenants: BTreeMap<(String, String), Acc> = BTreeMap::new();
    for r in rows {
        let snap: Snap = match serde_json::from_str(&r.stats) {
            Ok(s) => s,
            Err(e) => {
                out.skipped.push(format!("{}/{}: unreadable snapshot: {e}", r.pool, r.worker));
                continue;
            }
        };
        // When the worker wrote it (its clock); the snapshot's own time as a fallback.
        let at = if r.at > 0 { r.at } else { snap.at };
        if now - at > max_age_ms {
            out.skipped.push(format!("{}/{}: stale ({} ms old)", r.pool, r.worker, now - at));
            continue;
        }
        out.snapshots += 1;
        let p =
            pools.entry(r.pool.clone()).or_insert_with(|| PoolSummary { pool: r.pool.clone(), ..Default::default() });
        p.workers += 1;
        let Some(ps) = &snap.pool else {
            // The FIFO baseline reports totals only.
            if snap.policy.as_deref() == Some("fifo") {
                p.fifo_workers += 1;
            }
            p.running += snap.running.unwrap_or(0);
            p.queued += snap.queued.unwrap_or(0);
            continue;
        };
        p.slots += ps.slots;
        p.reserved_slots += ps.reserved_slots;
        p.running += ps.running;
        p.queued += ps.queued;
        p.free_shared += ps.free_shared;
        p.idle_reserved += ps.idle_reserved;
        p.fast_lanes += ps.fast_lanes;
        p.running_fast_lane += ps.running_fast_lane;
        p.spilled += ps.spilled;
        if ps.unassigned_ms > 0 {
            p.unassigned_workers += 1;
            p.unassigned_ms_max = p.unassigned_ms_max.max(ps.unassigned_ms);
        }
        if let Some(g) = &ps.group {
            if !p.groups.contains(g) {
                p.groups.push(g.clone());
            }
        }
        for b in &ps.breakers_open {
            if !p.breakers_open.contains(b) {
                p.breakers_open.push(b.clone());
            }
        }
        if let Some(e) = &ps.process_enforcement {
            if !p.process_enforcement.contains(e) {
                p.process_enforcement.push(e.clone());
            }
        }
        if let Some(v) = ps.registry_version {
            p.registry_version = Some(p.registry_version.map_or(v, |x: i64| x.min(v)));
            p.registry_version_max = Some(p.registry_version_max.map_or(v, |x: i64| x.max(v)));
        }
        for t in &snap.tenants {
            let a = tenants.entry((r.pool.clone(), t.tenant.clone())).or_insert_with(|| Acc {
                s: TenantSummary {
                    pool: r.pool.clone(),
                    tenant: t.tenant.clone(),
                    tier: t.tier.clone(),
                    weight: t.weight,
                    ..Default::default()
                },
                lead_backlog: None,
                ent: 0.0,
                act: 0.0,
            });
            let s = &mut a.s;
            s.backlog.urgent += t.backlog.urgent;
            s.backlog.normal += t.backlog.normal;
            s.backlog.low += t.backlog.low;
            s.backlog.total += t.backlog.total;
            s.backlog.spilled += t.backlog.spilled;
            s.running += t.running;
            s.slot_seconds_used += t.slot_seconds_used;
            s.dispatched += t.dispatched;
            s.oldest_wait_ms = match (s.oldest_wait_ms, t.oldest_wait_ms) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            if t.backlog.total > 0 || t.running > 0 {
                s.active_workers += 1;
            }
            a.ent += t.entitlement_share * ps.slots as f64;
            a.act += t.actual_share * ps.slots as f64;
            if let Some(w) = &t.wait_reason {
                *s.waits.entry(w.reason.clone()).or_default() += 1;
                if w.reason == "rate_limited" {
                    if let Some(u) = w.until {
                        s.rate_limited_until = Some(s.rate_limited_until.map_or(u, |x: Millis| x.min(u)));
                    }
                }
                if w.reason == "recycling_cap" {
                    s.recycling_until = s.recycling_until.max(w.until);
                }
            }
            // The worker holding most of the tenant's backlog names its wait reason.
            if t.backlog.total > 0 && a.lead_backlog.is_none_or(|b| t.backlog.total > b) {
                a.lead_backlog = Some(t.backlog.total);
                s.wait_reason = t.wait_reason.as_ref().map(|w| w.reason.clone());
                s.weight = t.weight;
            }
        }
    }
    for ((pool, _), a) in tenants {
        let mut s = a.s;
        let slots = pools.get(&pool).map_or(0, |p| p.slots);
        if slots > 0 {
            s.entitled_share = a.ent / slots as f64;
            s.actual_share = a.act / slots as f64;
        }
        out.tenants.push(s);
    }
    out.pools = pools.into_values().collect();
    out
}

/// Most tenants in a published snapshot (per worker and pool).
pub const SNAPSHOT_TENANTS: usize = 500;

/// Drops the tenants of a scheduler snapshot (`SchedulerStats` JSON) that are idle now
/// (nothing queued, nothing running and (almost) no recent share), then keeps at most
/// [`SNAPSHOT_TENANTS`]: the biggest backlogs first, then the most running, then the
/// biggest recent share; `pool.tenants_left_out` says how many active ones were left out.
/// Published as is, thousands of tenants would make every worker's row large. Returns
/// how many tenants were dropped.
pub fn compact_snapshot(stats: &mut serde_json::Value) -> usize {
    let Some(tenants) = stats.get_mut("tenants").and_then(|t| t.as_array_mut()) else { return 0 };
    let before = tenants.len();
    let num = |t: &serde_json::Value, k: &str| t.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let queued =
        |t: &serde_json::Value| t.get("backlog").and_then(|b| b.get("total")).and_then(|v| v.as_f64()).unwrap_or(0.0);
    tenants.retain(|t| queued(t) > 0.0 || num(t, "running") > 0.0 || num(t, "actual_share") >= 1e-4);
    let active = tenants.len();
    if active > SNAPSHOT_TENANTS {
        let rank = |t: &serde_json::Value| (queued(t), num(t, "running"), num(t, "actual_share"));
        tenants.sort_by(|a, b| {
            let (a, b) = (rank(a), rank(b));
            b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)).then(b.2.total_cmp(&a.2))
        });
        tenants.truncate(SNAPSHOT_TENANTS);
        tenants.sort_by(|a, b| a.get("tenant").and_then(|v| v.as_str()).cmp(&b.get("tenant").and_then(|v| v.as_str())));
    }
    if let Some(pool) = stats.get_mut("pool").and_then(|p| p.as_object_mut()) {
        pool.insert("tenants_left_out".into(), active.saturating_sub(SNAPSHOT_TENANTS).into());
    }
    before - active.min(SNAPSHOT_TENANTS)
}

/// Adds spilled backlogs (jobs beyond the worker's buffer, in the store) to a scheduler
/// snapshot: per tenant `backlog.spilled` (also counted in `backlog.total`), per pool
/// `pool.spilled` (also counted in `pool.queued`).
pub fn add_spilled(stats: &mut serde_json::Value, per_tenant: &std::collections::HashMap<&str, u64>, total: u64) {
    if let Some(pool) = stats.get_mut("pool").and_then(|p| p.as_object_mut()) {
        pool.insert("spilled".into(), total.into());
        let queued = pool.get("queued").and_then(|v| v.as_u64()).unwrap_or(0);
        pool.insert("queued".into(), (queued + total).into());
    }
    let Some(tenants) = stats.get_mut("tenants").and_then(|t| t.as_array_mut()) else { return };
    for t in tenants {
        let Some(n) = t.get("tenant").and_then(|v| v.as_str()).and_then(|name| per_tenant.get(name)).copied() else {
            continue;
        };
        if let Some(b) = t.get_mut("backlog").and_then(|b| b.as_object_mut()) {
            let total = b.get("total").and_then(|v| v.as_u64()).unwrap_or(0);
            b.insert("total".into(), (total + n).into());
            b.insert("spilled".into(), n.into());
        }
    }
}

/// Age (ms) of the oldest queued job of a scheduler snapshot, if any is queued.
pub fn oldest_wait_ms(stats: &serde_json::Value) -> Option<Millis> {
    stats.get("tenants")?.as_array()?.iter().filter_map(|t| t.get("oldest_wait_ms")?.as_i64()).max()
}

/// Backlog, running jobs and slot-seconds used of one tier in one scheduler snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierTotals {
    pub backlog: usize,
    pub running: usize,
    pub slot_seconds_used: f64,
    /// Sum of the tier's tenants' entitled shares of the pool's slots (0-1).
    pub entitled_share: f64,
    /// Sum of the tier's tenants' recent actual shares of the pool's slot-time (0-1).
    pub actual_share: f64,
}

/// Per-tier totals of a scheduler snapshot (`SchedulerStats` JSON), every tier present
/// (zeros included, so gauges of a tier that went idle drop to 0). None for snapshots
/// without per-tenant figures (the FIFO baseline, or no snapshot yet).
pub fn tier_totals(stats: &serde_json::Value) -> Option<BTreeMap<&'static str, TierTotals>> {
    let snap: Snap = serde_json::from_value(stats.clone()).ok()?;
    snap.pool.as_ref()?;
    let mut out: BTreeMap<&'static str, TierTotals> = TIERS.iter().map(|t| (*t, TierTotals::default())).collect();
    for t in &snap.tenants {
        let Some(tier) = TIERS.iter().find(|x| **x == t.tier) else { continue };
        let e = out.entry(tier).or_default();
        e.backlog += t.backlog.total;
        e.running += t.running;
        e.slot_seconds_used += t.slot_seconds_used;
        e.entitled_share += t.entitlement_share;
        e.actual_share += t.actual_share;
    }
    Some(out)
}

/// The tier names of `SchedulerStats` (bounded metric label values).
pub const TIERS: [&str; 4] = ["free", "standard", "pro", "enterprise"];

#[cfg(test)]
mod tests {
    use super::*;

    const B: i64 = 60_000;
    const W: i64 = 15 * 60_000;
    const H: f64 = 300_000.0;
    const DECAY: Decay = Decay { bucket_ms: B, window_ms: W, half_life_ms: H };

    fn cell(pool: &str, bucket: Millis, tenant: &str, worker: &str, slot_ms: i64) -> UsageCell {
        UsageCell { pool: pool.into(), bucket, tenant: tenant.into(), worker: worker.into(), slot_ms }
    }

    #[test]
    fn buckets_cover_the_window() {
        assert_eq!(bucket_start(125_000, B), 120_000);
        assert_eq!(bucket_start(-1, B), -60_000);
        let now = 10 * B + 5_000;
        let bs = window_buckets(now, 3 * B, B);
        assert_eq!(bs, vec![7 * B, 8 * B, 9 * B, 10 * B]);
        assert_eq!(window_buckets(10 * B, 3 * B, B), vec![7 * B, 8 * B, 9 * B, 10 * B]);
        assert_eq!(window_buckets(now, W, B).len(), 16);
    }

    #[test]
    fn decay_halves_per_half_life_from_the_bucket_end() {
        let now = 100 * B;
        // The open bucket counts fully.
        assert_eq!(decay_weight(now, B, now + 30_000, H), 1.0);
        assert_eq!(decay_weight(now - B, B, now, H), 1.0);
        let w = decay_weight(now - B - 300_000, B, now, H);
        assert!((w - 0.5).abs() < 1e-12, "{w}");
        let w = decay_weight(now - B - 600_000, B, now, H);
        assert!((w - 0.25).abs() < 1e-12, "{w}");
        // Clock skew: a bucket from the future counts fully, never more.
        assert_eq!(decay_weight(now + 5 * B, B, now, H), 1.0);
    }

    #[test]
    fn elsewhere_excludes_only_own_cells_of_own_pool() {
        let now = 100 * B + 10_000;
        let b = bucket_start(now, B);
        let cells = vec![
            cell("short", b, "acme", "me", 5_000),    // own: excluded
            cell("short", b, "acme", "other", 2_000), // another worker, same pool
            cell("medium", b, "acme", "me", 3_000),   // own worker, another pool
            cell("long", b, "globex", "x", 1_000),
        ];
        let m = usage_elsewhere(&cells, "short", "me", now, DECAY);
        assert!((m["acme"] - 5.0).abs() < 1e-9, "{m:?}");
        assert!((m["globex"] - 1.0).abs() < 1e-9);
        let m = usage_elsewhere(&cells, "medium", "me", now, DECAY);
        assert!((m["acme"] - 7.0).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn elsewhere_decays_old_buckets_and_drops_those_outside_the_window() {
        let now = 100 * B;
        let cells = vec![
            cell("short", now - B - 300_000, "a", "w", 10_000), // ended 5 min ago: half
            cell("short", now - W - B, "a", "w", 1_000_000),    // ended before the window
            cell("short", now - W, "a", "w", 8_000),            // ended 14 min ago: inside
        ];
        let m = usage_elsewhere(&cells, "short", "me", now, DECAY);
        let expect = 10.0 * 0.5 + 8.0 * 0.5f64.powf(14.0 * 60_000.0 / H);
        assert!((m["a"] - expect).abs() < 1e-9, "{} vs {expect}", m["a"]);
    }

    #[test]
    fn steady_use_elsewhere_converges_near_the_scheduler_level() {
        // One slot busy elsewhere for an hour, 1-minute buckets: the decayed level is
        // within the window truncation (1/8) and the bucket granularity (~15 %) of the
        // continuous model's x * H / ln 2.
        let now = 200 * B;
        let cells: Vec<UsageCell> = (0..60).map(|i| cell("medium", now - (i + 1) * B, "a", "w", B)).collect();
        let m = usage_elsewhere(&cells, "short", "me", now, DECAY);
        let ideal = H / 1000.0 / std::f64::consts::LN_2;
        let ratio = m["a"] / ideal;
        assert!(ratio > 0.8 && ratio < 1.1, "ratio {ratio}");
    }

    #[test]
    fn folding_a_growing_level_yields_the_fresh_use() {
        // What the scheduler derives from two successive publications: the growth beyond
        // decay equals the slot-time added in between (within the open-bucket error).
        let t0 = 100 * B + 1_000;
        let b = bucket_start(t0, B);
        let mut cells = vec![cell("short", b - B, "a", "w", 30_000), cell("short", b, "a", "w", 2_000)];
        let l0 = usage_elsewhere(&cells, "x", "me", t0, DECAY)["a"];
        let t1 = t0 + 5_000;
        cells[1].slot_ms += 4_000;
        let l1 = usage_elsewhere(&cells, "x", "me", t1, DECAY)["a"];
        let fresh = l1 - l0 * 0.5f64.powf(5_000.0 / H);
        assert!((fresh - 4.0).abs() < 0.05, "fresh {fresh}");
    }

    #[test]
    fn closed_buckets_decay_exactly_as_the_scheduler_expects() {
        // With no new use, successive publications only decay: the scheduler sees no
        // fresh use (level(t1) == level(t0) * 2^(-dt/H)), so nothing is charged twice.
        let t0 = 100 * B + 1_000;
        let cells = vec![cell("short", 97 * B, "a", "w", 40_000), cell("long", 99 * B, "a", "v", 9_000)];
        let l0 = usage_elsewhere(&cells, "x", "me", t0, DECAY)["a"];
        for dt in [5_000, 30_000, 59_000] {
            let l1 = usage_elsewhere(&cells, "x", "me", t0 + dt, DECAY)["a"];
            let fresh = l1 - l0 * 0.5f64.powf(dt as f64 / H);
            assert!(fresh.abs() < 1e-9, "dt {dt}: fresh {fresh}");
        }
    }

    #[test]
    fn own_usage_accumulates_per_bucket_and_rewrites_only_changes() {
        let mut o = OwnUsage::default();
        let u = |t: &str, s: f64| HashMap::from([(t.to_string(), s)]);
        o.add(&u("a", 1.5), 10_000, B);
        o.add(&u("a", 0.5), 20_000, B);
        o.add(&u("b", 0.0), 20_000, B);
        assert_eq!(o.pending(), vec![(0, "a".to_string(), 2_000)]);
        let p = o.pending();
        o.written(&p);
        assert!(o.pending().is_empty());
        o.add(&u("a", 1.0), 61_000, B);
        assert_eq!(o.pending(), vec![(B, "a".to_string(), 1_000)]);
        assert_eq!(o.slot_ms(0, "a"), 2_000.0);
        o.evict(10 * B, B, 5 * B);
        assert!(o.pending().is_empty());
    }

    /// The usage exchange's writes per pass and a bucket's cells (what every worker
    /// reads) are bounded by `top_k + 1` per worker, however many tenants ran; the
    /// heavy tenants keep exact cells, the light ones share the remainder.
    #[test]
    fn usage_cells_per_pass_are_bounded_by_top_k_whatever_the_tenants() {
        let mut o = OwnUsage::new(50, MIN_CELL_MS);
        let mut pass = HashMap::new();
        for i in 0..100_000 {
            pass.insert(format!("light{i}"), 0.005);
        }
        for i in 0..60 {
            pass.insert(format!("heavy{i}"), 10.0 + i as f64);
        }
        o.add(&pass, 1_000, B);
        let cells = o.pending();
        assert_eq!(cells.len(), 51, "50 own cells and the remainder");
        let total: i64 = cells.iter().map(|c| c.2).sum();
        let expected = 100_000.0 * 5.0 + (0..60).map(|i| (10.0 + i as f64) * 1000.0).sum::<f64>();
        assert!((total as f64 - expected).abs() < 100.0, "every slot-ms is in a cell: {total} vs {expected}");
        assert!(cells.iter().any(|c| c.1 == "heavy59") && !cells.iter().any(|c| c.1 == "heavy0"), "the biggest first");
        o.written(&cells);
        // The next pass: more light use, and one heavy tenant ran again: two cells.
        o.add(&HashMap::from([("light7".to_string(), 0.01), ("heavy59".to_string(), 1.0)]), 6_000, B);
        let cells = o.pending();
        assert_eq!(cells.len(), 2, "{cells:?}");
        o.written(&cells);
        // Every worker's cells of the bucket: readers see at most workers x (top_k + 1).
        let read: Vec<UsageCell> = (0..3)
            .flat_map(|w| o.pending_all().into_iter().map(move |(b, t, v)| cell("short", b, &t, &format!("w{w}"), v)))
            .collect();
        assert_eq!(read.len(), 3 * 51);
        let m = usage_elsewhere(&read, "short", "w0", 10_000, Decay { window_ms: 15 * B, ..DECAY });
        assert!(m["heavy59"] > 2.0 * 69.0 * 0.9, "heavy use elsewhere is attributed: {}", m["heavy59"]);
        assert!(!m.contains_key(OTHERS) && !m.contains_key("light7"), "the remainder is nobody's");
    }

    #[test]
    fn view_rereads_only_unsettled_buckets() {
        let mut v = UsageView::new(B, 3 * B, 20_000);
        let now = 10 * B + 10_000;
        let want = v.wanted(&["short", "long"], now);
        assert_eq!(want.len(), 8, "4 buckets x 2 pools on the first pass");
        for (p, b) in &want {
            v.put(p, *b, vec![cell(p, *b, "a", "w", 1_000)], now);
        }
        // 10 s later: the bucket that ended 10 s ago is not settled yet, the open one neither.
        let want = v.wanted(&["short", "long"], now + 10_000);
        let b = |p: &str, b: i64| (p.to_string(), b);
        assert_eq!(want, vec![b("short", 9 * B), b("long", 9 * B), b("short", 10 * B), b("long", 10 * B)]);
        // A minute later: buckets that left the window are dropped; of the rest, those
        // read after they settled (8B) are not read again.
        let later = 11 * B + 25_000;
        v.evict(later);
        assert_eq!(v.len(), 6, "8B, 9B, 10B of two pools");
        let want = v.wanted(&["short", "long"], later);
        assert_eq!(want.len(), 6, "{want:?}");
        assert!(want.iter().all(|(_, x)| *x >= 9 * B), "{want:?}");
        let m = v.elsewhere("short", "me", now, H);
        assert!(m["a"] > 0.0);
    }

    #[test]
    fn spilled_backlogs_count_in_the_snapshot_and_the_merge() {
        let mut js = serde_json::json!({
            "at": 1, "pool": {"slots": 4, "queued": 10},
            "tenants": [
                {"tenant": "flood", "tier": "free", "backlog": {"normal": 8, "total": 8}, "oldest_wait_ms": 900},
                {"tenant": "quiet", "tier": "free", "backlog": {"normal": 2, "total": 2}, "oldest_wait_ms": 5},
            ]
        });
        let per: std::collections::HashMap<&str, u64> = [("flood", 1000)].into_iter().collect();
        add_spilled(&mut js, &per, 1000);
        assert_eq!(js["pool"]["queued"], 1010);
        assert_eq!(js["tenants"][0]["backlog"]["total"], 1008);
        assert_eq!(js["tenants"][0]["backlog"]["spilled"], 1000);
        assert_eq!(js["tenants"][1]["backlog"]["total"], 2);
        assert_eq!(oldest_wait_ms(&js), Some(900));
        assert_eq!(tier_totals(&js).unwrap()["free"].backlog, 1010);
        let row = SnapshotRow { pool: "p".into(), worker: "w".into(), at: 1, stats: js.to_string() };
        let m = aggregate(&[row], 1, 60_000);
        assert_eq!(m.pools[0].spilled, 1000);
        let flood = m.tenants.iter().find(|t| t.tenant == "flood").unwrap();
        assert_eq!((flood.backlog.total, flood.backlog.spilled), (1008, 1000));
    }

    #[test]
    fn tier_totals_sum_by_tier_with_every_tier_present() {
        let t = |name: &str, tier: &str, q: usize, r: usize| serde_json::json!({"tenant": name, "tier": tier, "backlog": {"total": q}, "running": r, "slot_seconds_used": 1.5, "entitlement_share": 0.25, "actual_share": 0.1});
        let js: serde_json::Value = serde_json::from_str(&snap(
            "short",
            8,
            serde_json::json!([t("a", "free", 3, 1), t("b", "free", 1, 0), t("c", "pro", 0, 2)]),
        ))
        .unwrap();
        let m = tier_totals(&js).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!((m["free"].backlog, m["free"].running), (4, 1));
        assert!((m["free"].slot_seconds_used - 3.0).abs() < 1e-9);
        assert_eq!(m["pro"].running, 2);
        assert!((m["free"].entitled_share - 0.5).abs() < 1e-9 && (m["free"].actual_share - 0.2).abs() < 1e-9);
        assert!((m["pro"].entitled_share - 0.25).abs() < 1e-9);
        assert_eq!(m["enterprise"], TierTotals::default());
        assert!(tier_totals(&serde_json::json!({"policy": "fifo", "queued": 1})).is_none());
        assert!(tier_totals(&serde_json::Value::Null).is_none());
    }

    #[test]
    fn compact_snapshot_keeps_only_active_tenants() {
        let t = |name: &str, q: usize, r: usize, share: f64| serde_json::json!({"tenant": name, "backlog": {"total": q}, "running": r, "actual_share": share});
        let mut js: serde_json::Value = serde_json::from_str(&snap(
            "short",
            8,
            serde_json::json!([
                t("queued", 2, 0, 0.0),
                t("running", 0, 1, 0.0),
                t("recent", 0, 0, 0.2),
                t("idle", 0, 0, 0.0)
            ]),
        ))
        .unwrap();
        assert_eq!(compact_snapshot(&mut js), 1);
        let names: Vec<&str> =
            js["tenants"].as_array().unwrap().iter().map(|t| t["tenant"].as_str().unwrap()).collect();
        assert_eq!(names, ["queued", "running", "recent"]);
        assert_eq!(compact_snapshot(&mut serde_json::json!({"policy": "fifo"})), 0);
    }

    #[test]
    fn compact_snapshot_keeps_the_biggest_tenants_up_to_a_bound() {
        let t = |i: usize| serde_json::json!({"tenant": format!("t{i:05}"), "backlog": {"total": i}, "running": 0});
        let many: Vec<serde_json::Value> = (1..=10_000).map(t).collect();
        let mut js: serde_json::Value = serde_json::from_str(&snap("short", 8, serde_json::json!(many))).unwrap();
        assert_eq!(compact_snapshot(&mut js), 10_000 - SNAPSHOT_TENANTS);
        let kept = js["tenants"].as_array().unwrap();
        assert_eq!(kept.len(), SNAPSHOT_TENANTS);
        assert_eq!(kept[0]["tenant"], "t09501", "the biggest backlogs, by name");
        assert_eq!(js["pool"]["tenants_left_out"], 10_000 - SNAPSHOT_TENANTS);
    }

    fn snap(pool: &str, slots: usize, tenants: serde_json::Value) -> String {
        serde_json::json!({
            "at": 1_000,
            "pool": {"pool": pool, "slots": slots, "reserved_slots": 0, "shared_slots": slots, "running": 2,
                     "running_reserved": 0, "idle_reserved": 0, "free_shared": slots - 2, "queued": 5,
                     "tenants": 1, "active_tenants": 1, "virtual_time": 0.0, "next_wakeup": null},
            "tenants": tenants,
        })
        .to_string()
    }

    #[test]
    fn aggregate_sums_workers_and_weights_shares_by_slots() {
        let t = |backlog: usize, running: usize, ent: f64, act: f64, reason: Option<&str>| {
            serde_json::json!({
                "tenant": "acme", "tier": "pro", "weight": 100.0,
                "backlog": {"urgent": 0, "normal": backlog, "low": 0, "total": backlog},
                "oldest_wait_ms": if backlog > 0 { Some(500) } else { None },
                "running": running, "running_reserved": 0, "reserved_slots": 0, "max_running": null,
                "rate_limit_per_second": null, "min_share": 0.01, "slot_seconds_used": 10.0, "deficit_ms": 0.0,
                "entitlement_share": ent, "actual_share": act, "dispatched": 7,
                "wait_reason": reason.map(|r| serde_json::json!({"reason": r})),
            })
        };
        let rows = vec![
            SnapshotRow {
                pool: "short".into(),
                worker: "w1".into(),
                at: 1_000,
                stats: snap("short", 10, serde_json::json!([t(5, 2, 0.5, 0.2, Some("deficit"))])),
            },
            SnapshotRow {
                pool: "short".into(),
                worker: "w2".into(),
                at: 1_000,
                stats: snap("short", 30, serde_json::json!([t(1, 0, 1.0, 0.0, Some("concurrency_cap"))])),
            },
            SnapshotRow {
                pool: "short".into(),
                worker: "old".into(),
                at: -100_000,
                stats: r#"{"at": -100000}"#.into(),
            },
            SnapshotRow { pool: "medium".into(), worker: "w1".into(), at: 1_000, stats: "not json".into() },
            SnapshotRow {
                pool: "long".into(),
                worker: "f".into(),
                at: 1_000,
                stats: r#"{"at": 1000, "policy": "fifo", "queued": 3, "running": 1}"#.into(),
            },
        ];
        let f = aggregate(&rows, 2_000, 30_000);
        assert_eq!(f.snapshots, 3);
        assert_eq!(f.skipped.len(), 2, "{:?}", f.skipped);
        let short = f.pools.iter().find(|p| p.pool == "short").unwrap();
        assert_eq!((short.workers, short.slots, short.running, short.queued), (2, 40, 4, 10));
        let long = f.pools.iter().find(|p| p.pool == "long").unwrap();
        assert_eq!((long.fifo_workers, long.queued), (1, 3));
        assert_eq!(f.tenants.len(), 1);
        let a = &f.tenants[0];
        assert_eq!((a.backlog.total, a.running, a.active_workers), (6, 2, 2));
        assert!((a.slot_seconds_used - 20.0).abs() < 1e-9);
        assert!((a.entitled_share - (0.5 * 10.0 + 1.0 * 30.0) / 40.0).abs() < 1e-9);
        assert!((a.actual_share - 0.05).abs() < 1e-9);
        assert_eq!(a.wait_reason.as_deref(), Some("deficit"), "the worker with most backlog decides");
        assert_eq!(a.waits.len(), 2);
        assert_eq!(a.oldest_wait_ms, Some(500));
        let js = serde_json::to_value(&f).unwrap();
        assert_eq!(js["tenants"][0]["backlog"]["total"], 6);
        assert_eq!(js["tenants"][0]["running"], 2);
    }

    #[test]
    fn bucket_reads_read_a_settled_bucket_once_and_forget_what_left_the_window() {
        let mut r: BucketReads<u8> = BucketReads::new(10_000, 30_000, 5_000);
        // The window (10 s, 40 s] overlaps the buckets starting at 10, 20, 30 and 40 s.
        assert_eq!(r.wanted(40_000), vec![10_000, 20_000, 30_000, 40_000]);
        for b in [10_000, 20_000, 30_000, 40_000] {
            r.put(b, vec![1], 40_000);
        }
        // 10 s and 20 s had settled when read (ended 5 s before or earlier); 30 s and 40 s not.
        assert_eq!(r.wanted(41_000), vec![30_000, 40_000]);
        assert_eq!(r.cells().count(), 4);
        // At 55 s the window is (25 s, 55 s]: bucket 10 s is dropped, 50 s is new.
        assert_eq!(r.wanted(55_000), vec![30_000, 40_000, 50_000]);
        assert_eq!(r.cells().map(|(b, _)| b).collect::<Vec<_>>(), vec![20_000, 30_000, 40_000]);
    }

    #[test]
    fn own_cells_are_rewritten_only_when_changed_and_evicted_by_age() {
        let mut c: OwnCells<i64> = OwnCells::new(10_000);
        c.update("a", 1_000, |v| *v += 1);
        c.update("b", 12_000, |v| *v += 5);
        let p = c.pending();
        assert_eq!(p, vec![(0, "a".to_string(), 1), (10_000, "b".to_string(), 5)]);
        c.written(&p);
        assert!(c.pending().is_empty());
        c.update("b", 13_000, |v| *v += 1);
        assert_eq!(c.pending(), vec![(10_000, "b".to_string(), 6)], "cumulative, written whole");
        c.evict(31_000, 10_000);
        assert_eq!(c.pending(), Vec::<(Millis, String, i64)>::new(), "bucket 10 s ended 11 s ago, evicted");
    }

    #[test]
    fn bounded_cells_keep_at_most_max_keys_per_bucket() {
        let mut c: OwnCells<i64> = OwnCells::new(10_000);
        assert!(c.update_bounded("a", 0, 2, |v| *v += 1));
        assert!(c.update_bounded("b", 0, 2, |v| *v += 1));
        assert!(!c.update_bounded("c", 0, 2, |v| *v += 1), "a third key in a full bucket");
        assert!(c.update_bounded("a", 1, 2, |v| *v += 1), "a key already counted");
        assert!(c.update_bounded("c", 10_000, 2, |v| *v += 1), "the next bucket has room");
        assert_eq!(c.pending().len(), 3);
    }

    #[test]
    fn joined_keys_are_the_parts_with_their_separator_and_stay_bounded() {
        let mut c: OwnCells<i64> = OwnCells::new(10_000);
        let key = |a: &str, b: &str| format!("{a}{KEY_JOIN}{b}");
        assert!(c.update_joined(("echo", "acme"), 0, Some(2), |v| *v += 1));
        assert!(c.update_joined(("echo", "globex"), 1, Some(2), |v| *v += 2));
        c.update(&key("echo", "acme"), 2, |v| *v += 10);
        assert!(!c.update_joined(("echo", "initech"), 3, Some(2), |v| *v += 1), "a third key in a full bucket");
        assert!(c.update_joined(("echo", "acme"), 4, Some(2), |v| *v += 100), "a key already counted");
        assert!(c.update_joined(("echo", "initech"), 5, None, |v| *v += 1000), "no bound");
        let mut p = c.pending();
        p.sort();
        let want = [("acme", 111), ("globex", 2), ("initech", 1000)].map(|(t, n)| (0, key("echo", t), n));
        assert_eq!(p, want);
        assert_eq!(split_joined(&key("echo", "acme")), Some(("echo", "acme")));
        assert_eq!(split_joined("echo"), None);
    }
}
