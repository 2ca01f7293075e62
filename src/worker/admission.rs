//! What a worker tells the front door (`crate::admission`), one task per pool, every
//! second:
//! - **dequeued**: original submissions (scheduled ones too) that this pool dispatched, per tenant,
//!   added to the `dequeued` counters of `queue_depth` (the front door adds `enqueued`;
//!   queued = enqueued - dequeued);
//! - **outcomes**: successes and failed attempts (infrastructure ones apart) per job
//!   type and tenant in 10 s buckets
//!   (`core::admission::breaker::OwnOutcomes`, cumulative cells per worker in
//!   `tenant_outcome_cells`), which the API processes read every second for their submission
//!   circuit breakers;
//! - **run times** (when the classifier is on): runs, pool-range violations and a
//!   run-time histogram per (job type, tenant) in 10 s buckets (`core::classifier::RunCell`,
//!   cumulative cells per worker in `tenant_run_times`, at most `classifier.max_tracked`
//!   subjects per bucket), which the pool classifier's leader reads (`worker::classifier`).

use super::Shared;
use crate::core::admission::breaker::{OwnOutcomes, BUCKET_MS};
use crate::core::classifier::{RunCell, Subject, Violation, RUN_BUCKET_MS};
use crate::core::fleet::OwnCells;
use crate::core::refusals::{code as refusal_code, Class, Mark, OwnRefusals};
use crate::core::tenants::TenantSet;
use crate::model::{FailureClass, JobSubmitted, Millis};
use crate::store::{AdmissionStatements, ClassifierStatements, OutcomeCell, RefusalStatements, RunTimeCell};
use crate::{metrics as m, now_ms};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often counts are written.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Outcome cells expire after this (the breakers read the last minute).
const OUTCOME_TTL_SECS: i32 = 600;
/// Outcome buckets kept in memory (until written).
const KEEP_MS: i64 = 120_000;

/// Counts a pool accumulates between passes.
#[derive(Debug)]
pub struct Tally {
    dequeued: HashMap<String, i64>,
    outcomes: OwnOutcomes,
    runs: OwnCells<RunCell>,
    /// Jobs held for a tenant's breakers, quarantines or the recycling cap, per hour
    /// (`core::refusals`, `Mark::Held`): the tenant's page and limit alerts.
    held: OwnRefusals,
    /// The registry as last read: a tenant's tier picks the budget its held counts take
    /// (`core::refusals::Class`; without it every tenant counts as a free account).
    tenants: Option<watch::Receiver<Arc<TenantSet>>>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            dequeued: HashMap::new(),
            outcomes: OwnOutcomes::default(),
            runs: OwnCells::new(RUN_BUCKET_MS),
            held: OwnRefusals::default(),
            tenants: None,
        }
    }
}

impl Tally {
    /// A tally that reads tenants' tiers from the live registry.
    pub fn with_tenants(tenants: watch::Receiver<Arc<TenantSet>>) -> Tally {
        Tally { tenants: Some(tenants), ..Tally::default() }
    }

    /// A job was dispatched: an original submission (scheduled ones included, which the
    /// front door counts from submission) leaves its queue.
    pub fn dispatched(&mut self, job: &JobSubmitted) {
        // A hand-off copy was counted out when it was first dispatched.
        let original = job.first_dispatch() && job.generation == 0;
        if original {
            *self.dequeued.entry(job.tenant.clone()).or_default() += 1;
        }
    }

    /// An attempt of `tenant`'s job of `job_type` ended (`failure` None: succeeded).
    pub fn outcome(&mut self, job_type: &str, tenant: &str, failure: Option<FailureClass>, now: Millis) {
        self.outcomes.record(job_type, tenant, failure, now);
    }

    /// The worker held a job of `tenant` for `what` (`breaker/<job type>`,
    /// `quarantine/<job type>`, `recycling_cap`, `max_concurrency`, `rate_per_sec`) in
    /// `pool`.
    pub fn held(&mut self, tenant: &str, what: &str, pool: &str, now: Millis) {
        let tier = self.tenants.as_ref().and_then(|t| t.borrow().tenants.get(tenant).map(|r| r.tier));
        if self.held.record(tenant, Class::of(tier), &refusal_code(Mark::Held, what, pool), 1, now).is_err() {
            metrics::counter!(m::REFUSALS_UNTRACKED).increment(1);
        }
    }

    /// A run of `subject` took `run_ms` (and violated this pool's range or not); false
    /// when the bucket already counts `max_tracked` other subjects (the run is not counted).
    pub fn ran(
        &mut self,
        (job_type, tenant): (&str, &str),
        run: (Millis, Option<Violation>),
        now: Millis,
        max_tracked: usize,
    ) -> bool {
        self.runs.update_joined((job_type, tenant), now, Some(max_tracked), |c| c.record(run.0, run.1))
    }
}

/// The statements a pass writes with (prepared on the first pass that can).
#[derive(Default)]
struct Statements {
    counts: Option<AdmissionStatements>,
    runs: Option<ClassifierStatements>,
    held: Option<RefusalStatements>,
}

pub async fn report_loop(sh: Arc<Shared>, store: crate::store::Store, mut shutdown: watch::Receiver<bool>) {
    let mut stmts = Statements::default();
    loop {
        let stopping = tokio::select! {
            _ = shutdown.changed() => true,
            _ = tokio::time::sleep(INTERVAL) => false,
        };
        if let Err(e) = stmts.prepare(&sh, &store).await {
            tracing::warn!(pool = sh.route.pool.as_str(), error = %e, "front-door counts: cannot prepare statements (run `fairway init`)")
        }
        if let Some(s) = &stmts.counts {
            pass(&sh, s).await;
        }
        if let Some(s) = &stmts.runs {
            write_runs(&sh, s).await;
        }
        if let Some(s) = &stmts.held {
            write_held(&sh, s).await;
        }
        if stopping || *shutdown.borrow() {
            return;
        }
    }
}

impl Statements {
    async fn prepare(&mut self, sh: &Shared, store: &crate::store::Store) -> Result<(), crate::store::StoreError> {
        if self.counts.is_none() {
            self.counts = Some(store.admission_statements().await?);
        }
        if self.runs.is_none() && sh.route.cfg.classifier.enabled {
            self.runs = Some(store.classifier_statements().await?);
        }
        if self.held.is_none() {
            self.held = Some(store.refusal_statements().await?);
        }
        Ok(())
    }
}

/// Writes the changed held-job counts (cumulative per worker and pool: idempotent).
async fn write_held(sh: &Shared, stmts: &RefusalStatements) {
    let pending = {
        let mut t = sh.route.admission_tally.lock().expect("admission tally");
        t.held.evict(now_ms());
        t.held.pending()
    };
    if pending.is_empty() {
        return;
    }
    let process = format!("{}/{}", sh.route.worker_id, sh.route.pool.as_str());
    if let Err(e) = stmts.put_cells(&process, &pending).await {
        tracing::warn!(pool = sh.route.pool.as_str(), error = %e, "held-job counts not written (the tenants' pages and alerts); retried next pass");
        return;
    }
    sh.route.admission_tally.lock().expect("admission tally").held.written(&pending);
}

/// Writes the changed run-time cells (TTL: the classifier's window and a margin).
/// Cells not written within `KEEP_MS` are dropped (the window then counts fewer runs).
async fn write_runs(sh: &Shared, stmts: &ClassifierStatements) {
    let window = sh.route.cfg.classifier.window.0;
    let pending = {
        let mut t = sh.route.admission_tally.lock().expect("admission tally");
        t.runs.evict(now_ms(), KEEP_MS);
        t.runs.pending()
    };
    let mut by_bucket: HashMap<Millis, Vec<RunTimeCell>> = HashMap::new();
    for (bucket, key, cell) in &pending {
        let Some(subject) = Subject::from_key(key) else { continue };
        let (worker, cell) = (sh.route.worker_id.clone(), cell.clone());
        by_bucket.entry(*bucket).or_default().push(RunTimeCell { subject, pool: sh.route.pool, worker, cell });
    }
    let ttl = ((window + KEEP_MS) / 1000).clamp(60, i32::MAX as i64) as i32;
    let mut all_written = true;
    for (bucket, cells) in by_bucket {
        if let Err(e) = stmts.put_runs(bucket, &cells, ttl).await {
            all_written = false;
            metrics::counter!(m::RUN_TIME_WRITE_FAILURES, "pool" => sh.route.pool.as_str()).increment(1);
            tracing::warn!(pool = sh.route.pool.as_str(), error = %e, "run times not written for the pool classifier; retried next pass");
        }
    }
    if all_written {
        sh.route.admission_tally.lock().expect("admission tally").runs.written(&pending);
    }
}

/// Writes the dispatch counts taken from the tally with `write`; a count whose write
/// fails goes back into `tally`, to be written with the next pass. Counters are not
/// idempotent: a write that failed yet applied (a timeout) counts those jobs out twice,
/// and the queue reads low for a while; never retrying would read it high for good
/// (false 429s).
async fn count_out<F, Fut, E>(tally: &std::sync::Mutex<Tally>, pool: &str, dequeued: HashMap<String, i64>, mut write: F)
where
    F: FnMut(String, i64) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    for (tenant, n) in dequeued {
        if let Err(e) = write(tenant.clone(), n).await {
            metrics::counter!(m::QUEUE_COUNT_FAILURES).increment(1);
            tracing::warn!(pool, tenant, n, error = %e, "dispatched jobs not yet counted out of their tenant's queue depth; retried next pass");
            *tally.lock().expect("admission tally").dequeued.entry(tenant).or_default() += n;
        }
    }
}

async fn pass(sh: &Shared, stmts: &AdmissionStatements) {
    let (dequeued, pending) = {
        let mut t = sh.route.admission_tally.lock().expect("admission tally");
        t.outcomes.evict(now_ms(), KEEP_MS);
        (std::mem::take(&mut t.dequeued), t.outcomes.pending())
    };
    let pool = sh.route.pool.as_str();
    count_out(
        &sh.route.admission_tally,
        pool,
        dequeued,
        |tenant, n| async move { stmts.dequeued(&tenant, pool, n).await },
    )
    .await;
    let mut by_bucket: HashMap<i64, Vec<OutcomeCell>> = HashMap::new();
    for (bucket, key, (ok, failed, infra, timeouts, dependency)) in &pending {
        let (job_type, tenant) = OwnOutcomes::key_parts(key);
        let cell = OutcomeCell {
            pool: pool.to_string(),
            job_type: job_type.to_string(),
            tenant: tenant.to_string(),
            worker: sh.route.worker_id.clone(),
            ok: *ok,
            failed: *failed,
            infra: *infra,
            timeouts: *timeouts,
            dependency: *dependency,
        };
        by_bucket.entry(*bucket).or_default().push(cell);
    }
    let mut all_written = true;
    for (bucket, cells) in by_bucket {
        debug_assert_eq!(bucket.rem_euclid(BUCKET_MS), 0);
        if let Err(e) = stmts.put_outcomes(bucket, &cells, OUTCOME_TTL_SECS).await {
            all_written = false;
            metrics::counter!(m::OUTCOME_COUNT_FAILURES, "pool" => pool).increment(1);
            tracing::warn!(pool, error = %e, "attempt outcomes not written for the submission breakers; retried next pass");
        }
    }
    if all_written {
        sh.route.admission_tally.lock().expect("admission tally").outcomes.written(&pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn original(tenant: &str) -> JobSubmitted {
        JobSubmitted::original("j".into(), tenant.into(), "echo".into(), Vec::new(), 0)
    }

    /// A `dequeued` counter write that fails is written again with the next pass, with
    /// what was dispatched since (before, the count was dropped: the tenant's queue read
    /// high for good, and its submissions were refused with false 429s).
    #[tokio::test]
    async fn a_failed_dequeued_write_is_retried_with_the_next_pass() {
        let tally = Mutex::new(Tally::default());
        for t in ["acme", "acme", "globex"] {
            tally.lock().unwrap().dispatched(&original(t));
        }
        let take = || std::mem::take(&mut tally.lock().unwrap().dequeued);
        let written = Mutex::new(Vec::new());
        let write = |fail: &'static str| {
            let written = &written;
            move |tenant: String, n: i64| async move {
                if tenant == fail {
                    return Err("store unreachable");
                }
                written.lock().unwrap().push((tenant, n));
                Ok(())
            }
        };
        count_out(&tally, "short", take(), write("acme")).await;
        assert_eq!(*written.lock().unwrap(), vec![("globex".to_string(), 1)]);
        tally.lock().unwrap().dispatched(&original("acme"));
        count_out(&tally, "short", take(), write("nobody")).await;
        assert_eq!(written.lock().unwrap().last(), Some(&("acme".to_string(), 3)), "2 retried + 1 new");
        assert!(take().is_empty());
    }
}
