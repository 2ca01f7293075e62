//! Scheduler configuration: tiers, per-tenant policy and the per-pool knobs, with
//! validation that names the offending field and the fix.

use crate::model::{Millis, Pool};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A tenant's commercial tier. Decides its weight and its guarantees (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// All free tenants together form ONE flow of weight `weights.free_tier` (1.0),
    /// shared equally (in slot-time) between the free tenants that have work.
    #[default]
    Free,
    /// Weight 10 per tenant.
    Standard,
    /// Weight 100 per tenant plus a minimum share floor (`pro_min_share`).
    Pro,
    /// Weight 1000 per tenant plus slots reserved for it alone (`enterprise_reserved_slots`).
    Enterprise,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Free, Tier::Standard, Tier::Pro, Tier::Enterprise];
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Standard => "standard",
            Tier::Pro => "pro",
            Tier::Enterprise => "enterprise",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown tier {s:?}: expected one of free, standard, pro, enterprise"))
    }
}

/// Weight of each tier. Only ratios matter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierWeights {
    /// Weight of the whole free tier (one flow shared by every free tenant).
    pub free_tier: f64,
    pub standard: f64,
    pub pro: f64,
    pub enterprise: f64,
}

impl Default for TierWeights {
    fn default() -> Self {
        TierWeights { free_tier: 1.0, standard: 10.0, pro: 100.0, enterprise: 1000.0 }
    }
}

impl TierWeights {
    pub fn of(&self, tier: Tier) -> f64 {
        match tier {
            Tier::Free => self.free_tier,
            Tier::Standard => self.standard,
            Tier::Pro => self.pro,
            Tier::Enterprise => self.enterprise,
        }
    }
}

/// A dispatch rate limit (GCRA / token bucket): at most `burst` dispatches at once, refilled
/// at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained dispatches per second (may be fractional, e.g. 0.5 = one every 2 s).
    pub per_second: f64,
    /// Dispatches allowed back to back after an idle period (at least 1).
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

impl RateLimit {
    pub fn per_second(per_second: f64) -> Self {
        RateLimit { per_second, burst: 1 }
    }
}

/// Scheduling policy of one tenant in one pool of one worker. Every `None` means "the
/// tier's default from [`SchedulerConfig`]".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicy {
    pub tier: Tier,
    /// Overrides the tier weight. Not allowed for free tenants (they share the free-tier weight).
    pub weight: Option<f64>,
    /// Most jobs of this tenant running at once in this pool on this worker.
    pub max_running: Option<usize>,
    /// Dispatch rate limit of this tenant in this pool on this worker.
    pub rate_limit: Option<RateLimit>,
    /// Most jobs of this tenant queued here; `enqueue` rejects beyond it.
    pub max_queued: Option<usize>,
    /// Enterprise only: slots only this tenant may use (idle when it has nothing queued).
    pub reserved_slots: Option<usize>,
    /// Minimum share of the pool's shared slot-time while backlogged, 0..1. Not for free
    /// tenants. Default: `pro_min_share` for pro, none otherwise.
    pub min_share: Option<f64>,
    /// Suspended: queued jobs wait (wait reason `suspended`), nothing is dispatched.
    pub suspended: bool,
}

impl TenantPolicy {
    /// The policy of a tenant never configured with `set_tenant` (see `default_tenant`).
    pub fn unconfigured(cfg: &super::SchedulerConfig, name: &str) -> Self {
        if crate::core::tenants::AccountPattern::any(&cfg.free_accounts, name) {
            TenantPolicy::tier(Tier::Free)
        } else {
            cfg.default_tenant.clone()
        }
    }

    pub fn tier(tier: Tier) -> Self {
        TenantPolicy { tier, ..Default::default() }
    }
}

/// Knobs of one pool's scheduler. Start from [`SchedulerConfig::for_pool`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Worker slots of this process for this pool.
    pub slots: usize,
    /// Cost estimate (slot-ms) of a job type never measured here.
    pub default_cost_ms: f64,
    /// Smallest charge of one job (slot-ms): keeps zero-length jobs from being free.
    pub min_cost_ms: f64,
    /// Weight of the newest measurement in a job type's moving average (0 < a <= 1).
    pub ewma_alpha: f64,
    /// A queued job rises one priority level per this much waiting (low -> normal -> urgent).
    pub aging_step_ms: Millis,
    pub weights: TierWeights,
    /// Default minimum share of pro tenants (fraction of the shared slots), e.g. 0.01.
    pub pro_min_share: f64,
    /// Sum of the floors of backlogged tenants is scaled down to at most this (0..1), so
    /// floors can never crowd out weighted sharing.
    pub max_total_min_share: f64,
    /// Default reserved slots of an enterprise tenant (per tenant, this pool, this worker).
    pub enterprise_reserved_slots: usize,
    /// Reservations may never leave fewer shared slots than this.
    pub min_shared_slots: usize,
    /// Default `max_queued` of a tenant.
    pub max_queued_per_tenant: usize,
    /// Most slot-ms of service credit a capped or rate-limited tenant keeps when it
    /// becomes eligible again (stops credit banked while blocked from turning into a burst).
    pub max_credit_ms: f64,
    /// Most wall-clock ms of unused floor a tenant can bank (limits floor bursts).
    pub floor_burst_ms: f64,
    /// Half-life (ms) of the decayed fleet usage passed to `fold_fleet_usage`.
    pub fleet_half_life_ms: f64,
    /// How much one slot-ms used elsewhere counts here (1.0 = like local use).
    pub fleet_usage_scale: f64,
    /// Fleet usage can push a tenant at most this many (weighted) slot-ms ahead of the
    /// local virtual time, so it always gets served eventually.
    pub max_fleet_lead_ms: f64,
    /// Half-life (ms) of the "actual share" window in stats.
    pub stats_half_life_ms: f64,
    /// Policy of tenants never configured with `set_tenant`...
    pub default_tenant: TenantPolicy,
    /// ...except row-less free accounts (names matching one of these): the free tier's.
    pub free_accounts: Vec<crate::core::tenants::AccountPattern>,
    /// Job types tracked for cost estimates; further types use `default_cost_ms`.
    pub max_job_types: usize,
    /// Extra lanes beyond `slots`, used only when every shared slot is busy, and only by
    /// a light tenant (its job arrived while it had nothing queued or running here) not
    /// ahead of its fair share, for one job estimated at most `fast_lane_max_cost_ms`:
    /// a quiet tenant's short job starts at once instead of waiting for a flood's
    /// run-to-completion jobs to end. 0 = a strict cap of `slots`.
    pub fast_lanes: usize,
    /// Largest estimated cost (slot-ms) of a job that may take a fast lane.
    pub fast_lane_max_cost_ms: f64,
    /// A tenant with nothing queued or running here and no activity for this long is
    /// forgotten by [`super::Scheduler::evict_idle`] (its policy is kept): it comes back
    /// as a new tenant does, at the virtual time, with no banked credit.
    pub idle_evict_ms: Millis,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::for_pool(Pool::Medium, 16)
    }
}

impl SchedulerConfig {
    /// Defaults for a pool: unknown job types cost 100 ms (short), 10 s (medium) or
    /// 10 min (long); aging, credit and burst limits scale with that.
    pub fn for_pool(pool: Pool, slots: usize) -> Self {
        let (default_cost_ms, aging_step_ms): (f64, Millis) = match pool {
            Pool::Short => (100.0, 5_000),
            Pool::Medium => (10_000.0, 60_000),
            Pool::Long => (600_000.0, 900_000),
        };
        SchedulerConfig {
            slots,
            default_cost_ms,
            min_cost_ms: 1.0,
            ewma_alpha: 0.2,
            aging_step_ms,
            weights: TierWeights::default(),
            pro_min_share: 0.01,
            max_total_min_share: 0.5,
            enterprise_reserved_slots: 0,
            min_shared_slots: 1,
            max_queued_per_tenant: 10_000,
            max_credit_ms: 10.0 * default_cost_ms,
            floor_burst_ms: 10.0 * default_cost_ms,
            fleet_half_life_ms: 300_000.0,
            fleet_usage_scale: 1.0,
            max_fleet_lead_ms: 60.0 * default_cost_ms,
            stats_half_life_ms: 60_000.0,
            default_tenant: TenantPolicy::default(),
            free_accounts: Vec::new(),
            max_job_types: 10_000,
            fast_lanes: 0,
            fast_lane_max_cost_ms: default_cost_ms,
            idle_evict_ms: 600_000,
        }
    }

    pub fn validate(&self) -> Result<(), SchedulerError> {
        let bad = |field: &str, message: String| Err(SchedulerError::Invalid { field: field.to_string(), message });
        if self.slots == 0 {
            return bad("slots", "must be at least 1".into());
        }
        if self.min_shared_slots > self.slots {
            return bad(
                "min_shared_slots",
                format!("is {} but the pool has only {} slots", self.min_shared_slots, self.slots),
            );
        }
        for (field, v) in [
            ("default_cost_ms", self.default_cost_ms),
            ("min_cost_ms", self.min_cost_ms),
            ("fleet_half_life_ms", self.fleet_half_life_ms),
            ("stats_half_life_ms", self.stats_half_life_ms),
            ("weights.free_tier", self.weights.free_tier),
            ("weights.standard", self.weights.standard),
            ("weights.pro", self.weights.pro),
            ("weights.enterprise", self.weights.enterprise),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, format!("must be a positive number, got {v}"));
            }
        }
        for (field, v) in [
            ("max_credit_ms", self.max_credit_ms),
            ("floor_burst_ms", self.floor_burst_ms),
            ("fleet_usage_scale", self.fleet_usage_scale),
            ("max_fleet_lead_ms", self.max_fleet_lead_ms),
            ("fast_lane_max_cost_ms", self.fast_lane_max_cost_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, format!("must be zero or a positive number, got {v}"));
            }
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return bad("ewma_alpha", format!("must be in (0, 1], got {}", self.ewma_alpha));
        }
        if self.idle_evict_ms <= 0 {
            return bad("idle_evict_ms", format!("must be positive, got {}", self.idle_evict_ms));
        }
        if self.aging_step_ms <= 0 {
            return bad("aging_step_ms", format!("must be positive, got {}", self.aging_step_ms));
        }
        if !(0.0..1.0).contains(&self.pro_min_share) {
            return bad("pro_min_share", format!("must be in [0, 1), got {}", self.pro_min_share));
        }
        if !(self.max_total_min_share > 0.0 && self.max_total_min_share < 1.0) {
            return bad("max_total_min_share", format!("must be in (0, 1), got {}", self.max_total_min_share));
        }
        if self.max_queued_per_tenant == 0 {
            return bad("max_queued_per_tenant", "must be at least 1".into());
        }
        self.default_tenant.validate("default_tenant")?;
        if self.default_tenant.tier == Tier::Enterprise
            && self.default_tenant.reserved_slots.unwrap_or(self.enterprise_reserved_slots) > 0
        {
            return bad(
                "default_tenant",
                "unconfigured tenants cannot reserve slots; make the default tier non-enterprise or set reserved_slots = 0"
                    .into(),
            );
        }
        Ok(())
    }
}

impl TenantPolicy {
    /// Checks the fields on their own (capacity checks happen in `Scheduler::set_tenant`).
    pub fn validate(&self, who: &str) -> Result<(), SchedulerError> {
        let bad =
            |field: &str, message: String| Err(SchedulerError::Invalid { field: format!("{who}.{field}"), message });
        if let Some(w) = self.weight {
            if self.tier == Tier::Free {
                return bad(
                    "weight",
                    "free tenants share the free-tier weight; remove weight or choose a paid tier".into(),
                );
            }
            if !(w.is_finite() && w > 0.0) {
                return bad("weight", format!("must be a positive number, got {w}"));
            }
        }
        if self.max_running == Some(0) {
            return bad("max_running", "must be at least 1 (0 would never run anything)".into());
        }
        if self.max_queued == Some(0) {
            return bad("max_queued", "must be at least 1".into());
        }
        if let Some(r) = self.rate_limit {
            if !(r.per_second.is_finite() && r.per_second > 0.0 && 1.0 / r.per_second < 1e9) {
                return bad(
                    "rate_limit.per_second",
                    format!("must be a positive number of dispatches per second, got {}", r.per_second),
                );
            }
            if r.burst == 0 {
                return bad("rate_limit.burst", "must be at least 1".into());
            }
        }
        if let Some(r) = self.reserved_slots {
            if r > 0 && self.tier != Tier::Enterprise {
                return bad(
                    "reserved_slots",
                    "only enterprise tenants can reserve slots; set tier = \"enterprise\" or remove it".into(),
                );
            }
        }
        if let Some(m) = self.min_share {
            if self.tier == Tier::Free && m > 0.0 {
                return bad("min_share", "free tenants have no floor; remove min_share or choose a paid tier".into());
            }
            if !(0.0..1.0).contains(&m) {
                return bad("min_share", format!("must be a fraction in [0, 1), got {m}"));
            }
        }
        Ok(())
    }
}

/// A scheduler setting, tenant policy or slot count the scheduler cannot honour; the
/// message names the field and the fix. (Not `config::ConfigError`, the config file's
/// error: a bad scheduler section is reported there with this message.)
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedulerError {
    #[error("scheduler setting `{field}` {message}")]
    Invalid { field: String, message: String },
    #[error(
        "tenant {tenant:?} asks for {requested} reserved slots but only {available} can be reserved \
         ({slots} slots, {reserved_by_others} reserved by other tenants, at least {min_shared} must stay shared); \
         lower its reserved_slots or give the pool more slots"
    )]
    ReservationTooLarge {
        tenant: String,
        requested: usize,
        available: usize,
        slots: usize,
        reserved_by_others: usize,
        min_shared: usize,
    },
    #[error(
        "cannot shrink the pool to {slots} slots: {reserved} are reserved and at least {min_shared} must stay shared"
    )]
    SlotsTooFew { slots: usize, reserved: usize, min_shared: usize },
}
