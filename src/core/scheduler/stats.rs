//! Introspection types for `fairway top`, `fairway stats --json` and the metrics.

use super::config::Tier;
use crate::model::{Millis, Pool};
use serde::Serialize;

/// Why a tenant's next queued job is not running yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WaitReason {
    /// All shared slots are busy and other tenants are ahead in fair order (their
    /// received slot-time per weight is lower); it gets a slot as they catch up.
    Deficit,
    /// The tenant already runs `max_running` jobs in this pool here.
    ConcurrencyCap,
    /// The tenant's dispatch rate limit allows the next dispatch at `until` (epoch ms).
    RateLimited { until: Millis },
    /// Shared slots are busy while slots reserved for enterprise tenants sit idle; those
    /// are never lent out.
    ReservedSlots,
    /// The tenant is suspended (`fairway tenants suspend`): its jobs wait until resumed.
    Suspended,
    /// Its jobs' children were killed or ended abnormally too often in this pool
    /// (`core::recycling`): its jobs wait until `until` (epoch ms), the others run.
    RecyclingCap { until: Millis },
}

/// Jobs queued per priority (as submitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Backlog {
    pub urgent: usize,
    pub normal: usize,
    pub low: usize,
    pub total: usize,
}

/// One tenant in one pool of this worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantStats {
    pub tenant: String,
    pub tier: Tier,
    /// Scheduling weight (for free tenants: their equal part of the free-tier weight
    /// among the free tenants currently active).
    pub weight: f64,
    pub backlog: Backlog,
    /// Age (ms) of the oldest queued job.
    pub oldest_wait_ms: Option<Millis>,
    pub running: usize,
    /// Of `running`, how many occupy the tenant's reserved slots.
    pub running_reserved: usize,
    pub reserved_slots: usize,
    pub max_running: Option<usize>,
    pub rate_limit_per_second: Option<f64>,
    pub min_share: Option<f64>,
    /// Slot-seconds used here since start (finished runs plus elapsed time of running ones).
    pub slot_seconds_used: f64,
    /// Fair-queueing position in slot-ms: positive = owed service (behind the others),
    /// negative = ahead of its fair share.
    pub deficit_ms: f64,
    /// Share of this pool's slots the tenant is entitled to right now given the active
    /// tenants: (reserved slots + its weighted part of the shared slots) / slots. Idle
    /// tenants are entitled to their reserved slots only.
    pub entitlement_share: f64,
    /// Share of this pool's slot-time it actually used over a decayed window
    /// (`stats_half_life_ms`).
    pub actual_share: f64,
    pub dispatched: u64,
    pub wait_reason: Option<WaitReason>,
}

/// The pool as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolStats {
    pub pool: Pool,
    pub slots: usize,
    /// Slots reserved for enterprise tenants (idle when their owner has nothing queued).
    pub reserved_slots: usize,
    pub shared_slots: usize,
    pub running: usize,
    pub running_reserved: usize,
    /// Reserved slots with nothing running, which no other tenant may take.
    pub idle_reserved: usize,
    /// Shared slots free right now.
    pub free_shared: usize,
    /// Fast lanes (beyond `slots`, for tenants with nothing running) and how many are busy.
    pub fast_lanes: usize,
    pub running_fast_lane: usize,
    pub queued: usize,
    /// Tenants whose state this scheduler holds (idle ones are evicted, see `evicted`).
    pub tenants: usize,
    pub active_tenants: usize,
    /// Idle tenants forgotten since start (`SchedulerConfig::idle_evict_ms`).
    pub evicted_tenants: u64,
    /// Fair-queueing virtual time (weighted slot-ms).
    pub virtual_time: f64,
    /// When a rate-limited job becomes eligible, if the loop should wake up for it.
    pub next_wakeup: Option<Millis>,
}

/// Everything `stats --json` prints for one pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchedulerStats {
    pub at: Millis,
    pub pool: PoolStats,
    pub tenants: Vec<TenantStats>,
}

/// An exponentially decayed integral of a level over time: after a constant level `x`
/// for a long time its value is `x * tau`; dividing two such integrals gives a share over
/// a recent, smoothly forgotten window.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Decayed {
    value: f64,
    at: Millis,
}

impl Decayed {
    pub(crate) fn new(at: Millis) -> Self {
        Decayed { value: 0.0, at }
    }

    /// The integral at `now` if the level was `level` since the last update.
    pub(crate) fn value_at(&self, now: Millis, level: f64, tau: f64) -> f64 {
        let dt = (now - self.at).max(0) as f64;
        if dt == 0.0 {
            return self.value;
        }
        let keep = (-dt / tau).exp();
        self.value * keep + level * tau * (1.0 - keep)
    }

    /// Records that the level was `level` from the last update until `now`.
    pub(crate) fn advance(&mut self, now: Millis, level: f64, tau: f64) {
        if now > self.at {
            self.value = self.value_at(now, level, tau);
            self.at = now;
        }
    }
}
