//! The pool classifier's leader (rules: `core::classifier`; tables: `store::classifier`).
//!
//! One worker of the deployment at a time (lease `classifier`) reads, every
//! `classifier.interval`, the window's run-time cells every worker wrote
//! (`worker::admission`; settled buckets are read once), sums them per (job type,
//! tenant) and pool, and asks [`decide`] about each such subject of a configured job
//! type with the runs of the pool it is assigned to now: one tenant's slow runs move
//! that tenant's jobs only. A move is written to `tenant_pool_classes` first (what
//! submitters read), then counted (`fairway_pool_reclassifications_total`), logged and
//! published as a `pool_reclassified` event to the tenant; `fairway_pool_class` counts
//! the tenants of each type per pool. Classes idle at the pass ([`idle`]) are dropped,
//! and no new class is made while `classifier.max_tracked` exist ([`room_for_class`]).

use super::Shared;
use crate::core::classifier::{assigned, decide, idle, room_for_class, window_runs, Class, Subject, RUN_BUCKET_MS};
use crate::core::fleet::BucketReads;
use crate::store::{ClassRow, ClassifierStatements, RunTimeCell, StoreError};
use crate::{metrics as m, now_ms};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Buckets this long past their end are final (workers flush every second).
const SETTLE_MS: i64 = 5_000;

pub async fn classifier_loop(
    sh: Arc<Shared>,
    (store, producer): (crate::store::Store, crate::kafka::Producer),
    mut shutdown: watch::Receiver<bool>,
) {
    let c = &sh.route.cfg.classifier;
    let interval = Duration::from_millis(c.interval.0 as u64);
    let lease_secs = (3 * c.interval.0 / 1000).clamp(15, 600) as i32;
    let mut reads = BucketReads::new(RUN_BUCKET_MS, c.window.0, SETTLE_MS);
    let mut stmts: Option<ClassifierStatements> = None;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match store.lease("classifier", &sh.route.worker_id, lease_secs, now_ms()).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                failed("lease", &e);
                continue;
            }
        }
        if stmts.is_none() {
            match store.classifier_statements().await {
                Ok(s) => stmts = Some(s),
                Err(e) => failed("prepare", &e),
            }
        }
        if let Some(s) = &stmts {
            if let Err(e) = pass(&sh, &producer, s, &mut reads).await {
                failed("pass", &e);
            }
        }
    }
}

fn failed(step: &'static str, e: &StoreError) {
    metrics::counter!(m::CLASSIFIER_PASS_FAILURES, "step" => step).increment(1);
    tracing::warn!(step, error = %e, "pool classifier: pass failed; job types keep their pools");
}

/// One evaluation of every configured job type.
async fn pass(
    sh: &Shared,
    producer: &crate::kafka::Producer,
    stmts: &ClassifierStatements,
    reads: &mut BucketReads<RunTimeCell>,
) -> Result<(), StoreError> {
    let cfg = &sh.route.cfg.classifier;
    let now = now_ms();
    for b in reads.wanted(now) {
        reads.put(b, stmts.runs(b).await?, now);
    }
    let mut classes: HashMap<Subject, Class> =
        stmts.classes().await?.into_iter().map(|r| (r.subject, r.class)).collect();
    let cells = reads.cells().map(|(b, c)| (b, &c.subject, c.pool, &c.cell));
    let window = window_runs(cells, now, cfg.window.0);
    let active: BTreeSet<&Subject> = window.keys().map(|(s, _)| s).collect();
    for subject in idle(&classes, |s| active.contains(s), now) {
        stmts.drop_class(&subject).await?;
        classes.remove(&subject);
    }
    for subject in active {
        let Some(jt) = sh.route.cfg.job_types.get(&subject.job_type) else { continue };
        let class = classes.get(subject);
        if class.is_none() && !room_for_class(classes.len(), cfg) {
            continue;
        }
        let Some(runs) = window.get(&(subject.clone(), assigned(jt.pool, class))) else { continue };
        let Some(mv) = decide(cfg, &sh.route.ranges, jt.pool, class, runs, now) else { continue };
        let reason = mv.describe(subject, cfg);
        stmts
            .put_class(&ClassRow { subject: subject.clone(), class: mv.class.clone(), reason: reason.clone() })
            .await?;
        let (name, from, to) = (subject.job_type.as_str(), mv.from.as_str(), mv.to.as_str());
        metrics::counter!(m::POOL_RECLASSIFICATIONS, "job_type" => name.to_string(), "from" => from, "to" => to)
            .increment(1);
        tracing::warn!(job_type = name, tenant = subject.tenant, from, to, "{reason}");
        let sticky = mv.class.sticky_until;
        crate::watch::events::pool_reclassified(producer, &sh.route.cfg, &sh.route.worker_id, subject, reason, sticky);
        classes.insert(subject.clone(), mv.class);
    }
    let mut tenants: HashMap<(&str, crate::model::Pool), f64> = HashMap::new();
    for (subject, class) in classes.iter().filter(|(s, _)| sh.route.cfg.job_types.contains_key(&s.job_type)) {
        *tenants.entry((subject.job_type.as_str(), class.pool)).or_default() += 1.0;
    }
    for name in sh.route.cfg.job_types.keys() {
        for pool in crate::model::Pool::ALL {
            let n = tenants.get(&(name.as_str(), pool)).copied().unwrap_or(0.0);
            metrics::gauge!(m::POOL_CLASS, "job_type" => name.clone(), "pool" => pool.as_str()).set(n);
        }
    }
    Ok(())
}
