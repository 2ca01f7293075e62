//! Statements of the refusal counts (`core::refusals`): `tenant_refusals`, one store
//! partition per deployment and hour, a row per (tenant, code, process) holding that
//! process's cumulative count (idempotent writes, TTL). The tenant's console page reads
//! its rows of each hour of the last day (one clustering prefix per hour); the ledger's
//! leader reads the last two hours, at most a bounded number of rows, keeping each class
//! of tenants within its share ([`HourRead`]).

use super::{prepare_statement, q, Store, StoreError};
use crate::core::refusals::{Cell, Class, ClassBudget};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How long a count is kept (the page shows a day; a margin for late readers).
pub const TTL_SECS: i32 = 8 * 86_400;

/// One process's cumulative count of one (tenant, code) in one hour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalCell {
    pub tenant: String,
    pub code: String,
    pub n: i64,
}

#[derive(Clone)]
pub struct RefusalStatements {
    session: Arc<Session>,
    scope: String,
    put: PreparedStatement,
    tenant_hour: PreparedStatement,
    hour: PreparedStatement,
}

/// An hour's rows as the leader keeps them.
#[derive(Debug, Default)]
pub struct HourRead {
    /// The rows kept: each class's first [`Class::max_rows`].
    pub cells: Vec<RefusalCell>,
    /// Rows read and not kept, per class (free, paying).
    pub dropped: [usize; 2],
    /// The read stopped at its `max_scan` rows: later rows were not seen.
    pub cut: bool,
}

impl Store {
    /// Prepares the refusal counts' statements.
    pub async fn refusal_statements(&self) -> Result<RefusalStatements, StoreError> {
        let ks = &self.keyspace;
        let s = &self.session;
        let prep = |cql: String, what: &'static str| prepare_statement(s, cql, what, false);
        let mut hour = prep(
            format!("SELECT tenant, code, n FROM {ks}.tenant_refusals WHERE scope = ? AND hour = ?"),
            "prepare read an hour's refusals",
        )
        .await?;
        hour.set_page_size(5_000);
        Ok(RefusalStatements {
            session: s.clone(),
            scope: self.scope.clone(),
            put: prep(
                format!(
                    "INSERT INTO {ks}.tenant_refusals (scope, hour, tenant, code, process, n) VALUES (?, ?, ?, ?, ?, ?) \
                     USING TTL ?"
                ),
                "prepare put refusals",
            )
            .await?,
            tenant_hour: prep(
                format!(
                    "SELECT code, n FROM {ks}.tenant_refusals WHERE scope = ? AND hour = ? AND tenant = ? LIMIT 5000"
                ),
                "prepare read a tenant's refusals",
            )
            .await?,
            hour,
        })
    }
}

impl RefusalStatements {
    /// Writes `process`'s cumulative cells of `hour`.
    pub async fn put(&self, hour: Millis, process: &str, cells: &[RefusalCell]) -> Result<(), StoreError> {
        let writes = cells.iter().map(|c| {
            let v = (&self.scope, hour, &c.tenant, &c.code, process, c.n, TTL_SECS);
            self.session.execute_unpaged(&self.put, v)
        });
        for r in futures::future::join_all(writes).await {
            r.map_err(q("write refusals"))?;
        }
        Ok(())
    }

    /// `tenant`'s rows of each of `hours`: (hour, code, count), every process's apart.
    pub async fn tenant(&self, tenant: &str, hours: &[Millis]) -> Result<Vec<(Millis, String, i64)>, StoreError> {
        let reads = hours.iter().map(|h| async move {
            let res = self
                .session
                .execute_unpaged(&self.tenant_hour, (&self.scope, *h, tenant))
                .await
                .map_err(q("read a tenant's refusals"))?;
            let rows = res.into_rows_result().map_err(q("read a tenant's refusals"))?;
            let mut out = Vec::new();
            for r in rows.rows::<(String, Option<i64>)>().map_err(q("read a tenant's refusals"))? {
                let (code, n) = r.map_err(q("read a tenant's refusals"))?;
                out.push((*h, code, n.unwrap_or(0)));
            }
            Ok::<_, StoreError>(out)
        });
        let mut all = Vec::new();
        for r in futures::future::join_all(reads).await {
            all.extend(r?);
        }
        Ok(all)
    }

    /// Writes `process`'s changed cells, an hour at a time; the first failure stops.
    pub async fn put_cells(&self, process: &str, cells: &[Cell]) -> Result<(), StoreError> {
        let mut by_hour: BTreeMap<Millis, Vec<RefusalCell>> = BTreeMap::new();
        for c in cells {
            let cell = RefusalCell { tenant: c.tenant.clone(), code: c.code.clone(), n: c.n };
            by_hour.entry(c.hour).or_default().push(cell);
        }
        for (hour, cells) in by_hour {
            self.put(hour, process, &cells).await?;
        }
        Ok(())
    }

    /// The rows of `hour`, reading at most `max_scan` and keeping at most each class's
    /// [`Class::max_rows`] (`class_of` gives a tenant's class): the free accounts'
    /// rows cannot crowd out the paying tenants' however their names sort.
    pub async fn hour(
        &self,
        hour: Millis,
        max_scan: usize,
        class_of: impl Fn(&str) -> Class,
    ) -> Result<HourRead, StoreError> {
        use futures::TryStreamExt;
        let pager = self
            .session
            .execute_iter(self.hour.clone(), (&self.scope, hour))
            .await
            .map_err(q("read an hour's refusals"))?;
        let mut rows = pager.rows_stream::<(String, String, Option<i64>)>().map_err(q("read an hour's refusals"))?;
        let (mut out, mut budget, mut scanned) = (HourRead::default(), ClassBudget::default(), 0usize);
        while let Some((tenant, code, n)) = rows.try_next().await.map_err(q("read an hour's refusals"))? {
            if scanned >= max_scan {
                out.cut = true;
                break;
            }
            scanned += 1;
            if budget.keep(class_of(&tenant)) {
                out.cells.push(RefusalCell { tenant, code, n: n.unwrap_or(0) });
            }
        }
        out.dropped = budget.dropped;
        Ok(out)
    }
}
