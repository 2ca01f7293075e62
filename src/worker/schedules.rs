//! Firing recurring schedules: the promoter's leader (the holder of its lease) reads the
//! deployment's schedule cursors once a second (no definitions: a definition, payload
//! included, is read by key only when its schedule is due) and submits each due fire
//! through the normal submission path (front-door admission, idempotency, the pool
//! topic), paced at `worker.promoter_rate` fires per second. A fire's job id and
//! idempotency key derive from (schedule id, fire time) (`core::recurring`), so a fire
//! submitted twice (two leaders overlapping for a moment, a leader dying before it moved
//! the cursor) is one job. The cursor (`next_fire_at`) moves by compare-and-set once its
//! fires are in.
//!
//! The same leader submits the jobs of due debounce windows (`crate::submit::dedupe`),
//! reading each window's job by key, one at a time: it closes a window by compare-and-set
//! on its revision (a submission that moved it meanwhile wins, and the window is looked
//! at again next pass), then submits its job under the window's id; a failed submit
//! reopens the window.

use super::relay::{PROMOTER_LEASE, PROMOTER_LEASE_SECS};
use crate::admission::{Admission, Ask};
use crate::config::Config;
use crate::core::promotion::Pace;
use crate::core::recurring::{self, Fire, Pass, Timing};
use crate::metrics as m;
use crate::now_ms;
use crate::ops::schedules::{self, Schedule, Schedules};
use crate::ops::tenants::LiveTenants;
use crate::store::Store;
use crate::submit::Submitter;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Most fires of one schedule in one pass (catch-up `all` goes on in the next passes).
const FIRES_PER_PASS: usize = 100;

/// Most due debounce windows closed in one pass.
const DEBOUNCES_PER_PASS: usize = 1_000;

/// What firing needs besides the store: schedules, debounce windows, a submitter, the
/// front door.
struct Firing {
    schedules: Schedules,
    debounces: crate::store::DebounceStatements,
    submitter: Submitter,
    admission: Arc<Admission>,
}

/// Fires due schedules while this worker holds the promoter's lease, until `shutdown`.
pub async fn fire_loop(
    cfg: Arc<Config>,
    store: Store,
    tenants: LiveTenants,
    worker_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut firing: Option<Firing> = None;
    let mut pace = Pace::new(cfg.worker.promoter_rate);
    let mut tick = tokio::time::interval(Duration::from_millis(1_000));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        if !matches!(store.lease(PROMOTER_LEASE, &worker_id, PROMOTER_LEASE_SECS, now_ms()).await, Ok(true)) {
            continue;
        }
        if firing.is_none() {
            match Firing::connect(&cfg, &store, &tenants, &shutdown).await {
                Ok(f) => firing = Some(f),
                Err(e) => tracing::warn!("cannot fire schedules yet: {e:#}"),
            }
        }
        if let Some(f) = &firing {
            f.pass(&mut pace).await;
            f.close_due_windows().await;
        }
    }
}

impl Firing {
    async fn connect(
        cfg: &Arc<Config>,
        store: &Store,
        tenants: &LiveTenants,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Firing, super::WorkerError> {
        let schedules = Schedules::connect(cfg.clone(), store).await?;
        let debounces = store.debounce_statements().await?;
        let submitter = Submitter::new(cfg.clone(), Some(store.clone()))?.with_tenants(tenants.clone());
        let admission = Arc::new(Admission::connect(cfg.clone(), store, Some(tenants.clone())).await?);
        admission.start_breakers(shutdown.clone());
        Ok(Firing { schedules, debounces, submitter, admission })
    }

    /// One pass: every active schedule's due fires, within the pace's budget.
    async fn pass(&self, pace: &mut Pace) {
        let max = self.schedules.bounds().max_total;
        let rows = match self.schedules.statements().cursors(max + 1).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read schedules");
                return;
            }
        };
        if rows.len() > max {
            tracing::warn!(
                "the deployment has more than schedules.max_total = {max} schedules (the bound was lowered, or adds \
                 raced it): only the first {max} fire; remove schedules or raise the bound"
            );
        }
        let paused = rows.iter().filter(|r| r.paused).count();
        metrics::gauge!(m::SCHEDULES, "state" => "paused").set(paused as f64);
        metrics::gauge!(m::SCHEDULES, "state" => "active").set((rows.len() - paused) as f64);
        let now = now_ms();
        let due: Vec<_> = rows
            .into_iter()
            .take(max)
            .filter(|c| !c.paused)
            .filter_map(|c| Some((c.next_fire_at.filter(|at| *at <= now)?, c)))
            .collect();
        let mut budget = pace.take(due.len() * FIRES_PER_PASS, now);
        let granted = budget;
        // The oldest fire still due after the pass (held by the front door, or beyond the pace).
        let mut oldest_left: Option<i64> = None;
        for (cursor, c) in due {
            let left = if budget == 0 { Some(cursor) } else { self.fire_due(&c, cursor, now, &mut budget).await };
            if let Some(c) = left.filter(|c| *c <= now) {
                oldest_left = Some(oldest_left.map_or(c, |o| o.min(c)));
            }
        }
        pace.give_back(budget.min(granted));
        let age = oldest_left.map_or(0.0, |c| (now - c) as f64 / 1000.0);
        metrics::gauge!(m::SCHEDULE_OLDEST_DUE_SECONDS).set(age);
    }

    /// Reads a due schedule's definition by key and submits its due fires; the new
    /// cursor (the old one if it was not fired).
    async fn fire_due(
        &self,
        c: &crate::store::ScheduleCursor,
        cursor: i64,
        now: i64,
        budget: &mut usize,
    ) -> Option<i64> {
        let loaded = self.schedules.get(&c.tenant, &c.name).await.map_err(|e| e.to_string());
        let s = match loaded {
            Ok(s) if s.row.next_fire_at == Some(cursor) && !s.row.paused => s,
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(tenant = %c.tenant, schedule = %c.name, "schedule not fired: {e}");
                return Some(cursor);
            }
        };
        let timing = match s.timing() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(tenant = %c.tenant, schedule = %c.name, "schedule not fired: {e}");
                return Some(cursor);
            }
        };
        let pass = timing.due(cursor, now, FIRES_PER_PASS);
        if pass.skipped {
            metrics::counter!(m::SCHEDULE_SKIPS, "policy" => s.spec.catch_up.as_str()).increment(1);
        }
        self.fire_schedule(&s, &timing, cursor, pass, budget).await
    }

    /// Submits a schedule's fires in order while the budget lasts and each is accepted,
    /// then moves its cursor past what was submitted; the new cursor.
    async fn fire_schedule(
        &self,
        s: &Schedule,
        timing: &Timing,
        cursor: i64,
        pass: Pass,
        budget: &mut usize,
    ) -> Option<i64> {
        let mut next = pass.cursor;
        for f in &pass.fires {
            if *budget == 0 {
                next = Some(f.at);
                break;
            }
            let now = now_ms();
            let outcome = match self.fire(s, timing, *f).await {
                Ok(()) if recurring::is_late(f.at, now) => "caught_up",
                Ok(()) => "on_time",
                Err(refused) => refused,
            };
            metrics::counter!(m::SCHEDULE_FIRES, "outcome" => outcome).increment(1);
            if !matches!(outcome, "on_time" | "caught_up") {
                next = Some(f.at);
                break;
            }
            metrics::histogram!(m::SCHEDULE_FIRE_LAG_SECONDS).record((now - f.at).max(0) as f64 / 1000.0);
            *budget -= 1;
        }
        if next != Some(cursor) {
            if let Err(e) = self.schedules.statements().advance(&s.row.tenant, &s.row.name, cursor, next).await {
                tracing::warn!(tenant = %s.row.tenant, schedule = %s.row.name, error = %e, "schedule cursor not moved");
            }
        }
        next
    }

    /// Submits one fire's job; else why not (`held` by the front door, or `failed`:
    /// refused by validation or not submitted), tried again next pass.
    async fn fire(&self, s: &Schedule, timing: &Timing, f: Fire) -> Result<(), &'static str> {
        let mut job = schedules::template(&s.spec);
        job.execute_at = Some(f.run_at);
        job.job_id = Some(timing.job_id(f.at));
        job.idempotency_key = Some(timing.fire_key(f.at));
        let (tenant, name) = (&s.row.tenant, &s.row.name);
        self.submitter.refresh_classes().await;
        let pool = match self.submitter.validate(&job, job.payload_bytes().len()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%tenant, schedule = %name, fire_at = f.at, "schedule fire refused: {e}");
                return Err("failed");
            }
        };
        let ask = Ask { tenant: tenant.clone(), user_key: job.user_key.clone(), pool, job_type: job.job_type.clone() };
        let ticket = match self.admission.admit(vec![ask]).await {
            Ok(t) => t,
            Err(r) => {
                tracing::debug!(%tenant, schedule = %name, fire_at = f.at, "schedule fire held by admission: {r:?}");
                return Err("held");
            }
        };
        let submitted = self.submitter.submit(&job).await;
        let accepted = submitted.as_ref().ok().filter(|s| !s.duplicate).map(|s| s.job_id.clone());
        self.admission.settle(ticket, &[accepted]).await;
        match submitted {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(%tenant, schedule = %name, fire_at = f.at, "schedule fire not submitted: {e}");
                Err("failed")
            }
        }
    }

    /// Submits the jobs of the debounce windows due now (see the module docs).
    async fn close_due_windows(&self) {
        let due = match self.debounces.due(now_ms(), DEBOUNCES_PER_PASS).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read debounce windows");
                return;
            }
        };
        for d in due {
            let w = match self.debounces.get(&d.tenant, &d.key).await {
                Ok(Some(w)) if w.rev == d.rev => w,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(tenant = %d.tenant, error = %e, "cannot read a due debounce window");
                    continue;
                }
            };
            match self.debounces.close(&w.tenant, &w.key, &w.rev).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(tenant = %w.tenant, error = %e, "cannot close a debounce window");
                    continue;
                }
            }
            let job = match crate::codec::decode_job(&w.job) {
                Ok(rec) => crate::submit::dedupe::window_job(rec),
                Err(e) => {
                    tracing::error!(tenant = %w.tenant, window = %w.window_id, "debounce window's job unreadable, dropped: {e}");
                    continue;
                }
            };
            if let Err(e) = self.submitter.submit(&job).await {
                tracing::warn!(tenant = %w.tenant, window = %w.window_id, "debounced job not submitted, window reopened: {e}");
                if let Err(e) = self.debounces.open(&w).await {
                    tracing::error!(tenant = %w.tenant, window = %w.window_id, error = %e, "debounce window lost");
                }
            }
        }
    }
}
