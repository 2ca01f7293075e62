//! Firing recurring schedules: the promoter's leader (the holder of its lease) reads the
//! due index (`store::due`) once a second: only the schedules due by now, oldest first,
//! at most [`ENTRIES_PER_PASS`]. An entry is checked against its schedule's cursor (no
//! definition); a definition, payload included, is read by key only when its schedule
//! fires, and a pass loads at most [`PASS_BYTES`] of definitions and jobs (the rest wait
//! for the next pass). Each due fire goes through the normal submission path (front-door
//! admission, idempotency, the pool topic), paced at `worker.promoter_rate` fires per
//! second. A fire's job id and idempotency key derive from (schedule id, fire time)
//! (`core::recurring`), so a fire submitted twice (two leaders overlapping for a moment,
//! a leader dying before it moved the cursor) is one job. The cursor (`next_fire_at`)
//! moves by compare-and-set once its fires are in.
//!
//! The same leader submits the jobs of due debounce windows (`crate::submit::dedupe`),
//! found the same way and read by key one at a time: it closes a window by
//! compare-and-set on its revision (a submission that moved it meanwhile wins, and the
//! window is looked at again when its new entry is due), then submits its job under the
//! window's id and frees its slot; a failed submit reopens the window.
//!
//! An index entry that no longer matches its row (moved, paused, closed, removed) is
//! dropped once it is older than `store::due::STALE_AFTER_MS`. Every
//! [`SWEEP_EVERY`] the leader also sweeps: it moves rows left in the old per-deployment
//! tables (once), counts schedules for the gauges, and writes the index rows of
//! schedules and windows overdue by over a minute again (a writer that failed between
//! its index write and its row write left them unindexed).

use super::relay::{PROMOTER_LEASE, PROMOTER_LEASE_SECS};
use crate::admission::{Admission, Ask};
use crate::config::Config;
use crate::core::promotion::Pace;
use crate::core::recurring::{self, Fire, Pass, Timing};
use crate::metrics as m;
use crate::now_ms;
use crate::ops::schedules::{self, Schedule, Schedules};
use crate::ops::tenants::LiveTenants;
use crate::store::{DebounceRow, DueEntry, ScheduleCursor, Store};
use crate::submit::dedupe::Windows;
use crate::submit::Submitter;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Most fires of one schedule in one pass (catch-up `all` goes on in the next passes).
const FIRES_PER_PASS: usize = 100;

/// Most due index entries (of each kind) one pass reads.
const ENTRIES_PER_PASS: usize = 1_000;

/// Most bytes of definitions and jobs one pass loads (of each kind).
const PASS_BYTES: usize = 8 << 20;

/// How often the leader sweeps (see the module docs).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A row due this long ago and still there gets its index row written again.
const OVERDUE_MS: i64 = 60_000;

/// Old rows moved per sweep (of each kind).
const MIGRATE_PER_SWEEP: usize = 1_000;

/// What firing needs besides the store: schedules, debounce windows, the tenants
/// registry (the sweep), a submitter, the front door.
struct Firing {
    schedules: Schedules,
    windows: Windows,
    tenants: crate::store::TenantStatements,
    /// `debounce.max_open_per_tenant`.
    max_open: usize,
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
    let mut swept: Option<tokio::time::Instant> = None;
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
            if swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
                f.sweep().await;
                swept = Some(tokio::time::Instant::now());
            }
            f.pass(&mut pace).await;
            f.close_due_windows().await;
        }
    }
}

impl Firing {
    async fn connect(
        cfg: &Arc<Config>,
        store: &Store,
        live: &LiveTenants,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Firing, super::WorkerError> {
        let schedules = Schedules::connect(cfg.clone(), store).await?;
        let windows = Windows::connect(store).await?;
        let tenants = store.tenant_statements().await?;
        let submitter = Submitter::new(cfg.clone(), Some(store.clone()))?.with_tenants(live.clone());
        let admission = Arc::new(Admission::connect(cfg.clone(), store, Some(live.clone())).await?);
        admission.start_breakers(shutdown.clone());
        let max_open = cfg.debounce.max_open_per_tenant;
        Ok(Firing { schedules, windows, tenants, max_open, submitter, admission })
    }

    /// One pass: the due schedules' fires, within the pace's and the byte budget.
    async fn pass(&self, pace: &mut Pace) {
        let now = now_ms();
        let due = match self.schedules.statements().due(now, ENTRIES_PER_PASS).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read due schedules");
                return;
            }
        };
        let mut budget = pace.take(due.len() * FIRES_PER_PASS, now);
        let granted = budget;
        let mut bytes = 0;
        // The oldest fire still due after the pass (held by the front door, or beyond a budget).
        let mut oldest_left: Option<i64> = None;
        for e in due {
            let left = if budget == 0 || bytes >= PASS_BYTES {
                Some(e.due_at)
            } else {
                self.fire_due(&e, now, &mut budget, &mut bytes).await
            };
            if let Some(c) = left.filter(|c| *c <= now) {
                oldest_left = Some(oldest_left.map_or(c, |o| o.min(c)));
            }
        }
        pace.give_back(budget.min(granted));
        let age = oldest_left.map_or(0.0, |c| (now - c) as f64 / 1000.0);
        metrics::gauge!(m::SCHEDULE_OLDEST_DUE_SECONDS).set(age);
    }

    /// Checks a due index entry against its schedule's cursor (a stale entry is dropped),
    /// reads the definition by key and submits its due fires; the new cursor (the old
    /// one if it was not fired, None if there was nothing to fire).
    async fn fire_due(&self, e: &DueEntry, now: i64, budget: &mut usize, bytes: &mut usize) -> Option<i64> {
        let stmts = self.schedules.statements();
        let current = match stmts.cursor(&e.tenant, &e.name).await {
            Ok(c) => c.filter(|c| !c.paused && c.next_fire_at == Some(e.due_at)),
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
                return Some(e.due_at);
            }
        };
        if current.is_none() {
            if e.stale_at(now) {
                if let Err(err) = stmts.drop_entry(e).await {
                    tracing::warn!(tenant = %e.tenant, schedule = %e.name, "stale due entry not dropped: {err}");
                }
            }
            return None;
        }
        let cursor = e.due_at;
        let loaded = self.schedules.get(&e.tenant, &e.name).await.map_err(|e| e.to_string());
        let s = match loaded {
            Ok(s) if s.row.next_fire_at == Some(cursor) && !s.row.paused => s,
            Ok(_) => return None,
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
                return Some(cursor);
            }
        };
        *bytes += s.row.spec.len();
        let timing = match s.timing() {
            Ok(t) => t,
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
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
            let moved = ScheduleCursor {
                tenant: s.row.tenant.clone(),
                name: s.row.name.clone(),
                paused: false,
                next_fire_at: next,
            };
            if let Err(e) = self.schedules.statements().advance(&moved, cursor, now_ms()).await {
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
        let now = now_ms();
        let due = match self.windows.rows.due(now, ENTRIES_PER_PASS).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read due debounce windows");
                return;
            }
        };
        let mut bytes = 0;
        for e in due {
            if bytes >= PASS_BYTES {
                break;
            }
            if let Some(w) = self.due_window(&e, now).await {
                bytes += w.job.len();
                self.close_window(w).await;
            }
        }
    }

    /// The window a due index entry points at, read by key, if it is still the one due
    /// (a stale entry is dropped).
    async fn due_window(&self, e: &DueEntry, now: i64) -> Option<DebounceRow> {
        let rows = &self.windows.rows;
        let current = match rows.due_of(&e.tenant, &e.name).await {
            Ok(d) => d.filter(|d| d.due_at == e.due_at && d.rev == e.rev),
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, error = %err, "cannot read a due debounce window");
                return None;
            }
        };
        if current.is_none() {
            if e.stale_at(now) {
                if let Err(err) = rows.drop_entry(e).await {
                    tracing::warn!(tenant = %e.tenant, error = %err, "stale due entry not dropped");
                }
            }
            return None;
        }
        match rows.get(&e.tenant, &e.name).await {
            Ok(Some(w)) if w.rev == e.rev => Some(w),
            Ok(_) => None,
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, error = %err, "cannot read a due debounce window");
                None
            }
        }
    }

    /// Closes a due window, submits its job and frees its slot; reopens it if the submit
    /// failed.
    async fn close_window(&self, w: DebounceRow) {
        match self.windows.rows.close(&w).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(tenant = %w.tenant, error = %e, "cannot close a debounce window");
                return;
            }
        }
        let job = match crate::codec::decode_job(&w.job) {
            Ok(rec) => crate::submit::dedupe::window_job(rec),
            Err(e) => {
                tracing::error!(tenant = %w.tenant, window = %w.window_id, "debounce window's job unreadable, dropped: {e}");
                return;
            }
        };
        match self.submitter.submit(&job).await {
            Ok(_) => {
                if let Err(e) = self.windows.release(&w).await {
                    tracing::warn!(tenant = %w.tenant, window = %w.window_id, error = %e, "debounce slot not freed");
                }
            }
            Err(e) => {
                tracing::warn!(tenant = %w.tenant, window = %w.window_id, "debounced job not submitted, window reopened: {e}");
                if let Err(e) = self.windows.rows.open(&w, now_ms()).await {
                    tracing::error!(tenant = %w.tenant, window = %w.window_id, error = %e, "debounce window lost");
                }
            }
        }
    }

    /// The slow sweep (see the module docs).
    async fn sweep(&self) {
        if let Err(e) = self.sweep_once(now_ms()).await {
            tracing::warn!("schedules and debounce sweep not finished: {e:#}");
        }
    }

    async fn sweep_once(&self, now: i64) -> anyhow::Result<()> {
        let moved = self.schedules.migrate(MIGRATE_PER_SWEEP).await?;
        let moved_windows = self.migrate_windows(now).await?;
        if moved + moved_windows > 0 {
            tracing::info!(
                schedules = moved,
                debounce_windows = moved_windows,
                "moved rows of the old per-deployment tables"
            );
        }
        let max = self.schedules.bounds().max_total;
        let (mut active, mut paused) = (0, 0);
        for t in self.tenants.list().await?.keys() {
            for c in self.schedules.statements().cursors(t, max).await? {
                if c.paused {
                    paused += 1;
                    continue;
                }
                active += 1;
                if c.next_fire_at.is_some_and(|at| at < now - OVERDUE_MS) {
                    self.schedules.statements().reindex(&c, now).await?;
                }
            }
            for w in self.windows.rows.windows(t, crate::core::unique::MAX_OPEN_PER_TENANT_CEILING).await? {
                if w.due_at < now - OVERDUE_MS {
                    self.windows.rows.reindex(&w, now).await?;
                }
            }
        }
        metrics::gauge!(m::SCHEDULES, "state" => "paused").set(paused as f64);
        metrics::gauge!(m::SCHEDULES, "state" => "active").set(active as f64);
        Ok(())
    }

    /// Moves windows left in the old per-deployment table to their tenants' partitions
    /// (each claims a slot, or holds none past its tenant's bound), then deletes them.
    async fn migrate_windows(&self, now: i64) -> anyhow::Result<usize> {
        let rows = &self.windows.rows;
        let old = rows.old_rows(MIGRATE_PER_SWEEP).await?;
        for mut w in old.iter().cloned() {
            if rows.get(&w.tenant, &w.key).await?.is_none() {
                let max = self.max_open;
                match self.windows.slots.claim_free(&w.tenant, max, &w.key, now).await? {
                    crate::store::Claimed::Held(s) => (w.slot, w.slot_at) = (s.slot, s.at),
                    _ => {
                        tracing::warn!(tenant = %w.tenant, "moved debounce window holds no slot (tenant at its bound)")
                    }
                }
                rows.open(&w, now).await?;
            }
            rows.old_remove(&w.tenant, &w.key).await?;
        }
        Ok(old.len())
    }
}
