//! Recurring schedules, the management shell shared by `fairway schedules` and the HTTP
//! API: validate a definition (`core::recurring`, the job template against the config
//! and the tenants registry), keep the per-tenant and total bounds, and read and write
//! the rows (`store::schedules`). Firing is the promoter leader's (`worker::schedules`).

use crate::config::Config;
use crate::core::recurring::{ScheduleSpec, SpecError, Timing};
use crate::model::Millis;
use crate::store::{
    contended, contention_pause, Claimed, ScheduleRow, ScheduleStatements, Slot, SlotKind, Slots, Store, StoreError,
    TenantStatements, LWT_TRIES,
};
use crate::submit::NewJob;
use serde::Serialize;
use std::sync::Arc;

/// How many upcoming fire times a listing shows.
pub const UPCOMING: usize = 3;

/// A slot claimed this long ago whose schedule does not exist is an add that died
/// between its claim and its insert (or a remove between its delete and its release):
/// freed when the tenant is at its bound.
const ORPHAN_SLOT_MS: Millis = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(transparent)]
    Invalid(#[from] SpecError),
    /// The job template does not fit the config or the registry: the field, and the
    /// message names the fix.
    #[error("schedule field `{field}`: {message}")]
    Template { field: &'static str, message: String },
    #[error("tenant {tenant:?} already has a schedule {name:?}; change it with `set` (PUT) or remove it first")]
    Exists { tenant: String, name: String },
    #[error(
        "tenant {tenant:?} has no schedule {name:?}; `fairway schedules list --tenant {tenant}` shows its schedules"
    )]
    NotFound { tenant: String, name: String },
    #[error("{0}")]
    TooMany(String),
    #[error(
        "schedule field `payload`: {bytes} bytes, over schedules.max_payload_bytes = {max}; pass larger inputs by \
         reference (a key or URL the job reads)"
    )]
    PayloadTooLarge { bytes: usize, max: usize },
    #[error("the schedule never fires: its window (start_at/end_at) holds no fire time after now")]
    NeverFires,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A schedule as listed: its definition, state and next fire times.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    #[serde(flatten)]
    pub spec: ScheduleSpec,
    pub id: String,
    pub paused: bool,
    /// The next fire times (epoch ms), the first one possibly already due.
    pub next_fires: Vec<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A stored schedule with its parsed definition.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub row: ScheduleRow,
    pub spec: ScheduleSpec,
}

impl Schedule {
    /// The row's definition parsed (a row no longer valid, e.g. after a job type was
    /// removed from the config, still parses: only its fires fail).
    pub fn of(row: ScheduleRow) -> Result<Schedule, SpecError> {
        let spec: ScheduleSpec = serde_json::from_str(&row.spec)
            .map_err(|e| SpecError { field: "spec", message: format!("stored definition unreadable: {e}") })?;
        Ok(Schedule { row, spec })
    }

    pub fn timing(&self) -> Result<Timing, SpecError> {
        self.spec.timing(&self.row.id, self.row.created_at)
    }

    pub fn listed(&self) -> Listed {
        let next = if self.row.paused {
            Vec::new()
        } else {
            self.timing().map(|t| t.upcoming(self.row.next_fire_at, UPCOMING)).unwrap_or_default()
        };
        Listed {
            spec: self.spec.clone(),
            id: self.row.id.clone(),
            paused: self.row.paused,
            next_fires: next,
            created_at: self.row.created_at,
            updated_at: self.row.updated_at,
        }
    }
}

/// The job a fire of `spec` submits (without its time and identity).
pub fn template(spec: &ScheduleSpec) -> NewJob {
    NewJob {
        tenant: spec.tenant.clone(),
        job_type: spec.job_type.clone(),
        payload: crate::submit::Payload::json(&spec.payload),
        priority: spec.priority,
        pool: spec.pool,
        flow_key: spec.flow_key.clone(),
        exact_schedule: true,
        ..Default::default()
    }
}

/// Managing one deployment's schedules.
#[derive(Clone)]
pub struct Schedules {
    cfg: Arc<Config>,
    stmts: ScheduleStatements,
    slots: Slots,
    tenants: TenantStatements,
    /// Store calls made by this instance's adds, changes and removes ([`Schedules::store_calls`]).
    calls: Arc<std::sync::atomic::AtomicU64>,
}

impl Schedules {
    pub async fn connect(cfg: Arc<Config>, store: &Store) -> Result<Self, StoreError> {
        Ok(Schedules {
            cfg,
            stmts: store.schedule_statements().await?,
            slots: store.slots(SlotKind::Schedule).await?,
            tenants: store.tenant_statements().await?,
            calls: Default::default(),
        })
    }

    /// Store calls (each a bounded number of statements: a keyed read or write, one
    /// partition's read of at most `schedules.max_per_tenant` rows, a slot claim) made so
    /// far by adds, changes and removes: what one of them costs, whatever the number of
    /// tenants or schedules in the deployment.
    pub fn store_calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn read(&self) {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn statements(&self) -> &ScheduleStatements {
        &self.stmts
    }

    /// The deployment's bounds (`[schedules]`).
    pub fn bounds(&self) -> crate::core::recurring::SchedulesConfig {
        self.cfg.schedules
    }

    /// Checks a definition whole: its timing, its job template against the config, its
    /// tenant against the registry.
    async fn check(&self, spec: &ScheduleSpec, id: &str, created_at: Millis) -> Result<Timing, ScheduleError> {
        let timing = spec.timing(id, created_at)?;
        let (bytes, max) = (spec.payload.to_string().len(), self.cfg.schedules.max_payload_bytes);
        if bytes > max {
            return Err(ScheduleError::PayloadTooLarge { bytes, max });
        }
        let job = template(spec);
        crate::submit::validate_job(&self.cfg, &job, job.payload_bytes().len()).map_err(|e| {
            use crate::submit::SubmitError as E;
            let field = match &e {
                E::UnknownJobType(..) | E::JobTypeNotAllowed { .. } => "job_type",
                E::PayloadTooLarge { .. } => "payload",
                _ => "job template",
            };
            ScheduleError::Template { field, message: e.to_string() }
        })?;
        self.read();
        if !self.tenants.exists(&spec.tenant).await? {
            let t = &spec.tenant;
            let message = format!("tenant {t:?} is not registered; add it with `fairway tenants add {t}`");
            return Err(ScheduleError::Template { field: "tenant", message });
        }
        Ok(timing)
    }

    /// Adds a schedule (refused if the tenant has one of that name, or is at its bound).
    pub async fn add(&self, spec: ScheduleSpec, now: Millis) -> Result<Listed, ScheduleError> {
        let id = uuid::Uuid::new_v4().to_string();
        let timing = self.check(&spec, &id, now).await?;
        self.check_bounds(&spec.tenant).await?;
        let next = timing.at_or_after(now).ok_or(ScheduleError::NeverFires)?;
        let row = ScheduleRow {
            tenant: spec.tenant.clone(),
            name: spec.name.clone(),
            id,
            spec: serde_json::to_string(&spec).expect("a schedule serializes"),
            paused: false,
            next_fire_at: Some(next),
            created_at: now,
            updated_at: now,
        };
        let slot = self.claim_slot(&spec.tenant, &spec.name, now).await?;
        // Counted before the insert (a refused count takes itself back).
        let counted = self.count_one().await;
        let counted_ok = counted.is_ok();
        let added = match counted {
            Ok(()) => self.insert(&row).await,
            Err(e) => Err(e),
        };
        if !matches!(added, Ok(true)) {
            self.read();
            self.slots.release(&spec.tenant, &slot).await?;
            if counted_ok {
                self.uncount().await;
            }
        }
        if !added? {
            return Err(ScheduleError::Exists { tenant: spec.tenant, name: spec.name });
        }
        Ok(Schedule { row, spec }.listed())
    }

    /// Counts one more schedule in the deployment's total (`schedule_totals`) and reads
    /// the total back: above `schedules.max_total`, the count is taken back and the add
    /// refused. Racing adds each see their own count and every one before it, so the
    /// total never passes the bound (they may all be refused near it: try again).
    async fn count_one(&self) -> Result<(), ScheduleError> {
        let max = self.cfg.schedules.max_total;
        self.read();
        self.stmts.count(1).await?;
        self.read();
        let total = match self.stmts.total().await {
            Ok(n) => n,
            Err(e) => {
                self.uncount().await;
                return Err(e.into());
            }
        };
        if total > max as i64 {
            self.uncount().await;
            return Err(total_full(max));
        }
        Ok(())
    }

    /// Takes back one count of [`Schedules::count_one`] (a failure is logged: the
    /// leader's sweep corrects the total within a minute).
    async fn uncount(&self) {
        self.read();
        if let Err(e) = self.stmts.count(-1).await {
            tracing::warn!(error = %e, "schedule total not decremented; the next sweep corrects it");
        }
    }

    /// Refuses an add with the tenant's schedules already at `schedules.max_per_tenant` (a
    /// quick check of its own partition; the slot claim is what holds the per-tenant
    /// bound under racing adds), or with the deployment's total at `schedules.max_total`
    /// (one read of `schedule_totals`; [`Schedules::count_one`] holds it under races).
    async fn check_bounds(&self, tenant: &str) -> Result<(), ScheduleError> {
        let bounds = self.cfg.schedules;
        self.read();
        if self.stmts.names(tenant, bounds.max_per_tenant).await?.len() >= bounds.max_per_tenant {
            return Err(tenant_full(tenant, bounds.max_per_tenant));
        }
        self.read();
        if self.stmts.total().await? >= bounds.max_total as i64 {
            return Err(total_full(bounds.max_total));
        }
        Ok(())
    }

    /// Claims one of the tenant's `max_per_tenant` slots for `name` claimed at `at`
    /// (`store::slots`); orphaned slots are freed once the tenant looks full.
    async fn claim_slot(&self, tenant: &str, name: &str, at: Millis) -> Result<Slot, ScheduleError> {
        let max = self.cfg.schedules.max_per_tenant;
        let mut orphans_freed = false;
        loop {
            self.read();
            match self.slots.claim_free(tenant, max, name, at).await? {
                Claimed::Held(s) => return Ok(s),
                Claimed::Full(taken) => {
                    if orphans_freed || self.free_orphans(tenant, &taken, crate::now_ms()).await? == 0 {
                        return Err(tenant_full(tenant, max));
                    }
                    orphans_freed = true;
                }
                Claimed::Contended => {
                    return Err(ScheduleError::TooMany(format!(
                        "tenant {tenant:?}: too many schedule adds at once to claim a slot; try again in a moment"
                    )))
                }
            }
        }
    }

    /// Inserts a new schedule's row unless its name is taken; true if this row is the one
    /// stored (read back when the answer was lost or said no).
    async fn insert(&self, row: &ScheduleRow) -> Result<bool, ScheduleError> {
        let mut lost = None;
        for _ in 0..LWT_TRIES {
            self.calls.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            match self.stmts.add(row).await {
                Ok(true) => return Ok(true),
                Ok(false) => lost = None,
                Err(e) => lost = Some(e),
            }
            if lost.is_some() {
                contention_pause().await;
            }
            match self.stmts.get(&row.tenant, &row.name).await? {
                Some(stored) => return Ok(stored.id == row.id),
                None if lost.is_none() => return Ok(false),
                None => {}
            }
        }
        Err(lost.unwrap_or_else(|| contended("add schedule")).into())
    }

    /// Frees the slots of `taken` claimed over [`ORPHAN_SLOT_MS`] ago that no schedule
    /// holds (no schedule of that name created at the claim); how many.
    async fn free_orphans(&self, tenant: &str, taken: &[Slot], now: Millis) -> Result<usize, ScheduleError> {
        let names = self.stmts.names(tenant, crate::core::recurring::MAX_PER_TENANT_CEILING).await?;
        let held = |s: &Slot| names.iter().any(|(n, at)| *n == s.holder && *at == s.at);
        let mut freed = 0;
        for s in taken.iter().filter(|s| s.at < now - ORPHAN_SLOT_MS && !held(s)) {
            freed += usize::from(self.slots.release(tenant, s).await?);
        }
        Ok(freed)
    }

    /// One schedule.
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Schedule, ScheduleError> {
        let row = self.stmts.get(tenant, name).await?;
        let row = row.ok_or_else(|| ScheduleError::NotFound { tenant: tenant.into(), name: name.into() })?;
        Ok(Schedule::of(row)?)
    }

    /// Changes a schedule's definition (`change` edits it; the name and tenant stay);
    /// its next fire is computed afresh from `now`.
    pub async fn set(
        &self,
        tenant: &str,
        name: &str,
        change: impl FnOnce(&mut ScheduleSpec),
        now: Millis,
    ) -> Result<Listed, ScheduleError> {
        let mut s = self.get(tenant, name).await?;
        let old = s.row.due_at();
        change(&mut s.spec);
        s.spec.tenant = tenant.into();
        s.spec.name = name.into();
        let timing = self.check(&s.spec, &s.row.id, s.row.created_at).await?;
        s.row.next_fire_at = Some(timing.at_or_after(now).ok_or(ScheduleError::NeverFires)?);
        s.row.spec = serde_json::to_string(&s.spec).expect("a schedule serializes");
        s.row.updated_at = now;
        if !self.stmts.replace(&s.row, old).await? {
            return Err(ScheduleError::NotFound { tenant: tenant.into(), name: name.into() });
        }
        Ok(s.listed())
    }

    /// Pauses (no fires) or resumes a schedule; a resumed schedule goes on from `now`
    /// (fires due while it was paused are not caught up).
    pub async fn pause(&self, tenant: &str, name: &str, paused: bool, now: Millis) -> Result<Listed, ScheduleError> {
        let mut s = self.get(tenant, name).await?;
        let old = s.row.due_at();
        if !paused {
            s.row.next_fire_at = s.timing()?.at_or_after(now);
        }
        s.row.paused = paused;
        s.row.updated_at = now;
        if !self.stmts.set_paused(&s.row, old).await? {
            return Err(ScheduleError::NotFound { tenant: tenant.into(), name: name.into() });
        }
        Ok(s.listed())
    }

    /// Removes a schedule and frees its slot (the one claimed with it: same name, claimed
    /// at its `created_at`; not a racing add's of the same name).
    pub async fn remove(&self, tenant: &str, name: &str) -> Result<(), ScheduleError> {
        self.read();
        let row = self.get(tenant, name).await?.row;
        self.read();
        self.stmts.remove(&row).await?;
        self.uncount().await;
        self.read();
        let slots = self.slots.taken(tenant, self.cfg.schedules.max_per_tenant).await?;
        for s in slots.iter().filter(|s| s.holder == name && s.at == row.created_at) {
            self.slots.release(tenant, s).await?;
        }
        Ok(())
    }

    /// A tenant's schedules, or every registered tenant's (at most `schedules.max_total`),
    /// each tenant's read from its own partition.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<Listed>, ScheduleError> {
        let max = self.cfg.schedules.max_total;
        let tenants: Vec<String> = match tenant {
            Some(t) => vec![t.to_string()],
            None => self.tenants.list().await?.into_keys().collect(),
        };
        let mut rows = Vec::new();
        for t in tenants {
            rows.extend(self.stmts.list(&t, max - rows.len()).await?);
            if rows.len() >= max {
                break;
            }
        }
        Ok(rows.into_iter().filter_map(|r| Schedule::of(r).ok()).map(|s| s.listed()).collect())
    }

    /// Moves the rows of the old per-deployment table (`schedules`) to their tenants'
    /// partitions with their index rows, a slot held by each (claimed at its
    /// `created_at`, unless it holds one: schedules from before slots existed), then
    /// deletes the old rows; idempotent (a row already moved is not overwritten). How
    /// many rows were moved; a schedule beyond its tenant's bound is moved and said so.
    pub async fn migrate(&self, limit: usize) -> Result<usize, ScheduleError> {
        let max = self.cfg.schedules.max_per_tenant;
        let old = self.stmts.old_rows(limit).await?;
        for row in &old {
            self.stmts.add(row).await?;
            let taken = self.slots.taken(&row.tenant, max).await?;
            if !taken.iter().any(|s| s.holder == row.name && s.at == row.created_at) {
                if let Err(e) = self.claim_slot(&row.tenant, &row.name, row.created_at).await {
                    tracing::warn!(tenant = %row.tenant, schedule = %row.name, "moved schedule holds no slot: {e}");
                }
            }
            self.stmts.old_remove(&row.tenant, &row.name).await?;
        }
        Ok(old.len())
    }
}

fn total_full(max: usize) -> ScheduleError {
    ScheduleError::TooMany(format!(
        "the deployment has {max} schedules, the most it keeps (schedules.max_total); remove some first"
    ))
}

fn tenant_full(tenant: &str, max: usize) -> ScheduleError {
    ScheduleError::TooMany(format!(
        "tenant {tenant:?} has {max} schedules, the most a tenant may have (schedules.max_per_tenant); remove one it \
         no longer needs (`fairway schedules remove`, DELETE /v1/schedules/<name>) or ask the operator to raise the \
         bound"
    ))
}
