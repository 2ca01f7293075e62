//! The worker's shared state, split by who uses it: [`RouteContext`] is what a job's
//! route (`check`, `exec`, `settle`, `durable`) needs; [`Shared`] adds what the pool's
//! loops (consumer, heartbeats, usage, quotas, admission reports) need beside it. The
//! store and the producer are not in either: the loops that reach them beyond the seams
//! (usage, quotas, admission reports, reaper, classifier) are handed them.

use super::{admission, frontier, watchdog};
use crate::config::Config;
use crate::core::breaker::{BreakerConfig, BreakerState, ScopedBreakers, Verdict};
use crate::core::poison::PoisonDetectors;
use crate::core::retry::{self, AttemptState, Decision, RetryBudget, RetryPolicy};
use crate::handlers::{JobLive, Registry};
use crate::model::{FailureClass, Millis, Pool};
use crate::seams::{Clock, RouteBroker, RouteStore};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Live handles of running jobs by job id (a fast hasher: one insert and one removal
/// per job, keys are job ids).
pub type RunningMap = crate::core::FastMap<String, Arc<JobLive>>;

/// What a job's route needs: its configuration and identity, the edges it reaches (the
/// store, the broker), the handlers, the running jobs' live handles, and the pure cores
/// (breakers, poison detectors, retry budgets, admission tally) its outcomes feed.
pub struct RouteContext {
    pub cfg: Arc<Config>,
    /// `cfg.results_topic()`, formed once (every result is sent to it).
    pub results_topic: String,
    pub pool: Pool,
    /// The store as the route reads and writes it.
    pub store: Arc<dyn RouteStore>,
    /// The broker as the route produces to it (results, retries, dead letters, events).
    pub broker: Arc<dyn RouteBroker>,
    /// The time the route stamps and compares.
    pub clock: Arc<dyn Clock>,
    /// The route's random draws (retry jitter, a held job's spread).
    pub dice: Arc<dyn crate::seams::Dice>,
    /// The store handlers save checkpoints in (`JobContext`); none in the simulator.
    pub checkpoints: Option<Store>,
    pub registry: Registry,
    pub worker_id: String,
    /// Live handles of running jobs (progress, cancellation) for the heartbeat loop.
    pub running: Mutex<RunningMap>,
    /// Routes of jobs in flight here: a second copy of one follows it (`exec::InFlight`).
    pub in_flight: super::exec::InFlight,
    /// Set once the pool drains for a hand-off: a job that starts after it (it was in its
    /// pre-run checks) is asked to stop at once.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Circuit breakers, poison detectors and retry budgets (pure cores behind a lock).
    pub health: Mutex<Health>,
    /// Dispatch frontiers of the pool topic's partitions: which jobs skip the state read.
    pub frontiers: frontier::Frontiers,
    /// Dispatches, attempt outcomes and run times for submission admission (`admission`).
    pub admission_tally: Mutex<admission::Tally>,
    /// The pools' run-time ranges (`pools.<p>.max_run`), for the classifier's counts.
    pub ranges: crate::core::classifier::Ranges,
    /// Kills and abnormal exits of `process` children per tenant (the recycling cap).
    pub recycling: Mutex<crate::core::recycling::Recycling>,
    /// The per-job metrics of this pool, registered once.
    pub metrics: crate::metrics::PoolMetrics,
    /// The fleet-wide dependency breakers as last read (one view per worker).
    pub dependencies: Arc<crate::dependencies::Holds>,
    /// When the store last refused a call of this pool's routes or heartbeats (epoch ms,
    /// 0: never): a lapse seen soon after may be the outage's, not a death.
    pub store_refused_at: std::sync::atomic::AtomicI64,
    /// When this route context was made (epoch ms, on its clock): a worker that just
    /// started cannot tell whether a store outage just ended (`store_steady_since`).
    pub started_at: Millis,
}

/// Everything a pool's loops share: the route's context and the loops' own state.
pub struct Shared {
    /// What the pool's jobs' routes need (handed to each execution).
    pub route: Arc<RouteContext>,
    /// Where the pool loop spills what exceeds its buffers (`worker::backlog`).
    pub backlog: Arc<dyn crate::seams::BacklogStore>,
    /// Latest scheduler introspection, for `fairway stats` and `top`.
    pub stats: Mutex<serde_json::Value>,
    /// Partitions of the pool topic this member owns now.
    pub assigned: std::sync::atomic::AtomicUsize,
    /// Jobs whose route ended here with a durable outcome (result and state recorded, or
    /// settled without running): progress a caller can poll ([`Worker::settled`]).
    pub settled: std::sync::atomic::AtomicU64,
    /// Fleet accounting: slot-seconds per tenant used here, accumulated by the pool
    /// loop and drained by the usage reporter.
    pub local_usage: Mutex<HashMap<String, f64>>,
    /// Decayed slot-seconds per tenant used by the rest of the fleet (other workers and
    /// pools), published by the usage reporter and folded in by the pool loop.
    pub fleet_usage: watch::Sender<HashMap<String, f64>>,
    /// The live tenants registry.
    pub tenants: Arc<dyn crate::seams::TenantsView>,
    /// Fleet-wide limits of this pool: demand reported by the pool loop, caps computed
    /// by the quota exchange (`worker::quota`).
    pub quotas: Mutex<crate::core::quota::Quotas>,
    /// The worker's readiness and liveness (`/readyz`, `/livez`).
    pub probes: crate::observe::probes::Probes,
    /// The worker's vitals (`watchdog`): a pool loop reports a fatal consumer error here.
    pub watch: Arc<watchdog::Watch>,
}

/// The failure-handling cores of one pool.
pub struct Health {
    /// Per job type and per (job type, tenant), scoped to who fails (`core::breaker`).
    pub breakers: ScopedBreakers,
    pub poison: PoisonDetectors,
    pub budget: RetryBudget,
    /// The value last set on `fairway_breaker_open` per job type label (configured types
    /// and "unknown"), so the gauge is written when it changes, not on every outcome.
    breaker_gauges: HashMap<String, bool>,
}

impl Health {
    /// With `worker.fleet_limits`, the retry budgets and poison detectors are judged on
    /// the whole pool's counts (`core::fleet_counts`), this worker being `worker_id`.
    pub fn new(cfg: &Config, worker_id: &str) -> Self {
        let configs = cfg.job_types.iter().filter_map(|(n, jt)| Some((n.clone(), jt.breaker.clone()?))).collect();
        let breakers = ScopedBreakers::new(BreakerConfig::default(), configs, cfg.admission.breaker.min_tenants);
        let mut budget = RetryBudget::new(cfg.worker.retry_budget.clone());
        if cfg.worker.fleet_limits {
            budget.fleet_wide(worker_id);
        }
        let poison = PoisonDetectors::new(cfg.worker.poison.clone());
        Health { breakers, poison, budget, breaker_gauges: HashMap::new() }
    }
}

impl RouteContext {
    pub fn job_timeout(&self, job_type: &str) -> Duration {
        match self.cfg.job_types.get(job_type) {
            Some(jt) => self.cfg.job_timeout(jt, self.pool),
            None => self.cfg.pool(self.pool).default_timeout,
        }
    }

    /// Asks every running job of this pool to stop for a hand-off.
    pub fn request_stop_all(&self) {
        if let Ok(running) = self.running.lock() {
            self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            for live in running.values() {
                live.request_stop();
            }
        }
    }

    /// Does this pool run any `process` job type (then its stats name the enforcement)?
    pub fn runs_processes(&self) -> bool {
        self.cfg.job_types.values().any(|t| t.pool == self.pool && t.handler == crate::config::HandlerKind::Process)
    }

    /// A child of `tenant` was killed or ended abnormally (`core::recycling`).
    pub fn record_recycling(&self, tenant: &str, now: Millis) {
        metrics::counter!(crate::metrics::PROCESS_RECYCLED, "pool" => self.pool.as_str()).increment(1);
        self.recycling.lock().expect("recycling lock").record(tenant, now);
    }

    /// Aborts every running job of this pool (it ignored the stop request): handed off
    /// without the progress since its last checkpoint.
    pub fn abort_all(&self) {
        if let Ok(running) = self.running.lock() {
            for live in running.values() {
                live.abort();
            }
        }
    }

    /// Heartbeats expire after about three intervals, so a dead worker's rows vanish.
    /// The store refused a call at `now`.
    pub fn store_refused(&self, now: Millis) {
        self.store_refused_at.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Since when this worker has reached the store without a refusal (epoch ms): its
    /// start or the last refusal. A lapse judged sooner than one lapse after it may be a
    /// store outage's, whose live runs could not heartbeat (`liveness::may_judge_lapses`).
    pub fn store_steady_since(&self) -> Millis {
        self.started_at.max(self.store_refused_at.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether the store refused a call within `window` ms before `now`.
    pub fn store_refused_within(&self, now: Millis, window: Millis) -> bool {
        let at = self.store_refused_at.load(std::sync::atomic::Ordering::Relaxed);
        at > 0 && now.saturating_sub(at) <= window
    }

    pub fn heartbeat_ttl_secs(&self) -> i32 {
        (self.cfg.pool(self.pool).heartbeat_interval.as_secs_f64() * 3.0).ceil().max(1.0) as i32
    }

    pub fn retry_policy(&self, job_type: &str) -> RetryPolicy {
        self.cfg.job_types.get(job_type).and_then(|jt| jt.retry.clone()).unwrap_or_default()
    }

    /// Job types are configured, so using them as a metric label keeps cardinality bounded.
    pub fn bounded_job_type(&self, job_type: &str) -> String {
        if self.cfg.job_types.contains_key(job_type) {
            job_type.to_string()
        } else {
            "unknown".to_string()
        }
    }

    /// The retry decision for a failed attempt, with the class it was decided as: a
    /// quarantined job type's failures are poison; retries above the tenant's budget
    /// are dead-lettered early.
    pub fn decide(
        &self,
        class: FailureClass,
        job_type: &str,
        tenant: &str,
        state: &AttemptState,
        policy: &RetryPolicy,
        now: Millis,
    ) -> (FailureClass, Decision) {
        let mut h = self.health.lock().expect("health lock");
        let class = h.poison.effective_class(&crate::core::poison::tenant_key(job_type, tenant), class, now);
        let jitter = self.dice.unit();
        let failed = retry::Failed { class, state, policy };
        (class, retry::decide_with_budget(failed, &mut h.budget, tenant, now, jitter))
    }

    /// May a job of this type run now? (Its dependency's circuit breaker.)
    pub fn breaker_verdict(&self, job_type: &str, tenant: &str, first_attempt: bool, now: Millis) -> Verdict {
        let mut h = self.health.lock().expect("health lock");
        let mut a = h.breakers.allow(job_type, tenant, now);
        if let Verdict::Rejected { retry_at } = &mut a {
            // While a probe is out, the breaker points at the probe's deadline; look
            // again after one cool-down instead, the probe usually answers sooner.
            let cool_down = h.breakers.config(job_type).cool_down.0;
            *retry_at = (*retry_at).min(now + cool_down.max(100));
        }
        // The retry budget compares retries with fresh dispatches (first attempts only).
        if first_attempt && !matches!(a, Verdict::Rejected { .. }) {
            h.budget.record_dispatch(tenant, now);
        }
        a
    }

    /// Counts a run's time of `tenant`'s job for the pool classifier, and its violation
    /// of this pool's range in `fairway_pool_violations_total`.
    pub fn record_run(&self, job_type: &str, tenant: &str, run_ms: Millis, now: Millis) {
        if !self.cfg.classifier.enabled {
            return;
        }
        let violation = self.ranges.violation(self.pool, run_ms);
        let pool = self.pool.as_str();
        if let Some(v) = violation {
            metrics::counter!(crate::metrics::POOL_VIOLATIONS, "pool" => pool, "job_type" => self.bounded_job_type(job_type), "direction" => v.as_str())
                .increment(1);
        }
        let max = self.cfg.classifier.max_tracked;
        if !self.admission_tally.lock().expect("admission tally").ran((job_type, tenant), (run_ms, violation), now, max)
        {
            metrics::counter!(crate::metrics::CLASSIFIER_UNTRACKED_RUNS, "pool" => pool).increment(1);
        }
    }

    /// Feeds an attempt of `tenant`'s job to the breaker and the poison detector (which
    /// judges each tenant's jobs of a type apart: one tenant's failing inputs quarantine
    /// the type for that tenant only).
    pub fn record_outcome(&self, job_type: &str, tenant: &str, failure: Option<FailureClass>, now: Millis) {
        self.admission_tally.lock().expect("admission tally").outcome(job_type, tenant, failure, now);
        let mut h = self.health.lock().expect("health lock");
        // Infrastructure failures open the tenant's breaker, and the type's only once
        // several tenants have them; successes close them.
        let changes = h.breakers.record(job_type, tenant, failure, now);
        if let Some(state) = changes.tenant {
            tracing::warn!(
                job_type,
                tenant,
                state = state.as_str(),
                "breaker of this tenant's jobs of the type changed"
            );
        }
        if let Some(q) = h.poison.record_tenant_outcome(job_type, tenant, now, failure) {
            tracing::warn!(
                job_type,
                tenant,
                quarantined = q,
                "poison quarantine changed (for this tenant's jobs of the type)"
            );
        }
        let open = h.breakers.type_wide().state(job_type) != BreakerState::Closed;
        let label = if self.cfg.job_types.contains_key(job_type) { job_type } else { "unknown" };
        if h.breaker_gauges.get(label) != Some(&open) {
            h.breaker_gauges.insert(label.to_string(), open);
            metrics::gauge!(crate::metrics::BREAKER_OPEN, "job_type" => label.to_string()).set(if open {
                1.0
            } else {
                0.0
            });
        }
    }
}
