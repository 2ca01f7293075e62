//! The fair scheduler: which queued job gets the next free worker slot of a pool.
//!
//! Pure: no I/O, no system clock (`now` is an argument, epoch ms), no async. One
//! [`Scheduler`] per pool per worker process; the worker loop enqueues decoded jobs, asks
//! [`Scheduler::next`] for work whenever something changed, reports the end of every run
//! with [`Scheduler::complete`] (or [`Scheduler::release`]) and sleeps until
//! [`Scheduler::next_wakeup`] or the next event. `J` is the worker's payload (e.g. the
//! decoded job plus its Kafka origin); the scheduler never looks inside it.
//!
//! ```text
//! let mut s = Scheduler::new(pool, SchedulerConfig::for_pool(pool, slots))?;
//! s.set_tenant("acme", TenantPolicy { tier: Tier::Pro, max_running: Some(8), ..Default::default() })?;
//! s.enqueue(&job.tenant, &job.job_type, job.priority, pending, now)   // Err((Rejected, pending)) if full
//! while let Some(d) = s.next(now) { spawn(d.payload); remember(d.id) }
//! s.complete(d.id, finished_at);          // or s.release(d.id, now) when it did not really run
//! sleep_until(min(s.next_wakeup(now), next event));
//! every few seconds: publish s.local_usage_since_last_report(now);
//!                    s.fold_fleet_usage(&usage_elsewhere, now);
//!                    s.evict_idle(now);
//! ```
//!
//! # The unit of fairness: slot-time
//!
//! A tenant's share is measured in slot-milliseconds (one worker slot busy for one ms),
//! not in jobs: a hundred 4-hour jobs cost a million times a hundred 10-ms ones. Each
//! dispatch is charged an *estimate* of its slot-time (an exponentially weighted moving
//! average of the tenant's measured run times of its job type; for a type the tenant
//! never ran, the average over all tenants; `default_cost_ms` for types never seen)
//! and the charge is *reconciled* to the measured run time when the job finishes, so
//! tenants whose jobs overrun pay for it and tenants whose jobs are shorter get it back.
//!
//! # Algorithm: start-time fair queueing over estimated slot-time
//!
//! Every flow `f` has a weight `w_f` and a virtual tag `v_f` = slot-ms charged to it /
//! `w_f`. The scheduler keeps a monotonic virtual time `V`: the tag the latest fair pick
//! started from.
//!
//! * **Pick**: the eligible backlogged flow with the smallest tag (ties: older tenant).
//!   This is the "largest deficit per weight" rule of deficit round robin, with
//!   `deficit_f = (V - v_f) * w_f`, but needs no tick and no quantum: one ordered set,
//!   O(log n) per decision.
//! * **Dispatch**: `v_f += estimate / w_f`. **Finish**: `v_f += (actual - estimate) / w_f`.
//! * **Becoming active** (first job queued after having none): `v_f = max(v_f, V)`. An
//!   idle tenant banks no credit, and since `v_f` only ever holds what it really used
//!   (beyond `V`, i.e. more than its share while others were waiting) it is not
//!   penalised for the idle time either.
//! * **Becoming eligible again** after a concurrency cap or rate limit held it back:
//!   `v_f = max(v_f, V - max_credit_ms / w_f)`: a tenant blocked by its own limits keeps
//!   at most `max_credit_ms` of unused entitlement, so lifting a cap cannot unleash an
//!   unbounded burst.
//!
//! Start-time fair queueing was chosen over the tick-based deficit loop of the design
//! notes because it is work-conserving by construction (no tick can leave a slot idle),
//! costs O(log n) per dispatch instead of O(n) per tick, and has the bound below.
//!
//! ## Fairness bound
//!
//! Let `k` = shared slots, `L` = longest run time, `E` = largest estimate ever charged
//! (at most `max(default_cost_ms, L, min_cost_ms)`: the EWMA averages measured run
//! times), `M = max(E, L)`, `n` = number of backlogged flows and `W` their total weight.
//! "Eligible" = not capped, not rate-limited; the statements exclude min-share picks and
//! fleet penalties.
//!
//! *Lemma (tag spread).* If flows f and g are both backlogged and eligible throughout a
//! period, then at any time in it after f's first fair pick,
//! `v_f - v_g <= (E + k*M)/w_f + k*E/w_g <= Δ_fg := (E + k*M) * (1/w_f + 1/w_g)`.
//! Proof: at f's latest pick `v_f <= v_g` (f had the smallest tag); the pick adds at most
//! `E/w_f`; after it `v_f` moves only by reconciling f's at most `k` jobs then running
//! (each at most `+M/w_f`), while `v_g` only grows except when reconciling its at most
//! `k` running jobs (each at least `-E/w_g`). Clamps only ever raise a tag.
//!
//! *Theorem (share).* Over a window of length `T` in which every flow stays backlogged
//! and eligible (so all `k` shared slots stay busy) and has been picked once, flow f with
//! entitlement `e_f = w_f / W` receives shared slot-time `A_f` with
//!
//! ```text
//! |A_f - e_f * k * T| <= 2 (E + k M) (1 + n e_f) + 4 k M (1 + e_f)
//! ```
//!
//! (apply the lemma at both ends: `S_f/w_f - S_g/w_g <= 2 Δ_fg` for the charges `S`;
//! weight-average over g; charges differ from slot-time received in the window only for
//! jobs straddling its ends, at most `k` per end and `2M` each). The share error is
//! `O((n + k) M / (k T))`: e.g. `n = 8`, `k = 1`, `M = 10 s` gives at most 5 % once
//! `T > 42 min`. A free tenant, one of `m` backlogged members of the free flow G (which
//! runs the same algorithm inside with equal weights), is entitled to `e_G / m` with
//! error at most `4 (E + k M) + 2 (E + k M)(1 + n e_G) / m + 4 k M (1 + e_f)`.
//!
//! *Theorem (no starvation).* A backlogged, eligible paid flow f is dispatched at least
//! once in every interval longer than
//! `5 M + (W - w_f) M / w_f + 2 (E + k M) ((W - w_f) / w_f + n - 1) / k`,
//! a free tenant at least once in every interval longer than
//! `(4 k M + (W / w_G) m (k M + 4 (E + k M)) + 2 (E + k M)(n - 1 + (W - w_G) / w_G)) / k`
//! (in an interval without a dispatch of f, f is charged at most `k M`, every other
//! flow at most its lemma-bounded lead over f, while the busy slots deliver `k` slot-ms
//! per ms). A queued job then waits at most that per job ahead of it in its tenant's
//! effective order (see aging below), so no eligible job waits unboundedly.
//!
//! The property tests assert both theorems, per generated case, on simulated runs
//! (`proptests.rs`); observed errors stay far inside these worst-case bounds.
//!
//! # Weights by tier
//!
//! * **free**: all free tenants together are ONE flow of weight `weights.free_tier`
//!   (1.0). Inside it the same fair queueing runs with equal weights, so the free tier
//!   gets `w_free / W` of the shared slots however many free accounts flood it, shared
//!   equally in slot-time among the free tenants that have work.
//! * **standard**: weight 10. **pro**: weight 100 plus a minimum share floor.
//! * **enterprise**: weight 1000 plus reserved slots.
//!
//! **Min-share floor** (pro, default `pro_min_share` = 1 % of the shared slots): a
//! virtual-clock guarantee on top of fair queueing. The tenant has a floor tag `F` in
//! wall-clock ms, advanced by `charge / (share * k)` for every shared-slot charge;
//! while `F <= now` the tenant is behind its floor and gets the next shared slot before
//! the fair pick. If its weighted share is above the floor, `F` runs ahead of `now` and
//! the floor never acts; a tenant held at its floor runs ahead in fair order, so it gets
//! the floor, not the floor plus its weighted share. Floors of backlogged tenants are
//! scaled down to at most `max_total_min_share` in total, so floors can never starve
//! weighted sharing; at most `floor_burst_ms` of unused floor is banked. (Floors are
//! verified by property tests - delivered share >= floor - 1 point over long runs - not
//! by a closed-form bound.)
//!
//! **Reserved slots** (enterprise, `enterprise_reserved_slots` or the tenant's
//! `reserved_slots`): that many of this pool's slots on this worker are the tenant's
//! alone. It uses them first and competes for the shared slots with its weight beyond
//! them; its reserved-slot runs are a separate logical pool and are not charged to its
//! fair-queueing tag. **The contract: when the tenant has nothing queued its reserved
//! slots stay idle - no one else may take them, so they are outside work conservation
//! for everyone else.** A reservation is refused if it would leave fewer than
//! `min_shared_slots` shared slots. Stats report such waits as
//! [`WaitReason::ReservedSlots`].
//!
//! # Flow control
//!
//! Per-tenant concurrency cap (`max_running`, lowered to this worker's part of a
//! fleet-wide cap by [`Scheduler::set_fleet_cap`]), per-tenant dispatch rate limit (GCRA
//! on a clock set from `now`, scaled to this worker's share of a fleet-wide rate by
//! [`Scheduler::set_fleet_rate`], see `clock.rs`) and per-tenant queue depth limit
//! (`max_queued`: [`Scheduler::enqueue`] returns [`Rejected::QueueFull`] and hands the
//! payload back). A capped or rate-limited tenant simply leaves the ready set until its
//! slot frees or its token is due; [`Scheduler::next_wakeup`] returns that due time.
//!
//! # Work conservation
//!
//! `next` returns a job whenever a shared slot is free and any tenant has an eligible job
//! (queued, under its cap, not rate-limited), or an enterprise tenant has an eligible job
//! and a free reserved slot. Only reserved slots can idle while work waits.
//!
//! # Fast lanes (latency for light tenants)
//!
//! Jobs run to completion, so even a perfectly fair pick leaves a light tenant waiting
//! for the next slot to free: behind a flood of 50 ms jobs on 8 slots that is up to a
//! whole run time, and the flood's starts tend to line up. `fast_lanes` (default 0 here;
//! the worker sets slots/16 rounded up) adds that many lanes beyond `slots`, used only
//! while every shared slot is busy and only by a tenant that
//! * is *light*: its queued work arrived while it had nothing queued or running here
//!   (a backlogged tenant never qualifies, whatever its weight),
//! * has nothing running (so one lane job per tenant),
//! * is not ahead of its fair share by more than `fast_lane_max_cost_ms`, and
//! * whose next job is estimated at most `fast_lane_max_cost_ms`.
//!
//! Among those, the longest-waiting job goes first. A lane job is charged to its tenant's
//! tag like any other (without moving virtual time), so lanes change *when* a light
//! tenant's job starts, not how much slot-time anyone gets; concurrency may exceed
//! `slots` by at most `fast_lanes`. The property tests check every lane dispatch against
//! these rules; `fairway-bench bench fairness --fast-lanes 0` shows the latency without them.
//!
//! # Priorities and aging (inside one tenant)
//!
//! Fairness picks the tenant; the tenant's job is the one with the best *effective*
//! priority: submitted priority (urgent 0, normal 1, low 2) minus one level per
//! `aging_step_ms` waited, floored at urgent; ties go to the longer-waiting job. So an
//! urgent job overtakes normal and low ones, but a low job becomes urgent-equivalent after
//! `2 * aging_step_ms` and is then served in arrival order with the urgent ones: it
//! waits at most `2 * aging_step_ms` plus the service of the jobs queued before it.
//!
//! # Cost
//!
//! `next` + `complete` are O(log n) (a few ordered-set re-keyings, one token check):
//! about 1 µs per dispatch with 1000 backlogged tenants (`dispatch_cost_with_1000_tenants`).
//! `stats` and `drain_where` are O(tenants + queued) and meant for occasional use.
//!
//! # Fleet-wide usage
//!
//! Each worker publishes [`Scheduler::local_usage_since_last_report`] (slot-seconds per
//! tenant, running jobs included up to `now`). The fleet side keeps per tenant an
//! exponentially decayed sum of everyone's reports (half-life `fleet_half_life_ms`) and
//! hands each scheduler, via [`Scheduler::fold_fleet_usage`], the decayed usage
//! **elsewhere** (other workers and pools; the caller subtracts this scheduler's own
//! part). The scheduler turns the growth of that level beyond its decay into fresh
//! external slot-ms and charges it to the tenant's tag like local use, scaled by
//! `fleet_usage_scale`: a tenant running a lot elsewhere falls behind in fair order here.
//! Limits: the correction is only as fresh as the reporting interval; a tenant is pushed
//! at most `max_fleet_lead_ms` (weighted) ahead of `V`, so it is always served eventually;
//! tenants never seen here are not tracked (they start at `V` like any new tenant);
//! external usage does not move min-share floors or reserved slots, which stay local
//! guarantees; and a free tenant's external usage is charged to the free flow as a whole.
//!
//! # Memory: idle tenants are forgotten
//!
//! A tenant's state (queues, tags, limiter, estimates, counters) is held only while it is
//! active here or was lately: [`Scheduler::evict_idle`] forgets a tenant with nothing
//! queued or running and no enqueue, dispatch or completion for `idle_evict_ms`
//! (default 10 minutes). Only a policy `set_tenant` gave it (one that differs from the
//! unconfigured policy) outlives that, so memory is O(tenants active within
//! `idle_evict_ms` + configured tenants), however many tenants ever submitted a job.
//! Tenants carrying state the worker set beyond their policy (reserved slots, a fleet
//! cap or rate part, a recycling hold, rate-limit debt, unreported usage) are kept until
//! it is cleared: forgetting it would loosen a limit.
//!
//! Eviction cannot be used to gain service. An evicted tenant comes back exactly as a new
//! tenant does, with `v_f = V` (no banked credit, and a full rate bucket, which it had
//! anyway: its limiter had settled). A tenant that was kept comes back at `max(v_f, V)`,
//! the same unless it had used more than its share (`v_f > V`): eviction can forgive that
//! excess, which by the lemma is at most `E + k M` weighted slot-ms (plus
//! `max_fleet_lead_ms` of fleet penalty) when it went idle, and only the part `V` did not
//! catch up with during the `idle_evict_ms` it stayed idle, i.e. only if the others did
//! not use the slots meanwhile. A tenant cycling "burst, idle `idle_evict_ms`" gains at
//! most `(E + k M + max_fleet_lead_ms) / (k idle_evict_ms)` of the slots, having given up
//! all of them for the idle period. Its own cost estimates restart from the job type's,
//! and its stats counters (`dispatched`, `slot_seconds_used`) from zero.

mod clock;
mod config;
mod stats;

#[cfg(test)]
mod eviction;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use config::{RateLimit, SchedulerConfig, SchedulerError, TenantPolicy, Tier, TierWeights};
pub use stats::{Backlog, PoolStats, SchedulerStats, TenantStats, WaitReason};

use crate::core::FastMap;
use crate::model::{Millis, Pool, Priority};
/// The GCRA limiter, shared with the flow keys' gate (`core::flow`).
pub(crate) use clock::{Limiter, PassedClock};
use serde::Serialize;
use stats::Decayed;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

/// Why `enqueue` refused a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Rejected {
    #[error(
        "tenant {tenant:?} has {depth} jobs queued in this worker's pool, the limit is {limit}; \
         the job was not accepted: slow down submissions or raise the tenant's max_queued"
    )]
    QueueFull { tenant: String, depth: usize, limit: usize },
}

/// Identifies a running job until `complete`/`release`. Stale ids are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DispatchId(u64);

impl DispatchId {
    pub fn as_u64(self) -> u64 {
        self.0
    }
    pub fn from_u64(v: u64) -> Self {
        DispatchId(v)
    }
}

impl fmt::Display for DispatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Which rule gave the job its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// Weighted fair queueing over the shared slots.
    Fair,
    /// The tenant was behind its minimum share (shared slot).
    MinShare,
    /// One of the tenant's reserved slots.
    Reserved,
    /// A fast lane: every shared slot was busy and the tenant had nothing running.
    FastLane,
}

/// A job that got a slot. Report its end with `complete(id, ..)` or `release(id, ..)`.
#[derive(Debug)]
pub struct Dispatch<J> {
    pub id: DispatchId,
    pub tenant: Arc<str>,
    pub job_type: Arc<str>,
    /// As submitted.
    pub priority: Priority,
    /// After aging, when it was picked.
    pub effective_priority: Priority,
    pub enqueued_at: Millis,
    pub dispatched_at: Millis,
    /// Slot-ms charged up front (reconciled at the end).
    pub estimated_ms: f64,
    pub via: Via,
    pub payload: J,
}

/// A slot freed by `complete`/`release`, and what its job used.
#[derive(Debug, Clone, PartialEq)]
pub struct Freed {
    pub tenant: Arc<str>,
    pub job_type: Arc<str>,
    /// Run time (finished - dispatched, at least 0).
    pub ran_ms: Millis,
    pub estimated_ms: f64,
    pub via: Via,
}

const GROUP: u32 = u32::MAX;
const UNTRACKED: u32 = u32::MAX;

/// An entry of an ordered ready set: smallest tag first, then the older tenant.
#[derive(Debug, Clone, Copy)]
struct Key {
    tag: f64,
    id: u32,
}

impl Key {
    fn new(tag: f64, id: u32) -> Key {
        Key { tag, id }
    }
}

impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.tag.total_cmp(&o.tag).then(self.id.cmp(&o.id))
    }
}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Key {}

fn level(p: Priority) -> usize {
    match p {
        Priority::Urgent => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

/// A limit of a tenant's own that holds its queued jobs ([`Scheduler::held_at_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnLimit {
    /// Its concurrency cap (`tenants.<name>.max_concurrency`, fleet-wide).
    Concurrency,
    /// Its dispatch rate (`tenants.<name>.rate_per_sec`, fleet-wide).
    Rate,
}

impl OwnLimit {
    /// The limit's name in refusal codes and alert rules (`held:<name>:<pool>`).
    pub fn as_str(self) -> &'static str {
        match self {
            OwnLimit::Concurrency => "max_concurrency",
            OwnLimit::Rate => "rate_per_sec",
        }
    }
}

#[derive(Debug)]
struct Waiting<J> {
    payload: J,
    jt: u32,
    job_type: Arc<str>,
    enqueued_at: Millis,
}

struct Tenant<J> {
    name: Arc<str>,
    policy: TenantPolicy,
    /// Fair weight: the tier's (or overridden) weight; 1 inside the free flow.
    weight: f64,
    free: bool,
    /// Suspended: its queued jobs wait, nothing of it is dispatched.
    suspended: bool,
    /// Held by the recycling cap (`core::recycling`) until this time: its queued jobs
    /// wait, the others' run. Set and lifted by the worker (`set_held`).
    held: Option<Millis>,
    /// In force: the lower of the policy's `max_running` and the fleet cap.
    max_running: usize,
    /// This worker's part of the tenant's fleet-wide `max_running` (`core::quota`).
    fleet_cap: usize,
    max_queued: usize,
    reserved: usize,
    min_share: f64,
    limiter: Option<Limiter>,
    queues: [VecDeque<Waiting<J>>; 3],
    queued: usize,
    running: usize,
    running_reserved: usize,
    /// Fair-queueing tag (top level; inside the free flow for free tenants).
    tag: f64,
    /// Min-share floor tag, wall-clock ms.
    floor_tag: f64,
    blocked_until: Option<Millis>,
    /// Key under which it sits in its ready set (top level or free flow), if it does.
    ready_key: Option<f64>,
    floor_key: Option<f64>,
    /// Key (oldest queued job's arrival) in the fast-lane candidates, if it sits there.
    lane_key: Option<Millis>,
    /// Its queued work arrived while it had nothing queued or running, and none of it
    /// has started yet: a light tenant, not a backlogged one (only those take fast lanes).
    arrived_idle: bool,
    used_ms: f64,
    unreported_ms: f64,
    usage: Decayed,
    fleet_level: f64,
    fleet_at: Millis,
    dispatched: u64,
    /// Its latest enqueue, dispatch or completion here (for `evict_idle`).
    last_active: Millis,
    /// This tenant's own cost estimates per job type (EWMA), for at most
    /// `TENANT_ESTIMATES` types: the same job type can cost very different amounts for
    /// different tenants.
    own_est: FastMap<u32, f64>,
}

/// Job types per tenant with their own cost estimate; further types use the type's.
const TENANT_ESTIMATES: usize = 64;

impl<J> Tenant<J> {
    /// Index of the queue whose head goes next, and that head's effective level.
    fn best_level(&self, now: Millis, step: Millis) -> Option<(usize, usize)> {
        let mut best: Option<(i64, Millis, usize)> = None;
        for (lvl, q) in self.queues.iter().enumerate() {
            if let Some(h) = q.front() {
                let aged = (now - h.enqueued_at).max(0) / step;
                let rank = (lvl as i64 - aged).max(0);
                let key = (rank, h.enqueued_at, lvl);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        best.map(|(rank, _, lvl)| (lvl, rank as usize))
    }

    /// This tenant's charge for a job of type `jt`: its own estimate, else the type's.
    fn cost(&self, jt: u32, types: &JobTypes, default_ms: f64) -> f64 {
        match self.own_est.get(&jt) {
            Some(&e) => e,
            None => types.estimate(jt).unwrap_or(default_ms),
        }
    }

    fn oldest_enqueued(&self) -> Option<Millis> {
        self.queues.iter().filter_map(|q| q.front()).map(|w| w.enqueued_at).min()
    }
}

/// The free tier as one flow, with its own fair queueing inside.
#[derive(Debug)]
struct FreeGroup {
    weight: f64,
    tag: f64,
    /// Virtual time inside the group.
    vtime: f64,
    ready: BTreeSet<Key>,
    key: Option<f64>,
    /// Free tenants with queued jobs.
    backlogged: usize,
}

#[derive(Debug)]
struct InFlight {
    tenant: u32,
    jt: u32,
    job_type: Arc<str>,
    dispatched_at: Millis,
    reported_at: Millis,
    est: f64,
    via: Via,
}

/// Running jobs by `DispatchId` (index + generation, so stale ids miss).
#[derive(Debug, Default)]
struct Slab {
    entries: Vec<(u32, Option<InFlight>)>,
    free: Vec<u32>,
}

impl Slab {
    fn insert(&mut self, rec: InFlight) -> DispatchId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push((0, None));
                (self.entries.len() - 1) as u32
            }
        };
        let e = &mut self.entries[idx as usize];
        e.0 = e.0.wrapping_add(1);
        e.1 = Some(rec);
        DispatchId(((e.0 as u64) << 32) | idx as u64)
    }
    fn remove(&mut self, id: DispatchId) -> Option<InFlight> {
        let idx = (id.0 & 0xffff_ffff) as usize;
        let gen = (id.0 >> 32) as u32;
        let e = self.entries.get_mut(idx)?;
        if e.0 != gen {
            return None;
        }
        let rec = e.1.take()?;
        self.free.push(idx as u32);
        Some(rec)
    }
    fn iter(&self) -> impl Iterator<Item = &InFlight> {
        self.entries.iter().filter_map(|e| e.1.as_ref())
    }
    fn iter_mut(&mut self) -> impl Iterator<Item = &mut InFlight> {
        self.entries.iter_mut().filter_map(|e| e.1.as_mut())
    }
}

/// Cost estimates per job type: EWMA of measured run times.
#[derive(Debug, Default)]
struct JobTypes {
    index: FastMap<Arc<str>, u32>,
    est: Vec<Option<f64>>,
    max: usize,
}

impl JobTypes {
    fn intern(&mut self, name: &str) -> (u32, Arc<str>) {
        if let Some((k, &i)) = self.index.get_key_value(name) {
            return (i, k.clone());
        }
        let name: Arc<str> = Arc::from(name);
        if self.est.len() >= self.max {
            return (UNTRACKED, name);
        }
        let i = self.est.len() as u32;
        self.est.push(None);
        self.index.insert(name.clone(), i);
        (i, name)
    }
    fn estimate(&self, jt: u32) -> Option<f64> {
        self.est.get(jt as usize).copied().flatten()
    }
    fn observe(&mut self, jt: u32, ms: f64, alpha: f64) {
        if let Some(e) = self.est.get_mut(jt as usize) {
            *e = Some(match *e {
                None => ms,
                Some(old) => old + alpha * (ms - old),
            });
        }
    }
}

/// One pool's fair scheduler on one worker. See the module docs.
pub struct Scheduler<J> {
    pool: Pool,
    cfg: SchedulerConfig,
    clock: PassedClock,
    started: bool,
    now: Millis,
    tenants: Vec<Tenant<J>>,
    index: FastMap<Arc<str>, u32>,
    /// Policies set with `set_tenant` that differ from the unconfigured one: they outlive
    /// the eviction of the tenant's state (bounded by the registry, not by traffic).
    policies: FastMap<Arc<str>, TenantPolicy>,
    /// The next `evict_idle` sweep is not before this.
    next_sweep: Millis,
    evicted: u64,
    job_types: JobTypes,
    /// Slots reserved by configuration (sum over tenants).
    reserved_total: usize,
    /// Slots unavailable to shared work because of reservations: sum over tenants of
    /// max(reserved, running in reserved slots).
    reserved_held: usize,
    shared_running: usize,
    running_reserved: usize,
    /// Jobs running in fast lanes (beyond `slots`).
    running_fast: usize,
    /// Eligible tenants with nothing running, by their oldest queued job: who may take a
    /// fast lane (only maintained when `fast_lanes > 0`).
    lane_ready: BTreeSet<(Millis, u32)>,
    total_queued: usize,
    vtime: f64,
    ready: BTreeSet<Key>,
    group: FreeGroup,
    floor_ready: BTreeSet<Key>,
    /// Sum of min shares of backlogged floored tenants.
    floor_sum: f64,
    /// Tenants with reserved slots.
    enterprise: Vec<u32>,
    /// Rate-limit due times (lazy: an entry counts only if it matches `blocked_until`).
    timers: BinaryHeap<Reverse<(Millis, u32)>>,
    inflight: Slab,
    capacity: Decayed,
}

impl<J> fmt::Debug for Scheduler<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("pool", &self.pool)
            .field("slots", &self.cfg.slots)
            .field("tenants", &self.tenants.len())
            .field("queued", &self.total_queued)
            .field("running", &self.running())
            .finish()
    }
}

impl<J> Scheduler<J> {
    /// Bytes one queued job takes in its tenant's queue besides what its payload owns
    /// (the payload itself, its job type's index, name and enqueue time), for callers that
    /// bound the memory of what they queue.
    pub const ENTRY_BYTES: usize = std::mem::size_of::<Waiting<J>>();

    pub fn new(pool: Pool, cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        cfg.validate()?;
        Ok(Scheduler {
            pool,
            clock: PassedClock::default(),
            started: false,
            now: 0,
            tenants: Vec::new(),
            index: FastMap::default(),
            policies: FastMap::default(),
            next_sweep: Millis::MIN,
            evicted: 0,
            job_types: JobTypes { max: cfg.max_job_types, ..Default::default() },
            reserved_total: 0,
            reserved_held: 0,
            shared_running: 0,
            running_reserved: 0,
            running_fast: 0,
            lane_ready: BTreeSet::new(),
            total_queued: 0,
            vtime: 0.0,
            ready: BTreeSet::new(),
            group: FreeGroup {
                weight: cfg.weights.free_tier,
                tag: 0.0,
                vtime: 0.0,
                ready: BTreeSet::new(),
                key: None,
                backlogged: 0,
            },
            floor_ready: BTreeSet::new(),
            floor_sum: 0.0,
            enterprise: Vec::new(),
            timers: BinaryHeap::new(),
            inflight: Slab::default(),
            capacity: Decayed::new(0),
            cfg,
        })
    }

    // ----- configuration -------------------------------------------------------------

    /// Sets (or replaces) a tenant's policy. Validates it, and refuses reservations that
    /// would leave fewer than `min_shared_slots` shared. Replacing the policy of a
    /// backlogged tenant re-activates it (it keeps no banked credit); a changed rate
    /// limit starts with a full bucket.
    pub fn set_tenant(&mut self, tenant: &str, policy: TenantPolicy) -> Result<(), SchedulerError> {
        policy.validate(&format!("tenants.{tenant}"))?;
        let reserved = self.reserved_of(&policy);
        let existing = self.index.get(tenant).copied();
        let old_reserved = existing.map_or(0, |t| self.tenants[t as usize].reserved);
        let others = self.reserved_total - old_reserved;
        let available = self.cfg.slots.saturating_sub(self.cfg.min_shared_slots).saturating_sub(others);
        if reserved > available {
            return Err(SchedulerError::ReservationTooLarge {
                tenant: tenant.to_string(),
                requested: reserved,
                available,
                slots: self.cfg.slots,
                reserved_by_others: others,
                min_shared: self.cfg.min_shared_slots,
            });
        }
        if policy == TenantPolicy::unconfigured(&self.cfg, tenant) {
            self.policies.remove(tenant);
        } else {
            self.policies.insert(Arc::from(tenant), policy.clone());
        }
        let t = match existing {
            Some(t) => t,
            None => self.create(tenant),
        };
        self.apply(t, policy);
        Ok(())
    }

    /// Sets this worker's part of a tenant's fleet-wide concurrency cap (`None`: no fleet
    /// cap); the lower of it and the policy's `max_running` is in force. Running jobs
    /// above a lowered cap finish; queued ones wait.
    pub fn set_fleet_cap(&mut self, tenant: &str, cap: Option<usize>) {
        let t = match self.index.get(tenant) {
            Some(&t) => t,
            // Untracked (new or evicted) tenants have no fleet cap.
            None if cap.is_none() => return,
            None => self.create(tenant),
        };
        let x = &mut self.tenants[t as usize];
        x.fleet_cap = cap.unwrap_or(usize::MAX);
        x.max_running = x.policy.max_running.unwrap_or(usize::MAX).min(x.fleet_cap);
        self.refresh(t);
    }

    /// Holds a tenant's queued jobs until `until` (the recycling cap, `core::recycling`),
    /// or lifts the hold (`None`); its running jobs go on, the other tenants run.
    pub fn set_held(&mut self, tenant: &str, until: Option<Millis>) {
        let t = match self.index.get(tenant) {
            Some(&t) => t,
            None if until.is_none() => return,
            None => self.create(tenant),
        };
        self.tenants[t as usize].held = until;
        self.refresh(t);
    }

    /// Sets this worker's part (0..=1) of a tenant's fleet-wide rate limit (`core::quota`):
    /// its limiter runs at `rate x share` with a burst of `burst x share` (at least one),
    /// keeping the tokens it holds. No effect on a tenant without a rate limit.
    pub fn set_fleet_rate(&mut self, tenant: &str, share: f64) {
        let t = match self.index.get(tenant) {
            Some(&t) => t,
            // Untracked (new or evicted) tenants run their limiter at the whole rate.
            None if share == 1.0 => return,
            None => self.create(tenant),
        };
        let x = &mut self.tenants[t as usize];
        let Some(limiter) = &mut x.limiter else { return };
        limiter.set_scale(share);
        // A held tenant looks at its token again now (it may be due sooner or later).
        if x.blocked_until.take().is_some() {
            self.refresh(t);
        }
    }

    /// Changes the number of slots (e.g. the worker was resized).
    pub fn set_slots(&mut self, slots: usize) -> Result<(), SchedulerError> {
        if slots == 0 || slots < self.reserved_total + self.cfg.min_shared_slots {
            return Err(SchedulerError::SlotsTooFew {
                slots,
                reserved: self.reserved_total,
                min_shared: self.cfg.min_shared_slots,
            });
        }
        self.capacity.advance(self.now, self.cfg.slots as f64, self.tau());
        self.cfg.slots = slots;
        Ok(())
    }

    pub fn pool(&self) -> Pool {
        self.pool
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The policy in force for a tenant (the default one if never set); for tests.
    #[cfg(test)]
    pub(crate) fn tenant_policy(&self, tenant: &str) -> TenantPolicy {
        match self.index.get(tenant) {
            Some(&t) => self.tenants[t as usize].policy.clone(),
            None => self.configured(tenant),
        }
    }

    // ----- the loop's calls ------------------------------------------------------------

    /// Queues a job. Unknown tenants get `default_tenant`'s policy. Refused (payload
    /// handed back) when the tenant already has `max_queued` jobs queued here.
    #[allow(clippy::result_large_err)]
    pub fn enqueue(
        &mut self,
        tenant: &str,
        job_type: &str,
        priority: Priority,
        payload: J,
        now: Millis,
    ) -> Result<(), (Rejected, J)> {
        let now = self.tick(now);
        let t = match self.index.get(tenant) {
            Some(&t) => t,
            None => self.create(tenant),
        };
        let x = &self.tenants[t as usize];
        if x.queued >= x.max_queued {
            let reason = Rejected::QueueFull { tenant: tenant.to_string(), depth: x.queued, limit: x.max_queued };
            return Err((reason, payload));
        }
        let (jt, job_type) = self.job_types.intern(job_type);
        let idle = x.queued == 0 && x.running == 0;
        if x.queued == 0 {
            self.activate(t, now);
        }
        let x = &mut self.tenants[t as usize];
        x.last_active = now;
        if idle {
            x.arrived_idle = true;
        }
        x.queues[level(priority)].push_back(Waiting { payload, jt, job_type, enqueued_at: now });
        x.queued += 1;
        self.total_queued += 1;
        self.refresh(t);
        Ok(())
    }

    /// The next job to start, if a slot is free for an eligible job. Call it until it
    /// returns `None` after every enqueue, completion, and wake-up.
    pub fn next(&mut self, now: Millis) -> Option<Dispatch<J>> {
        let now = self.tick(now);
        self.promote(now);
        for i in 0..self.enterprise.len() {
            let t = self.enterprise[i];
            let x = &self.tenants[t as usize];
            if x.running_reserved < x.reserved && self.eligible(t) && self.admit(t, now) {
                return Some(self.dispatch(t, Via::Reserved, now));
            }
        }
        if self.shared_free() == 0 {
            return self.next_fast_lane(now);
        }
        loop {
            if let Some(k) = self.floor_ready.first().copied() {
                if k.tag <= now as f64 {
                    if self.admit(k.id, now) {
                        return Some(self.dispatch(k.id, Via::MinShare, now));
                    }
                    continue;
                }
            }
            let k = self.ready.first().copied()?;
            let t = if k.id == GROUP {
                self.group.ready.first().expect("the free flow is ready only with a ready member").id
            } else {
                k.id
            };
            if self.admit(t, now) {
                return Some(self.dispatch(t, Via::Fair, now));
            }
        }
    }

    /// The job ran to an end (any outcome) at `finished_at`: frees its slot, reconciles
    /// the tenant's charge with the real run time and teaches the job type's estimate.
    /// `None` if `id` is unknown (already finished).
    pub fn complete(&mut self, id: DispatchId, finished_at: Millis) -> Option<Freed> {
        self.free_slot(id, finished_at, true)
    }

    /// The job ended without a representative run (skipped as a duplicate, cancelled,
    /// handed back at shutdown): frees its slot and charges the time it held the slot,
    /// but does not teach the estimate.
    pub fn release(&mut self, id: DispatchId, now: Millis) -> Option<Freed> {
        self.free_slot(id, now, false)
    }

    /// When the loop should call `next` again although nothing else happens: the earliest
    /// time a rate-limited tenant that could use a free slot gets its next token. `None`:
    /// only an enqueue or a completion can make progress. May lie in the past: call
    /// `next` at once.
    pub fn next_wakeup(&self, _now: Millis) -> Option<Millis> {
        if self.shared_free() > 0 || self.running_fast < self.cfg.fast_lanes {
            // Entries are exact except after a policy change (then early, which is harmless).
            return self.timers.peek().map(|r| r.0 .0);
        }
        self.enterprise
            .iter()
            .map(|&t| &self.tenants[t as usize])
            .filter(|x| {
                x.running_reserved < x.reserved
                    && x.queued > 0
                    && x.running < x.max_running
                    && !x.suspended
                    && x.held.is_none()
            })
            .filter_map(|x| x.blocked_until)
            .min()
    }

    /// Removes queued (not running) jobs whose payload matches `f`, e.g. those of revoked
    /// partitions, and returns them. `f` must be a pure test: it may see a job twice.
    pub fn drain_where<F: FnMut(&J) -> bool>(&mut self, mut f: F) -> Vec<J> {
        let mut out = Vec::new();
        for t in 0..self.tenants.len() as u32 {
            let x = &mut self.tenants[t as usize];
            if x.queued == 0 {
                continue;
            }
            let mut removed = 0;
            for q in x.queues.iter_mut() {
                // Most calls remove nothing: only a queue with a match is rebuilt.
                if !q.iter().any(|w| f(&w.payload)) {
                    continue;
                }
                for w in std::mem::take(q) {
                    if f(&w.payload) {
                        out.push(w.payload);
                        removed += 1;
                    } else {
                        q.push_back(w);
                    }
                }
            }
            if removed == 0 {
                continue;
            }
            x.queued -= removed;
            self.total_queued -= removed;
            if x.queued == 0 {
                self.deactivate(t);
            }
            self.refresh(t);
        }
        out
    }

    // ----- fleet accounting ------------------------------------------------------------

    /// Folds fleet-wide usage into local fair order. `usage`: per tenant, slot-seconds
    /// used **elsewhere** (other workers and pools, not this scheduler), exponentially
    /// decayed with half-life `fleet_half_life_ms`, as of `now`. The growth of a tenant's
    /// level beyond its decay since the previous fold is fresh external use; it is charged
    /// to the tenant's tag (times `fleet_usage_scale`), at most up to `max_fleet_lead_ms`
    /// ahead of the virtual time. Tenants absent from `usage` keep their last level.
    pub fn fold_fleet_usage(&mut self, usage: &HashMap<String, f64>, now: Millis) {
        let now = self.tick(now);
        for (name, &level) in usage {
            if !(level.is_finite() && level >= 0.0) {
                continue;
            }
            let Some(&t) = self.index.get(name.as_str()) else { continue };
            let x = &mut self.tenants[t as usize];
            let dt = (now - x.fleet_at).max(0) as f64;
            let decayed = x.fleet_level * 0.5f64.powf(dt / self.cfg.fleet_half_life_ms);
            let fresh_ms = (level - decayed).max(0.0) * 1000.0 * self.cfg.fleet_usage_scale;
            x.fleet_level = level;
            x.fleet_at = now;
            if fresh_ms > 0.0 {
                self.penalize(t, fresh_ms);
            }
        }
    }

    /// Slot-seconds used here per tenant since the previous call (running jobs count up
    /// to `now`), for the worker to publish. Tenants with no use are left out.
    pub fn local_usage_since_last_report(&mut self, now: Millis) -> HashMap<String, f64> {
        let now = self.tick(now);
        for rec in self.inflight.iter_mut() {
            let from = rec.reported_at.max(rec.dispatched_at);
            if now > from {
                self.tenants[rec.tenant as usize].unreported_ms += (now - from) as f64;
                rec.reported_at = now;
            }
        }
        let mut out = HashMap::new();
        for x in &mut self.tenants {
            if x.unreported_ms > 0.0 {
                out.insert(x.name.to_string(), x.unreported_ms / 1000.0);
                x.unreported_ms = 0.0;
            }
        }
        out
    }

    // ----- memory ----------------------------------------------------------------------

    /// Forgets the state of idle tenants: nothing queued or running here, no enqueue,
    /// dispatch or completion for `idle_evict_ms`, their usage reported, and nothing this
    /// worker set on them beyond their policy (no reserved slots, fleet cap, recycling
    /// hold, rate-limit debt or fleet rate part). Their policies stay. Sweeps (O(tracked
    /// tenants)) at most once per `idle_evict_ms / 8`; returns how many were evicted.
    /// See "Memory" in the module docs for why this cannot be gamed.
    pub fn evict_idle(&mut self, now: Millis) -> usize {
        let now = self.tick(now);
        if now < self.next_sweep {
            return 0;
        }
        self.next_sweep = now + (self.cfg.idle_evict_ms / 8).max(1);
        let mut evicted = 0;
        let mut t = 0u32;
        while (t as usize) < self.tenants.len() {
            if self.evictable(t, now) {
                self.evict(t);
                evicted += 1;
            } else {
                t += 1;
            }
        }
        if self.tenants.capacity() > 64 && self.tenants.len() < self.tenants.capacity() / 4 {
            self.tenants.shrink_to(self.tenants.len() * 2);
            self.index.shrink_to(self.tenants.len() * 2);
        }
        self.evicted += evicted as u64;
        evicted
    }

    /// Tenants whose state is held here (idle ones are evicted by `evict_idle`).
    pub fn tracked_tenants(&self) -> usize {
        self.tenants.len()
    }

    fn evictable(&self, t: u32, now: Millis) -> bool {
        let x = &self.tenants[t as usize];
        x.queued == 0
            && x.running == 0
            && now - x.last_active >= self.cfg.idle_evict_ms
            && x.reserved == 0
            && x.fleet_cap == usize::MAX
            && x.held.is_none()
            && x.unreported_ms == 0.0
            && x.limiter.as_ref().is_none_or(|l| l.scale() == 1.0 && l.settled())
    }

    /// Removes tenant `t` (idle: in no ready set, no job in flight); the last tenant
    /// takes its index.
    fn evict(&mut self, t: u32) {
        let last = (self.tenants.len() - 1) as u32;
        let gone = self.tenants.swap_remove(t as usize);
        debug_assert!(gone.ready_key.is_none() && gone.floor_key.is_none() && gone.lane_key.is_none());
        self.index.remove(&gone.name);
        if t != last {
            self.renumber(last, t);
        }
    }

    /// The tenant at index `to` was at `from`: re-key everything that names it.
    fn renumber(&mut self, from: u32, to: u32) {
        let x = &self.tenants[to as usize];
        if let Some(i) = self.index.get_mut(&x.name) {
            *i = to;
        }
        if let Some(k) = x.ready_key {
            let set = if x.free { &mut self.group.ready } else { &mut self.ready };
            set.remove(&Key::new(k, from));
            set.insert(Key::new(k, to));
        }
        if let Some(k) = x.floor_key {
            self.floor_ready.remove(&Key::new(k, from));
            self.floor_ready.insert(Key::new(k, to));
        }
        if let Some(k) = x.lane_key {
            self.lane_ready.remove(&(k, from));
            self.lane_ready.insert((k, to));
        }
        if let Some(at) = x.blocked_until {
            self.timers.push(Reverse((at, to)));
        }
        for e in self.enterprise.iter_mut().filter(|e| **e == from) {
            *e = to;
        }
        for rec in self.inflight.iter_mut().filter(|r| r.tenant == from) {
            rec.tenant = to;
        }
    }

    /// Panics unless every structure that names a tenant by index agrees with the
    /// tenants (for the eviction tests, which move tenants between indexes).
    #[cfg(test)]
    fn check_consistency(&self) {
        assert_eq!(self.index.len(), self.tenants.len());
        let mut running = vec![0usize; self.tenants.len()];
        for rec in self.inflight.iter() {
            running[rec.tenant as usize] += 1;
        }
        let (mut top, mut free) = (0, 0);
        for (i, x) in self.tenants.iter().enumerate() {
            let t = i as u32;
            assert_eq!(self.index.get(&x.name), Some(&t), "index of {}", x.name);
            assert_eq!(running[i], x.running, "running jobs of {}", x.name);
            assert_eq!(x.queued, x.queues.iter().map(VecDeque::len).sum::<usize>());
            if let Some(k) = x.ready_key {
                let set = if x.free { &self.group.ready } else { &self.ready };
                assert!(set.contains(&Key::new(k, t)), "{} not in its ready set", x.name);
                *(if x.free { &mut free } else { &mut top }) += 1;
            }
            if let Some(k) = x.floor_key {
                assert!(self.floor_ready.contains(&Key::new(k, t)));
            }
            if let Some(k) = x.lane_key {
                assert!(self.lane_ready.contains(&(k, t)));
            }
        }
        assert_eq!(self.ready.len(), top + usize::from(self.group.key.is_some()));
        assert_eq!(self.group.ready.len(), free);
        assert_eq!(self.total_queued, self.tenants.iter().map(|x| x.queued).sum::<usize>());
        assert_eq!(self.lane_ready.len(), self.tenants.iter().filter(|x| x.lane_key.is_some()).count());
        assert_eq!(self.floor_ready.len(), self.tenants.iter().filter(|x| x.floor_key.is_some()).count());
    }

    /// The policy a tenant gets when its state is created: the one `set_tenant` gave it,
    /// else the unconfigured one.
    fn configured(&self, tenant: &str) -> TenantPolicy {
        match self.policies.get(tenant) {
            Some(p) => p.clone(),
            None => TenantPolicy::unconfigured(&self.cfg, tenant),
        }
    }

    // ----- queries ---------------------------------------------------------------------

    pub fn slots(&self) -> usize {
        self.cfg.slots
    }
    pub fn running(&self) -> usize {
        self.shared_running + self.running_reserved + self.running_fast
    }
    pub fn queued_total(&self) -> usize {
        self.total_queued
    }
    /// Jobs of `tenant` queued here.
    pub fn queued(&self, tenant: &str) -> usize {
        self.index.get(tenant).map_or(0, |&t| self.tenants[t as usize].queued)
    }
    /// Tenants whose queued jobs wait at a limit of their own here now, as [`stats`]
    /// gives their wait reason: the concurrency cap in force (`max_running`, or this
    /// worker's part of the fleet-wide cap) or the dispatch rate. Suspended tenants and
    /// those at the recycling cap are left out (their waits have reasons of their own).
    ///
    /// [`stats`]: Scheduler::stats
    pub fn held_at_limits(&self, now: Millis) -> Vec<(Arc<str>, OwnLimit)> {
        self.tenants
            .iter()
            .filter(|x| x.queued > 0 && !x.suspended && x.held.is_none())
            .filter_map(|x| {
                let limit = if x.running >= x.max_running {
                    OwnLimit::Concurrency
                } else if x.blocked_until.is_some_and(|u| u > now) {
                    OwnLimit::Rate
                } else {
                    return None;
                };
                Some((x.name.clone(), limit))
            })
            .collect()
    }

    /// Jobs of `tenant` running here.
    pub fn running_of(&self, tenant: &str) -> usize {
        self.index.get(tenant).map_or(0, |&t| self.tenants[t as usize].running)
    }
    /// How many more jobs `tenant` may queue before `enqueue` rejects (for pausing its
    /// partitions ahead of time).
    pub fn room(&self, tenant: &str) -> usize {
        match self.index.get(tenant) {
            Some(&t) => {
                let x = &self.tenants[t as usize];
                x.max_queued.saturating_sub(x.queued)
            }
            None => self.configured(tenant).max_queued.unwrap_or(self.cfg.max_queued_per_tenant),
        }
    }
    /// Shared slots free right now.
    pub fn shared_free(&self) -> usize {
        self.cfg.slots.saturating_sub(self.reserved_held + self.shared_running)
    }
    /// Current slot-ms estimate of a job type.
    pub fn estimate_ms(&self, job_type: &str) -> f64 {
        self.job_types.index.get(job_type).and_then(|&i| self.job_types.estimate(i)).unwrap_or(self.cfg.default_cost_ms)
    }
    /// Current slot-ms estimate of a job type for one tenant (its own runs first).
    pub fn estimate_ms_for(&self, tenant: &str, job_type: &str) -> f64 {
        match (self.index.get(tenant), self.job_types.index.get(job_type)) {
            (Some(&t), Some(&jt)) => self.cost_of(t, jt),
            _ => self.estimate_ms(job_type),
        }
    }

    /// What a job of type `jt` is charged for tenant `t`: the tenant's own estimate of
    /// the type, else every tenant's, else the pool default.
    fn cost_of(&self, t: u32, jt: u32) -> f64 {
        self.tenants[t as usize].cost(jt, &self.job_types, self.cfg.default_cost_ms)
    }

    /// Per-tenant figures (sorted by tenant), see [`TenantStats`].
    pub fn stats(&self, now: Millis) -> Vec<TenantStats> {
        let now = now.max(self.now);
        let tau = self.tau();
        let shared_slots = self.cfg.slots.saturating_sub(self.reserved_total);
        let shares = self.shared_entitlements();
        let capacity = self.capacity.value_at(now, self.cfg.slots as f64, tau);
        let shared_free = self.shared_free();
        let idle_reserved: usize = self
            .enterprise
            .iter()
            .map(|&t| &self.tenants[t as usize])
            .map(|x| x.reserved.saturating_sub(x.running_reserved))
            .sum();
        let free_active = self.tenants.iter().filter(|x| x.free && (x.queued > 0 || x.running > 0)).count();
        let mut running_since = vec![0.0f64; self.tenants.len()];
        for rec in self.inflight.iter() {
            running_since[rec.tenant as usize] += (now - rec.dispatched_at).max(0) as f64;
        }
        let mut out: Vec<TenantStats> = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let backlog = Backlog {
                    urgent: x.queues[0].len(),
                    normal: x.queues[1].len(),
                    low: x.queues[2].len(),
                    total: x.queued,
                };
                let oldest = x.queues.iter().filter_map(|q| q.front()).map(|w| w.enqueued_at).min();
                let wait_reason = if x.queued == 0 {
                    None
                } else if x.suspended {
                    Some(WaitReason::Suspended)
                } else if let Some(until) = x.held {
                    Some(WaitReason::RecyclingCap { until })
                } else if x.running >= x.max_running {
                    Some(WaitReason::ConcurrencyCap)
                } else if let Some(until) = x.blocked_until.filter(|&u| u > now) {
                    Some(WaitReason::RateLimited { until })
                } else if x.running_reserved < x.reserved || shared_free > 0 {
                    None
                } else if idle_reserved > 0 {
                    Some(WaitReason::ReservedSlots)
                } else {
                    Some(WaitReason::Deficit)
                };
                let deficit_ms = if x.free { self.group.vtime - x.tag } else { (self.vtime - x.tag) * x.weight };
                let weight = if x.free { self.group.weight / free_active.max(1) as f64 } else { x.weight };
                let entitled_slots = x.reserved as f64 + shares[i] * shared_slots as f64;
                let used = x.usage.value_at(now, x.running as f64, tau);
                TenantStats {
                    tenant: x.name.to_string(),
                    tier: x.policy.tier,
                    weight,
                    backlog,
                    oldest_wait_ms: oldest.map(|e| (now - e).max(0)),
                    running: x.running,
                    running_reserved: x.running_reserved,
                    reserved_slots: x.reserved,
                    max_running: (x.max_running != usize::MAX).then_some(x.max_running),
                    rate_limit_per_second: x.limiter.as_ref().map(|l| l.spec().per_second),
                    min_share: (x.min_share > 0.0).then_some(x.min_share),
                    slot_seconds_used: (x.used_ms + running_since[i]) / 1000.0,
                    deficit_ms,
                    entitlement_share: entitled_slots / self.cfg.slots as f64,
                    actual_share: if capacity > 0.0 { used / capacity } else { 0.0 },
                    dispatched: x.dispatched,
                    wait_reason,
                }
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// The pool as a whole.
    pub fn pool_stats(&self, now: Millis) -> PoolStats {
        let idle_reserved = self
            .enterprise
            .iter()
            .map(|&t| &self.tenants[t as usize])
            .map(|x| x.reserved.saturating_sub(x.running_reserved))
            .sum();
        PoolStats {
            pool: self.pool,
            slots: self.cfg.slots,
            reserved_slots: self.reserved_total,
            shared_slots: self.cfg.slots.saturating_sub(self.reserved_total),
            running: self.running(),
            running_reserved: self.running_reserved,
            idle_reserved,
            free_shared: self.shared_free(),
            fast_lanes: self.cfg.fast_lanes,
            running_fast_lane: self.running_fast,
            queued: self.total_queued,
            tenants: self.tenants.len(),
            active_tenants: self.tenants.iter().filter(|x| x.queued > 0 || x.running > 0).count(),
            evicted_tenants: self.evicted,
            virtual_time: self.vtime,
            next_wakeup: self.next_wakeup(now),
        }
    }

    /// Pool and tenant figures together (what `stats --json` prints).
    pub fn snapshot(&self, now: Millis) -> SchedulerStats {
        SchedulerStats { at: now.max(self.now), pool: self.pool_stats(now), tenants: self.stats(now) }
    }

    // ----- internals -------------------------------------------------------------------

    fn tau(&self) -> f64 {
        self.cfg.stats_half_life_ms / std::f64::consts::LN_2
    }

    /// Records `now` (kept monotonic) and moves the rate limiters' clock.
    fn tick(&mut self, now: Millis) -> Millis {
        if !self.started {
            self.started = true;
            self.now = now;
            self.capacity = Decayed::new(now);
            for x in &mut self.tenants {
                x.usage = Decayed::new(now);
                x.fleet_at = now;
            }
        }
        if now > self.now {
            self.now = now;
        }
        self.clock.set(self.now);
        self.now
    }

    fn reserved_of(&self, p: &TenantPolicy) -> usize {
        if p.tier == Tier::Enterprise {
            p.reserved_slots.unwrap_or(self.cfg.enterprise_reserved_slots)
        } else {
            0
        }
    }

    fn create(&mut self, name: &str) -> u32 {
        let t = self.tenants.len() as u32;
        let name: Arc<str> = Arc::from(name);
        let default = self.configured(&name);
        let free = default.tier == Tier::Free;
        self.tenants.push(Tenant {
            name: name.clone(),
            policy: TenantPolicy::default(),
            weight: 1.0,
            free,
            suspended: false,
            held: None,
            max_running: usize::MAX,
            fleet_cap: usize::MAX,
            max_queued: self.cfg.max_queued_per_tenant,
            reserved: 0,
            min_share: 0.0,
            limiter: None,
            queues: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            queued: 0,
            running: 0,
            running_reserved: 0,
            tag: if free { self.group.vtime } else { self.vtime },
            floor_tag: self.now as f64,
            blocked_until: None,
            ready_key: None,
            floor_key: None,
            lane_key: None,
            arrived_idle: false,
            used_ms: 0.0,
            unreported_ms: 0.0,
            usage: Decayed::new(self.now),
            fleet_level: 0.0,
            fleet_at: self.now,
            dispatched: 0,
            last_active: self.now,
            own_est: FastMap::default(),
        });
        self.index.insert(name, t);
        self.apply(t, default);
        t
    }

    /// Applies a validated policy whose reservation fits.
    fn apply(&mut self, t: u32, policy: TenantPolicy) {
        // Take the tenant out of every set and count, change it, put it back.
        let was_backlogged = self.tenants[t as usize].queued > 0;
        self.unlist(t);
        if was_backlogged {
            self.deactivate(t);
        }
        let weight = policy.weight.unwrap_or(self.cfg.weights.of(policy.tier));
        let reserved = self.reserved_of(&policy);
        let min_share = match policy.tier {
            Tier::Free => 0.0,
            Tier::Pro => policy.min_share.unwrap_or(self.cfg.pro_min_share),
            _ => policy.min_share.unwrap_or(0.0),
        };
        let max_queued = policy.max_queued.unwrap_or(self.cfg.max_queued_per_tenant);
        let clock = self.clock.clone();
        let (vtime, gvtime) = (self.vtime, self.group.vtime);
        let x = &mut self.tenants[t as usize];
        let free = policy.tier == Tier::Free;
        if free != x.free {
            x.tag = if free { gvtime } else { vtime };
        }
        x.free = free;
        x.weight = if free { 1.0 } else { weight };
        x.max_running = policy.max_running.unwrap_or(usize::MAX).min(x.fleet_cap);
        x.suspended = policy.suspended;
        x.max_queued = max_queued;
        x.min_share = min_share;
        if x.limiter.as_ref().map(|l| l.spec()) != policy.rate_limit {
            // A fleet-wide part in force stays in force for the new limit.
            let scale = x.limiter.as_ref().map_or(1.0, Limiter::scale);
            x.limiter = policy.rate_limit.map(|r| Limiter::new(r, &clock));
            if let Some(l) = &mut x.limiter {
                l.set_scale(scale);
            }
            x.blocked_until = None;
        }
        let held_before = x.reserved.max(x.running_reserved);
        self.reserved_total = self.reserved_total - x.reserved + reserved;
        x.reserved = reserved;
        self.reserved_held = self.reserved_held - held_before + x.reserved.max(x.running_reserved);
        x.policy = policy;
        self.enterprise.retain(|&e| e != t);
        if reserved > 0 {
            self.enterprise.push(t);
        }
        if was_backlogged {
            self.activate(t, self.now);
        }
        self.refresh(t);
    }

    /// Removes a tenant from the ready sets (before changing what it is keyed by).
    fn unlist(&mut self, t: u32) {
        let x = &mut self.tenants[t as usize];
        if let Some(k) = x.ready_key.take() {
            if x.free {
                self.group.ready.remove(&Key::new(k, t));
            } else {
                self.ready.remove(&Key::new(k, t));
            }
        }
        if let Some(k) = x.floor_key.take() {
            self.floor_ready.remove(&Key::new(k, t));
        }
        if let Some(k) = x.lane_key.take() {
            self.lane_ready.remove(&(k, t));
        }
        if x.free {
            self.sync_group();
        }
    }

    /// The tenant got its first queued job: no credit from idle time.
    fn activate(&mut self, t: u32, now: Millis) {
        let x = &mut self.tenants[t as usize];
        if x.free {
            x.tag = x.tag.max(self.group.vtime);
            if self.group.backlogged == 0 {
                self.group.tag = self.group.tag.max(self.vtime);
            }
            self.group.backlogged += 1;
        } else {
            x.tag = x.tag.max(self.vtime);
        }
        if x.min_share > 0.0 {
            x.floor_tag = x.floor_tag.max(now as f64);
            self.floor_sum += x.min_share;
        }
    }

    /// The tenant's queue became empty.
    fn deactivate(&mut self, t: u32) {
        let x = &self.tenants[t as usize];
        if x.free {
            debug_assert!(self.group.backlogged > 0);
            self.group.backlogged = self.group.backlogged.saturating_sub(1);
        }
        if x.min_share > 0.0 {
            self.floor_sum = (self.floor_sum - x.min_share).max(0.0);
        }
    }

    fn eligible(&self, t: u32) -> bool {
        let x = &self.tenants[t as usize];
        x.queued > 0 && x.running < x.max_running && x.blocked_until.is_none() && !x.suspended && x.held.is_none()
    }

    /// Puts the tenant in (or takes it out of) its ready sets according to its state,
    /// re-keyed by its current tags.
    fn refresh(&mut self, t: u32) {
        let eligible = self.eligible(t);
        let credit = self.cfg.max_credit_ms;
        let x = &mut self.tenants[t as usize];
        let want = if eligible {
            if x.ready_key.is_none() {
                // Eligible again after a cap or rate limit: bounded credit.
                let base = if x.free { self.group.vtime } else { self.vtime };
                x.tag = x.tag.max(base - credit / x.weight);
            }
            Some(x.tag)
        } else {
            None
        };
        if x.ready_key != want {
            let set = if x.free { &mut self.group.ready } else { &mut self.ready };
            if let Some(k) = x.ready_key {
                set.remove(&Key::new(k, t));
            }
            if let Some(k) = want {
                set.insert(Key::new(k, t));
            }
            x.ready_key = want;
        }
        let want_floor = (eligible && x.min_share > 0.0).then_some(x.floor_tag);
        if x.floor_key != want_floor {
            if let Some(k) = x.floor_key {
                self.floor_ready.remove(&Key::new(k, t));
            }
            if let Some(k) = want_floor {
                self.floor_ready.insert(Key::new(k, t));
            }
            x.floor_key = want_floor;
        }
        let lane = self.cfg.fast_lanes > 0 && eligible && x.running == 0 && x.arrived_idle;
        let want_lane = if lane { x.oldest_enqueued() } else { None };
        if x.lane_key != want_lane {
            if let Some(k) = x.lane_key {
                self.lane_ready.remove(&(k, t));
            }
            if let Some(k) = want_lane {
                self.lane_ready.insert((k, t));
            }
            x.lane_key = want_lane;
        }
        if x.free {
            self.sync_group();
        }
    }

    /// Keeps the free flow in the top-level ready set iff a free tenant is ready.
    fn sync_group(&mut self) {
        let g = &mut self.group;
        let want = if g.ready.is_empty() {
            None
        } else {
            if g.key.is_none() {
                g.tag = g.tag.max(self.vtime - self.cfg.max_credit_ms / g.weight);
            }
            Some(g.tag)
        };
        if g.key != want {
            if let Some(k) = g.key {
                self.ready.remove(&Key::new(k, GROUP));
            }
            if let Some(k) = want {
                self.ready.insert(Key::new(k, GROUP));
            }
            g.key = want;
        }
    }

    /// Wakes tenants whose rate-limit token is due.
    fn promote(&mut self, now: Millis) {
        while let Some(&Reverse((at, t))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            // An entry of an evicted tenant may name an index now gone or reused: it
            // only acts on a tenant blocked until exactly then, whose token is due.
            let Some(x) = self.tenants.get_mut(t as usize) else { continue };
            if x.blocked_until == Some(at) {
                x.blocked_until = None;
                self.refresh(t);
            }
        }
    }

    /// Takes a rate-limit token for a dispatch of `t`, or marks it blocked until due.
    fn admit(&mut self, t: u32, now: Millis) -> bool {
        let x = &mut self.tenants[t as usize];
        let Some(limiter) = &mut x.limiter else { return true };
        match limiter.take() {
            Ok(()) => true,
            Err(until) => {
                let until = until.max(now + 1);
                x.blocked_until = Some(until);
                self.timers.push(Reverse((until, t)));
                self.refresh(t);
                false
            }
        }
    }

    /// A fast lane for the light tenant (its job arrived when it had nothing queued or
    /// running) whose job has waited longest, if the job is cheap enough and the tenant
    /// is not ahead of its fair share by more than one such job. A backlogged tenant never
    /// qualifies, so lanes cut the latency of light tenants without becoming extra
    /// capacity for heavy ones. Called only when every shared slot is busy.
    fn next_fast_lane(&mut self, now: Millis) -> Option<Dispatch<J>> {
        // Candidates looked at per call: bounds the cost when many idle tenants only
        // have expensive jobs.
        const SCAN: usize = 16;
        if self.running_fast >= self.cfg.fast_lanes {
            return None;
        }
        loop {
            // A refused rate-limit token takes the tenant out of the candidates: this ends.
            let t = self.lane_ready.iter().take(SCAN).map(|&(_, t)| t).find(|&t| self.fits_lane(t, now))?;
            if self.admit(t, now) {
                return Some(self.dispatch(t, Via::FastLane, now));
            }
        }
    }

    /// The tenant is not ahead of its fair share by more than the lane cap and its next
    /// job is estimated within it.
    fn fits_lane(&self, t: u32, now: Millis) -> bool {
        let cap = self.cfg.fast_lane_max_cost_ms;
        let x = &self.tenants[t as usize];
        let ahead = if x.free {
            x.tag - self.group.vtime > cap || (self.group.tag - self.vtime) * self.group.weight > cap
        } else {
            (x.tag - self.vtime) * x.weight > cap
        };
        let next = x.best_level(now, self.cfg.aging_step_ms).and_then(|(lvl, _)| x.queues[lvl].front());
        !ahead && !x.suspended && x.held.is_none() && next.is_some_and(|w| self.cost_of(t, w.jt) <= cap)
    }

    fn shared_capacity(&self) -> f64 {
        self.cfg.slots.saturating_sub(self.reserved_total).max(1) as f64
    }

    /// Charges `amount` slot-ms of shared-slot use to the tenant (negative: refund).
    /// `fair_pick`: this is a dispatch chosen by fair order, which advances virtual time.
    fn charge(&mut self, t: u32, amount: f64, fair_pick: bool) {
        let k = self.shared_capacity();
        let x = &mut self.tenants[t as usize];
        if x.free {
            if fair_pick {
                self.group.vtime = self.group.vtime.max(x.tag);
                self.vtime = self.vtime.max(self.group.tag);
            }
            x.tag += amount;
            self.group.tag += amount / self.group.weight;
        } else {
            if fair_pick {
                self.vtime = self.vtime.max(x.tag);
            }
            x.tag += amount / x.weight;
        }
        if x.min_share > 0.0 {
            let scale = (self.cfg.max_total_min_share / self.floor_sum.max(x.min_share)).min(1.0);
            x.floor_tag += amount / (x.min_share * scale * k);
        }
    }

    /// Charges fresh external use, never beyond `max_fleet_lead_ms` ahead of virtual time.
    fn penalize(&mut self, t: u32, ms: f64) {
        let lead = self.cfg.max_fleet_lead_ms;
        let x = &mut self.tenants[t as usize];
        if x.free {
            let cap = self.group.vtime + lead;
            if x.tag < cap {
                x.tag = (x.tag + ms).min(cap);
            }
            let gcap = self.vtime + lead / self.group.weight;
            if self.group.tag < gcap {
                self.group.tag = (self.group.tag + ms / self.group.weight).min(gcap);
            }
        } else {
            let cap = self.vtime + lead / x.weight;
            if x.tag < cap {
                x.tag = (x.tag + ms / x.weight).min(cap);
            }
        }
        self.refresh(t);
    }

    fn dispatch(&mut self, t: u32, via: Via, now: Millis) -> Dispatch<J> {
        let tau = self.tau();
        let step = self.cfg.aging_step_ms;
        let burst = self.cfg.floor_burst_ms;
        let x = &mut self.tenants[t as usize];
        let (lvl, rank) = x.best_level(now, step).expect("an eligible tenant has a queued job");
        let w = x.queues[lvl].pop_front().expect("best_level points at a non-empty queue");
        x.queued -= 1;
        self.total_queued -= 1;
        x.usage.advance(now, x.running as f64, tau);
        x.running += 1;
        x.dispatched += 1;
        x.last_active = now;
        x.arrived_idle = false;
        let est = x.cost(w.jt, &self.job_types, self.cfg.default_cost_ms);
        if via == Via::Reserved {
            let before = x.reserved.max(x.running_reserved);
            x.running_reserved += 1;
            self.reserved_held = self.reserved_held - before + x.reserved.max(x.running_reserved);
            self.running_reserved += 1;
        } else {
            if via == Via::FastLane {
                self.running_fast += 1;
            } else {
                self.shared_running += 1;
            }
            if x.min_share > 0.0 {
                x.floor_tag = x.floor_tag.max(now as f64 - burst);
            }
            self.charge(t, est, via == Via::Fair);
        }
        if self.tenants[t as usize].queued == 0 {
            self.deactivate(t);
        }
        let id = self.inflight.insert(InFlight {
            tenant: t,
            jt: w.jt,
            job_type: w.job_type.clone(),
            dispatched_at: now,
            reported_at: now,
            est,
            via,
        });
        self.refresh(t);
        Dispatch {
            id,
            tenant: self.tenants[t as usize].name.clone(),
            job_type: w.job_type,
            priority: Priority::ALL[lvl],
            effective_priority: Priority::ALL[rank],
            enqueued_at: w.enqueued_at,
            dispatched_at: now,
            estimated_ms: est,
            via,
            payload: w.payload,
        }
    }

    fn free_slot(&mut self, id: DispatchId, at: Millis, learn: bool) -> Option<Freed> {
        let rec = self.inflight.remove(id)?;
        let now = self.tick(at);
        let tau = self.tau();
        let end = at.max(rec.dispatched_at);
        let ran = end - rec.dispatched_at;
        let cost = (ran as f64).max(self.cfg.min_cost_ms);
        let t = rec.tenant;
        let x = &mut self.tenants[t as usize];
        x.usage.advance(now, x.running as f64, tau);
        x.running -= 1;
        x.last_active = now;
        x.used_ms += ran as f64;
        x.unreported_ms += (end - rec.reported_at.max(rec.dispatched_at)).max(0) as f64;
        if rec.via == Via::Reserved {
            let before = x.reserved.max(x.running_reserved);
            x.running_reserved -= 1;
            self.reserved_held = self.reserved_held - before + x.reserved.max(x.running_reserved);
            self.running_reserved -= 1;
        } else {
            if rec.via == Via::FastLane {
                self.running_fast -= 1;
            } else {
                self.shared_running -= 1;
            }
            self.charge(t, cost - rec.est, false);
        }
        if learn {
            self.job_types.observe(rec.jt, cost, self.cfg.ewma_alpha);
            let x = &mut self.tenants[t as usize];
            if rec.jt != UNTRACKED && (x.own_est.len() < TENANT_ESTIMATES || x.own_est.contains_key(&rec.jt)) {
                let alpha = self.cfg.ewma_alpha;
                x.own_est.entry(rec.jt).and_modify(|e| *e += alpha * (cost - *e)).or_insert(cost);
            }
        }
        self.refresh(t);
        Some(Freed {
            tenant: self.tenants[t as usize].name.clone(),
            job_type: rec.job_type,
            ran_ms: ran,
            estimated_ms: rec.est,
            via: rec.via,
        })
    }

    /// Each tenant's entitled fraction of the shared slots given who is active (queued or
    /// running): weights, the free flow split equally, floors water-filled.
    fn shared_entitlements(&self) -> Vec<f64> {
        let n = self.tenants.len();
        let active: Vec<bool> = self.tenants.iter().map(|x| x.queued > 0 || x.running > 0).collect();
        let free_active = (0..n).filter(|&i| active[i] && self.tenants[i].free).count();
        // Flows: paid active tenants, plus the free flow (index n) if any free tenant is active.
        let mut flows: Vec<(usize, f64, f64)> = (0..n)
            .filter(|&i| active[i] && !self.tenants[i].free)
            .map(|i| (i, self.tenants[i].weight, self.tenants[i].min_share))
            .collect();
        if free_active > 0 {
            flows.push((n, self.group.weight, 0.0));
        }
        let floor_total: f64 = flows.iter().map(|f| f.2).sum();
        let floor_scale = if floor_total > 0.0 { (self.cfg.max_total_min_share / floor_total).min(1.0) } else { 1.0 };
        let mut bound = vec![false; flows.len()];
        loop {
            let rest_w: f64 = flows.iter().zip(&bound).filter(|(_, b)| !**b).map(|(f, _)| f.1).sum();
            let rest_share =
                1.0 - flows.iter().zip(&bound).filter(|(_, b)| **b).map(|(f, _)| f.2 * floor_scale).sum::<f64>();
            let mut changed = false;
            for (j, f) in flows.iter().enumerate() {
                if !bound[j] && rest_w > 0.0 && f.2 * floor_scale > rest_share * f.1 / rest_w {
                    bound[j] = true;
                    changed = true;
                }
            }
            if !changed {
                let mut out = vec![0.0; n];
                for (j, f) in flows.iter().enumerate() {
                    let share = if bound[j] { f.2 * floor_scale } else { rest_share * f.1 / rest_w };
                    if f.0 == n {
                        for i in (0..n).filter(|&i| active[i] && self.tenants[i].free) {
                            out[i] = share / free_active as f64;
                        }
                    } else {
                        out[f.0] = share;
                    }
                }
                return out;
            }
        }
    }
}
