//! Front-door admission, the I/O shell shared by the HTTP API and `fairway submit`
//! (rules: `core::admission`; counts: `store::admission`).
//!
//! Before anything is written, a submission (one job or a batch, all or nothing) must
//! pass, in order:
//! 1. the **circuit breakers** of its pools and job types, the tenant's own and the
//!    shared ones (fed every second from the workers' outcome counts in the store;
//!    scoping in `core::admission::breaker`) – 503 `CIRCUIT_OPEN`;
//! 2. the tenant's **queue depth** – the counter row `queue_depth` (enqueued by the
//!    front door, dequeued by workers at first dispatch), read at most every
//!    `admission.queue_cache` per tenant, plus what this process admitted since the
//!    read – 429 `TENANT_QUEUE_FULL`;
//! 3. the **rates** – the tenant's token bucket and the end user's (`user_key`) sliding
//!    window in this process – 429 `TENANT_RATE_LIMIT_EXCEEDED` / `USER_RATE_LIMIT_EXCEEDED`.
//!
//! Each admitted job (scheduled ones too: they hold their slot from submission until a
//! worker dispatches them, so `max_queued` bounds what waits in the scheduler as well;
//! `admission.max_schedule_ahead` bounds for how long) then adds 1 to its tenant's
//! `enqueued` counter once it is produced ([`Admission::settle`]). Quota alerts: every admission updates the share of
//! each limit the tenant uses; crossing an alert level (60 %, 80 %) logs, counts
//! `fairway_quota_alerts_total` and moves the `fairway_quota_tenants_over` gauge.

use crate::config::{Config, Tier};
use crate::core::admission::breaker::{self, Gate, Pass, BUCKET_MS};
use crate::core::admission::{self as rules, Demand, Limit, QuotaLevels, RateLimiters, Refusal};
use crate::core::fleet::BucketReads;
use crate::core::refusals::{code as refusal_code, Class, Mark, OwnRefusals};
use crate::core::tenants::TenantRecord;
use crate::core::window::Counts;
use crate::metrics as m;
use crate::model::{Millis, Pool};
use crate::now_ms;
use crate::store::RefusalStatements;
use crate::store::{AdmissionStatements, Store, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One job asking to be admitted.
#[derive(Debug, Clone)]
pub struct Ask {
    pub tenant: String,
    /// The end user (the job's `user_key`), for the per-user window.
    pub user_key: Option<String>,
    pub pool: Pool,
    pub job_type: String,
}

/// Why a submission is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    Limit(Refusal),
    /// The fleet-wide breaker of a dependency the job type declares is open
    /// (`core::dependency`): submissions wait `wait_ms`.
    DependencyOpen {
        dependency: String,
        wait_ms: i64,
    },
    /// A front-door breaker is open: `scope` is `pool:<name>` or `job_type:<name>`, or one
    /// of those of a tenant (`breaker::tenant_scope`).
    CircuitOpen {
        scope: String,
        wait_ms: i64,
        counts: Counts,
        ratio: f64,
    },
    Store(String),
}

impl From<StoreError> for Refused {
    fn from(e: StoreError) -> Self {
        Refused::Store(e.to_string())
    }
}

/// What an admission reserved, to settle once the jobs were produced (or not).
#[derive(Debug)]
pub struct Ticket {
    asks: Vec<Ask>,
    /// Breaker scopes whose probe is the job at this index.
    probes: Vec<(String, usize)>,
}

/// A tenant's queued count as last read, with this process's admissions since.
#[derive(Debug, Clone)]
struct QueueView {
    read_at: Instant,
    queued: u64,
    since: u64,
}

#[derive(Debug, Default)]
struct State {
    rates: RateLimiters,
    queues: HashMap<String, QueueView>,
    quota: QuotaLevels,
    /// When idle end-user windows were last forgotten.
    pruned_at: Millis,
}

/// How often idle end-user windows are forgotten.
const PRUNE_MS: Millis = 10_000;

/// The front door of one process (cheap to share behind an `Arc`).
pub struct Admission {
    cfg: Arc<Config>,
    stmts: Option<AdmissionStatements>,
    store: Option<Store>,
    tenants: Option<crate::ops::tenants::LiveTenants>,
    state: Mutex<State>,
    gates: Mutex<HashMap<String, ScopedGate>>,
    /// The fleet-wide dependency breakers as last read (`crate::dependencies`).
    dependencies: Arc<crate::dependencies::Holds>,
    /// This process's refusals and near-limit admissions per hour (`core::refusals`),
    /// written every [`REFUSALS_EVERY`] under `process`.
    refusals: Mutex<OwnRefusals>,
    process: String,
}

/// A gate and, for a shared one that opened, the tenants whose failures opened it (they
/// are never its probe).
#[derive(Debug)]
struct ScopedGate {
    gate: Gate,
    /// A pool's or job type's gate (not one tenant's).
    shared: bool,
    culprits: std::collections::BTreeSet<String>,
}

impl ScopedGate {
    /// May `tenant`'s submission go now? A culprit waits while the gate is not closed,
    /// so another tenant's job is the probe.
    fn pass(&mut self, tenant: &str, now: Millis, cool_down: Millis) -> Pass {
        if self.culprits.contains(tenant) {
            match self.gate.state() {
                breaker::GateState::Closed { .. } => {}
                breaker::GateState::Open { until, .. } if now < *until => return Pass::Refused { retry_at: *until },
                _ => return Pass::Refused { retry_at: now + cool_down },
            }
        }
        self.gate.pass(now)
    }
}

impl Admission {
    /// Without a store: rates only (no queue depth, no breaker).
    pub fn local(cfg: Arc<Config>) -> Self {
        let quota = QuotaLevels::new(cfg.admission.alert_levels.clone());
        let state = Mutex::new(State { quota, ..Default::default() });
        Admission {
            cfg,
            stmts: None,
            store: None,
            tenants: None,
            state,
            gates: Default::default(),
            dependencies: Default::default(),
            refusals: Default::default(),
            process: format!("admission-{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// With the store's counts and the live registry.
    pub async fn connect(
        cfg: Arc<Config>,
        store: &Store,
        tenants: Option<crate::ops::tenants::LiveTenants>,
    ) -> Result<Self, StoreError> {
        let stmts = store.admission_statements().await?;
        Ok(Admission { stmts: Some(stmts), store: Some(store.clone()), tenants, ..Admission::local(cfg) })
    }

    /// Starts the breaker feed (every second, until `stop`) for a long-lived process.
    pub fn start_breakers(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        if let (Some(store), true) = (&self.store, crate::dependencies::in_use(&self.cfg)) {
            tokio::spawn(self.dependencies.clone().run(store.clone(), "api", stop.clone()));
        }
        if self.store.is_some() {
            tokio::spawn(refusals_loop(Arc::downgrade(self), stop.clone()));
        }
        if self.cfg.admission.breaker.enabled && self.stmts.is_some() {
            tokio::spawn(gates_loop(Arc::downgrade(self), stop));
        }
    }

    /// Counts `n` marks of `code` for `tenant`, of `tier` (None: no registry row), in its
    /// class's budget (past a bound: counted as untracked).
    fn mark(&self, tenant: &str, tier: Option<Tier>, code: &str, n: u64, now: Millis) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let kept = self.refusals.lock().expect("refusals").record(tenant, Class::of(tier), code, n, now);
        if kept.is_err() {
            metrics::counter!(m::REFUSALS_UNTRACKED).increment(1);
        }
    }

    /// Writes the changed refusal cells; a failed write is tried again with the next.
    async fn write_refusals(&self, stmts: &RefusalStatements) {
        let pending = {
            let mut own = self.refusals.lock().expect("refusals");
            own.evict(now_ms());
            own.pending()
        };
        if pending.is_empty() {
            return;
        }
        if let Err(e) = stmts.put_cells(&self.process, &pending).await {
            tracing::warn!(error = %e, "refusal counts not written (the tenants' pages and limit alerts); retried next pass");
            return;
        }
        self.refusals.lock().expect("refusals").written(&pending);
    }

    fn record(&self, tenant: &str) -> Option<TenantRecord> {
        match &self.tenants {
            Some(live) => live.standing(tenant).ok(),
            None => self.cfg.tenants.get(tenant).map(|t| TenantRecord::from_config(tenant, t)),
        }
    }

    /// Admits every job of `asks` or none (see the module docs); a refusal is counted
    /// in `fairway_admission_refused_total{reason}`.
    pub async fn admit(&self, asks: Vec<Ask>) -> Result<Ticket, Refused> {
        let n = asks.len() as u64;
        let admitted = self.admit_all(&asks).await;
        if let Err(refused) = &admitted {
            let reason = match refused {
                Refused::Limit(rules::Refusal::QueueFull { .. }) => "max_queued",
                Refused::Limit(rules::Refusal::Rate { scope, .. } | rules::Refusal::AboveBurst { scope, .. }) => {
                    scope.as_str()
                }
                Refused::DependencyOpen { .. } => "dependency_circuit",
                Refused::CircuitOpen { .. } => crate::core::refusals::CIRCUIT_OPEN,
                Refused::Store(_) => "store_unavailable",
            };
            metrics::counter!(crate::metrics::ADMISSION_REFUSED, "reason" => reason).increment(n);
            if !matches!(refused, Refused::Store(_)) {
                let now = now_ms();
                let mut per: BTreeMap<(&str, Pool), u64> = BTreeMap::new();
                for a in &asks {
                    *per.entry((&a.tenant, a.pool)).or_default() += 1;
                }
                for ((tenant, pool), k) in per {
                    let tier = self.record(tenant).map(|r| r.tier);
                    self.mark(tenant, tier, &refusal_code(Mark::Refused, reason, pool.as_str()), k, now);
                }
            }
        }
        admitted.map(|probes| Ticket { asks, probes })
    }

    /// Admits every job of `asks` or none; the gates' probes taken on the way.
    async fn admit_all(&self, asks: &[Ask]) -> Result<Vec<(String, usize)>, Refused> {
        let now = now_ms();
        let probes = self.pass_gates(asks, now)?;
        let mut per_tenant: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
        for a in asks {
            let e = per_tenant.entry(&a.tenant).or_default();
            e.0 += 1;
            e.1 += 1;
        }
        let records: HashMap<&str, TenantRecord> =
            per_tenant.keys().filter_map(|t| Some((*t, self.record(t)?))).collect();
        // Queue depth: refresh stale reads first (outside the lock).
        for (tenant, (_, due)) in &per_tenant {
            let max = records.get(tenant).and_then(|r| self.cfg.admission.max_queued(r.tier, r.max_queued));
            if *due > 0 && max.is_some() {
                self.refresh_queue(tenant).await?;
            }
        }
        let demands: Vec<Demand> =
            asks.iter().filter_map(|a| self.demand(a, records.get(a.tenant.as_str())?)).collect();
        let mut st = self.state.lock().expect("admission state");
        if now - st.pruned_at >= PRUNE_MS {
            st.pruned_at = now;
            st.rates.prune(now);
        }
        let mut reserved = Vec::new();
        for (tenant, (_, due)) in &per_tenant {
            let max = records.get(tenant).and_then(|r| self.cfg.admission.max_queued(r.tier, r.max_queued));
            let Some(view) = st.queues.get_mut(*tenant).filter(|_| *due > 0 && max.is_some()) else { continue };
            if let Err(r) = rules::queue_check(tenant, view.queued + view.since, *due, max) {
                for (t, n) in reserved {
                    unreserve(&mut st, t, n, 0);
                }
                drop(st);
                self.release_probes(&probes, now);
                return Err(Refused::Limit(r));
            }
            view.since += due;
            reserved.push((*tenant, *due));
        }
        if let Err(r) = st.rates.admit(&demands, now) {
            for (t, n) in reserved {
                unreserve(&mut st, t, n, 0);
            }
            drop(st);
            self.release_probes(&probes, now);
            return Err(Refused::Limit(r));
        }
        let mut near = Vec::new();
        for tenant in per_tenant.keys() {
            let max = records.get(tenant).and_then(|r| self.cfg.admission.max_queued(r.tier, r.max_queued));
            for limit in observe_quota(&mut st, tenant, max, now) {
                near.push((*tenant, limit));
            }
        }
        drop(st);
        for (tenant, limit) in near {
            let pools: std::collections::BTreeSet<Pool> =
                asks.iter().filter(|a| a.tenant == tenant).map(|a| a.pool).collect();
            let tier = records.get(tenant).map(|r| r.tier);
            for pool in pools {
                self.mark(tenant, tier, &refusal_code(Mark::Near, limit.as_str(), pool.as_str()), 1, now);
            }
        }
        Ok(probes)
    }

    fn demand(&self, a: &Ask, r: &TenantRecord) -> Option<Demand> {
        let adm = &self.cfg.admission;
        Some(Demand {
            tenant: a.tenant.clone(),
            key: a.user_key.clone(),
            n: 1,
            tenant_rate: adm.tenant_rate(r.tier, r.rate_per_sec).share(self.cfg.api.replicas),
            user_rate: adm.user_rate.get(&r.tier).map(|u| u.share(self.cfg.api.replicas)),
        })
    }

    /// Reads the tenant's queued count if the cached one is older than `queue_cache`.
    async fn refresh_queue(&self, tenant: &str) -> Result<(), Refused> {
        let Some(stmts) = &self.stmts else { return Ok(()) };
        let fresh = {
            let st = self.state.lock().expect("admission state");
            st.queues.get(tenant).is_some_and(|v| v.read_at.elapsed() < self.cfg.admission.queue_cache)
        };
        if fresh {
            return Ok(());
        }
        let read_at = Instant::now();
        let (enq, deq) = stmts.depth(tenant).await?;
        let mut st = self.state.lock().expect("admission state");
        // Admissions settled since are in the counter now; keep those still in flight.
        let in_flight = st.queues.get(tenant).map_or(0, |v| v.since);
        st.queues.insert(tenant.to_string(), QueueView { read_at, queued: rules::queued(enq, deq), since: in_flight });
        Ok(())
    }

    fn pass_gates(&self, asks: &[Ask], now: Millis) -> Result<Vec<(String, usize)>, Refused> {
        let mut gates = self.gates.lock().expect("gates");
        let mut probes = Vec::new();
        let cool_down = self.cfg.admission.breaker.cool_down.0;
        for (i, a) in asks.iter().enumerate() {
            if let Some((d, until)) = self.dependencies.held(self.cfg.dependencies_of(&a.job_type), now) {
                drop(gates);
                self.release_probes(&probes, now);
                metrics::counter!(m::DEPENDENCY_HELD, "dependency" => d.clone(), "at" => "api").increment(1);
                return Err(Refused::DependencyOpen { dependency: d, wait_ms: (until - now).max(1) });
            }
            let shared = [format!("pool:{}", a.pool.as_str()), format!("job_type:{}", a.job_type)];
            let own = shared.iter().map(|s| breaker::tenant_scope(s, &a.tenant)).collect::<Vec<_>>();
            for scope in shared.into_iter().chain(own) {
                let Some(g) = gates.get_mut(&scope) else { continue };
                match g.pass(&a.tenant, now, cool_down) {
                    Pass::Allowed => {}
                    Pass::Probe if !probes.iter().any(|(s, _)| *s == scope) => probes.push((scope, i)),
                    Pass::Probe => {}
                    Pass::Refused { retry_at } => {
                        let counts = match g.gate.state() {
                            breaker::GateState::Open { counts, .. } => *counts,
                            _ => Counts::default(),
                        };
                        drop(gates);
                        self.release_probes(&probes, now);
                        let ratio = self.cfg.admission.breaker.failure_ratio;
                        return Err(Refused::CircuitOpen { scope, wait_ms: (retry_at - now).max(1), counts, ratio });
                    }
                }
            }
        }
        Ok(probes)
    }

    fn release_probes(&self, probes: &[(String, usize)], now: Millis) {
        let mut gates = self.gates.lock().expect("gates");
        for (scope, _) in probes {
            if let Some(g) = gates.get_mut(scope) {
                g.gate.probe_sent(None, now);
            }
        }
    }

    /// After the produce: `outcome[i]` is the job id of `asks[i]` when it was accepted
    /// (None: not produced, or a duplicate of an earlier job). Counts the accepted jobs
    /// into their tenants' queues and hands the probes' ids to the breakers.
    pub async fn settle(&self, ticket: Ticket, outcome: &[Option<String>]) {
        let now = now_ms();
        {
            let mut gates = self.gates.lock().expect("gates");
            for (scope, i) in &ticket.probes {
                if let Some(g) = gates.get_mut(scope) {
                    g.gate.probe_sent(outcome.get(*i).cloned().flatten(), now);
                }
            }
        }
        let mut counts: BTreeMap<(&str, Pool), i64> = BTreeMap::new();
        // Per tenant: (reserved, accepted) jobs.
        let mut due: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (a, o) in ticket.asks.iter().zip(outcome.iter().chain(std::iter::repeat(&None))) {
            let d = due.entry(&a.tenant).or_default();
            d.0 += 1;
            if o.is_some() {
                d.1 += 1;
                *counts.entry((&a.tenant, a.pool)).or_default() += 1;
            }
        }
        if let Some(stmts) = &self.stmts {
            let writes = counts.iter().map(|((t, p), n)| stmts.enqueued(t, p.as_str(), *n));
            for r in futures::future::join_all(writes).await {
                if let Err(e) = r {
                    metrics::counter!(m::QUEUE_COUNT_FAILURES).increment(1);
                    tracing::warn!(error = %e, "accepted jobs not counted in their tenant's queue depth (undercount)");
                }
            }
        }
        // Settled jobs are in the counter now (or never will be): no longer in flight.
        let mut st = self.state.lock().expect("admission state");
        for (t, (n, counted)) in due {
            unreserve(&mut st, t, n, counted);
        }
    }
}

/// Takes back `n` reserved jobs of which `counted` were accepted and counted in the
/// store (they count in the cached figure until the next read shows them).
fn unreserve(st: &mut State, tenant: &str, n: u64, counted: u64) {
    if let Some(v) = st.queues.get_mut(tenant) {
        v.since = v.since.saturating_sub(n);
        v.queued += counted;
    }
}

/// Updates the tenant's quota levels after an admission; alerts on crossings. Returns
/// the limits the tenant uses at least `core::refusals::NEAR_SHARE` of.
fn observe_quota(st: &mut State, tenant: &str, max_queued: Option<u64>, now: Millis) -> Vec<Limit> {
    let mut near = Vec::new();
    let (bucket, user) = st.rates.used(tenant, now);
    let queue = match (max_queued, st.queues.get(tenant)) {
        (Some(max), Some(v)) => Some((v.queued + v.since) as f64 / max.max(1) as f64),
        _ => None,
    };
    for (limit, used) in [(Limit::Queue, queue), (Limit::TenantRate, bucket), (Limit::UserRate, user)] {
        let Some(used) = used else { continue };
        if used >= crate::core::refusals::NEAR_SHARE {
            near.push(limit);
        }
        if let Some(c) = st.quota.observe(tenant, limit, used) {
            let level = format!("{}", (c.level * 100.0).round());
            metrics::counter!(m::QUOTA_ALERTS, "limit" => limit.as_str(), "level" => level).increment(1);
            tracing::warn!(
                tenant,
                limit = limit.as_str(),
                used = format!("{:.0} %", used * 100.0),
                "tenant crossed {:.0} % of a limit",
                c.level * 100.0
            );
        }
    }
    for (limit, level, n) in st.quota.tenants_at() {
        let level = format!("{}", (level * 100.0).round());
        metrics::gauge!(m::QUOTA_TENANTS_OVER, "limit" => limit.as_str(), "level" => level).set(n as f64);
    }
    near
}

/// How often an API process writes its refusal counts.
const REFUSALS_EVERY: Duration = Duration::from_secs(5);

/// Writes this process's refusal counts every [`REFUSALS_EVERY`] until `stop` (and once
/// more then).
async fn refusals_loop(adm: std::sync::Weak<Admission>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut stmts = None;
    loop {
        let stopping = tokio::select! {
            _ = stop.changed() => true,
            _ = tokio::time::sleep(REFUSALS_EVERY) => false,
        };
        let Some(adm) = adm.upgrade() else { return };
        let Some(store) = &adm.store else { return };
        if stmts.is_none() {
            match store.refusal_statements().await {
                Ok(s) => stmts = Some(s),
                Err(e) => tracing::warn!(error = %e, "refusal counts: cannot prepare their statements; trying again"),
            }
        }
        if let Some(s) = &stmts {
            adm.write_refusals(s).await;
        }
        if stopping {
            return;
        }
    }
}

/// How often the breakers are fed.
const GATE_INTERVAL: Duration = Duration::from_secs(1);
/// Buckets this long past their end are final (workers flush every second) and cached.
const SETTLE_MS: i64 = 5_000;

/// The window's outcome buckets as last read.
type OutcomeReads = BucketReads<crate::store::OutcomeCell>;

/// Feeds the breakers every second: reads the window's outcome buckets (settled ones
/// once), sums them per pool and job type, opens gates, and asks the store for the
/// probes' verdicts.
async fn gates_loop(adm: std::sync::Weak<Admission>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut reads = None;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(GATE_INTERVAL) => {}
        }
        let Some(adm) = adm.upgrade() else { return };
        let reads = reads.get_or_insert_with(|| adm.outcome_reads());
        if let Err(e) = adm.feed_gates(reads).await {
            tracing::warn!(error = %e, "submission breakers: cannot read outcome counts; keeping their state");
        }
    }
}

impl Admission {
    /// One breaker pass now (a one-shot process such as `fairway submit`).
    pub async fn read_breakers_now(&self) -> Result<(), StoreError> {
        if !self.cfg.admission.breaker.enabled {
            return Ok(());
        }
        self.feed_gates(&mut self.outcome_reads()).await
    }

    fn outcome_reads(&self) -> OutcomeReads {
        BucketReads::new(BUCKET_MS, self.cfg.admission.breaker.window.0, SETTLE_MS)
    }

    async fn feed_gates(&self, reads: &mut OutcomeReads) -> Result<(), StoreError> {
        let (Some(stmts), Some(store)) = (&self.stmts, &self.store) else { return Ok(()) };
        let bc = &self.cfg.admission.breaker;
        let now = now_ms();
        let window = bc.window.0;
        for b in reads.wanted(now) {
            reads.put(b, stmts.outcomes(b).await?, now);
        }
        let since: HashMap<String, Millis> = self
            .gates
            .lock()
            .expect("gates")
            .iter()
            .map(|(k, g)| (k.clone(), g.gate.counting_since().unwrap_or(Millis::MAX)))
            .collect();
        let cells = reads.cells().map(|(bucket, c)| breaker::TenantCell {
            bucket,
            pool: c.pool.as_str(),
            job_type: c.job_type.as_str(),
            tenant: c.tenant.as_str(),
            ok: c.ok,
            failed: c.failed,
            infra: c.infra,
            timeouts: c.timeouts,
        });
        let sums = breaker::window_counts(cells, now, window, bc, |k| since.get(k).copied().unwrap_or(Millis::MIN));
        let probes: Vec<(String, String)> = {
            let mut gates = self.gates.lock().expect("gates");
            // A closed gate whose scope had nothing in the window, and whose count does not
            // start inside it, is a fresh gate's equal: forgotten.
            gates.retain(|scope, g| {
                sums.contains_key(scope) || g.gate.counting_since().is_none_or(|since| since > now - window)
            });
            for (scope, sc) in sums {
                if !sc.may_open(bc) && !gates.contains_key(&scope) {
                    continue;
                }
                let shared = sc.tenant.is_none();
                let new = || ScopedGate { gate: Gate::new(bc.clone()), shared, culprits: Default::default() };
                let g = gates.entry(scope.clone()).or_insert_with(new);
                if sc.may_open(bc) && g.gate.observe(sc.counts, now) {
                    g.culprits = if shared { sc.failing.clone() } else { Default::default() };
                    tracing::warn!(
                        scope,
                        ok = sc.counts.ok,
                        failed = sc.counts.failed,
                        tenants = ?sc.failing,
                        "submission circuit breaker opened: new submissions get 503 for {}",
                        bc.cool_down
                    );
                }
            }
            // Shared gates only: tenants' own would make the label unbounded.
            for (scope, g) in gates.iter().filter(|(_, g)| g.shared) {
                let open = if matches!(g.gate.state(), breaker::GateState::Closed { .. }) { 0.0 } else { 1.0 };
                metrics::gauge!(m::SUBMIT_BREAKER_OPEN, "scope" => scope.clone()).set(open);
            }
            gates.iter().filter_map(|(s, g)| Some((s.clone(), g.gate.probe_job()?.to_string()))).collect()
        };
        for (scope, job_id) in probes {
            let row = store.job(&job_id).await?;
            if let Some(ok) = breaker::probe_outcome(row.as_ref().and_then(|r| r.status.as_deref())) {
                tracing::info!(scope, job_id, ok, "submission breaker probe finished");
                if let Some(g) = self.gates.lock().expect("gates").get_mut(&scope) {
                    g.gate.probe_verdict(ok, now_ms());
                }
            }
        }
        Ok(())
    }
}
