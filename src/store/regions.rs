//! A deployment's region state (`region_states`, one row per deployment): what
//! `fairway region up|draining|down` writes and every API process polls
//! (`api::regions`). No row: the region is up.

use super::{q, Store, StoreError};
use crate::core::regions::RegionState;

/// The region's state as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionStateRow {
    pub state: RegionState,
    /// `Retry-After` for refused clients; None: the config's `region.retry_after_secs`.
    pub retry_after_secs: Option<u64>,
    /// Why, as the operator said it (shown in 503 bodies and `/readyz`).
    pub reason: Option<String>,
    /// When it was set (epoch ms).
    pub at: Option<i64>,
}

impl Store {
    /// This deployment's region state (up when never set).
    pub async fn region_state(&self) -> Result<RegionStateRow, StoreError> {
        let cql =
            format!("SELECT state, retry_after_secs, reason, at FROM {}.region_states WHERE scope = ?", self.keyspace);
        let res = self.session.query_unpaged(cql, (self.scope.as_str(),)).await.map_err(q("read region state"))?;
        let rows = res.into_rows_result().map_err(q("read region state"))?;
        type Row = (Option<String>, Option<i32>, Option<String>, Option<i64>);
        let Some((state, retry, reason, at)) = rows.maybe_first_row::<Row>().map_err(q("read region state"))? else {
            return Ok(RegionStateRow::default());
        };
        let state = match state.as_deref() {
            None => RegionState::Up,
            Some(s) => {
                RegionState::parse(s).map_err(|message| StoreError::Query { what: "read region state", message })?
            }
        };
        let retry_after_secs = retry.and_then(|r| u64::try_from(r).ok());
        Ok(RegionStateRow { state, retry_after_secs, reason, at })
    }

    /// Sets this deployment's region state (the whole row: unset fields are cleared).
    pub async fn set_region_state(&self, row: &RegionStateRow) -> Result<(), StoreError> {
        let cql = format!(
            "INSERT INTO {}.region_states (scope, state, retry_after_secs, reason, at) VALUES (?, ?, ?, ?, ?)",
            self.keyspace
        );
        let retry = row.retry_after_secs.map(|r| r.min(i32::MAX as u64) as i32);
        let values = (self.scope.as_str(), row.state.as_str(), retry, row.reason.as_deref(), row.at);
        self.session.query_unpaged(cql, values).await.map_err(q("write region state"))?;
        Ok(())
    }
}
