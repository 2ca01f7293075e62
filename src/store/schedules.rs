//! Recurring schedules' rows (`crate::ops::schedules`; rules in `core::recurring`): one row
//! per (tenant, name) in the deployment's partition of `schedules` (keyed by the topic
//! prefix). The definition is its JSON; `next_fire_at` is the first fire not yet
//! submitted, moved only by compare-and-set (LWT), so two promoters that overlap for a
//! moment never move it back.

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
}
