//! Statements of tenant-facing alerts (rules `core::alerts`; evaluated in `crate::ledger`,
//! delivered by `watch::alerts`): every alert per tenant (`tenant_alerts`, TTL'd), and the
//! alerts open or with a delivery unfinished (`tenant_alerts_open`, one store partition
//! per deployment: at most three rows per tracked tenant).

use super::{prepare_statement, q, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// Most alerts one read of a tenant's history returns.
pub const MAX_RECENT: i32 = 200;
/// Most open rows one read of a tenant's open alerts returns (a tenant's limit alerts
/// are bounded by its codes: 64 per hour, `core::refusals`).
pub const MAX_OPEN_OF_TENANT: i32 = 256;

/// One alert as stored and shown.
#[derive(Clone, Debug, PartialEq, serde::Serialize, scylla::DeserializeRow)]
pub struct AlertRow {
    pub tenant: String,
    pub alert_id: String,
    pub rule: String,
    pub opened_at: Millis,
    pub resolved_at: Option<Millis>,
    pub value: f64,
    pub threshold: f64,
}

/// An open row: the alert and whether its opening was delivered.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenAlert {
    pub alert: AlertRow,
    pub opened_sent: bool,
}

#[derive(Clone)]
pub struct AlertStatements {
    session: Arc<Session>,
    scope: String,
    put_alert: PreparedStatement,
    put_open: PreparedStatement,
    resolve_open: PreparedStatement,
    opened_sent: PreparedStatement,
    delete_open: PreparedStatement,
    open: PreparedStatement,
    open_of_tenant: PreparedStatement,
    recent: PreparedStatement,
}

const COLUMNS: &str = "tenant, alert_id, rule, opened_at, resolved_at, value, threshold";

impl Store {
    /// Prepares the alerts' statements.
    pub async fn alert_statements(&self) -> Result<AlertStatements, StoreError> {
        let ks = &self.keyspace;
        let s = &self.session;
        let prep = |cql: String, what: &'static str| prepare_statement(s, cql, what, false);
        let mut open = prep(
            format!("SELECT {COLUMNS}, opened_sent FROM {ks}.tenant_alerts_open WHERE scope = ?"),
            "prepare read open alerts",
        )
        .await?;
        open.set_page_size(1000);
        Ok(AlertStatements {
            session: s.clone(),
            scope: self.scope.clone(),
            put_alert: prep(
                format!("INSERT INTO {ks}.tenant_alerts (scope, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"),
                "prepare put alert",
            )
            .await?,
            put_open: prep(
                format!(
                    "INSERT INTO {ks}.tenant_alerts_open (scope, {COLUMNS}, opened_sent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, false)"
                ),
                "prepare put open alert",
            )
            .await?,
            resolve_open: prep(
                format!("UPDATE {ks}.tenant_alerts_open SET resolved_at = ? WHERE scope = ? AND tenant = ? AND rule = ?"),
                "prepare resolve open alert",
            )
            .await?,
            opened_sent: prep(
                format!("UPDATE {ks}.tenant_alerts_open SET opened_sent = true WHERE scope = ? AND tenant = ? AND rule = ?"),
                "prepare mark alert opening sent",
            )
            .await?,
            delete_open: prep(
                format!("DELETE FROM {ks}.tenant_alerts_open WHERE scope = ? AND tenant = ? AND rule = ?"),
                "prepare delete open alert",
            )
            .await?,
            open,
            open_of_tenant: prep(
                format!("SELECT {COLUMNS} FROM {ks}.tenant_alerts_open WHERE scope = ? AND tenant = ? LIMIT ?"),
                "prepare read a tenant's open alerts",
            )
            .await?,
            recent: prep(
                format!("SELECT {COLUMNS} FROM {ks}.tenant_alerts WHERE scope = ? AND tenant = ? LIMIT ?"),
                "prepare read alerts",
            )
            .await?,
        })
    }
}

impl AlertStatements {
    /// An alert opened: its history row (kept `ttl_secs`) and its open row.
    pub async fn opened(&self, a: &AlertRow, ttl_secs: i32) -> Result<(), StoreError> {
        self.put_history(a, ttl_secs).await?;
        let v = (&self.scope, &a.tenant, &a.alert_id, &a.rule, a.opened_at, a.resolved_at, a.value, a.threshold);
        self.session.execute_unpaged(&self.put_open, v).await.map_err(q("write open alert"))?;
        Ok(())
    }

    /// An alert resolved: its history row, and its open row waits for the delivery.
    pub async fn resolved(&self, a: &AlertRow, ttl_secs: i32) -> Result<(), StoreError> {
        self.put_history(a, ttl_secs).await?;
        let v = (a.resolved_at, &self.scope, &a.tenant, &a.rule);
        self.session.execute_unpaged(&self.resolve_open, v).await.map_err(q("resolve open alert"))?;
        Ok(())
    }

    async fn put_history(&self, a: &AlertRow, ttl_secs: i32) -> Result<(), StoreError> {
        let v =
            (&self.scope, &a.tenant, &a.alert_id, &a.rule, a.opened_at, a.resolved_at, a.value, a.threshold, ttl_secs);
        self.session.execute_unpaged(&self.put_alert, v).await.map_err(q("write alert"))?;
        Ok(())
    }

    /// The opening of the tenant's open `rule` alert was delivered (or given up).
    pub async fn opened_sent(&self, tenant: &str, rule: &str) -> Result<(), StoreError> {
        let v = (&self.scope, tenant, rule);
        self.session.execute_unpaged(&self.opened_sent, v).await.map_err(q("mark alert opening sent"))?;
        Ok(())
    }

    /// The resolution was delivered (or given up): the open row goes.
    pub async fn forget_open(&self, tenant: &str, rule: &str) -> Result<(), StoreError> {
        let v = (&self.scope, tenant, rule);
        self.session.execute_unpaged(&self.delete_open, v).await.map_err(q("delete open alert"))?;
        Ok(())
    }

    /// Every open row of the deployment.
    pub async fn open(&self) -> Result<Vec<OpenAlert>, StoreError> {
        use futures::TryStreamExt;
        let what = "read open alerts";
        let pager = self.session.execute_iter(self.open.clone(), (&self.scope,)).await.map_err(q(what))?;
        type Row = (String, String, String, Millis, Option<Millis>, f64, f64, Option<bool>);
        let mut rows = pager.rows_stream::<Row>().map_err(q(what))?;
        let mut out = Vec::new();
        while let Some((tenant, alert_id, rule, opened_at, resolved_at, value, threshold, sent)) =
            rows.try_next().await.map_err(q(what))?
        {
            let alert = AlertRow { tenant, alert_id, rule, opened_at, resolved_at, value, threshold };
            out.push(OpenAlert { alert, opened_sent: sent.unwrap_or(false) });
        }
        Ok(out)
    }

    /// A tenant's open rows (open alerts, and resolved ones whose resolution is still
    /// being delivered), at most [`MAX_OPEN_OF_TENANT`].
    pub async fn open_of(&self, tenant: &str) -> Result<Vec<AlertRow>, StoreError> {
        let what = "read a tenant's open alerts";
        let v = (&self.scope, tenant, MAX_OPEN_OF_TENANT);
        let res = self.session.execute_unpaged(&self.open_of_tenant, v).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        rows.rows::<AlertRow>().map_err(q(what))?.map(|r| r.map_err(q(what))).collect()
    }

    /// A tenant's alerts, newest first (at most [`MAX_RECENT`]).
    pub async fn recent(&self, tenant: &str) -> Result<Vec<AlertRow>, StoreError> {
        let what = "read alerts";
        let res =
            self.session.execute_unpaged(&self.recent, (&self.scope, tenant, MAX_RECENT)).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        rows.rows::<AlertRow>().map_err(q(what))?.map(|r| r.map_err(q(what))).collect()
    }
}
