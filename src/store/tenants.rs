//! The tenants registry's rows (see `crate::ops::tenants`): one row per tenant that has
//! settings of its own in the deployment's partition of `tenants` (keyed by the topic
//! prefix, so deployments sharing a keyspace keep their own tenants), a change feed per
//! deployment and minute in `tenant_changes`, and a counter per deployment in
//! `registry_versions` that every change bumps: processes poll the counter (one small
//! read) and read the feed since they last looked when it moved.
//!
//! Writes are shaped to the values present: no null and no empty collection is ever
//! bound (each would be a tombstone that every later read of the partition wades
//! through). Registrations by policy are written with a write timestamp below any
//! operator's, so one never overrides an operator's add, set or remove.

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::core::scheduler::Tier;
use crate::core::tenants::{ChangeKind, TenantChange, TenantRecord};
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::CqlValue;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The feed's bucket: one store partition per deployment and minute.
const FEED_BUCKET_MS: i64 = 60_000;
/// Feed rows live this long; a process further behind reloads every row instead.
const FEED_TTL_SECS: i64 = 3_600;
/// Most buckets one feed read spans (half the TTL); beyond it, [`TenantStatements::changes_since`] says reload.
const MAX_FEED_BUCKETS: i64 = 30;
/// Statements per registration batch (one store partition each; ~60 bytes a row).
const REGISTER_BATCH: usize = 100;
/// The write timestamp of registrations by policy: below every operator's write.
const REGISTRATION_TIMESTAMP: i64 = 1;

const COLUMNS: &str =
    "name, tier, weight, max_concurrency, rate_per_sec, reserved_slots, max_queued, suspended, labels";

/// Statements of the tenants registry ([`Store::tenant_statements`]).
#[derive(Clone)]
pub struct TenantStatements {
    session: Arc<Session>,
    keyspace: String,
    scope: String,
    /// Writes shaped to the values present, prepared once per shape (at most 2^8).
    shapes: Arc<tokio::sync::Mutex<HashMap<String, PreparedStatement>>>,
    delete: PreparedStatement,
    change: PreparedStatement,
    feed: PreparedStatement,
    list: PreparedStatement,
    exists: PreparedStatement,
    bump: PreparedStatement,
    version: PreparedStatement,
    regions: RegionStatements,
}

/// Statements of `tenant_regions`: a tenant's home and secondary region, a row only for
/// tenants with a home (written and deleted with the tenant's row).
#[derive(Clone)]
struct RegionStatements {
    put_home: PreparedStatement,
    put_both: PreparedStatement,
    delete: PreparedStatement,
    list: PreparedStatement,
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

fn int(v: usize) -> CqlValue {
    CqlValue::Int(v.min(i32::MAX as usize) as i32)
}

/// The columns a record has a value for, and the values (never a null, never an empty map).
fn cells(t: &TenantRecord, now: i64) -> (Vec<&'static str>, Vec<CqlValue>) {
    let mut cols = vec!["tier", "updated_at"];
    let mut vals = vec![CqlValue::Text(t.tier.as_str().to_string()), CqlValue::BigInt(now)];
    let mut push = |col, v| {
        cols.push(col);
        vals.push(v);
    };
    if let Some(w) = t.weight {
        push("weight", CqlValue::Double(w));
    }
    if let Some(c) = t.max_concurrency {
        push("max_concurrency", int(c));
    }
    if let Some(r) = t.rate_per_sec {
        push("rate_per_sec", int(r as usize));
    }
    if t.reserved_slots > 0 {
        push("reserved_slots", int(t.reserved_slots));
    }
    if let Some(m) = t.max_queued {
        push("max_queued", int(m));
    }
    if t.suspended {
        push("suspended", CqlValue::Boolean(true));
    }
    if !t.labels.is_empty() {
        let map = t.labels.iter().map(|(k, v)| (CqlValue::Text(k.clone()), CqlValue::Text(v.clone()))).collect();
        push("labels", CqlValue::Map(map));
    }
    (cols, vals)
}

/// How a shaped row write ends.
#[derive(Clone, Copy)]
enum Write {
    /// `IF NOT EXISTS` (an operator's add).
    IfNotExists,
    /// `USING TIMESTAMP ?` (the value bound last).
    At(i64),
}

fn text(s: &str) -> CqlValue {
    CqlValue::Text(s.to_string())
}

impl Store {
    pub async fn tenant_statements(&self) -> Result<TenantStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, false).await }
        };
        let paged = |mut p: PreparedStatement| {
            p.set_page_size(5000);
            p
        };
        Ok(TenantStatements {
            session: self.session.clone(),
            keyspace: ks.to_string(),
            scope: self.scope.clone(),
            shapes: Default::default(),
            delete: prep(
                format!("DELETE FROM {ks}.tenants USING TIMESTAMP ? WHERE scope = ? AND name = ?"),
                "prepare delete tenant",
            )
            .await?,
            change: prep(
                format!(
                    "INSERT INTO {ks}.tenant_changes (scope, bucket, at, name, change) VALUES (?, ?, ?, ?, ?) \
                     USING TTL {FEED_TTL_SECS}"
                ),
                "prepare write tenant change",
            )
            .await?,
            feed: paged(
                prep(
                    format!(
                        "SELECT at, name, change FROM {ks}.tenant_changes WHERE scope = ? AND bucket = ? AND at >= ?"
                    ),
                    "prepare read tenant changes",
                )
                .await?,
            ),
            list: paged(
                prep(format!("SELECT {COLUMNS} FROM {ks}.tenants WHERE scope = ?"), "prepare list tenants").await?,
            ),
            exists: prep(format!("SELECT name FROM {ks}.tenants WHERE scope = ? AND name = ?"), "prepare read tenant")
                .await?,
            bump: prep(
                format!("UPDATE {ks}.registry_versions SET version = version + 1 WHERE scope = ?"),
                "prepare bump registry version",
            )
            .await?,
            version: prep(
                format!("SELECT version FROM {ks}.registry_versions WHERE scope = ?"),
                "prepare read registry version",
            )
            .await?,
            regions: RegionStatements {
                put_home: prep(
                    format!(
                        "INSERT INTO {ks}.tenant_regions (scope, name, home, updated_at) VALUES (?, ?, ?, ?) \
                         USING TIMESTAMP ?"
                    ),
                    "prepare write tenant region",
                )
                .await?,
                put_both: prep(
                    format!(
                        "INSERT INTO {ks}.tenant_regions (scope, name, home, secondary, updated_at) \
                         VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
                    ),
                    "prepare write tenant region",
                )
                .await?,
                delete: prep(
                    format!("DELETE FROM {ks}.tenant_regions USING TIMESTAMP ? WHERE scope = ? AND name = ?"),
                    "prepare delete tenant region",
                )
                .await?,
                list: paged(
                    prep(
                        format!("SELECT name, home, secondary FROM {ks}.tenant_regions WHERE scope = ?"),
                        "prepare list tenant regions",
                    )
                    .await?,
                ),
            },
        })
    }
}

impl TenantStatements {
    /// The prepared row write for this set of columns, and its values.
    async fn shaped(
        &self,
        t: &TenantRecord,
        now: i64,
        how: Write,
    ) -> Result<(PreparedStatement, Vec<CqlValue>), StoreError> {
        let (cols, mut vals) = cells(t, now);
        let marks = vec!["?"; cols.len() + 2].join(", ");
        let tail = match how {
            Write::IfNotExists => "IF NOT EXISTS",
            Write::At(_) => "USING TIMESTAMP ?",
        };
        let ks = &self.keyspace;
        let cql = format!("INSERT INTO {ks}.tenants (scope, name, {}) VALUES ({marks}) {tail}", cols.join(", "));
        let mut shapes = self.shapes.lock().await;
        let stmt = match shapes.get(&cql) {
            Some(p) => p.clone(),
            None => {
                let lwt = matches!(how, Write::IfNotExists);
                let p = prepare_statement(&self.session, cql.clone(), "prepare write tenant", lwt).await?;
                shapes.insert(cql, p.clone());
                p
            }
        };
        let mut values = vec![text(&self.scope), text(&t.name)];
        values.append(&mut vals);
        if let Write::At(ts) = how {
            values.push(CqlValue::BigInt(ts));
        }
        Ok((stmt, values))
    }

    /// Writes a tenant's whole record (replacing any earlier one: a row delete just
    /// below the write's timestamp), then its feed entry, then bumps the version.
    pub async fn put(&self, t: &TenantRecord, now: i64) -> Result<(), StoreError> {
        let ts = now.saturating_mul(1000);
        let (stmt, values) = self.shaped(t, now, Write::At(ts)).await?;
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.set_consistency(Consistency::LocalQuorum);
        batch.append_statement(self.delete.clone());
        batch.append_statement(stmt);
        let delete = vec![CqlValue::BigInt(ts - 1), text(&self.scope), text(&t.name)];
        let mut rows = vec![delete.clone(), values];
        batch.append_statement(self.regions.delete.clone());
        rows.push(delete);
        if let Some((stmt, values)) = self.region_row(t, now, ts) {
            batch.append_statement(stmt);
            rows.push(values);
        }
        self.session.batch(&batch, rows).await.map_err(q("put tenant"))?;
        self.record(&[(t.name.as_str(), ChangeKind::Put(t.clone()))], now).await?;
        self.bump().await
    }

    /// The `tenant_regions` row of a tenant with a home region, written at `ts` (no null bound).
    fn region_row(&self, t: &TenantRecord, now: i64, ts: i64) -> Option<(PreparedStatement, Vec<CqlValue>)> {
        let home = t.home_region.as_deref()?;
        let mut values = vec![text(&self.scope), text(&t.name), text(home)];
        let stmt = match t.secondary_region.as_deref() {
            Some(s) => {
                values.push(text(s));
                self.regions.put_both.clone()
            }
            None => self.regions.put_home.clone(),
        };
        values.extend([CqlValue::BigInt(now), CqlValue::BigInt(ts)]);
        Some((stmt, values))
    }

    /// Adds a tenant unless one of that name exists; true if it was added.
    pub async fn add(&self, t: &TenantRecord, now: i64) -> Result<bool, StoreError> {
        let (stmt, values) = self.shaped(t, now, Write::IfNotExists).await?;
        let res = self.session.execute_unpaged(&stmt, values).await.map_err(q("add tenant"))?;
        let added = applied(res)?;
        if let Some((stmt, values)) = self.region_row(t, now, now.saturating_mul(1000)).filter(|_| added) {
            self.session.execute_unpaged(&stmt, values).await.map_err(q("add tenant region"))?;
        }
        if added {
            self.record(&[(t.name.as_str(), ChangeKind::Put(t.clone()))], now).await?;
            self.bump().await?;
        }
        Ok(added)
    }

    /// Registers tenants admitted by policy, many per store write, one version bump for
    /// all. Idempotent, and never over an operator's record: the rows are written at a
    /// timestamp below every operator's write, and the feed's `Register` entries count
    /// only where a process does not know the tenant.
    pub async fn register(&self, tenants: &[TenantRecord], now: i64) -> Result<(), StoreError> {
        if tenants.is_empty() {
            return Ok(());
        }
        for chunk in tenants.chunks(REGISTER_BATCH) {
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_consistency(Consistency::LocalQuorum);
            let mut values = Vec::with_capacity(chunk.len());
            for t in chunk {
                let (stmt, v) = self.shaped(t, now, Write::At(REGISTRATION_TIMESTAMP)).await?;
                batch.append_statement(stmt);
                values.push(v);
            }
            self.session.batch(&batch, values).await.map_err(q("register tenants"))?;
            let changes: Vec<_> = chunk.iter().map(|t| (t.name.as_str(), ChangeKind::Register(t.clone()))).collect();
            self.record(&changes, now).await?;
        }
        self.bump().await
    }

    pub async fn remove(&self, name: &str, now: i64) -> Result<(), StoreError> {
        let ts = now.saturating_mul(1000);
        let values = (ts, self.scope.as_str(), name);
        self.session.execute_unpaged(&self.delete, values).await.map_err(q("remove tenant"))?;
        self.session.execute_unpaged(&self.regions.delete, values).await.map_err(q("remove tenant region"))?;
        self.record(&[(name, ChangeKind::Removed)], now).await?;
        self.bump().await
    }

    /// Appends changes to the feed (one batch: they share the minute's partition).
    async fn record(&self, changes: &[(&str, ChangeKind)], now: i64) -> Result<(), StoreError> {
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.set_consistency(Consistency::LocalQuorum);
        let mut values = Vec::with_capacity(changes.len());
        for (name, kind) in changes {
            let json = serde_json::to_string(kind).map_err(q("write tenant change"))?;
            batch.append_statement(self.change.clone());
            values.push((self.scope.as_str(), now.div_euclid(FEED_BUCKET_MS), now, *name, json));
        }
        self.session.batch(&batch, values).await.map_err(q("write tenant change"))?;
        Ok(())
    }

    /// The feed's entries written at or after `since` (by the writers' clocks), read up to
    /// `now`'s minute; None if that spans too many minutes (the caller reloads every row).
    pub async fn changes_since(&self, since: i64, now: i64) -> Result<Option<Vec<TenantChange>>, StoreError> {
        use futures::TryStreamExt;
        let (first, last) = (since.div_euclid(FEED_BUCKET_MS), now.div_euclid(FEED_BUCKET_MS));
        if last - first >= MAX_FEED_BUCKETS {
            return Ok(None);
        }
        let mut out = Vec::new();
        for bucket in first..=last {
            let values = (self.scope.as_str(), bucket, since);
            let pager = self.session.execute_iter(self.feed.clone(), values).await.map_err(q("read tenant changes"))?;
            let mut rows = pager.rows_stream::<(i64, String, String)>().map_err(q("read tenant changes"))?;
            while let Some((at, name, change)) = rows.try_next().await.map_err(q("read tenant changes"))? {
                let kind = serde_json::from_str(&change).map_err(|e| StoreError::Query {
                    what: "read tenant changes",
                    message: format!("tenant {name}'s change at {at} is not readable ({e}); it is skipped until the next full reload"),
                })?;
                out.push(TenantChange { at, name, kind });
            }
        }
        Ok(Some(out))
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
        let pager = self
            .session
            .execute_iter(self.regions.list.clone(), (self.scope.as_str(),))
            .await
            .map_err(q("list tenant regions"))?;
        let mut rows =
            pager.rows_stream::<(String, Option<String>, Option<String>)>().map_err(q("list tenant regions"))?;
        while let Some((name, home, secondary)) = rows.try_next().await.map_err(q("list tenant regions"))? {
            if let Some(t) = out.get_mut(&name) {
                (t.home_region, t.secondary_region) = (home, secondary);
            }
        }
        Ok(out)
    }

    /// Whether `name` is registered (one keyed read, whatever the registry's size).
    pub async fn exists(&self, name: &str) -> Result<bool, StoreError> {
        let what = "read tenant";
        let res = self.session.execute_unpaged(&self.exists, (self.scope.as_str(), name)).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        Ok(rows.rows_num() > 0)
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
