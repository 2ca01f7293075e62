//! HTTP API keys (`api_keys`, per deployment = topic prefix) and the owners of jobs
//! submitted through the API (`job_owners`). Only SHA-256 hashes of key secrets are
//! stored (see `core::auth`).

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::core::auth::{Caller, KeyRecord};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// An owner row lives this long (seconds): longer than any job stays queued.
pub const JOB_OWNER_TTL_SECS: i32 = 30 * 24 * 3600;

/// One key as `fairway keys list` shows it (no hash).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRow {
    pub id: String,
    pub role: String,
    pub tenant: Option<String>,
    pub label: Option<String>,
    pub created_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

type KeyRow = (String, Option<Vec<u8>>, Option<String>, Option<String>, Option<String>, Option<i64>, Option<i64>);

/// Statements of API keys and job owners ([`Store::key_statements`]).
#[derive(Clone)]
pub struct KeyStatements {
    session: Arc<Session>,
    scope: String,
    insert: PreparedStatement,
    get: PreparedStatement,
    list: PreparedStatement,
    revoke: PreparedStatement,
    put_owner: PreparedStatement,
    get_owner: PreparedStatement,
}

const COLUMNS: &str = "key_id, hash, role, tenant, label, created_at, revoked_at";

impl Store {
    pub async fn key_statements(&self) -> Result<KeyStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, lwt).await }
        };
        Ok(KeyStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            insert: prep(
                format!(
                    "INSERT INTO {ks}.api_keys (scope, key_id, hash, role, tenant, label, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                "prepare insert api key",
                true,
            )
            .await?,
            get: prep(
                format!("SELECT {COLUMNS} FROM {ks}.api_keys WHERE scope = ? AND key_id = ?"),
                "prepare get api key",
                false,
            )
            .await?,
            list: prep(format!("SELECT {COLUMNS} FROM {ks}.api_keys WHERE scope = ?"), "prepare list api keys", false)
                .await?,
            revoke: prep(
                // Not `IF EXISTS` (Cassandra 2.1.0 lacks it): `revoke` reads first, and
                // keys are never deleted, so the row cannot vanish in between.
                format!("UPDATE {ks}.api_keys SET revoked_at = ? WHERE scope = ? AND key_id = ?"),
                "prepare revoke api key",
                false,
            )
            .await?,
            put_owner: prep(
                format!("INSERT INTO {ks}.job_owners (job_id, tenant) VALUES (?, ?) USING TTL ?"),
                "prepare put job owner",
                false,
            )
            .await?,
            get_owner: prep(
                format!("SELECT tenant FROM {ks}.job_owners WHERE job_id = ?"),
                "prepare get job owner",
                false,
            )
            .await?,
        })
    }
}

impl KeyStatements {
    /// Stores a new key's hash; false if the id is taken (draw another).
    pub async fn insert(
        &self,
        id: &str,
        hash: &[u8],
        caller: &Caller,
        label: Option<&str>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.insert, (self.scope.as_str(), id, hash, caller.role(), caller.tenant(), label, now))
            .await
            .map_err(q("insert api key"))?;
        applied(res)
    }

    /// The key `id` as far as checking it goes (None: no such key).
    pub async fn get(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        let res = self.session.execute_unpaged(&self.get, (self.scope.as_str(), id)).await.map_err(q("get api key"))?;
        let rows = res.into_rows_result().map_err(q("get api key"))?;
        let row = rows.maybe_first_row::<KeyRow>().map_err(q("get api key"))?;
        Ok(row.map(|(id, hash, role, tenant, _, _, revoked_at)| KeyRecord {
            id,
            hash: hash.unwrap_or_default(),
            caller: Caller::from_role(role.as_deref().unwrap_or(""), tenant.as_deref()),
            revoked: revoked_at.is_some(),
        }))
    }

    /// Every key of the deployment, without hashes.
    pub async fn list(&self) -> Result<Vec<ApiKeyRow>, StoreError> {
        use futures::TryStreamExt;
        let pager =
            self.session.execute_iter(self.list.clone(), (self.scope.as_str(),)).await.map_err(q("list api keys"))?;
        let mut rows = pager.rows_stream::<KeyRow>().map_err(q("list api keys"))?;
        let mut out = Vec::new();
        while let Some((id, _, role, tenant, label, created_at, revoked_at)) =
            rows.try_next().await.map_err(q("list api keys"))?
        {
            out.push(ApiKeyRow { id, role: role.unwrap_or_default(), tenant, label, created_at, revoked_at });
        }
        Ok(out)
    }

    /// Marks a key revoked; false if there is no such key.
    pub async fn revoke(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        if self.get(id).await?.is_none() {
            return Ok(false);
        }
        self.session
            .execute_unpaged(&self.revoke, (now, self.scope.as_str(), id))
            .await
            .map_err(q("revoke api key"))?;
        Ok(true)
    }

    /// Records that `tenant` submitted `job_id` through the API.
    pub async fn put_owner(&self, job_id: &str, tenant: &str) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.put_owner, (job_id, tenant, JOB_OWNER_TTL_SECS))
            .await
            .map_err(q("put job owner"))?;
        Ok(())
    }

    /// The tenant that submitted `job_id` through the API, if recorded.
    pub async fn owner(&self, job_id: &str) -> Result<Option<String>, StoreError> {
        let res = self.session.execute_unpaged(&self.get_owner, (job_id,)).await.map_err(q("get job owner"))?;
        let rows = res.into_rows_result().map_err(q("get job owner"))?;
        Ok(rows.maybe_first_row::<(Option<String>,)>().map_err(q("get job owner"))?.and_then(|r| r.0))
    }
}
