//! Statements of the usage ledger (`crate::watch::ledger`; rules in `core::ledger`): an
//! account's totals per window and partition of the results topic (`ledger`, one store
//! partition per tenant and day), the fleet's totals per window (`ledger_fleet`, one store
//! partition per day: what the console's shares are of), the tenants with usage per day
//! (`ledger_tenants`, what a month's export walks), and where the ledger's reader starts
//! again (`ledger_positions`).
//!
//! A total is written `USING TIMESTAMP <end offset of the prefix it covers>`: the longest
//! prefix wins (see `core::ledger`). Only the ledger writes these cells.

use super::{prepare_statement, q, Store, StoreError};
use crate::core::alerts::WaitHistogram;
use crate::core::ledger::{Account, FleetRow, Flush, LedgerRow, OverBudget, RowBudget, Usage};
use crate::model::{Millis, Pool};
use futures::TryStreamExt;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// Row writes of one flush in flight at once.
const WRITE_CONCURRENCY: usize = 32;
const DAY_MS: Millis = 86_400_000;

const USAGE_COLUMNS: &str =
    "results, succeeded, failed, cancelled, expired, attempts, retries, run_ms, bytes_out, cpu_ms, peak_memory_bytes, waits";

/// A read of a request with a row budget ([`RowBudget`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerReadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the read stopped at {} ledger rows (api.limits.ledger_rows_per_request)", .0.limit)]
    OverBudget(#[from] OverBudget),
}

#[derive(Clone)]
pub struct LedgerStatements {
    session: Arc<Session>,
    scope: String,
    put_row: PreparedStatement,
    put_tenant: PreparedStatement,
    put_position: PreparedStatement,
    put_fleet: PreparedStatement,
    positions: PreparedStatement,
    rows: PreparedStatement,
    tenants: PreparedStatement,
    fleet: PreparedStatement,
}

/// Where the ledger's reader of one partition starts again: the first offset of its
/// current window (`first`), and how far it had written (`next`, for lag reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerPosition {
    pub partition: i32,
    pub first: i64,
    pub next: i64,
}

impl Store {
    /// Prepares the ledger's statements.
    pub async fn ledger_statements(&self) -> Result<LedgerStatements, StoreError> {
        let ks = &self.keyspace;
        let s = &self.session;
        let mut rows = prepare_statement(
            s,
            format!(
                "SELECT window, pool, job_type, {USAGE_COLUMNS} FROM {ks}.ledger WHERE scope = ? AND tenant = ? AND day = ?"
            ),
            "prepare read ledger",
            false,
        )
        .await?;
        rows.set_page_size(1000);
        let mut tenants = prepare_statement(
            s,
            format!("SELECT tenant FROM {ks}.ledger_tenants WHERE scope = ? AND day = ?"),
            "prepare read ledger tenants",
            false,
        )
        .await?;
        tenants.set_page_size(1000);
        let mut fleet = prepare_statement(
            s,
            format!("SELECT window, pool, results, run_ms FROM {ks}.ledger_fleet WHERE scope = ? AND day = ?"),
            "prepare read ledger fleet",
            false,
        )
        .await?;
        fleet.set_page_size(1000);
        Ok(LedgerStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            put_row: prepare_statement(
                s,
                format!(
                    "INSERT INTO {ks}.ledger (scope, tenant, day, window, pool, job_type, part, {USAGE_COLUMNS}) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ? AND TIMESTAMP ?"
                ),
                "prepare put ledger row",
                false,
            )
            .await?,
            put_tenant: prepare_statement(
                s,
                format!("INSERT INTO {ks}.ledger_tenants (scope, day, tenant) VALUES (?, ?, ?) USING TTL ?"),
                "prepare put ledger tenant",
                false,
            )
            .await?,
            put_position: prepare_statement(
                s,
                format!(
                    "INSERT INTO {ks}.ledger_positions (scope, topic, part, first, next, at) VALUES (?, ?, ?, ?, ?, ?)"
                ),
                "prepare put ledger position",
                false,
            )
            .await?,
            put_fleet: prepare_statement(
                s,
                format!(
                    "INSERT INTO {ks}.ledger_fleet (scope, day, window, pool, part, results, run_ms) \
                     VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ? AND TIMESTAMP ?"
                ),
                "prepare put ledger fleet",
                false,
            )
            .await?,
            positions: prepare_statement(
                s,
                format!("SELECT part, first, next FROM {ks}.ledger_positions WHERE scope = ? AND topic = ?"),
                "prepare read ledger positions",
                false,
            )
            .await?,
            rows,
            tenants,
            fleet,
        })
    }
}

impl LedgerStatements {
    /// Writes one flush of partition `part`'s tally (rows kept `ttl_secs`), then the days'
    /// tenant index. Idempotent: a write of a shorter prefix never wins over a longer one.
    pub async fn put_flush(&self, part: i32, f: &Flush, ttl_secs: i32) -> Result<(), StoreError> {
        let scope = self.scope.as_str();
        let day = f.window.div_euclid(DAY_MS) * DAY_MS;
        let rows: Vec<RowValues> = f
            .rows
            .iter()
            .map(|(a, u)| RowValues {
                scope,
                tenant: a.tenant.as_str(),
                day,
                window: f.window,
                pool: a.pool.as_str(),
                job_type: a.job_type.as_str(),
                part,
                results: u.results,
                succeeded: u.succeeded,
                failed: u.failed,
                cancelled: u.cancelled,
                expired: u.expired,
                attempts: u.attempts,
                retries: u.retries,
                run_ms: u.run_ms,
                bytes_out: u.bytes_out,
                cpu_ms: u.cpu_ms,
                peak_memory_bytes: u.peak_memory_bytes,
                waits: u.waits.counts().iter().map(|c| (*c).min(i32::MAX as u32) as i32).collect(),
                ttl: ttl_secs,
                timestamp: f.upto,
            })
            .collect();
        for chunk in rows.chunks(WRITE_CONCURRENCY) {
            let writes: Vec<_> = chunk.iter().map(|v| self.session.execute_unpaged(&self.put_row, v)).collect();
            futures::future::try_join_all(writes).await.map_err(q("write ledger row"))?;
        }
        let fleet: Vec<_> = f
            .fleet
            .iter()
            .map(|(pool, u)| {
                let v = (scope, day, f.window, pool.as_str(), part, u.results, u.run_ms, ttl_secs, f.upto);
                self.session.execute_unpaged(&self.put_fleet, v)
            })
            .collect();
        futures::future::try_join_all(fleet).await.map_err(q("write ledger fleet"))?;
        let mut tenants: Vec<&str> = f.rows.iter().map(|(a, _)| a.tenant.as_str()).collect();
        tenants.dedup();
        for chunk in tenants.chunks(WRITE_CONCURRENCY) {
            let writes: Vec<_> = chunk
                .iter()
                .map(|t| self.session.execute_unpaged(&self.put_tenant, (scope, day, *t, ttl_secs)))
                .collect();
            futures::future::try_join_all(writes).await.map_err(q("write ledger tenant"))?;
        }
        Ok(())
    }

    pub async fn put_position(&self, topic: &str, p: &LedgerPosition, now: Millis) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), topic, p.partition, p.first, p.next, now);
        self.session.execute_unpaged(&self.put_position, v).await.map_err(q("write ledger position"))?;
        Ok(())
    }

    pub async fn positions(&self, topic: &str) -> Result<Vec<LedgerPosition>, StoreError> {
        let what = "read ledger positions";
        let res = self.session.execute_unpaged(&self.positions, (self.scope.as_str(), topic)).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        let it = rows.rows::<(i32, Option<i64>, Option<i64>)>().map_err(q(what))?;
        let mut out = Vec::new();
        for r in it {
            let (partition, first, next) = r.map_err(q(what))?;
            out.push(LedgerPosition { partition, first: first.unwrap_or(0), next: next.unwrap_or(0) });
        }
        Ok(out)
    }

    /// A tenant's rows of the day starting at `day` (every window and partition).
    pub async fn rows(&self, tenant: &str, day: Millis) -> Result<Vec<LedgerRow>, StoreError> {
        match self.rows_within(tenant, day, &mut RowBudget::new(u64::MAX)).await {
            Ok(rows) => Ok(rows),
            Err(LedgerReadError::Store(e)) => Err(e),
            Err(LedgerReadError::OverBudget(_)) => unreachable!("an unlimited budget"),
        }
    }

    /// [`LedgerStatements::rows`] within `budget`: the read stops (no further page is
    /// fetched) at the first row past it.
    pub async fn rows_within(
        &self,
        tenant: &str,
        day: Millis,
        budget: &mut RowBudget,
    ) -> Result<Vec<LedgerRow>, LedgerReadError> {
        let what = "read ledger";
        let pager =
            self.session.execute_iter(self.rows.clone(), (self.scope.as_str(), tenant, day)).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<StoredRow>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some(r) = rows.try_next().await.map_err(q(what))? {
            budget.take(1)?;
            let Ok(pool) = r.pool.parse::<Pool>() else { continue };
            let account = Account { tenant: tenant.to_string(), pool, job_type: r.job_type.clone() };
            out.push(LedgerRow { window: r.window, account, usage: r.usage() });
        }
        Ok(out)
    }

    /// The fleet's rows of the day starting at `day` (every window, pool and partition),
    /// each handed to `f` as read; the read stops at the first row past `budget`.
    pub async fn fold_fleet(
        &self,
        day: Millis,
        budget: &mut RowBudget,
        mut f: impl FnMut(FleetRow),
    ) -> Result<(), LedgerReadError> {
        let what = "read ledger fleet";
        let pager = self.session.execute_iter(self.fleet.clone(), (self.scope.as_str(), day)).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(i64, String, Option<i64>, Option<i64>)>().map_err(q(what))?;
        while let Some((window, pool, results, run_ms)) = rows.try_next().await.map_err(q(what))? {
            budget.take(1)?;
            let Ok(pool) = pool.parse::<Pool>() else { continue };
            let usage = Usage { results: results.unwrap_or(0), run_ms: run_ms.unwrap_or(0), ..Usage::default() };
            f(FleetRow { window, pool, usage });
        }
        Ok(())
    }

    /// The tenants with usage on the day starting at `day`, each handed to `f` as read;
    /// the read stops at the first name past `budget`.
    pub async fn fold_tenants(
        &self,
        day: Millis,
        budget: &mut RowBudget,
        mut f: impl FnMut(&str),
    ) -> Result<(), LedgerReadError> {
        let what = "read ledger tenants";
        let pager =
            self.session.execute_iter(self.tenants.clone(), (self.scope.as_str(), day)).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(String,)>().map_err(q(what))?;
        while let Some((t,)) = rows.try_next().await.map_err(q(what))? {
            budget.take(1)?;
            f(&t);
        }
        Ok(())
    }

    /// The fleet's rows of the day starting at `day` (every window, pool and partition).
    pub async fn fleet(&self, day: Millis) -> Result<Vec<FleetRow>, StoreError> {
        let what = "read ledger fleet";
        let pager = self.session.execute_iter(self.fleet.clone(), (self.scope.as_str(), day)).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(i64, String, Option<i64>, Option<i64>)>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some((window, pool, results, run_ms)) = rows.try_next().await.map_err(q(what))? {
            let Ok(pool) = pool.parse::<Pool>() else { continue };
            let usage = Usage { results: results.unwrap_or(0), run_ms: run_ms.unwrap_or(0), ..Usage::default() };
            out.push(FleetRow { window, pool, usage });
        }
        Ok(out)
    }

    /// The tenants with usage on the day starting at `day`.
    pub async fn tenants(&self, day: Millis) -> Result<Vec<String>, StoreError> {
        let what = "read ledger tenants";
        let pager =
            self.session.execute_iter(self.tenants.clone(), (self.scope.as_str(), day)).await.map_err(q(what))?;
        let mut rows = pager.rows_stream::<(String,)>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some((t,)) = rows.try_next().await.map_err(q(what))? {
            out.push(t);
        }
        Ok(out)
    }
}

/// `put_row`'s values in bind order.
#[derive(scylla::SerializeRow)]
#[scylla(flavor = "enforce_order", skip_name_checks)]
struct RowValues<'a> {
    scope: &'a str,
    tenant: &'a str,
    day: i64,
    window: i64,
    pool: &'a str,
    job_type: &'a str,
    part: i32,
    results: i64,
    succeeded: i64,
    failed: i64,
    cancelled: i64,
    expired: i64,
    attempts: i64,
    retries: i64,
    run_ms: i64,
    bytes_out: i64,
    cpu_ms: i64,
    peak_memory_bytes: i64,
    waits: Vec<i32>,
    ttl: i32,
    timestamp: i64,
}

/// A `ledger` row as read.
#[derive(scylla::DeserializeRow)]
struct StoredRow {
    window: i64,
    pool: String,
    job_type: String,
    results: Option<i64>,
    succeeded: Option<i64>,
    failed: Option<i64>,
    cancelled: Option<i64>,
    expired: Option<i64>,
    attempts: Option<i64>,
    retries: Option<i64>,
    run_ms: Option<i64>,
    bytes_out: Option<i64>,
    cpu_ms: Option<i64>,
    peak_memory_bytes: Option<i64>,
    waits: Option<Vec<i32>>,
}

impl StoredRow {
    fn usage(&self) -> Usage {
        Usage {
            results: self.results.unwrap_or(0),
            succeeded: self.succeeded.unwrap_or(0),
            failed: self.failed.unwrap_or(0),
            cancelled: self.cancelled.unwrap_or(0),
            expired: self.expired.unwrap_or(0),
            attempts: self.attempts.unwrap_or(0),
            retries: self.retries.unwrap_or(0),
            run_ms: self.run_ms.unwrap_or(0),
            bytes_out: self.bytes_out.unwrap_or(0),
            cpu_ms: self.cpu_ms.unwrap_or(0),
            peak_memory_bytes: self.peak_memory_bytes.unwrap_or(0),
            waits: self.waits.as_deref().map(WaitHistogram::from_counts).unwrap_or_default(),
        }
    }
}
