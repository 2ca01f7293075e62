//! The database's own count of the requests a keyspace was sent (Cassandra's
//! `system_views` coordinator latency tables): what a benchmark divides by its jobs to
//! report store requests per job. Not used on any job's path.

use super::{q, Store, StoreError};

/// Requests the coordinator served for one keyspace since the database started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Single-partition reads.
    pub reads: i64,
    /// Writes (a batch counts once).
    pub writes: i64,
    /// Range reads (scans).
    pub scans: i64,
}

impl RequestCounts {
    /// What was served between `earlier` and `self` (never negative: a restart in
    /// between resets the database's counts, and then nothing is claimed).
    pub fn since(self, earlier: RequestCounts) -> RequestCounts {
        RequestCounts {
            reads: self.reads.saturating_sub(earlier.reads).max(0),
            writes: self.writes.saturating_sub(earlier.writes).max(0),
            scans: self.scans.saturating_sub(earlier.scans).max(0),
        }
    }
}

impl Store {
    /// This store's keyspace's request counts (`system_views`, Cassandra 4.0 and later;
    /// a database without those tables answers with an error naming them).
    pub async fn request_counts(&self) -> Result<RequestCounts, StoreError> {
        let mut counts = RequestCounts::default();
        for (table, slot) in [
            ("coordinator_read_latency", &mut counts.reads),
            ("coordinator_write_latency", &mut counts.writes),
            ("coordinator_scan_latency", &mut counts.scans),
        ] {
            let cql = format!("SELECT count FROM system_views.{table} WHERE keyspace_name = ? ALLOW FILTERING");
            let res = self
                .session()
                .query_unpaged(cql, (self.keyspace(),))
                .await
                .map_err(q("read system_views request counts"))?;
            let rows = res.into_rows_result().map_err(q("read system_views request counts"))?;
            for row in rows.rows::<(Option<i64>,)>().map_err(q("system_views request counts"))? {
                let (n,) = row.map_err(q("system_views request count"))?;
                *slot = slot.saturating_add(n.unwrap_or(0));
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::RequestCounts;

    #[test]
    fn counts_since_an_earlier_reading_never_go_negative() {
        let before = RequestCounts { reads: 10, writes: 20, scans: 3 };
        let after = RequestCounts { reads: 15, writes: 50, scans: 3 };
        assert_eq!(after.since(before), RequestCounts { reads: 5, writes: 30, scans: 0 });
        // The database restarted in between: its counts began again.
        assert_eq!(before.since(after), RequestCounts { reads: 0, writes: 0, scans: 0 });
    }
}
