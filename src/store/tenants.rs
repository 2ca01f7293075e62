//! The tenants registry's rows (see `crate::tenants`): one row per tenant in the
//! deployment's partition of `tenants` (keyed by the topic prefix, so deployments sharing
//! a keyspace keep their own tenants), and a counter per deployment in
//! `registry_versions` that every change bumps: processes poll the counter (one small
//! read) and reload the rows only when it moved.

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::core::scheduler::Tier;
use crate::core::tenants::TenantRecord;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const COLUMNS: &str =
    "name, tier, weight, max_concurrency, rate_per_sec, reserved_slots, max_queued, suspended, labels";

/// Statements of the tenants registry ([`Store::tenant_statements`]).
#[derive(Clone)]
pub struct TenantStatements {
    session: Arc<Session>,
    scope: String,
    put: PreparedStatement,
    add: PreparedStatement,
    delete: PreparedStatement,
    list: PreparedStatement,
    bump: PreparedStatement,
    version: PreparedStatement,
}

type Row = (
    String,
    Option<String>,
    Option<f64>,
    Option<i32>,
    Option<i32>,
    Option<i32>,
    Option<i32>,
    Option<bool>,
    Option<HashMap<String, String>>,
);

fn to_record(r: Row) -> Result<TenantRecord, StoreError> {
    let (name, tier, weight, max_concurrency, rate, reserved, max_queued, suspended, labels) = r;
    let tier: Tier = match tier.as_deref() {
        Some(t) => serde_json::from_value(serde_json::Value::String(t.to_string())).map_err(|_| StoreError::Query {
            what: "read tenants",
            message: format!("tenant {name} has an unknown tier {t:?}"),
        })?,
        None => Tier::Free,
    };
    let count = |v: Option<i32>| v.and_then(|v| usize::try_from(v).ok());
    Ok(TenantRecord {
        tier,
        weight,
        max_concurrency: count(max_concurrency),
        rate_per_sec: rate.and_then(|v| u32::try_from(v).ok()),
        reserved_slots: count(reserved).unwrap_or(0),
        max_queued: count(max_queued),
        suspended: suspended.unwrap_or(false),
        labels: labels.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>(),
        ..TenantRecord::new(&name, tier)
    })
}

fn int(v: Option<usize>) -> Option<i32> {
    v.map(|v| v.min(i32::MAX as usize) as i32)
}

impl Store {
    pub async fn tenant_statements(&self) -> Result<TenantStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        let values = "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?";
        Ok(TenantStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            put: prep(
                format!("INSERT INTO {ks}.tenants (scope, {COLUMNS}, updated_at) VALUES ({values})"),
                "prepare put tenant",
                false,
            )
            .await?,
            add: prep(
                format!("INSERT INTO {ks}.tenants (scope, {COLUMNS}, updated_at) VALUES ({values}) IF NOT EXISTS"),
                "prepare add tenant",
                true,
            )
            .await?,
            delete: prep(
                format!("DELETE FROM {ks}.tenants WHERE scope = ? AND name = ?"),
                "prepare delete tenant",
                false,
            )
            .await?,
            list: {
                let mut p =
                    prep(format!("SELECT {COLUMNS} FROM {ks}.tenants WHERE scope = ?"), "prepare list tenants", false)
                        .await?;
                p.set_page_size(5000);
                p
            },
            bump: prep(
                format!("UPDATE {ks}.registry_versions SET version = version + 1 WHERE scope = ?"),
                "prepare bump registry version",
                false,
            )
            .await?,
            version: prep(
                format!("SELECT version FROM {ks}.registry_versions WHERE scope = ?"),
                "prepare read registry version",
                false,
            )
            .await?,
        })
    }
}

impl TenantStatements {
    fn values<'a>(&'a self, t: &'a TenantRecord, now: i64) -> impl scylla::serialize::row::SerializeRow + 'a {
        (
            self.scope.as_str(),
            t.name.as_str(),
            t.tier.as_str(),
            t.weight,
            int(t.max_concurrency),
            t.rate_per_sec.map(|r| r.min(i32::MAX as u32) as i32),
            t.reserved_slots.min(i32::MAX as usize) as i32,
            int(t.max_queued),
            t.suspended,
            t.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<String, String>>(),
            now,
        )
    }

    /// Writes a tenant (insert or replace), then bumps the registry version.
    pub async fn put(&self, t: &TenantRecord, now: i64) -> Result<(), StoreError> {
        self.session.execute_unpaged(&self.put, self.values(t, now)).await.map_err(q("put tenant"))?;
        self.bump().await
    }

    /// Adds a tenant unless one of that name exists; true if it was added.
    pub async fn add(&self, t: &TenantRecord, now: i64) -> Result<bool, StoreError> {
        let res = self.session.execute_unpaged(&self.add, self.values(t, now)).await.map_err(q("add tenant"))?;
        let added = applied(res)?;
        if added {
            self.bump().await?;
        }
        Ok(added)
    }

    pub async fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.session.execute_unpaged(&self.delete, (self.scope.as_str(), name)).await.map_err(q("remove tenant"))?;
        self.bump().await
    }

    /// Every tenant of the deployment (paged).
    pub async fn list(&self) -> Result<BTreeMap<String, TenantRecord>, StoreError> {
        use futures::TryStreamExt;
        let pager =
            self.session.execute_iter(self.list.clone(), (self.scope.as_str(),)).await.map_err(q("list tenants"))?;
        let mut rows = pager.rows_stream::<Row>().map_err(q("list tenants"))?;
        let mut out = BTreeMap::new();
        while let Some(r) = rows.try_next().await.map_err(q("list tenants"))? {
            let t = to_record(r)?;
            out.insert(t.name.clone(), t);
        }
        Ok(out)
    }

    async fn bump(&self) -> Result<(), StoreError> {
        self.session.execute_unpaged(&self.bump, (self.scope.as_str(),)).await.map_err(q("bump registry version"))?;
        Ok(())
    }

    /// The registry's version (0 before the first change).
    pub async fn version(&self) -> Result<i64, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.version, (self.scope.as_str(),))
            .await
            .map_err(q("read registry version"))?;
        let rows = res.into_rows_result().map_err(q("read registry version"))?;
        let row = rows.maybe_first_row::<(Option<scylla::value::Counter>,)>().map_err(q("read registry version"))?;
        Ok(row.and_then(|(c,)| c).map(|c| c.0).unwrap_or(0))
    }
}
