//! Recurring schedules, the management shell shared by `fairway schedules` and the HTTP
//! API: validate a definition (`core::recurring`, the job template against the config
//! and the tenants registry), keep the per-tenant and total bounds, and read and write
//! the rows (`store::schedules`). Firing is the promoter leader's (`worker::schedules`).

use crate::config::Config;
use crate::core::recurring::{ScheduleSpec, SpecError, Timing};
use crate::model::Millis;
use crate::store::{ScheduleRow, ScheduleStatements, Store, StoreError, TenantStatements};
use crate::submit::NewJob;
use serde::Serialize;
use std::sync::Arc;

/// How many upcoming fire times a listing shows.
pub const UPCOMING: usize = 3;

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
    tenants: TenantStatements,
}

impl Schedules {
    pub async fn connect(cfg: Arc<Config>, store: &Store) -> Result<Self, StoreError> {
        Ok(Schedules { cfg, stmts: store.schedule_statements().await?, tenants: store.tenant_statements().await? })
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
        if !self.tenants.list().await?.contains_key(&spec.tenant) {
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
        if !self.stmts.add(&row).await? {
            return Err(ScheduleError::Exists { tenant: spec.tenant, name: spec.name });
        }
        Ok(Schedule { row, spec }.listed())
    }

    /// Refuses an add beyond `schedules.max_per_tenant` or `schedules.max_total` (checked
    /// before the insert, not with it: adds racing each other may pass it by their number).
    async fn check_bounds(&self, tenant: &str) -> Result<(), ScheduleError> {
        let bounds = self.cfg.schedules;
        let own = self.stmts.list(Some(tenant), bounds.max_per_tenant).await?;
        if own.len() >= bounds.max_per_tenant {
            return Err(ScheduleError::TooMany(format!(
                "tenant {tenant:?} has {} schedules, the most a tenant may have (schedules.max_per_tenant); \
                 remove one it no longer needs (`fairway schedules remove`, DELETE /v1/schedules/<name>) or ask \
                 the operator to raise the bound",
                bounds.max_per_tenant
            )));
        }
        if self.stmts.list(None, bounds.max_total).await?.len() >= bounds.max_total {
            return Err(ScheduleError::TooMany(format!(
                "the deployment has {} schedules, the most it keeps (schedules.max_total); remove some first",
                bounds.max_total
            )));
        }
        Ok(())
    }

    /// One schedule.
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Schedule, ScheduleError> {
        let rows = self.stmts.list(Some(tenant), self.cfg.schedules.max_total).await?;
        let row = rows.into_iter().find(|r| r.name == name);
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
        change(&mut s.spec);
        s.spec.tenant = tenant.into();
        s.spec.name = name.into();
        let timing = self.check(&s.spec, &s.row.id, s.row.created_at).await?;
        s.row.next_fire_at = Some(timing.at_or_after(now).ok_or(ScheduleError::NeverFires)?);
        s.row.spec = serde_json::to_string(&s.spec).expect("a schedule serializes");
        s.row.updated_at = now;
        if !self.stmts.replace(&s.row).await? {
            return Err(ScheduleError::NotFound { tenant: tenant.into(), name: name.into() });
        }
        Ok(s.listed())
    }

    /// Pauses (no fires) or resumes a schedule; a resumed schedule goes on from `now`
    /// (fires due while it was paused are not caught up).
    pub async fn pause(&self, tenant: &str, name: &str, paused: bool, now: Millis) -> Result<Listed, ScheduleError> {
        let mut s = self.get(tenant, name).await?;
        if !paused {
            s.row.next_fire_at = s.timing()?.at_or_after(now);
        }
        s.row.paused = paused;
        s.row.updated_at = now;
        if !self.stmts.set_paused(&s.row).await? {
            return Err(ScheduleError::NotFound { tenant: tenant.into(), name: name.into() });
        }
        Ok(s.listed())
    }

    pub async fn remove(&self, tenant: &str, name: &str) -> Result<(), ScheduleError> {
        self.get(tenant, name).await?;
        Ok(self.stmts.remove(tenant, name).await?)
    }

    /// A tenant's schedules, or every one of the deployment.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<Listed>, ScheduleError> {
        let rows = self.stmts.list(tenant, self.cfg.schedules.max_total).await?;
        Ok(rows.into_iter().filter_map(|r| Schedule::of(r).ok()).map(|s| s.listed()).collect())
    }
}
