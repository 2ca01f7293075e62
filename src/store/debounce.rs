//! Open debounce windows (`crate::submit::dedupe`; rules in `core::unique`): one row per
//! (tenant, debounce key) in the deployment's partition of `debounces`, holding the
//! pending job (Avro), when the window opened, when the job is due, and a revision that
//! every change replaces. Every write is a compare-and-set (LWT) on the revision, so
//! submissions from several API processes and the promoter's leader, which takes a due
//! window out to submit its job, never lose one another's change. The leader's
//! per-second read lists windows without their jobs ([`DebounceDue`]); a due window's job
//! is read by key when it is closed.

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

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
}

type Row = (String, String, Option<String>, Option<i64>, Option<i64>, Option<String>, Option<Vec<u8>>);

/// A due window as the leader lists it: its key and revision, not its job.
#[derive(Debug, Clone, PartialEq)]
pub struct DebounceDue {
    pub tenant: String,
    pub key: String,
    pub rev: String,
}

const COLUMNS: &str = "tenant, key, window_id, first_at, due_at, rev, job";

/// Statements of debounce windows ([`Store::debounce_statements`]).
#[derive(Clone)]
pub struct DebounceStatements {
    session: Arc<Session>,
    scope: String,
    get: PreparedStatement,
    open: PreparedStatement,
    extend: PreparedStatement,
    close: PreparedStatement,
    list: PreparedStatement,
    tenant_keys: PreparedStatement,
}

impl Store {
    pub async fn debounce_statements(&self) -> Result<DebounceStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        let key = "WHERE scope = ? AND tenant = ? AND key = ?";
        let mut list = prep(
            format!("SELECT tenant, key, due_at, rev FROM {ks}.debounces WHERE scope = ?"),
            "prepare list debounces",
            false,
        )
        .await?;
        list.set_page_size(1000);
        Ok(DebounceStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            get: prep(format!("SELECT {COLUMNS} FROM {ks}.debounces {key}"), "prepare get debounce", false).await?,
            open: prep(
                format!("INSERT INTO {ks}.debounces (scope, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"),
                "prepare open debounce",
                true,
            )
            .await?,
            extend: prep(
                format!("UPDATE {ks}.debounces SET due_at = ?, rev = ?, job = ? {key} IF rev = ?"),
                "prepare extend debounce",
                true,
            )
            .await?,
            close: prep(format!("DELETE FROM {ks}.debounces {key} IF rev = ?"), "prepare close debounce", true).await?,
            list,
            tenant_keys: prep(
                format!("SELECT key FROM {ks}.debounces WHERE scope = ? AND tenant = ?"),
                "prepare debounce keys",
                false,
            )
            .await?,
        })
    }
}

fn to_row((tenant, key, window_id, first_at, due_at, rev, job): Row) -> DebounceRow {
    DebounceRow {
        tenant,
        key,
        window_id: window_id.unwrap_or_default(),
        first_at: first_at.unwrap_or(0),
        due_at: due_at.unwrap_or(0),
        rev: rev.unwrap_or_default(),
        job: job.unwrap_or_default(),
    }
}

impl DebounceStatements {
    /// The open window of (tenant, key), if any.
    pub async fn get(&self, tenant: &str, key: &str) -> Result<Option<DebounceRow>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.get, (self.scope.as_str(), tenant, key))
            .await
            .map_err(q("get debounce"))?;
        let rows = res.into_rows_result().map_err(q("get debounce"))?;
        Ok(rows.maybe_first_row::<Row>().map_err(q("get debounce"))?.map(to_row))
    }

    /// Opens a window unless one is open; true if opened.
    pub async fn open(&self, r: &DebounceRow) -> Result<bool, StoreError> {
        let v = (
            self.scope.as_str(),
            r.tenant.as_str(),
            r.key.as_str(),
            r.window_id.as_str(),
            r.first_at,
            r.due_at,
            r.rev.as_str(),
            r.job.as_slice(),
        );
        applied(self.session.execute_unpaged(&self.open, v).await.map_err(q("open debounce"))?)
    }

    /// Moves an open window's due time and job, if its revision is still `from_rev`.
    pub async fn extend(&self, r: &DebounceRow, from_rev: &str) -> Result<bool, StoreError> {
        let v = (
            r.due_at,
            r.rev.as_str(),
            r.job.as_slice(),
            self.scope.as_str(),
            r.tenant.as_str(),
            r.key.as_str(),
            from_rev,
        );
        applied(self.session.execute_unpaged(&self.extend, v).await.map_err(q("extend debounce"))?)
    }

    /// Closes a window, if its revision is still `rev`; true if closed (by this call).
    pub async fn close(&self, tenant: &str, key: &str, rev: &str) -> Result<bool, StoreError> {
        let v = (self.scope.as_str(), tenant, key, rev);
        applied(self.session.execute_unpaged(&self.close, v).await.map_err(q("close debounce"))?)
    }

    /// How many windows `tenant` has open, counted up to `limit`.
    pub async fn open_keys(&self, tenant: &str, limit: usize) -> Result<usize, StoreError> {
        use futures::TryStreamExt;
        let what = "count debounces";
        let v = (self.scope.as_str(), tenant);
        let pager = self.session.execute_iter(self.tenant_keys.clone(), v).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(String,)>().map_err(q(what))?;
        let mut n = 0;
        while n < limit && rows.try_next().await.map_err(q(what))?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    /// The deployment's open windows due at `now`, without their jobs (paged; at most
    /// `limit`).
    pub async fn due(&self, now: Millis, limit: usize) -> Result<Vec<DebounceDue>, StoreError> {
        use futures::TryStreamExt;
        let pager =
            self.session.execute_iter(self.list.clone(), (self.scope.as_str(),)).await.map_err(q("list debounces"))?;
        type Light = (String, String, Option<i64>, Option<String>);
        let mut rows = pager.rows_stream::<Light>().map_err(q("list debounces"))?;
        let mut out = Vec::new();
        while let Some((tenant, key, due_at, rev)) = rows.try_next().await.map_err(q("list debounces"))? {
            let rev = rev.unwrap_or_default();
            if due_at.unwrap_or(0) <= now && !rev.is_empty() {
                out.push(DebounceDue { tenant, key, rev });
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}
