//! The pool classifier's submit side, shared by the HTTP API, `fairway submit` and
//! `fairway replay` (rules: `core::classifier`; tables: `store::classifier`; the
//! measuring and deciding: `worker::classifier`).
//!
//! Workers measure run times and the classifier's leader records the pool of each
//! reclassified (job type, tenant) in `tenant_pool_classes`. A submitting process reads
//! that table (one partition, one row per reclassified subject, at most
//! `classifier.max_tracked`) when its copy is older than `classifier.cache`, so a
//! decision reaches every submitter within the leader's `interval` plus `cache`. A
//! failed read keeps the copy it has (the configured pools at first), logs it and counts
//! `fairway_pool_class_read_failures_total`: a submission is never refused for it.

use crate::config::Config;
use crate::core::classifier::{self as rules, Class, Subject};
use crate::metrics as m;
use crate::model::Pool;
use crate::store::{ClassifierStatements, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The classes as last read, cheap to share.
pub struct PoolClasses {
    cfg: Arc<Config>,
    store: Store,
    stmts: tokio::sync::OnceCell<ClassifierStatements>,
    /// When last read (None: never), and what.
    seen: Mutex<(Option<Instant>, HashMap<Subject, Class>)>,
    /// Held while reading, so concurrent submissions read once.
    reading: tokio::sync::Mutex<()>,
}

impl PoolClasses {
    pub fn new(cfg: Arc<Config>, store: Store) -> Self {
        PoolClasses {
            cfg,
            store,
            stmts: Default::default(),
            seen: Mutex::new((None, HashMap::new())),
            reading: Default::default(),
        }
    }

    fn fresh(&self) -> bool {
        let cache = Duration::from_millis(self.cfg.classifier.cache.0.max(0) as u64);
        self.seen.lock().expect("pool classes").0.is_some_and(|at| at.elapsed() < cache)
    }

    /// Reads the classes unless the copy is younger than `classifier.cache`.
    pub async fn refresh(&self) {
        if self.fresh() {
            return;
        }
        let _reading = self.reading.lock().await;
        if self.fresh() {
            return;
        }
        let read = async {
            let stmts = self.stmts.get_or_try_init(|| self.store.classifier_statements()).await?;
            stmts.classes().await
        };
        let read = read.await;
        let mut seen = self.seen.lock().expect("pool classes");
        seen.0 = Some(Instant::now());
        match read {
            Ok(rows) => seen.1 = rows.into_iter().map(|r| (r.subject, r.class)).collect(),
            Err(e) => {
                metrics::counter!(m::POOL_CLASS_READ_FAILURES).increment(1);
                tracing::warn!(error = %e, "pool classes not read; new jobs go to the pools last read (configured pools if none)");
            }
        }
    }

    fn with_class<T>(&self, job_type: &str, tenant: &str, f: impl FnOnce(Option<&Class>) -> T) -> T {
        f(self.seen.lock().expect("pool classes").1.get(&Subject::new(job_type, tenant)))
    }

    /// The pool of `tenant`'s new job (`core::classifier::route`).
    pub fn route(&self, explicit: Option<Pool>, job_type: &str, tenant: &str, declared: Pool) -> Pool {
        self.with_class(job_type, tenant, |c| rules::route(explicit, declared, c))
    }

    /// The pool of `tenant`'s replayed job (`core::classifier::replay_pool`).
    pub fn replay_pool(&self, recorded: Option<Pool>, job_type: &str, tenant: &str, declared: Pool) -> Pool {
        self.with_class(job_type, tenant, |c| rules::replay_pool(recorded, declared, c))
    }
}
