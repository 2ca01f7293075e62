//! Firing recurring schedules: the promoter's leader (the holder of its lease) reads the
//! due index (`store::due`) every [`PASS_EVERY`]: only what is due by now (and
//! `core::recurring::FIRE_AHEAD_MS` ahead: those fires' jobs are held by their worker
//! until the fire, so they start on time instead of up to a pass late), from the floor
//! below which nothing due is left (`core::due`), at most [`ENTRIES_PER_READ`]. A pass
//! takes on at most [`ENTRIES_PER_PASS`] entries in **tenant turns** (each tenant's
//! oldest before any tenant's second), [`IN_FLIGHT`] at a time; the rest wait for the
//! next pass. So one tenant's thousand schedules due at once delay another tenant's fire
//! by a turn, and a backlog never holds a pass longer than its share. An entry is checked
//! against its schedule's cursor (no definition); a definition, payload included, is read
//! by key only when its schedule fires, and a pass loads at most [`PASS_BYTES`] of
//! definitions and jobs. Each due fire goes through the normal submission path
//! (front-door admission, idempotency, the pool topic), paced at `worker.promoter_rate`
//! fires per second. A fire's job id and idempotency key derive from (schedule id, fire
//! time) (`core::recurring`), so a fire submitted twice (two leaders overlapping for a
//! moment, a leader dying before it moved the cursor) is one job. The cursor
//! (`next_fire_at`) moves by compare-and-set once its fires are in.
//!
//! The same leader, in the same passes, submits the jobs of due debounce windows
//! (`crate::submit::dedupe`), found the same way and read by key: it closes a window by
//! compare-and-set on its revision (a submission that moved it meanwhile wins, and the
//! window is looked at again when its new entry is due), then submits its job under the
//! window's id and frees its slot; a failed submit reopens the window.
//!
//! An index entry that no longer matches its row (moved, paused, closed, removed) is
//! dropped once it is older than `store::due::STALE_AFTER_MS`. Every [`SWEEP_EVERY`] a
//! task of its own (passes never wait for it) sweeps: it moves rows left in the old
//! per-deployment tables (once), counts schedules for the gauges, and writes the index
//! rows of schedules and windows overdue by over a minute again (a writer that failed
//! between its index write and its row write left them unindexed; the first sweep of a
//! leadership takes every row already due, see [`sweep_loop`]); then the next reads
//! start from the beginning again.

use super::relay::{PROMOTER_LEASE, PROMOTER_LEASE_SECS};
use crate::admission::{Admission, Ask};
use crate::config::Config;
use crate::core::due::{tenant_turns, DueFloor, PassLeft};
use crate::core::promotion::Pace;
use crate::core::recurring::{self, Fire, Pass, Timing};
use crate::metrics as m;
use crate::model::Millis;
use crate::now_ms;
use crate::ops::schedules::{self, Schedule, Schedules};
use crate::ops::tenants::LiveTenants;
use crate::store::{DebounceRow, DueEntry, ScheduleCursor, Store};
use crate::submit::dedupe::Windows;
use crate::submit::Submitter;
use futures::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Most fires of one schedule in one pass (catch-up `all` goes on in the next passes).
const FIRES_PER_PASS: usize = 100;

/// How often the leader reads what is due.
const PASS_EVERY: Duration = Duration::from_millis(250);

/// How often the leader renews its lease.
const LEASE_EVERY: Duration = Duration::from_secs(1);

/// Most due index entries (of each kind) one read returns.
const ENTRIES_PER_READ: usize = 5_000;

/// Most entries (of each kind) one pass takes on, in tenant turns.
const ENTRIES_PER_PASS: usize = 1_024;

/// Entries (of each kind) worked on at once. A fire waits on about five store round
/// trips (two of them lightweight transactions) and the producer's linger, ~50-100 ms;
/// 128 at once let the leader fire well over 1,000 schedules a second.
const IN_FLIGHT: usize = 128;

/// Most bytes of definitions and jobs one pass loads (of each kind).
const PASS_BYTES: usize = 8 << 20;

/// How often the leader sweeps (see the module docs).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Tenants the sweep looks at at once.
const SWEEP_IN_FLIGHT: usize = 16;

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
    /// Set by a sweep that wrote index rows (perhaps below the floors).
    reindexed: AtomicBool,
}

/// What a due index entry is after a pass took it on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum After {
    /// Fired or closed (its index row moved on), or dropped as stale.
    Done,
    /// Not matching its row yet (a writer between its index and row writes): read again.
    Waiting(Millis),
    /// Still due (held by the front door or a budget, or an error): tried next pass.
    Due(Millis),
}

/// What a sweep saw: schedules by state, index rows written again (or rows moved).
#[derive(Debug, Default)]
struct Swept {
    active: usize,
    paused: usize,
    reindexed: usize,
}

/// A pass's floors and what it left: see [`core::due`](crate::core::due).
#[derive(Default)]
struct Floors {
    schedules: DueFloor,
    windows: DueFloor,
}

impl Floors {
    fn reset(&mut self) {
        self.schedules.reset();
        self.windows.reset();
    }
}

/// Fires due schedules while this worker holds the promoter's lease, until `shutdown`.
pub async fn fire_loop(
    cfg: Arc<Config>,
    store: Store,
    tenants: LiveTenants,
    worker_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut firing: Option<Arc<Firing>> = None;
    let mut pace = Pace::new(cfg.worker.promoter_rate);
    let mut floors = Floors::default();
    let leading = Arc::new(AtomicBool::new(false));
    let mut renewed: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(PASS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        if renewed.is_none_or(|at| at.elapsed() >= LEASE_EVERY) {
            let held = matches!(store.lease(PROMOTER_LEASE, &worker_id, PROMOTER_LEASE_SECS, now_ms()).await, Ok(true));
            if !held {
                floors.reset();
            }
            leading.store(held, Ordering::SeqCst);
            renewed = Some(tokio::time::Instant::now());
        }
        if !leading.load(Ordering::SeqCst) {
            continue;
        }
        if firing.is_none() {
            match Firing::connect(&cfg, &store, &tenants, &shutdown).await {
                Ok(f) => {
                    let f = Arc::new(f);
                    tokio::spawn(sweep_loop(f.clone(), leading.clone(), shutdown.clone()));
                    firing = Some(f);
                }
                Err(e) => tracing::warn!("cannot fire schedules yet: {e:#}"),
            }
        }
        if let Some(f) = &firing {
            if f.reindexed.swap(false, Ordering::SeqCst) {
                floors.reset();
            }
            tokio::join!(f.pass(&mut pace, &mut floors.schedules), f.close_due_windows(&mut floors.windows));
        }
    }
}

/// The sweep (see the module docs), every [`SWEEP_EVERY`] while this worker leads. The
/// first sweep of each leadership indexes again every row already due, not only those
/// [`OVERDUE_MS`] overdue: a restored backup (its schedules copied before their due index,
/// a fire in between) or a leader that died mid-fire can leave a due row without its
/// index entry, and a new leader should not wait a minute to fire it.
async fn sweep_loop(f: Arc<Firing>, leading: Arc<AtomicBool>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut led = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let leads = leading.load(Ordering::SeqCst);
        if leads {
            f.sweep(if led { OVERDUE_MS } else { 0 }).await;
        }
        led = leads;
    }
}

/// Runs `work` over `items`, at most [`IN_FLIGHT`] at once; the results in completion order.
async fn in_flight<T, F: Future<Output = After>>(items: Vec<T>, work: impl Fn(T) -> F) -> Vec<After> {
    let (mut running, mut out) = (FuturesUnordered::new(), Vec::with_capacity(items.len()));
    for item in items {
        if running.len() >= IN_FLIGHT {
            out.extend(running.next().await);
        }
        running.push(work(item));
    }
    while let Some(after) = running.next().await {
        out.push(after);
    }
    out
}

/// The entries a pass takes on (in tenant turns, at most [`ENTRIES_PER_PASS`]) and what
/// it leaves of its read at `now` for the next pass.
fn take_on(read: crate::store::DueRead, now: Millis) -> (Vec<DueEntry>, PassLeft) {
    let mut turns = tenant_turns(read.entries, |e| &e.tenant);
    let later = turns.split_off(turns.len().min(ENTRIES_PER_PASS));
    let oldest_left = later.iter().map(|e| e.due_at).min();
    (turns, PassLeft { now, oldest_left, read_stopped_at: read.stopped_at })
}

/// Adds what the entries taken on are after the pass to `left`; the oldest still due.
fn left_after(left: &mut PassLeft, afters: &[After]) -> Option<Millis> {
    let mut oldest_due: Option<Millis> = None;
    for a in afters {
        let at = match *a {
            After::Done => continue,
            After::Waiting(at) => at,
            After::Due(at) => {
                oldest_due = Some(oldest_due.map_or(at, |o| o.min(at)));
                at
            }
        };
        left.oldest_left = Some(left.oldest_left.map_or(at, |o| o.min(at)));
    }
    oldest_due
}

/// Takes one unit from `budget`, if any is left.
fn take_one(budget: &AtomicUsize) -> bool {
    budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1)).is_ok()
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
        let reindexed = AtomicBool::new(false);
        Ok(Firing { schedules, windows, tenants, max_open, submitter, admission, reindexed })
    }

    /// One pass: the due schedules' fires, within the pace's and the byte budget.
    async fn pass(&self, pace: &mut Pace, floor: &mut DueFloor) {
        let now = now_ms();
        // Fires due within the look-ahead go now, their jobs due at the fire.
        let until = now + recurring::FIRE_AHEAD_MS;
        let read = match self.schedules.statements().due(until, floor.from(), ENTRIES_PER_READ).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read due schedules");
                return;
            }
        };
        let (entries, mut left) = take_on(read, now);
        let granted = pace.take(entries.len() * FIRES_PER_PASS, now);
        let (budget, bytes) = (AtomicUsize::new(granted), AtomicUsize::new(0));
        let afters = in_flight(entries, |e| self.fire_due(e, now, &budget, &bytes)).await;
        pace.give_back(budget.into_inner().min(granted));
        let oldest_due = left_after(&mut left, &afters).into_iter().chain(left.oldest_left).min();
        floor.passed(left);
        let age = oldest_due.map_or(0.0, |c| (now - c).max(0) as f64 / 1000.0);
        metrics::gauge!(m::SCHEDULE_OLDEST_DUE_SECONDS).set(age);
    }

    /// Checks a due index entry against its schedule's cursor (a stale entry is dropped),
    /// reads the definition by key and submits its due fires, while the budgets last.
    async fn fire_due(&self, e: DueEntry, now: i64, budget: &AtomicUsize, bytes: &AtomicUsize) -> After {
        if budget.load(Ordering::SeqCst) == 0 || bytes.load(Ordering::SeqCst) >= PASS_BYTES {
            return After::Due(e.due_at);
        }
        let stmts = self.schedules.statements();
        let current = match stmts.cursor(&e.tenant, &e.name).await {
            Ok(c) => c.filter(|c| !c.paused && c.next_fire_at == Some(e.due_at)),
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
                return After::Due(e.due_at);
            }
        };
        if current.is_none() {
            return self.not_matching(&e, now, stmts.drop_entry(&e)).await;
        }
        let cursor = e.due_at;
        let s = match self.schedules.get(&e.tenant, &e.name).await {
            Ok(s) if s.row.next_fire_at == Some(cursor) && !s.row.paused => s,
            Ok(_) => return After::Waiting(cursor),
            // Removed since its cursor was read: an entry that no longer matches its row
            // (left due, it held the pass's floor, and every later read, back for good).
            Err(schedules::ScheduleError::NotFound { .. }) => {
                return self.not_matching(&e, now, stmts.drop_entry(&e)).await;
            }
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
                return After::Due(cursor);
            }
        };
        bytes.fetch_add(s.row.spec.len(), Ordering::SeqCst);
        let timing = match s.timing() {
            Ok(t) => t,
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, schedule = %e.name, "schedule not fired: {err}");
                return After::Due(cursor);
            }
        };
        let pass = timing.due_by(cursor, now, now + recurring::FIRE_AHEAD_MS, FIRES_PER_PASS);
        if pass.skipped {
            metrics::counter!(m::SCHEDULE_SKIPS, "policy" => s.spec.catch_up.as_str()).increment(1);
        }
        match self.fire_schedule(&s, &timing, cursor, pass, budget).await {
            Some(next) if next <= now_ms() + recurring::FIRE_AHEAD_MS => After::Due(next),
            _ => After::Done,
        }
    }

    /// An entry not matching its row: dropped (by `drop`) once stale, else read again.
    async fn not_matching(
        &self,
        e: &DueEntry,
        now: Millis,
        drop: impl Future<Output = Result<(), crate::store::StoreError>>,
    ) -> After {
        if !e.stale_at(now) {
            return After::Waiting(e.due_at);
        }
        match drop.await {
            Ok(()) => After::Done,
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, entry = %e.name, "stale due entry not dropped: {err}");
                After::Waiting(e.due_at)
            }
        }
    }

    /// Submits a schedule's fires in order while the budget lasts and each is accepted,
    /// then moves its cursor past what was submitted; the cursor as it now stands (the
    /// old one if it could not be moved).
    async fn fire_schedule(
        &self,
        s: &Schedule,
        timing: &Timing,
        cursor: i64,
        pass: Pass,
        budget: &AtomicUsize,
    ) -> Option<i64> {
        let mut next = pass.cursor;
        for f in &pass.fires {
            if !take_one(budget) {
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
                budget.fetch_add(1, Ordering::SeqCst);
                next = Some(f.at);
                break;
            }
            metrics::histogram!(m::SCHEDULE_FIRE_LAG_SECONDS).record((now - f.at).max(0) as f64 / 1000.0);
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
                return Some(cursor);
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
    async fn close_due_windows(&self, floor: &mut DueFloor) {
        let now = now_ms();
        let read = match self.windows.rows.due(now, floor.from(), ENTRIES_PER_READ).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read due debounce windows");
                return;
            }
        };
        let (entries, mut left) = take_on(read, now);
        let bytes = AtomicUsize::new(0);
        let afters = in_flight(entries, |e| self.close_due(e, now, &bytes)).await;
        left_after(&mut left, &afters);
        floor.passed(left);
    }

    /// Closes the window a due index entry points at if it is still the one due (a stale
    /// entry is dropped), while the byte budget lasts.
    async fn close_due(&self, e: DueEntry, now: Millis, bytes: &AtomicUsize) -> After {
        if bytes.load(Ordering::SeqCst) >= PASS_BYTES {
            return After::Due(e.due_at);
        }
        let rows = &self.windows.rows;
        // The entry's window: the one it names (by id; an entry written before entries
        // carried the id names the window's revision then, and its due time).
        let current = match rows.due_of(&e.tenant, &e.name).await {
            Ok(d) => d.filter(|d| d.window_id == e.rev || (d.rev == e.rev && d.due_at == e.due_at)),
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, error = %err, "cannot read a due debounce window");
                return After::Due(e.due_at);
            }
        };
        let Some(d) = current else {
            return self.not_matching(&e, now, rows.drop_entry(&e)).await;
        };
        if d.due_at > now {
            // Joined since its entry was written: the entry moves to its due time.
            return match rows.move_entry(&e, &d, now).await {
                Ok(()) => After::Done,
                Err(err) => {
                    tracing::warn!(tenant = %e.tenant, error = %err, "cannot move a debounce window's index entry");
                    After::Due(e.due_at)
                }
            };
        }
        match rows.get(&e.tenant, &e.name).await {
            Ok(Some(w)) if w.window_id == d.window_id => {
                bytes.fetch_add(w.job.len(), Ordering::SeqCst);
                self.close_window(w, &e).await
            }
            Ok(_) => After::Waiting(e.due_at),
            Err(err) => {
                tracing::warn!(tenant = %e.tenant, error = %err, "cannot read a due debounce window");
                After::Due(e.due_at)
            }
        }
    }

    /// Closes a due window, submits its job and frees its slot; reopens it if the submit
    /// failed.
    async fn close_window(&self, w: DebounceRow, e: &DueEntry) -> After {
        match self.windows.rows.close(&w, e).await {
            Ok(true) => {}
            // Joined (or closed) since it was read: its entry is read again.
            Ok(false) => return After::Waiting(e.due_at),
            Err(e) => {
                tracing::warn!(tenant = %w.tenant, error = %e, "cannot close a debounce window");
                return After::Due(w.due_at);
            }
        }
        let job = match crate::codec::decode_job(&w.job) {
            Ok(rec) => crate::submit::dedupe::window_job(rec),
            Err(e) => {
                tracing::error!(tenant = %w.tenant, window = %w.window_id, "debounce window's job unreadable, dropped: {e}");
                return After::Done;
            }
        };
        match self.submitter.submit(&job).await {
            Ok(_) => {
                if let Err(e) = self.windows.release(&w).await {
                    tracing::warn!(tenant = %w.tenant, window = %w.window_id, error = %e, "debounce slot not freed");
                }
                After::Done
            }
            Err(e) => {
                tracing::warn!(tenant = %w.tenant, window = %w.window_id, "debounced job not submitted, window reopened: {e}");
                if let Err(e) = self.windows.rows.open(&w, now_ms()).await {
                    tracing::error!(tenant = %w.tenant, window = %w.window_id, error = %e, "debounce window lost");
                }
                After::Due(w.due_at)
            }
        }
    }

    /// The slow sweep (see the module docs).
    /// One sweep: rows due more than `overdue` ms ago get their index entry written again.
    async fn sweep(&self, overdue: i64) {
        if let Err(e) = self.sweep_once(now_ms(), overdue).await {
            tracing::warn!("schedules and debounce sweep not finished: {e:#}");
        }
    }

    async fn sweep_once(&self, now: i64, overdue: i64) -> anyhow::Result<()> {
        let moved = self.schedules.migrate(MIGRATE_PER_SWEEP).await?;
        let moved_windows = self.migrate_windows(now).await?;
        if moved + moved_windows > 0 {
            tracing::info!(
                schedules = moved,
                debounce_windows = moved_windows,
                "moved rows of the old per-deployment tables"
            );
        }
        let tenants: Vec<String> = self.tenants.list().await?.into_keys().collect();
        let counted_before = self.schedules.statements().total().await?;
        let mut seen = Swept { reindexed: moved + moved_windows, ..Swept::default() };
        for chunk in tenants.chunks(SWEEP_IN_FLIGHT) {
            let swept = futures::future::try_join_all(chunk.iter().map(|t| self.sweep_tenant(t, now, overdue))).await?;
            for s in swept {
                seen.active += s.active;
                seen.paused += s.paused;
                seen.reindexed += s.reindexed;
            }
        }
        if seen.reindexed > 0 {
            self.reindexed.store(true, Ordering::SeqCst);
        }
        // The total an add checks (`schedule_totals`) set to what the walk found, when no
        // add or remove counted meanwhile (a new deployment's, a restored one's, or one a
        // lost counter write left off).
        let counted_after = self.schedules.statements().total().await?;
        let found = i64::try_from(seen.active + seen.paused).unwrap_or(i64::MAX);
        if counted_before == counted_after && found != counted_after {
            tracing::info!(counted = counted_after, found, "schedule total corrected");
            self.schedules.statements().count(found - counted_after).await?;
        }
        metrics::gauge!(m::SCHEDULES, "state" => "paused").set(seen.paused as f64);
        metrics::gauge!(m::SCHEDULES, "state" => "active").set(seen.active as f64);
        Ok(())
    }

    /// One tenant's part of the sweep: its schedules counted, its rows due more than
    /// `overdue` ms ago indexed again.
    async fn sweep_tenant(&self, tenant: &str, now: Millis, overdue: i64) -> anyhow::Result<Swept> {
        let mut seen = Swept::default();
        let stmts = self.schedules.statements();
        for c in stmts.cursors(tenant, self.schedules.bounds().max_total).await? {
            if c.paused {
                seen.paused += 1;
                continue;
            }
            seen.active += 1;
            if c.next_fire_at.is_some_and(|at| at <= now - overdue) {
                stmts.reindex(&c, now).await?;
                seen.reindexed += 1;
            }
        }
        for w in self.windows.rows.windows(tenant, crate::core::unique::MAX_OPEN_PER_TENANT_CEILING).await? {
            if w.due_at <= now - overdue {
                self.windows.rows.reindex(&w, now).await?;
                seen.reindexed += 1;
            }
        }
        Ok(seen)
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
