//! Disaster recovery's statements (`ops::backup`): whole tables read row by row as JSON
//! (`SELECT JSON`, paged: memory stays one page) and written back the same way
//! (`INSERT ... JSON`), so a table added later needs no code here, only its role in
//! `core::dr::TABLES`; and the restore's bookkeeping (`restores`), which makes a second
//! restore of the same backup change nothing.

use super::{q, Store, StoreError};
use futures::TryStreamExt;

/// Rows per page of a table dump.
const DUMP_PAGE: i32 = 500;
/// Inserts in flight at once during a restore.
const INSERTS_IN_FLIGHT: usize = 32;

impl Store {
    /// Every row of `table` as one JSON object (CQL's `SELECT JSON`: blobs as `0x…` hex),
    /// passed to `each` in turn; returns how many. `each`'s error stops the dump.
    pub async fn dump_table(
        &self,
        table: &str,
        mut each: impl FnMut(String) -> Result<(), String>,
    ) -> Result<u64, StoreError> {
        let selected = match crate::core::dr::ttl_column(table) {
            None => "*".to_string(),
            Some(ttl) => {
                let mut columns = self.columns(table).await?;
                columns.push(format!("ttl({ttl}) AS \"{}\"", crate::core::dr::TTL_KEY));
                columns.join(", ")
            }
        };
        let cql = format!("SELECT JSON {selected} FROM {}.{table}", self.keyspace);
        let mut stmt = scylla::statement::unprepared::Statement::new(cql);
        stmt.set_page_size(DUMP_PAGE);
        let pager = self.session.query_iter(stmt, ()).await.map_err(q("dump table"))?;
        let mut rows = pager.rows_stream::<(String,)>().map_err(q("dump table"))?;
        let mut n = 0;
        while let Some((json,)) = rows.try_next().await.map_err(q("dump table"))? {
            each(json)
                .map_err(|message| StoreError::Query { what: "dump table", message: format!("{table}: {message}") })?;
            n += 1;
        }
        Ok(n)
    }

    /// The columns of `table` (quoted), from the schema tables.
    async fn columns(&self, table: &str) -> Result<Vec<String>, StoreError> {
        let cql = "SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?";
        let res = self.session.query_unpaged(cql, (self.keyspace.as_str(), table)).await.map_err(q("read columns"))?;
        let rows = res.into_rows_result().map_err(q("read columns"))?;
        let names = rows.rows::<(String,)>().map_err(q("read columns"))?;
        names.map(|r| r.map(|(c,)| format!("\"{c}\"")).map_err(q("read columns"))).collect()
    }

    /// Writes `rows` (JSON objects as [`Store::dump_table`] gave them, with their
    /// remaining TTL if they carry one: `core::dr::split_ttl`) into `table`,
    /// [`INSERTS_IN_FLIGHT`] at a time. Idempotent: a row written twice is the same row.
    pub async fn insert_json_rows(&self, table: &str, rows: &[(String, Option<i32>)]) -> Result<(), StoreError> {
        let ks = &self.keyspace;
        // The name is checked against the schema's tables (`core::dr::Manifest::check_contents`)
        // and quoted: an archive's text never becomes CQL.
        let table = format!("\"{}\"", table.replace('"', "\"\""));
        let plain = self
            .session
            .prepare(format!("INSERT INTO {ks}.{table} JSON ?"))
            .await
            .map_err(q("prepare restore insert"))?;
        let ttl = self
            .session
            .prepare(format!("INSERT INTO {ks}.{table} JSON ? USING TTL ?"))
            .await
            .map_err(q("prepare restore insert"))?;
        for chunk in rows.chunks(INSERTS_IN_FLIGHT) {
            let writes = chunk.iter().map(|(row, left)| async {
                match left {
                    Some(left) => self.session.execute_unpaged(&ttl, (row.as_str(), *left)).await,
                    None => self.session.execute_unpaged(&plain, (row.as_str(),)).await,
                }
            });
            for r in futures::future::join_all(writes).await {
                r.map_err(|e| StoreError::Query { what: "restore insert", message: format!("{table}: {e}") })?;
            }
        }
        Ok(())
    }

    /// Whether `table` holds any row (a restore refuses a keyspace that is not empty).
    pub async fn has_rows(&self, table: &str) -> Result<bool, StoreError> {
        let cql = format!("SELECT * FROM {}.{table} LIMIT 1", self.keyspace);
        let res = self.session.query_unpaged(cql, ()).await.map_err(q("probe table"))?;
        Ok(res.into_rows_result().map_err(q("probe table"))?.rows_num() > 0)
    }

    /// The steps of restoring `backup_id` already done here.
    pub async fn restore_steps(&self, backup_id: &str) -> Result<Vec<String>, StoreError> {
        let cql = format!("SELECT step FROM {}.restores WHERE backup_id = ?", self.keyspace);
        let res = self.session.query_unpaged(cql, (backup_id,)).await.map_err(q("read restore steps"))?;
        let rows = res.into_rows_result().map_err(q("read restore steps"))?;
        let steps = rows.rows::<(String,)>().map_err(q("read restore steps"))?;
        steps.map(|r| r.map(|(s,)| s).map_err(q("read restore steps"))).collect()
    }

    /// Records a step of restoring `backup_id` as done.
    pub async fn restore_step_done(&self, backup_id: &str, step: &str, at: i64) -> Result<(), StoreError> {
        let cql = format!("INSERT INTO {}.restores (backup_id, step, at) VALUES (?, ?, ?)", self.keyspace);
        self.session.query_unpaged(cql, (backup_id, step, at)).await.map_err(q("record restore step"))?;
        Ok(())
    }

    /// Every backup ever restored into this keyspace.
    pub async fn restored_backups(&self) -> Result<Vec<String>, StoreError> {
        let cql = format!("SELECT DISTINCT backup_id FROM {}.restores", self.keyspace);
        let res = self.session.query_unpaged(cql, ()).await.map_err(q("read restores"))?;
        let rows = res.into_rows_result().map_err(q("read restores"))?;
        let ids = rows.rows::<(String,)>().map_err(q("read restores"))?;
        ids.map(|r| r.map(|(s,)| s).map_err(q("read restores"))).collect()
    }
}
