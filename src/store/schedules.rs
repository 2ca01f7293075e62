//! Recurring schedules' rows (`crate::ops::schedules`; rules in `core::recurring`): one row
//! per (tenant, name) in the deployment's partition of `schedules` (keyed by the topic
//! prefix). The definition is its JSON; `next_fire_at` is the first fire not yet
//! submitted, moved only by compare-and-set (LWT), so two promoters that overlap for a
//! moment never move it back.
//!
//! Each schedule also holds one of its tenant's `schedules.max_per_tenant` slots
//! (`schedule_slots`), claimed by `IF NOT EXISTS` before the schedule is inserted: the
//! per-tenant bound holds under any number of racing adds on any number of API
//! processes. The leader reads cursors only ([`ScheduleStatements::cursors`]); a
//! definition is read by key when it fires or is asked for.

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// `next_fire_at` of a schedule that never fires again (no null: an LWT compares it).
const NEVER: Millis = i64::MAX;

/// One schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    pub tenant: String,
    pub name: String,
    /// Fixed at `add` (kept by `set`): seeds the fires' job ids, so a schedule removed
    /// and added again under its name does not collapse into the old one's jobs.
    pub id: String,
    /// The definition (`core::recurring::ScheduleSpec`) as JSON.
    pub spec: String,
    pub paused: bool,
    /// The first fire not yet submitted; None: never again.
    pub next_fire_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

type Row = (String, String, Option<String>, Option<String>, Option<bool>, Option<i64>, Option<i64>, Option<i64>);

const COLUMNS: &str = "tenant, name, id, spec, paused, next_fire_at, created_at, updated_at";

fn to_row((tenant, name, id, spec, paused, next, created_at, updated_at): Row) -> ScheduleRow {
    ScheduleRow {
        tenant,
        name,
        id: id.unwrap_or_default(),
        spec: spec.unwrap_or_default(),
        paused: paused.unwrap_or(false),
        next_fire_at: next.filter(|n| *n != NEVER),
        created_at: created_at.unwrap_or(0),
        updated_at: updated_at.unwrap_or(0),
    }
}

/// Statements of the schedules table ([`Store::schedule_statements`]).
#[derive(Clone)]
pub struct ScheduleStatements {
    session: Arc<Session>,
    scope: String,
    add: PreparedStatement,
    replace: PreparedStatement,
    set_paused: PreparedStatement,
    advance: PreparedStatement,
    remove: PreparedStatement,
    list: PreparedStatement,
    list_tenant: PreparedStatement,
    get: PreparedStatement,
    cursors: PreparedStatement,
    names: PreparedStatement,
    slots: PreparedStatement,
    claim: PreparedStatement,
    release: PreparedStatement,
}

/// A schedule's firing state without its definition: what the leader reads every pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleCursor {
    pub tenant: String,
    pub name: String,
    pub paused: bool,
    pub next_fire_at: Option<Millis>,
}

/// A claimed slot of a tenant's schedules.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSlot {
    pub slot: i32,
    /// The schedule that claimed it.
    pub name: String,
    /// When it was claimed.
    pub at: Millis,
}

impl Store {
    pub async fn schedule_statements(&self) -> Result<ScheduleStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        let key = "WHERE scope = ? AND tenant = ? AND name = ?";
        let mut list =
            prep(format!("SELECT {COLUMNS} FROM {ks}.schedules WHERE scope = ?"), "prepare list schedules", false)
                .await?;
        list.set_page_size(1000);
        let mut cursors = prep(
            format!("SELECT tenant, name, paused, next_fire_at, created_at FROM {ks}.schedules WHERE scope = ?"),
            "prepare schedule cursors",
            false,
        )
        .await?;
        cursors.set_page_size(1000);
        let slot_key = "WHERE scope = ? AND tenant = ? AND slot";
        Ok(ScheduleStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            add: prep(
                format!(
                    "INSERT INTO {ks}.schedules (scope, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                "prepare add schedule",
                true,
            )
            .await?,
            replace: prep(
                format!("UPDATE {ks}.schedules SET spec = ?, next_fire_at = ?, updated_at = ? {key} IF id = ?"),
                "prepare replace schedule",
                true,
            )
            .await?,
            set_paused: prep(
                format!("UPDATE {ks}.schedules SET paused = ?, next_fire_at = ?, updated_at = ? {key} IF id = ?"),
                "prepare pause schedule",
                true,
            )
            .await?,
            advance: prep(
                format!("UPDATE {ks}.schedules SET next_fire_at = ? {key} IF next_fire_at = ?"),
                "prepare advance schedule",
                true,
            )
            .await?,
            remove: prep(format!("DELETE FROM {ks}.schedules {key}"), "prepare remove schedule", false).await?,
            list,
            list_tenant: prep(
                format!("SELECT {COLUMNS} FROM {ks}.schedules WHERE scope = ? AND tenant = ?"),
                "prepare list tenant schedules",
                false,
            )
            .await?,
            get: prep(format!("SELECT {COLUMNS} FROM {ks}.schedules {key}"), "prepare get schedule", false).await?,
            cursors,
            names: prep(
                format!("SELECT name, created_at FROM {ks}.schedules WHERE scope = ? AND tenant = ?"),
                "prepare schedule names",
                false,
            )
            .await?,
            slots: prep(
                format!("SELECT slot, name, at FROM {ks}.schedule_slots {slot_key} IN ?"),
                "prepare schedule slots",
                false,
            )
            .await?,
            claim: prep(
                format!("INSERT INTO {ks}.schedule_slots (scope, tenant, slot, name, at) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"),
                "prepare claim schedule slot",
                true,
            )
            .await?,
            release: prep(
                format!("DELETE FROM {ks}.schedule_slots {slot_key} = ? IF name = ? AND at = ?"),
                "prepare release schedule slot",
                true,
            )
            .await?,
        })
    }
}

impl ScheduleStatements {
    /// Adds a schedule unless the tenant has one of that name; true if added.
    pub async fn add(&self, r: &ScheduleRow) -> Result<bool, StoreError> {
        let v = (
            self.scope.as_str(),
            r.tenant.as_str(),
            r.name.as_str(),
            r.id.as_str(),
            r.spec.as_str(),
            r.paused,
            r.next_fire_at.unwrap_or(NEVER),
            r.created_at,
            r.updated_at,
        );
        applied(self.session.execute_unpaged(&self.add, v).await.map_err(q("add schedule"))?)
    }

    /// Replaces the definition and cursor of the schedule `r.id`; false if it is gone
    /// (removed, or removed and added again).
    pub async fn replace(&self, r: &ScheduleRow) -> Result<bool, StoreError> {
        let next = r.next_fire_at.unwrap_or(NEVER);
        let v = (
            r.spec.as_str(),
            next,
            r.updated_at,
            self.scope.as_str(),
            r.tenant.as_str(),
            r.name.as_str(),
            r.id.as_str(),
        );
        applied(self.session.execute_unpaged(&self.replace, v).await.map_err(q("replace schedule"))?)
    }

    /// Pauses or resumes the schedule `r.id` with its cursor; false if it is gone.
    pub async fn set_paused(&self, r: &ScheduleRow) -> Result<bool, StoreError> {
        let next = r.next_fire_at.unwrap_or(NEVER);
        let v = (r.paused, next, r.updated_at, self.scope.as_str(), r.tenant.as_str(), r.name.as_str(), r.id.as_str());
        applied(self.session.execute_unpaged(&self.set_paused, v).await.map_err(q("pause schedule"))?)
    }

    /// Moves the cursor from `from` to `to`; false if it is no longer at `from`.
    pub async fn advance(
        &self,
        tenant: &str,
        name: &str,
        from: Millis,
        to: Option<Millis>,
    ) -> Result<bool, StoreError> {
        let v = (to.unwrap_or(NEVER), self.scope.as_str(), tenant, name, from);
        applied(self.session.execute_unpaged(&self.advance, v).await.map_err(q("advance schedule"))?)
    }

    pub async fn remove(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), tenant, name);
        self.session.execute_unpaged(&self.remove, v).await.map_err(q("remove schedule"))?;
        Ok(())
    }

    /// The deployment's schedules, or one tenant's (paged; at most `limit` rows).
    pub async fn list(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<ScheduleRow>, StoreError> {
        use futures::TryStreamExt;
        let scope = self.scope.as_str();
        let pager = match tenant {
            Some(t) => self.session.execute_iter(self.list_tenant.clone(), (scope, t)).await,
            None => self.session.execute_iter(self.list.clone(), (scope,)).await,
        }
        .map_err(q("list schedules"))?;
        let mut rows = pager.rows_stream::<Row>().map_err(q("list schedules"))?;
        let mut out = Vec::new();
        while let Some(r) = rows.try_next().await.map_err(q("list schedules"))? {
            // A cursor moved just as the row was removed leaves a row without a spec.
            if r.3.is_some() {
                out.push(to_row(r));
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// One schedule, read by key.
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Option<ScheduleRow>, StoreError> {
        let v = (self.scope.as_str(), tenant, name);
        let res = self.session.execute_unpaged(&self.get, v).await.map_err(q("get schedule"))?;
        let rows = res.into_rows_result().map_err(q("get schedule"))?;
        let row = rows.maybe_first_row::<Row>().map_err(q("get schedule"))?;
        Ok(row.filter(|r| r.3.is_some()).map(to_row))
    }

    /// The deployment's schedules' cursors (paged; at most `limit`), definitions left in
    /// the store.
    pub async fn cursors(&self, limit: usize) -> Result<Vec<ScheduleCursor>, StoreError> {
        use futures::TryStreamExt;
        let what = "read schedule cursors";
        let pager = self.session.execute_iter(self.cursors.clone(), (self.scope.as_str(),)).await.map_err(q(what))?;
        type Light = (String, String, Option<bool>, Option<i64>, Option<i64>);
        let mut rows = pager.rows_stream::<Light>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some((tenant, name, paused, next, created_at)) = rows.try_next().await.map_err(q(what))? {
            // A cursor moved just as the row was removed leaves a row without `created_at`.
            if created_at.is_none() {
                continue;
            }
            let next_fire_at = next.filter(|n| *n != NEVER);
            out.push(ScheduleCursor { tenant, name, paused: paused.unwrap_or(false), next_fire_at });
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The names of a tenant's schedules with their `created_at` (at most `limit`).
    pub async fn names(&self, tenant: &str, limit: usize) -> Result<Vec<(String, Millis)>, StoreError> {
        use futures::TryStreamExt;
        let what = "read schedule names";
        let v = (self.scope.as_str(), tenant);
        let pager = self.session.execute_iter(self.names.clone(), v).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(String, Option<i64>)>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some((name, created_at)) = rows.try_next().await.map_err(q(what))? {
            // A cursor moved just as the row was removed leaves a row without `created_at`.
            if let Some(at) = created_at {
                out.push((name, at));
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The claimed slots among `0..count` of a tenant.
    pub async fn slots(&self, tenant: &str, count: usize) -> Result<Vec<ScheduleSlot>, StoreError> {
        let all: Vec<i32> = (0..count as i32).collect();
        let mut out = Vec::new();
        for chunk in all.chunks(100) {
            out.extend(self.slots_in(tenant, chunk).await?);
        }
        Ok(out)
    }

    /// The claimed slots of a tenant among `slots` (at most 100).
    pub async fn slots_in(&self, tenant: &str, slots: &[i32]) -> Result<Vec<ScheduleSlot>, StoreError> {
        let what = "read schedule slots";
        let v = (self.scope.as_str(), tenant, slots.to_vec());
        let res = self.session.execute_unpaged(&self.slots, v).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        let mut out = Vec::new();
        for r in rows.rows::<(i32, Option<String>, Option<i64>)>().map_err(q(what))? {
            let (slot, name, at) = r.map_err(q(what))?;
            out.push(ScheduleSlot { slot, name: name.unwrap_or_default(), at: at.unwrap_or(0) });
        }
        Ok(out)
    }

    /// Claims slot `slot` of `tenant` for the schedule `name`; true if it was free.
    pub async fn claim(&self, tenant: &str, slot: i32, name: &str, at: Millis) -> Result<bool, StoreError> {
        let v = (self.scope.as_str(), tenant, slot, name, at);
        applied(self.session.execute_unpaged(&self.claim, v).await.map_err(q("claim schedule slot"))?)
    }

    /// Frees a slot if `s` still holds it.
    pub async fn release(&self, tenant: &str, s: &ScheduleSlot) -> Result<bool, StoreError> {
        let v = (self.scope.as_str(), tenant, s.slot, s.name.as_str(), s.at);
        applied(self.session.execute_unpaged(&self.release, v).await.map_err(q("release schedule slot"))?)
    }
}
