//! The seam between the consumer loop and the scheduling policy. The worker loop only
//! enqueues jobs and asks for the next one; which one comes next is a pure decision
//! made by either the fair scheduler (`core::scheduler`) or plain FIFO (the baseline the
//! fairness benchmark compares against).

use crate::config::Config;
use crate::core::scheduler::{DispatchId, Rejected as SchedRejected, Scheduler, SchedulerConfig, TenantPolicy, Via};
use crate::model::{Millis, Pool, Priority};
use std::collections::{HashMap, VecDeque};

/// A job waiting for a slot, with what the policy needs to know about it.
#[derive(Debug)]
pub struct Queued<J> {
    pub tenant: String,
    pub job_type: String,
    pub priority: Priority,
    pub job: J,
}

/// Identifies a running job to the policy when it completes.
#[derive(Debug, Clone, PartialEq)]
pub struct Ticket {
    pub dispatched_at: Millis,
    /// Opaque handle of the policy (e.g. the scheduler's running-job id).
    pub handle: u64,
    /// It got a fast lane beyond the slots (a light tenant's job).
    pub fast_lane: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejected {
    #[error("tenant {tenant} has {depth} jobs queued in this worker, the limit is {limit}; slow down submissions or raise worker.tenant_queue_limit")]
    QueueFull { tenant: String, depth: usize, limit: usize },
}

pub trait Dispatcher<J>: Send {
    fn enqueue(&mut self, q: Queued<J>, now: Millis) -> Result<(), (Rejected, Queued<J>)>;
    /// The next job to start if a slot is free and a job is eligible.
    fn next(&mut self, now: Millis) -> Option<(J, Ticket)>;
    /// A dispatched job ended; `ran` says whether a handler really ran (its run time
    /// then teaches the cost estimate) or it was skipped/handed back.
    fn complete(&mut self, ticket: &Ticket, now: Millis, ran: bool);
    /// Removes queued (not running) jobs matching `f`, e.g. those of revoked partitions.
    fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J>;
    /// When to ask `next` again although nothing happened (rate limits).
    fn next_wakeup(&self, now: Millis) -> Option<Millis>;
    fn queued(&self, tenant: &str) -> usize;
    fn queued_total(&self) -> usize;
    fn running(&self) -> usize;
    fn stats_json(&self, now: Millis) -> serde_json::Value;
    /// Slot-seconds per tenant used here since the last call (fleet accounting).
    fn take_usage(&mut self, _now: Millis) -> HashMap<String, f64> {
        HashMap::new()
    }
    /// Decayed slot-seconds each tenant used elsewhere in the fleet.
    fn fold_fleet_usage(&mut self, _usage: &HashMap<String, f64>, _now: Millis) {}
    /// Does this policy enforce per-tenant concurrency caps (and so fleet-wide ones)?
    fn enforces_tenant_caps(&self) -> bool {
        false
    }
    /// Jobs of a tenant running now.
    fn running_of(&self, _tenant: &str) -> usize {
        0
    }
    /// This worker's part of a tenant's fleet-wide concurrency cap (`core::quota`).
    fn set_fleet_cap(&mut self, _tenant: &str, _cap: Option<usize>) {}
    /// This worker's part (0..=1) of a tenant's fleet-wide rate (`core::quota::share`).
    fn set_fleet_rate(&mut self, _tenant: &str, _share: f64) {}
    /// Tenants whose queued jobs wait at their own concurrency cap or rate now.
    fn held_at_limits(&self, _now: Millis) -> Vec<(std::sync::Arc<str>, crate::core::scheduler::OwnLimit)> {
        Vec::new()
    }
    /// Holds a tenant's queued jobs until `until` (recycling cap), `None` lifts it.
    fn set_held(&mut self, _tenant: &str, _until: Option<Millis>) {}
    /// Forgets idle tenants' state (`Scheduler::evict_idle`): (evicted now, still held).
    fn evict_idle(&mut self, _now: Millis) -> (usize, usize) {
        (0, 0)
    }
    /// Applies a tenant's (new) policy from the registry; queued jobs stay queued.
    fn set_tenant(&mut self, _tenant: &str, _policy: TenantPolicy) -> Result<(), String> {
        Ok(())
    }
}

/// Plain first-in first-out across all tenants: what a Kafka consumer does by default.
pub struct Fifo<J> {
    slots: usize,
    running: usize,
    queue: VecDeque<Queued<J>>,
    tenant_limit: usize,
}

impl<J> Fifo<J> {
    pub fn new(slots: usize, tenant_limit: usize) -> Self {
        Fifo { slots, running: 0, queue: VecDeque::new(), tenant_limit }
    }
}

impl<J: Send> Dispatcher<J> for Fifo<J> {
    fn enqueue(&mut self, q: Queued<J>, _now: Millis) -> Result<(), (Rejected, Queued<J>)> {
        let depth = self.queued(&q.tenant);
        if depth >= self.tenant_limit {
            let tenant = q.tenant.clone();
            return Err((Rejected::QueueFull { tenant, depth, limit: self.tenant_limit }, q));
        }
        self.queue.push_back(q);
        Ok(())
    }
    fn next(&mut self, now: Millis) -> Option<(J, Ticket)> {
        if self.running >= self.slots {
            return None;
        }
        let q = self.queue.pop_front()?;
        self.running += 1;
        Some((q.job, Ticket { dispatched_at: now, handle: 0, fast_lane: false }))
    }
    fn complete(&mut self, _ticket: &Ticket, _now: Millis, _ran: bool) {
        self.running = self.running.saturating_sub(1);
    }
    fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J> {
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(self.queue.len());
        for q in self.queue.drain(..) {
            if f(&q.job) {
                out.push(q.job)
            } else {
                keep.push_back(q)
            }
        }
        self.queue = keep;
        out
    }
    fn next_wakeup(&self, _now: Millis) -> Option<Millis> {
        None
    }
    fn queued(&self, tenant: &str) -> usize {
        self.queue.iter().filter(|q| q.tenant == tenant).count()
    }
    fn queued_total(&self) -> usize {
        self.queue.len()
    }
    fn running(&self) -> usize {
        self.running
    }
    fn stats_json(&self, _now: Millis) -> serde_json::Value {
        serde_json::json!({"policy": "fifo", "queued": self.queue.len(), "running": self.running})
    }
}

/// Deficit-based weighted fair queueing in slot-time (`core::scheduler`).
pub struct Fair<J> {
    inner: Scheduler<J>,
}

impl<J> Fair<J> {
    /// One pool's scheduler with every registered tenant's tier, caps and limits.
    pub fn new(
        cfg: &Config,
        pool: Pool,
        tenants: &crate::core::tenants::TenantSet,
    ) -> Result<Self, crate::core::scheduler::SchedulerError> {
        let pc = cfg.pool(pool);
        let mut sc = SchedulerConfig::for_pool(pool, pc.slots);
        sc.default_cost_ms = pc.default_estimate.as_millis().max(1) as f64;
        sc.max_queued_per_tenant = cfg.worker.tenant_queue_limit.saturating_mul(2);
        sc.fast_lanes = pc.fast_lanes_for(pool);
        sc.fast_lane_max_cost_ms = pc.fast_lane_max_estimate().as_millis() as f64;
        sc.default_tenant = TenantPolicy::tier(cfg.registry.default_tier);
        sc.free_accounts = cfg.registry.free_accounts.clone();
        sc.idle_evict_ms = cfg.worker.tenant_idle_evict.as_millis() as Millis;
        let mut inner = Scheduler::new(pool, sc)?;
        // Registry content never stops a worker from starting: what fits is applied,
        // the rest reported (log and metric).
        for (name, t) in &tenants.tenants {
            if let Err(e) = set_fitting(&mut inner, name, t.policy()) {
                tracing::error!(%pool, tenant = %name, error = %e, "cannot apply all of the tenant's registry settings here");
                metrics::counter!(crate::metrics::TENANT_APPLY_FAILURES, "pool" => pool.as_str()).increment(1);
            }
        }
        Ok(Fair { inner })
    }
}

/// Applies a tenant's policy. A reservation the pool cannot hold (the registry reserves
/// more of its slots than it has) is left out and the rest applied; Err says what was not
/// applied (any other refusal applies nothing).
fn set_fitting<J>(inner: &mut Scheduler<J>, tenant: &str, policy: TenantPolicy) -> Result<(), String> {
    match inner.set_tenant(tenant, policy.clone()) {
        Ok(()) => Ok(()),
        Err(e @ crate::core::scheduler::SchedulerError::ReservationTooLarge { .. }) => {
            let fits = TenantPolicy { reserved_slots: Some(0), ..policy };
            inner.set_tenant(tenant, fits).map_err(|e| e.to_string())?;
            Err(format!("{e}; applied without its reservation"))
        }
        Err(e) => Err(e.to_string()),
    }
}

impl<J: Send> Dispatcher<J> for Fair<J> {
    fn enqueue(&mut self, q: Queued<J>, now: Millis) -> Result<(), (Rejected, Queued<J>)> {
        let Queued { tenant, job_type, priority, job } = q;
        match self.inner.enqueue(&tenant, &job_type, priority, job, now) {
            Ok(()) => Ok(()),
            Err((SchedRejected::QueueFull { tenant: t, depth, limit }, job)) => {
                Err((Rejected::QueueFull { tenant: t, depth, limit }, Queued { tenant, job_type, priority, job }))
            }
        }
    }
    fn next(&mut self, now: Millis) -> Option<(J, Ticket)> {
        let d = self.inner.next(now)?;
        let ticket =
            Ticket { dispatched_at: d.dispatched_at, handle: d.id.as_u64(), fast_lane: d.via == Via::FastLane };
        Some((d.payload, ticket))
    }
    fn complete(&mut self, ticket: &Ticket, now: Millis, ran: bool) {
        let id = DispatchId::from_u64(ticket.handle);
        if ran {
            self.inner.complete(id, now);
        } else {
            self.inner.release(id, now);
        }
    }
    fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J> {
        self.inner.drain_where(f)
    }
    fn next_wakeup(&self, now: Millis) -> Option<Millis> {
        self.inner.next_wakeup(now)
    }
    fn queued(&self, tenant: &str) -> usize {
        self.inner.queued(tenant)
    }
    fn queued_total(&self) -> usize {
        self.inner.queued_total()
    }
    fn running(&self) -> usize {
        self.inner.running()
    }
    fn stats_json(&self, now: Millis) -> serde_json::Value {
        serde_json::to_value(self.inner.snapshot(now)).unwrap_or_default()
    }
    fn take_usage(&mut self, now: Millis) -> HashMap<String, f64> {
        self.inner.local_usage_since_last_report(now)
    }
    fn fold_fleet_usage(&mut self, usage: &HashMap<String, f64>, now: Millis) {
        self.inner.fold_fleet_usage(usage, now)
    }
    fn set_tenant(&mut self, tenant: &str, policy: TenantPolicy) -> Result<(), String> {
        set_fitting(&mut self.inner, tenant, policy)
    }
    fn enforces_tenant_caps(&self) -> bool {
        true
    }
    fn running_of(&self, tenant: &str) -> usize {
        self.inner.running_of(tenant)
    }
    fn held_at_limits(&self, now: Millis) -> Vec<(std::sync::Arc<str>, crate::core::scheduler::OwnLimit)> {
        self.inner.held_at_limits(now)
    }
    fn set_fleet_cap(&mut self, tenant: &str, cap: Option<usize>) {
        self.inner.set_fleet_cap(tenant, cap)
    }
    fn set_fleet_rate(&mut self, tenant: &str, share: f64) {
        self.inner.set_fleet_rate(tenant, share)
    }
    fn set_held(&mut self, tenant: &str, until: Option<Millis>) {
        self.inner.set_held(tenant, until)
    }
    fn evict_idle(&mut self, now: Millis) -> (usize, usize) {
        (self.inner.evict_idle(now), self.inner.tracked_tenants())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(t: &str, n: u32) -> Queued<u32> {
        Queued { tenant: t.into(), job_type: "x".into(), priority: Priority::Normal, job: n }
    }

    #[test]
    fn fifo_is_first_in_first_out_and_respects_slots() {
        let mut f = Fifo::new(2, 10);
        for (i, t) in ["a", "a", "b"].iter().enumerate() {
            f.enqueue(q(t, i as u32), 0).unwrap();
        }
        let (j0, t0) = f.next(0).unwrap();
        let (j1, _) = f.next(0).unwrap();
        assert_eq!((j0, j1), (0, 1));
        assert!(f.next(0).is_none(), "both slots busy");
        f.complete(&t0, 1, true);
        assert_eq!(f.next(1).unwrap().0, 2);
    }

    #[test]
    fn fifo_rejects_over_tenant_limit() {
        let mut f = Fifo::new(1, 1);
        f.enqueue(q("a", 0), 0).unwrap();
        assert!(matches!(f.enqueue(q("a", 1), 0), Err((Rejected::QueueFull { .. }, _))));
        f.enqueue(q("b", 2), 0).unwrap();
    }
}
