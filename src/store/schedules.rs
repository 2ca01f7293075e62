//! Recurring schedules' rows (`crate::ops::schedules`; rules in `core::recurring`): one row
//! per schedule in its tenant's partition of `tenant_schedules` (keyed by the topic
//! prefix and the tenant). The definition is its JSON; `next_fire_at` is the first fire
//! not yet submitted, moved only by compare-and-set (LWT), so two promoters that overlap
//! for a moment never move it back.
//!
//! An active schedule's cursor is also in the due index (`store::due`): every write puts
//! the new index row before it changes the row and drops the old one after. The leader
//! reads the index for what is due, checks an entry against the row's cursor
//! ([`ScheduleStatements::cursor`], no definition) and reads a definition by key only
//! when it fires. Each schedule also holds one of its tenant's slots (`store::slots`).
//! Rows of the old per-deployment table (`schedules`) are moved here once
//! ([`ScheduleStatements::old_rows`], `ops::schedules::Schedules::migrate`).

use super::{applied, prepare_statement, q, read_paged, DueEntry, DueIndex, DueKind, DueRead, Store, StoreError};
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

impl ScheduleRow {
    /// When the row comes due, if it is active.
    pub fn due_at(&self) -> Option<Millis> {
        self.next_fire_at.filter(|_| !self.paused)
    }
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
    index: DueIndex,
    add: PreparedStatement,
    replace: PreparedStatement,
    set_paused: PreparedStatement,
    advance: PreparedStatement,
    remove: PreparedStatement,
    list_tenant: PreparedStatement,
    get: PreparedStatement,
    cursor: PreparedStatement,
    cursors: PreparedStatement,
    names: PreparedStatement,
    old_rows: PreparedStatement,
    old_remove: PreparedStatement,
    count: PreparedStatement,
    count_add: PreparedStatement,
}

/// A schedule's firing state without its definition.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleCursor {
    pub tenant: String,
    pub name: String,
    pub paused: bool,
    pub next_fire_at: Option<Millis>,
}

type Light = (String, String, Option<bool>, Option<i64>, Option<i64>);

fn to_cursor((tenant, name, paused, next, created_at): Light) -> Option<ScheduleCursor> {
    // A cursor moved just as the row was removed leaves a row without `created_at`.
    created_at?;
    Some(ScheduleCursor { tenant, name, paused: paused.unwrap_or(false), next_fire_at: next.filter(|n| *n != NEVER) })
}

impl Store {
    pub async fn schedule_statements(&self) -> Result<ScheduleStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        let table = format!("{ks}.tenant_schedules");
        let part = "WHERE scope = ? AND tenant = ?";
        let key = "WHERE scope = ? AND tenant = ? AND name = ?";
        let light = "tenant, name, paused, next_fire_at, created_at";
        let mut old_rows =
            prep(format!("SELECT {COLUMNS} FROM {ks}.schedules WHERE scope = ?"), "prepare old schedules", false)
                .await?;
        old_rows.set_page_size(100);
        Ok(ScheduleStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            index: self.due_index(DueKind::Schedule).await?,
            add: prep(
                format!("INSERT INTO {table} (scope, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"),
                "prepare add schedule",
                true,
            )
            .await?,
            replace: prep(
                format!("UPDATE {table} SET spec = ?, next_fire_at = ?, updated_at = ? {key} IF id = ?"),
                "prepare replace schedule",
                true,
            )
            .await?,
            set_paused: prep(
                format!("UPDATE {table} SET paused = ?, next_fire_at = ?, updated_at = ? {key} IF id = ?"),
                "prepare pause schedule",
                true,
            )
            .await?,
            advance: prep(
                format!("UPDATE {table} SET next_fire_at = ? {key} IF next_fire_at = ?"),
                "prepare advance schedule",
                true,
            )
            .await?,
            remove: prep(format!("DELETE FROM {table} {key}"), "prepare remove schedule", false).await?,
            list_tenant: prep(format!("SELECT {COLUMNS} FROM {table} {part}"), "prepare list schedules", false).await?,
            get: prep(format!("SELECT {COLUMNS} FROM {table} {key}"), "prepare get schedule", false).await?,
            cursor: prep(format!("SELECT {light} FROM {table} {key}"), "prepare schedule cursor", false).await?,
            cursors: prep(format!("SELECT {light} FROM {table} {part}"), "prepare schedule cursors", false).await?,
            names: prep(format!("SELECT name, created_at FROM {table} {part}"), "prepare schedule names", false)
                .await?,
            old_rows,
            old_remove: prep(format!("DELETE FROM {ks}.schedules {key}"), "prepare remove old schedule", false).await?,
            count: prep(format!("SELECT n FROM {ks}.schedule_totals WHERE scope = ?"), "prepare schedule total", false)
                .await?,
            count_add: prep(
                format!("UPDATE {ks}.schedule_totals SET n = n + ? WHERE scope = ?"),
                "prepare count schedules",
                false,
            )
            .await?,
        })
    }
}

impl ScheduleStatements {
    /// The due index's entry of an active row.
    fn entry(&self, r: &ScheduleRow, now: Millis) -> Option<DueEntry> {
        Some(DueEntry::new(&r.tenant, &r.name, r.due_at()?, "", now))
    }

    async fn index_put(&self, r: &ScheduleRow, now: Millis) -> Result<(), StoreError> {
        match self.entry(r, now) {
            Some(e) => self.index.put(&e).await,
            None => Ok(()),
        }
    }

    /// Drops the index row of the cursor `old` unless the row is still due then.
    async fn index_moved(&self, r: &ScheduleRow, old: Option<Millis>) -> Result<(), StoreError> {
        match old.filter(|o| r.due_at() != Some(*o)) {
            Some(o) => self.index.drop(&r.tenant, &r.name, o, "").await,
            None => Ok(()),
        }
    }

    /// Adds a schedule unless the tenant has one of that name; true if added.
    pub async fn add(&self, r: &ScheduleRow) -> Result<bool, StoreError> {
        self.index_put(r, r.updated_at).await?;
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

    /// Replaces the definition and cursor of the schedule `r.id` (whose due time was
    /// `old`); false if it is gone (removed, or removed and added again).
    pub async fn replace(&self, r: &ScheduleRow, old: Option<Millis>) -> Result<bool, StoreError> {
        self.index_put(r, r.updated_at).await?;
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
        let done = applied(self.session.execute_unpaged(&self.replace, v).await.map_err(q("replace schedule"))?)?;
        if done {
            self.index_moved(r, old).await?;
        }
        Ok(done)
    }

    /// Pauses or resumes the schedule `r.id` (whose due time was `old`) with its cursor;
    /// false if it is gone.
    pub async fn set_paused(&self, r: &ScheduleRow, old: Option<Millis>) -> Result<bool, StoreError> {
        self.index_put(r, r.updated_at).await?;
        let next = r.next_fire_at.unwrap_or(NEVER);
        let v = (r.paused, next, r.updated_at, self.scope.as_str(), r.tenant.as_str(), r.name.as_str(), r.id.as_str());
        let done = applied(self.session.execute_unpaged(&self.set_paused, v).await.map_err(q("pause schedule"))?)?;
        if done {
            self.index_moved(r, old).await?;
        }
        Ok(done)
    }

    /// Moves the cursor of an active schedule from `from` to `to`; false if it is no
    /// longer at `from`.
    pub async fn advance(&self, c: &ScheduleCursor, from: Millis, now: Millis) -> Result<bool, StoreError> {
        if let Some(to) = c.next_fire_at {
            self.index.put(&DueEntry::new(&c.tenant, &c.name, to, "", now)).await?;
        }
        let v = (c.next_fire_at.unwrap_or(NEVER), self.scope.as_str(), c.tenant.as_str(), c.name.as_str(), from);
        let done = applied(self.session.execute_unpaged(&self.advance, v).await.map_err(q("advance schedule"))?)?;
        if done && c.next_fire_at != Some(from) {
            self.index.drop(&c.tenant, &c.name, from, "").await?;
        }
        Ok(done)
    }

    /// Deletes a schedule's row and then its index row (`r` as read before).
    pub async fn remove(&self, r: &ScheduleRow) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), r.tenant.as_str(), r.name.as_str());
        self.session.execute_unpaged(&self.remove, v).await.map_err(q("remove schedule"))?;
        if let Some(at) = r.due_at() {
            self.index.drop(&r.tenant, &r.name, at, "").await?;
        }
        Ok(())
    }

    /// The deployment's schedule count (`schedule_totals`: adds and removes counted as
    /// they happen, corrected by the leader's sweep; 0 before the first).
    pub async fn total(&self) -> Result<i64, StoreError> {
        let what = "read schedule total";
        let res = self.session.execute_unpaged(&self.count, (self.scope.as_str(),)).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        let row = rows.maybe_first_row::<(Option<scylla::value::Counter>,)>().map_err(q(what))?;
        Ok(row.and_then(|(n,)| n).map_or(0, |n| n.0))
    }

    /// Adds `delta` to the deployment's schedule count (a counter: not idempotent; a
    /// write whose answer was lost may or may not have counted, which the sweep corrects).
    pub async fn count(&self, delta: i64) -> Result<(), StoreError> {
        let v = (scylla::value::Counter(delta), self.scope.as_str());
        self.session.execute_unpaged(&self.count_add, v).await.map_err(q("count schedules"))?;
        Ok(())
    }

    /// A tenant's schedules (paged; at most `limit` rows).
    pub async fn list(&self, tenant: &str, limit: usize) -> Result<Vec<ScheduleRow>, StoreError> {
        let v = (self.scope.as_str(), tenant);
        // A cursor moved just as the row was removed leaves a row without a spec.
        read_paged(&self.session, &self.list_tenant, v, "list schedules", limit, |r: Row| {
            r.3.is_some().then(|| to_row(r))
        })
        .await
    }

    /// One schedule, read by key.
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Option<ScheduleRow>, StoreError> {
        let v = (self.scope.as_str(), tenant, name);
        let res = self.session.execute_unpaged(&self.get, v).await.map_err(q("get schedule"))?;
        let rows = res.into_rows_result().map_err(q("get schedule"))?;
        let row = rows.maybe_first_row::<Row>().map_err(q("get schedule"))?;
        Ok(row.filter(|r| r.3.is_some()).map(to_row))
    }

    /// One schedule's cursor, read by key without its definition.
    pub async fn cursor(&self, tenant: &str, name: &str) -> Result<Option<ScheduleCursor>, StoreError> {
        let what = "read schedule cursor";
        let v = (self.scope.as_str(), tenant, name);
        let res = self.session.execute_unpaged(&self.cursor, v).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        Ok(rows.maybe_first_row::<Light>().map_err(q(what))?.and_then(to_cursor))
    }

    /// A tenant's schedules' cursors (paged; at most `limit`), definitions left in the store.
    pub async fn cursors(&self, tenant: &str, limit: usize) -> Result<Vec<ScheduleCursor>, StoreError> {
        let v = (self.scope.as_str(), tenant);
        read_paged(&self.session, &self.cursors, v, "read schedule cursors", limit, to_cursor).await
    }

    /// The names of a tenant's schedules with their `created_at` (at most `limit`).
    pub async fn names(&self, tenant: &str, limit: usize) -> Result<Vec<(String, Millis)>, StoreError> {
        let v = (self.scope.as_str(), tenant);
        // A cursor moved just as the row was removed leaves a row without `created_at`.
        read_paged(&self.session, &self.names, v, "read schedule names", limit, |(n, at): (String, Option<i64>)| {
            Some((n, at?))
        })
        .await
    }

    /// The schedules due by `now` in the due index, from `from` on (at most `limit`).
    pub async fn due(&self, now: Millis, from: Option<Millis>, limit: usize) -> Result<DueRead, StoreError> {
        self.index.due(now, from, limit).await
    }

    /// Drops an index entry found not matching its row.
    pub async fn drop_entry(&self, e: &DueEntry) -> Result<(), StoreError> {
        self.index.drop(&e.tenant, &e.name, e.due_at, &e.rev).await
    }

    /// Writes the index row of an active row again (the sweep's repair).
    pub async fn reindex(&self, c: &ScheduleCursor, now: Millis) -> Result<(), StoreError> {
        match c.next_fire_at.filter(|_| !c.paused) {
            Some(at) => self.index.put(&DueEntry::new(&c.tenant, &c.name, at, "", now)).await,
            None => Ok(()),
        }
    }

    /// Rows left in the old per-deployment table (at most `limit`).
    pub async fn old_rows(&self, limit: usize) -> Result<Vec<ScheduleRow>, StoreError> {
        let v = (self.scope.as_str(),);
        read_paged(&self.session, &self.old_rows, v, "read old schedules", limit, |r: Row| Some(to_row(r))).await
    }

    /// Deletes a row of the old per-deployment table (once it is moved).
    pub async fn old_remove(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), tenant, name);
        self.session.execute_unpaged(&self.old_remove, v).await.map_err(q("remove old schedule"))?;
        Ok(())
    }
}
