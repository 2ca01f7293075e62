//! Open debounce windows (`crate::submit::dedupe`; rules in `core::unique`): one row per
//! (tenant, debounce key) in its tenant's partition of `tenant_debounces`, holding the
//! pending job (Avro), when the window opened, when the job is due, a revision that
//! every change replaces, and the tenant's slot (`store::slots`, `debounce_slots`) the
//! window holds. Every write is a compare-and-set (LWT) on the revision, so submissions
//! from several API processes and the promoter's leader, which takes a due window out to
//! submit its job, never lose one another's change.
//!
//! A window is also in the due index (`store::due`, shared by every tenant's windows of
//! a minute; the entry carries the window's id): opening puts its entry (before the
//! window row), a join only moves the window's own row (never the index, so a tenant
//! joining a window thousands of times writes no tombstone into the shared bucket), and
//! the leader, finding an entry due, checks it against the window
//! ([`DebounceStatements::due_of`], no job): a window joined since is due later, so its
//! entry moves once to the window's due time ([`DebounceStatements::move_entry`]: one
//! index write per leader visit, not per join); a due one is closed and its entry
//! dropped. Rows of the old
//! per-deployment table (`debounces`) are moved here once ([`DebounceStatements::old_rows`]).

use super::{applied, prepare_statement, q, read_paged, DueEntry, DueIndex, DueKind, DueRead, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// `slot` of a window that holds none (moved from the old table past its tenant's bound).
pub const NO_SLOT: i32 = -1;

/// One open window.
#[derive(Debug, Clone, PartialEq)]
pub struct DebounceRow {
    pub tenant: String,
    pub key: String,
    /// The job id the window's job gets (its first submission's).
    pub window_id: String,
    pub first_at: Millis,
    pub due_at: Millis,
    /// Replaced by every change: what the compare-and-sets compare.
    pub rev: String,
    /// The pending job (`codec::encode_job`).
    pub job: Vec<u8>,
    /// The tenant's slot the window holds ([`NO_SLOT`]: none) and when it was claimed.
    pub slot: i32,
    pub slot_at: Millis,
}

impl DebounceRow {
    /// The window's due index entry (its id in the entry's revision: stable across joins).
    fn entry(&self, now: Millis) -> DueEntry {
        DueEntry::new(&self.tenant, &self.key, self.due_at, &self.window_id, now)
    }
}

type Row = (
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<Vec<u8>>,
    Option<i32>,
    Option<i64>,
);

/// A window without its job: what the leader checks an index entry against, and what
/// the sweep reads.
#[derive(Debug, Clone, PartialEq)]
pub struct DebounceDue {
    pub tenant: String,
    pub key: String,
    pub window_id: String,
    pub due_at: Millis,
    pub rev: String,
    pub slot: i32,
    pub slot_at: Millis,
}

type Light = (String, String, Option<String>, Option<i64>, Option<String>, Option<i32>, Option<i64>);

fn to_due((tenant, key, window_id, due_at, rev, slot, slot_at): Light) -> Option<DebounceDue> {
    Some(DebounceDue {
        tenant,
        key,
        window_id: window_id.unwrap_or_default(),
        due_at: due_at?,
        rev: rev?,
        slot: slot.unwrap_or(NO_SLOT),
        slot_at: slot_at.unwrap_or(0),
    })
}

const COLUMNS: &str = "tenant, key, window_id, first_at, due_at, rev, job, slot, slot_at";
const OLD_COLUMNS: &str = "tenant, key, window_id, first_at, due_at, rev, job";
const LIGHT: &str = "tenant, key, window_id, due_at, rev, slot, slot_at";

/// Statements of debounce windows ([`Store::debounce_statements`]).
#[derive(Clone)]
pub struct DebounceStatements {
    session: Arc<Session>,
    scope: String,
    index: DueIndex,
    get: PreparedStatement,
    due_of: PreparedStatement,
    open: PreparedStatement,
    extend: PreparedStatement,
    close: PreparedStatement,
    windows: PreparedStatement,
    old_rows: PreparedStatement,
    old_remove: PreparedStatement,
}

impl Store {
    pub async fn debounce_statements(&self) -> Result<DebounceStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        let table = format!("{ks}.tenant_debounces");
        let key = "WHERE scope = ? AND tenant = ? AND key = ?";
        let mut old_rows =
            prep(format!("SELECT {OLD_COLUMNS} FROM {ks}.debounces WHERE scope = ?"), "prepare old debounces", false)
                .await?;
        old_rows.set_page_size(100);
        Ok(DebounceStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            index: self.due_index(DueKind::Debounce).await?,
            get: prep(format!("SELECT {COLUMNS} FROM {table} {key}"), "prepare get debounce", false).await?,
            due_of: prep(format!("SELECT {LIGHT} FROM {table} {key}"), "prepare debounce due", false).await?,
            open: prep(
                format!("INSERT INTO {table} (scope, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"),
                "prepare open debounce",
                true,
            )
            .await?,
            extend: prep(
                format!("UPDATE {table} SET due_at = ?, rev = ?, job = ? {key} IF rev = ?"),
                "prepare extend debounce",
                true,
            )
            .await?,
            close: prep(format!("DELETE FROM {table} {key} IF rev = ?"), "prepare close debounce", true).await?,
            windows: prep(
                format!("SELECT {LIGHT} FROM {table} WHERE scope = ? AND tenant = ?"),
                "prepare debounce windows",
                false,
            )
            .await?,
            old_rows,
            old_remove: prep(format!("DELETE FROM {ks}.debounces {key}"), "prepare remove old debounce", false).await?,
        })
    }
}

fn to_row((tenant, key, window_id, first_at, due_at, rev, job, slot, slot_at): Row) -> DebounceRow {
    DebounceRow {
        tenant,
        key,
        window_id: window_id.unwrap_or_default(),
        first_at: first_at.unwrap_or(0),
        due_at: due_at.unwrap_or(0),
        rev: rev.unwrap_or_default(),
        job: job.unwrap_or_default(),
        slot: slot.unwrap_or(NO_SLOT),
        slot_at: slot_at.unwrap_or(0),
    }
}

impl DebounceStatements {
    /// The open window of (tenant, key), if any.
    pub async fn get(&self, tenant: &str, key: &str) -> Result<Option<DebounceRow>, StoreError> {
        let v = (self.scope.as_str(), tenant, key);
        let res = self.session.execute_unpaged(&self.get, v).await.map_err(q("get debounce"))?;
        let rows = res.into_rows_result().map_err(q("get debounce"))?;
        Ok(rows.maybe_first_row::<Row>().map_err(q("get debounce"))?.map(to_row))
    }

    /// The open window of (tenant, key) without its job.
    pub async fn due_of(&self, tenant: &str, key: &str) -> Result<Option<DebounceDue>, StoreError> {
        let what = "read debounce due";
        let v = (self.scope.as_str(), tenant, key);
        let res = self.session.execute_unpaged(&self.due_of, v).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        Ok(rows.maybe_first_row::<Light>().map_err(q(what))?.and_then(to_due))
    }

    /// Opens a window unless one is open; true if opened.
    pub async fn open(&self, r: &DebounceRow, now: Millis) -> Result<bool, StoreError> {
        self.index.put(&r.entry(now)).await?;
        let v = (
            self.scope.as_str(),
            r.tenant.as_str(),
            r.key.as_str(),
            r.window_id.as_str(),
            r.first_at,
            r.due_at,
            r.rev.as_str(),
            r.job.as_slice(),
            r.slot,
            r.slot_at,
        );
        applied(self.session.execute_unpaged(&self.open, v).await.map_err(q("open debounce"))?)
    }

    /// Moves an open window (`from`, as read) to `r`'s due time, revision and job, if its
    /// revision is still `from`'s. Its index entry stays where it is (the leader moves it
    /// when it finds it due: see the module docs).
    pub async fn extend(&self, r: &DebounceRow, from: &DebounceRow) -> Result<bool, StoreError> {
        let v = (
            r.due_at,
            r.rev.as_str(),
            r.job.as_slice(),
            self.scope.as_str(),
            r.tenant.as_str(),
            r.key.as_str(),
            from.rev.as_str(),
        );
        applied(self.session.execute_unpaged(&self.extend, v).await.map_err(q("extend debounce"))?)
    }

    /// Closes a window, if its revision is still `w.rev`; true if closed (by this call).
    /// Its index entry (`entry`, the one the leader found due) goes with it.
    pub async fn close(&self, w: &DebounceRow, entry: &DueEntry) -> Result<bool, StoreError> {
        let v = (self.scope.as_str(), w.tenant.as_str(), w.key.as_str(), w.rev.as_str());
        let done = applied(self.session.execute_unpaged(&self.close, v).await.map_err(q("close debounce"))?)?;
        if done {
            self.drop_entry(entry).await?;
        }
        Ok(done)
    }

    /// Moves an index entry found due to its window's later due time (`d`: the window
    /// was joined since the entry was written): the new entry first, then the old dropped.
    pub async fn move_entry(&self, e: &DueEntry, d: &DebounceDue, now: Millis) -> Result<(), StoreError> {
        self.index.put(&DueEntry::new(&d.tenant, &d.key, d.due_at, &d.window_id, now)).await?;
        self.drop_entry(e).await
    }

    /// A tenant's open windows without their jobs (paged; at most `limit`).
    pub async fn windows(&self, tenant: &str, limit: usize) -> Result<Vec<DebounceDue>, StoreError> {
        let v = (self.scope.as_str(), tenant);
        read_paged(&self.session, &self.windows, v, "read debounce windows", limit, to_due).await
    }

    /// The windows due by `now` in the due index, from `from` on (at most `limit`).
    pub async fn due(&self, now: Millis, from: Option<Millis>, limit: usize) -> Result<DueRead, StoreError> {
        self.index.due(now, from, limit).await
    }

    /// Drops an index entry found not matching its window.
    pub async fn drop_entry(&self, e: &DueEntry) -> Result<(), StoreError> {
        self.index.drop(&e.tenant, &e.name, e.due_at, &e.rev).await
    }

    /// Writes a window's index row again (the sweep's repair).
    pub async fn reindex(&self, d: &DebounceDue, now: Millis) -> Result<(), StoreError> {
        self.index.put(&DueEntry::new(&d.tenant, &d.key, d.due_at, &d.window_id, now)).await
    }

    /// Windows left in the old per-deployment table (at most `limit`; no slot).
    pub async fn old_rows(&self, limit: usize) -> Result<Vec<DebounceRow>, StoreError> {
        type Old = (String, String, Option<String>, Option<i64>, Option<i64>, Option<String>, Option<Vec<u8>>);
        let v = (self.scope.as_str(),);
        read_paged(&self.session, &self.old_rows, v, "read old debounces", limit, |(t, k, w, f, d, r, j): Old| {
            Some(to_row((t, k, w, f, d, r, j, None, None)))
        })
        .await
    }

    /// Deletes a row of the old per-deployment table (once it is moved).
    pub async fn old_remove(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), tenant, key);
        self.session.execute_unpaged(&self.old_remove, v).await.map_err(q("remove old debounce"))?;
        Ok(())
    }
}
