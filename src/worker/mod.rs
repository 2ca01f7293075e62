//! The worker: one consumer-group member per pool it serves, each running the loop in
//! `pool`, sharing a store session, a producer and the handler registry. Pure decisions
//! (scheduling, retry, breakers, offsets) live in `crate::core`; this module moves data
//! between them and Kafka / ScyllaDB.

pub mod admission;
pub mod backlog;
mod check;
pub mod classifier;
mod context;
pub mod dispatch;
mod durable;
pub mod early_commit;
pub mod exec;
pub mod frontier;
pub mod liveness;
pub mod ownership;
pub mod pool;
pub mod quota;
pub mod relay;
pub mod route;
#[cfg(test)]
mod route_tests;
pub mod schedules;
mod settle;
pub mod usage;
pub mod watchdog;

pub use context::{Health, RouteContext, Shared};

use crate::config::Config;
use crate::handlers::Registry;
use crate::kafka;
use crate::model::Pool;
use crate::store::open_waiting;
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
    /// The tenants registry as this worker reads it.
    pub tenants: crate::ops::tenants::LiveTenants,
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
        let store = open_waiting(&cfg, cfg.scylla.connect_wait, |w| {
            let waiting = w.describe();
            tracing::warn!("{waiting}");
            if let Some(r) = probes.worker_readiness() {
                r.set_store_waiting(waiting);
            }
        })
        .await?;
        if let Some(r) = probes.worker_readiness() {
            r.set_store_up(true);
        }
        let producer = kafka::worker_producer(&cfg)?;
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
        let holds = Arc::new(crate::dependencies::Holds::default());
        if crate::dependencies::in_use(&cfg) {
            tasks.push(tokio::spawn(holds.clone().run(store.clone(), "worker", rx.clone())));
        }
        for &pool in pools {
            let route = Arc::new(RouteContext {
                results_topic: cfg.results_topic(),
                cfg: cfg.clone(),
                metrics: crate::metrics::PoolMetrics::new(pool.as_str()),
                pool,
                store: Arc::new(store.clone()),
                broker: Arc::new(producer.clone()),
                clock: Arc::new(crate::seams::SystemClock),
                dice: Arc::new(crate::seams::ThreadDice),
                checkpoints: Some(store.clone()),
                registry: registry.clone(),
                worker_id: worker_id.clone(),
                running: Mutex::default(),
                in_flight: Default::default(),
                stopping: Default::default(),
                health: Mutex::new(Health::new(&cfg, &worker_id)),
                frontiers: frontier::Frontiers::new(cfg.pool_topic(pool), cfg.worker.skip_fresh_reads, feed.clone()),
                admission_tally: Mutex::new(admission::Tally::with_tenants(tenants.subscribe())),
                ranges: cfg.run_ranges(),
                recycling: Mutex::new(crate::core::recycling::Recycling::new(cfg.pool(pool).recycling)),
                dependencies: holds.clone(),
                store_refused_at: Default::default(),
                started_at: crate::now_ms(),
            });
            let sh = Arc::new(Shared {
                route,
                backlog: Arc::new(store.backlog_statements().await?),
                stats: Mutex::new(serde_json::Value::Null),
                assigned: Default::default(),
                settled: Default::default(),
                local_usage: Mutex::new(HashMap::new()),
                fleet_usage: watch::channel(HashMap::new()).0,
                tenants: Arc::new(tenants.clone()),
                quotas: Mutex::new(Default::default()),
                probes: probes.clone(),
                watch: vitals.clone(),
            });
            let (sh3, rx3) = (sh.clone(), halted.clone());
            tasks.push(tokio::spawn(liveness::heartbeat_loop(sh3.route.clone(), rx3)));
            tasks.push(tokio::spawn(usage::usage_loop(sh.clone(), store.clone(), rx.clone())));
            if cfg.worker.fleet_limits {
                tasks.push(tokio::spawn(quota::quota_loop(sh.clone(), store.clone(), rx.clone())));
            }
            tasks.push(tokio::spawn(admission::report_loop(sh.clone(), store.clone(), halted.clone())));
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
            let edges = (store.clone(), producer.clone());
            tasks.push(tokio::spawn(liveness::reaper_loop(sh.clone(), edges.clone(), rx.clone())));
            if cfg.classifier.enabled {
                tasks.push(tokio::spawn(classifier::classifier_loop(sh.clone(), edges, rx.clone())));
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
        if shared.iter().any(|s| s.route.runs_processes()) {
            crate::handlers::process::confine_worker();
            let e = crate::handlers::process::Enforcement::current();
            tracing::info!(enforcement = %e.name(), "process job sandbox: {}", e.describe());
        }
        Ok(Worker { worker_id, probes, shutdown: tx, halt, pool_tasks, tasks, shared, watch: vitals, tenants })
    }

    /// Waits until every pool's consumer owns at least one partition (group formed).
    /// Looks every millisecond: a bench times its jobs from the answer.
    pub async fn wait_assigned(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.shared.iter().all(|s| s.assigned.load(std::sync::atomic::Ordering::SeqCst) > 0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
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

pub(crate) fn make_dispatcher(
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
