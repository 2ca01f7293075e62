//! The worker: one consumer-group member per pool it serves, each running the loop in
//! `pool`, sharing a store session, a producer and the handler registry. Pure decisions
//! (scheduling, retry, breakers, offsets) live in `crate::core`; this module moves data
//! between them and Kafka / ScyllaDB.

pub mod admission;
pub mod backlog;
mod check;
pub mod classifier;
pub mod dispatch;
mod durable;
pub mod exec;
pub mod frontier;
pub mod liveness;
pub mod pool;
pub mod quota;
pub mod relay;
pub mod route;
pub mod schedules;
mod settle;
pub mod usage;
pub mod watchdog;

use crate::config::Config;
use crate::core::breaker::{BreakerConfig, BreakerState, ScopedBreakers, Verdict};
use crate::core::poison::PoisonDetectors;
use crate::core::retry::{self, AttemptState, Decision, RetryBudget, RetryPolicy};
use crate::handlers::{JobLive, Registry};
use crate::kafka;
use crate::model::{FailureClass, Millis, Pool};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Why a worker, or one of its pools' loops, could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
    #[error(transparent)]
    Submit(#[from] crate::submit::SubmitError),
    #[error("cannot schedule pool {pool}: pools.{pool}: {source}")]
    Schedule { pool: Pool, source: crate::core::scheduler::SchedulerError },
}

/// Which dispatch policy the worker uses (FIFO exists as the fairness benchmark's baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Policy {
    #[default]
    Fair,
    Fifo,
}

/// Everything a pool loop and its executions share.
pub struct Shared {
    pub cfg: Arc<Config>,
    pub pool: Pool,
    pub store: Store,
    pub producer: kafka::Producer,
    pub registry: Registry,
    pub worker_id: String,
    /// Live handles of running jobs (progress, cancellation) for the heartbeat loop.
    pub running: Mutex<HashMap<String, Arc<JobLive>>>,
    /// Set once the pool drains for a hand-off: a job that starts after it (it was in its
    /// pre-run checks) is asked to stop at once.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Latest scheduler introspection, for `fairway stats` and `top`.
    pub stats: Mutex<serde_json::Value>,
    /// Circuit breakers, poison detectors and retry budgets (pure cores behind a lock).
    pub health: Mutex<Health>,
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
    /// Dispatch frontiers of the pool topic's partitions: which jobs skip the state read.
    pub frontiers: frontier::Frontiers,
    /// The live tenants registry.
    pub tenants: crate::ops::tenants::LiveTenants,
    /// Fleet-wide limits of this pool: demand reported by the pool loop, caps computed
    /// by the quota exchange (`worker::quota`).
    pub quotas: Mutex<crate::core::quota::Quotas>,
    /// Dispatches, attempt outcomes and run times for submission admission (`admission`).
    pub admission_tally: Mutex<admission::Tally>,
    /// The pools' run-time ranges (`pools.<p>.max_run`), for the classifier's counts.
    pub ranges: crate::core::classifier::Ranges,
    /// Kills and abnormal exits of `process` children per tenant (the recycling cap).
    pub recycling: Mutex<crate::core::recycling::Recycling>,
    /// The worker's readiness and liveness (`/readyz`, `/livez`).
    pub probes: crate::observe::probes::Probes,
    /// The worker's vitals (`watchdog`): a pool loop reports a fatal consumer error here.
    pub watch: Arc<watchdog::Watch>,
    /// The per-job metrics of this pool, registered once.
    pub metrics: crate::metrics::PoolMetrics,
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

impl Shared {
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
        let jitter = rand::random::<f64>();
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
        let (pool, job_type_label) = (self.pool.as_str(), self.bounded_job_type(job_type));
        if let Some(v) = violation {
            metrics::counter!(crate::metrics::POOL_VIOLATIONS, "pool" => pool, "job_type" => job_type_label.clone(), "direction" => v.as_str())
                .increment(1);
        }
        let subject = crate::core::classifier::Subject::new(job_type, tenant);
        let max = self.cfg.classifier.max_tracked;
        if !self.admission_tally.lock().expect("admission tally").ran(&subject, (run_ms, violation), now, max) {
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
        let key = crate::core::poison::tenant_key(job_type, tenant);
        if let Some(q) = h.poison.record_outcome(&key, now, failure) {
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

/// A running worker process: its pools' loops and their shutdown switch.
pub struct Worker {
    pub worker_id: String,
    /// Readiness and liveness, served on the metrics listener by `fairway worker`.
    pub probes: crate::observe::probes::Probes,
    shutdown: watch::Sender<bool>,
    halt: watch::Sender<bool>,
    pool_tasks: Vec<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub shared: Vec<Arc<Shared>>,
    /// Whether this worker can make progress; resolves `gave_up` when it cannot.
    pub watch: Arc<watchdog::Watch>,
}

pub fn new_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// How to start a worker: its pools, dispatch policy and probes.
pub struct WorkerStart<'a> {
    pub pools: &'a [Pool],
    pub policy: Policy,
    /// Readiness and liveness state (made with `Probes::worker(pools)`), served by the
    /// caller, possibly before the start completes.
    pub probes: crate::observe::probes::Probes,
}

impl Worker {
    /// Starts one consumer loop per pool.
    pub async fn start(
        cfg: Arc<Config>,
        pools: &[Pool],
        registry: Registry,
        policy: Policy,
    ) -> Result<Worker, WorkerError> {
        let probes = crate::observe::probes::Probes::worker(pools);
        Worker::start_with(cfg, registry, WorkerStart { pools, policy, probes }).await
    }

    /// Starts one consumer loop per pool, reporting readiness and liveness to `s.probes`.
    pub async fn start_with(cfg: Arc<Config>, registry: Registry, s: WorkerStart<'_>) -> Result<Worker, WorkerError> {
        let WorkerStart { pools, policy, probes } = s;
        let store = Store::open(&cfg).await?;
        if let Some(r) = probes.worker_readiness() {
            r.set_store_up(true);
        }
        let producer = kafka::producer(&cfg)?;
        let worker_id = new_worker_id();
        let (tx, rx) = watch::channel(false);
        // Pools stop on `tx`; heartbeats and the rest on `halt`, once the pools drained
        // (a draining job keeps heartbeating).
        let (halt, halted) = watch::channel(false);
        let mut pool_tasks = Vec::new();
        let tenants = crate::ops::tenants::LiveTenants::start(cfg.clone(), &store, rx.clone()).await?;
        let mut tasks = Vec::new();
        let mut shared = Vec::new();
        let vitals = Arc::new(watchdog::Watch::new(cfg.worker.store_outage_limit));
        let v = vitals.clone();
        probes.liveness.watch(Arc::new(move || v.live()));
        tasks.push(tokio::spawn(watchdog::watchdog_loop(
            vitals.clone(),
            store.clone(),
            producer.clone(),
            halted.clone(),
        )));
        let feed = Arc::new(frontier::CancelFeed::default());
        tasks.push(tokio::spawn(feed.clone().run(store.clone(), rx.clone())));
        for &pool in pools {
            let sh = Arc::new(Shared {
                cfg: cfg.clone(),
                metrics: crate::metrics::PoolMetrics::new(pool.as_str()),
                pool,
                store: store.clone(),
                producer: producer.clone(),
                registry: registry.clone(),
                worker_id: worker_id.clone(),
                running: Mutex::new(HashMap::new()),
                stopping: Default::default(),
                stats: Mutex::new(serde_json::Value::Null),
                health: Mutex::new(Health::new(&cfg, &worker_id)),
                assigned: Default::default(),
                settled: Default::default(),
                local_usage: Mutex::new(HashMap::new()),
                fleet_usage: watch::channel(HashMap::new()).0,
                frontiers: frontier::Frontiers::new(cfg.pool_topic(pool), cfg.worker.skip_fresh_reads, feed.clone()),
                tenants: tenants.clone(),
                quotas: Mutex::new(Default::default()),
                admission_tally: Default::default(),
                ranges: cfg.run_ranges(),
                recycling: Mutex::new(crate::core::recycling::Recycling::new(cfg.pool(pool).recycling)),
                probes: probes.clone(),
                watch: vitals.clone(),
            });
            let (sh3, rx3) = (sh.clone(), halted.clone());
            tasks.push(tokio::spawn(liveness::heartbeat_loop(sh3, rx3)));
            tasks.push(tokio::spawn(usage::usage_loop(sh.clone(), rx.clone())));
            if cfg.worker.fleet_limits {
                tasks.push(tokio::spawn(quota::quota_loop(sh.clone(), rx.clone())));
            }
            tasks.push(tokio::spawn(admission::report_loop(sh.clone(), halted.clone())));
            let dispatcher = make_dispatcher(&cfg, pool, policy, &tenants.current())?;
            let rx = rx.clone();
            let sh2 = sh.clone();
            pool_tasks.push(tokio::spawn(async move {
                let liveness = sh2.probes.liveness.clone();
                if let Err(e) = pool::run(sh2, dispatcher, rx).await {
                    tracing::error!(pool = pool.as_str(), error = %e, "pool loop failed");
                    liveness.fail(format!("pool {pool}: its loop failed ({e})"));
                }
            }));
            shared.push(sh);
        }
        // Any worker may lead the reaper and the pool classifier (one at a time, by lease).
        if let Some(sh) = shared.first() {
            tasks.push(tokio::spawn(liveness::reaper_loop(sh.clone(), rx.clone())));
            if cfg.classifier.enabled {
                tasks.push(tokio::spawn(classifier::classifier_loop(sh.clone(), rx.clone())));
            }
        }
        // Every worker also relays due retries back to their pools (one group, shared).
        let (cfg2, producer2, store2, rx2) = (cfg.clone(), producer.clone(), store.clone(), rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = relay::run(cfg2, producer2, store2, rx2).await {
                tracing::error!(error = %e, "retry relay failed");
            }
        }));
        // Any worker may lead the promoter of parked (scheduled) jobs, one at a time.
        tasks.push(tokio::spawn(relay::promoter_loop(
            cfg.clone(),
            producer.clone(),
            store.clone(),
            worker_id.clone(),
            rx.clone(),
        )));
        // The promoter's leader also fires recurring schedules.
        tasks.push(tokio::spawn(schedules::fire_loop(
            cfg.clone(),
            store.clone(),
            tenants.clone(),
            worker_id.clone(),
            rx.clone(),
        )));
        tracing::info!(%worker_id, ?pools, ?policy, "worker started");
        if shared.iter().any(|s| s.runs_processes()) {
            crate::handlers::process::confine_worker();
            let e = crate::handlers::process::Enforcement::current();
            tracing::info!(enforcement = %e.name(), "process job sandbox: {}", e.describe());
        }
        Ok(Worker { worker_id, probes, shutdown: tx, halt, pool_tasks, tasks, shared, watch: vitals })
    }

    /// Waits until every pool's consumer owns at least one partition (group formed).
    pub async fn wait_assigned(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.shared.iter().all(|s| s.assigned.load(std::sync::atomic::Ordering::SeqCst) > 0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Jobs settled durably by this worker's pools so far (see [`Shared::settled`]).
    pub fn settled(&self) -> u64 {
        self.shared.iter().map(|s| s.settled.load(std::sync::atomic::Ordering::Relaxed)).sum()
    }

    /// Graceful stop (SIGTERM, SIGINT): no new work; running jobs finish within their
    /// pool's `drain_timeout`, then are asked to stop and handed off through their
    /// checkpoints; offsets committed; the group left. Heartbeats go on until the end.
    pub async fn stop(self) {
        if let Some(r) = self.probes.worker_readiness() {
            r.draining();
        }
        let _ = self.shutdown.send(true);
        for t in self.pool_tasks {
            let _ = t.await;
        }
        let _ = self.halt.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

fn make_dispatcher(
    cfg: &Config,
    pool: Pool,
    policy: Policy,
    tenants: &crate::core::tenants::TenantSet,
) -> Result<Box<dyn dispatch::Dispatcher<route::Pending>>, WorkerError> {
    let slots = cfg.pool(pool).slots;
    // The hard per-tenant limit is twice the spill threshold: read-backs and messages
    // already fetched still fit.
    let limit = cfg.worker.tenant_queue_limit.saturating_mul(2);
    Ok(match policy {
        Policy::Fifo => Box::new(dispatch::Fifo::new(slots, limit)),
        // A pool configuration the scheduler refuses stops the start with the reason;
        // registry content never does (see `Fair::new`).
        Policy::Fair => Box::new(
            dispatch::Fair::<route::Pending>::new(cfg, pool, tenants)
                .map_err(|source| WorkerError::Schedule { pool, source })?,
        ),
    })
}
