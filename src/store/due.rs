//! The due index of schedules and debounce windows: one row per entry that comes due,
//! keyed by ((scope, kind, minute bucket), due_at, tenant, name, rev), and one marker
//! per bucket that may hold rows (`due_buckets`). The promoter's leader reads only the
//! buckets up to now and, in them, only the rows due by now: what it reads grows with
//! what is due, not with how many schedules and windows exist.
//!
//! An entry's main row (`tenant_schedules`, `tenant_debounces`) is the truth; the index
//! only says where to look. Writers put the new index row (marker first) before they
//! change the main row and drop the old one after, so a main row that comes due always
//! has an index row unless a write failed between the two; the leader's slow sweep
//! (`worker::schedules`) writes index rows again for main rows overdue by a minute. An
//! index row the leader finds not matching its main row (moved, paused, closed, removed)
//! is dropped once it is older than [`STALE_AFTER_MS`] (a writer's three statements
//! finish well within it).

use super::{prepare_statement, q, read_paged, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// Index buckets are minutes.
pub const BUCKET_MS: Millis = 60_000;

/// An index row not matching its main row is dropped once it was written this long ago.
pub const STALE_AFTER_MS: Millis = 60_000;

/// Most buckets one read looks at.
const BUCKETS_PER_READ: usize = 1_000;

/// What an index entry points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueKind {
    Schedule,
    Debounce,
}

impl DueKind {
    fn as_str(self) -> &'static str {
        match self {
            DueKind::Schedule => "schedule",
            DueKind::Debounce => "debounce",
        }
    }
}

/// One index row: the (tenant, name) whose main row says it is due at `due_at`, with
/// the main row's revision where it has one (debounce windows; "" for schedules).
#[derive(Debug, Clone, PartialEq)]
pub struct DueEntry {
    pub tenant: String,
    pub name: String,
    pub due_at: Millis,
    pub rev: String,
    pub written_at: Millis,
}

impl DueEntry {
    pub fn new(tenant: &str, name: &str, due_at: Millis, rev: &str, now: Millis) -> DueEntry {
        DueEntry { tenant: tenant.into(), name: name.into(), due_at, rev: rev.into(), written_at: now }
    }

    /// Whether a non-matching entry may be dropped at `now`.
    pub fn stale_at(&self, now: Millis) -> bool {
        self.written_at < now - STALE_AFTER_MS
    }
}

fn bucket(at: Millis) -> i64 {
    at.div_euclid(BUCKET_MS)
}

/// Statements of the due index ([`Store::due_index`]).
#[derive(Clone)]
pub struct DueIndex {
    session: Arc<Session>,
    scope: String,
    kind: DueKind,
    mark: PreparedStatement,
    unmark: PreparedStatement,
    buckets: PreparedStatement,
    put: PreparedStatement,
    drop: PreparedStatement,
    in_bucket: PreparedStatement,
}

impl Store {
    /// The due index of one kind of entry.
    pub async fn due_index(&self, kind: DueKind) -> Result<DueIndex, StoreError> {
        let ks = self.keyspace();
        let s = &self.session;
        let bucket_key = "WHERE scope = ? AND kind = ? AND bucket";
        let row_key =
            "WHERE scope = ? AND kind = ? AND bucket = ? AND due_at = ? AND tenant = ? AND name = ? AND rev = ?";
        let mut buckets = prepare_statement(
            s,
            format!("SELECT bucket FROM {ks}.due_buckets {bucket_key} >= ? AND bucket <= ?"),
            "prepare due buckets",
            false,
        )
        .await?;
        buckets.set_page_size(BUCKETS_PER_READ as i32);
        let mut in_bucket = prepare_statement(
            s,
            format!(
                "SELECT due_at, tenant, name, rev, written_at FROM {ks}.due_index {bucket_key} = ? \
                 AND due_at >= ? AND due_at <= ?"
            ),
            "prepare due entries",
            false,
        )
        .await?;
        in_bucket.set_page_size(1_000);
        Ok(DueIndex {
            session: self.session.clone(),
            scope: self.scope.clone(),
            kind,
            mark: prepare_statement(
                s,
                format!("INSERT INTO {ks}.due_buckets (scope, kind, bucket) VALUES (?, ?, ?)"),
                "prepare mark due bucket",
                false,
            )
            .await?,
            unmark: prepare_statement(
                s,
                format!("DELETE FROM {ks}.due_buckets {bucket_key} = ?"),
                "prepare unmark due bucket",
                false,
            )
            .await?,
            buckets,
            put: prepare_statement(
                s,
                format!(
                    "INSERT INTO {ks}.due_index (scope, kind, bucket, due_at, tenant, name, rev, written_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                "prepare put due entry",
                false,
            )
            .await?,
            drop: prepare_statement(
                s,
                format!("DELETE FROM {ks}.due_index {row_key}"),
                "prepare drop due entry",
                false,
            )
            .await?,
            in_bucket,
        })
    }
}

impl DueIndex {
    /// Writes an entry (its bucket's marker first).
    pub async fn put(&self, e: &DueEntry) -> Result<(), StoreError> {
        let (scope, kind, b) = (self.scope.as_str(), self.kind.as_str(), bucket(e.due_at));
        self.session.execute_unpaged(&self.mark, (scope, kind, b)).await.map_err(q("mark due bucket"))?;
        let v = (scope, kind, b, e.due_at, e.tenant.as_str(), e.name.as_str(), e.rev.as_str(), e.written_at);
        self.session.execute_unpaged(&self.put, v).await.map_err(q("put due entry"))?;
        Ok(())
    }

    /// Deletes an entry (its marker stays until the leader finds the bucket empty).
    pub async fn drop(&self, tenant: &str, name: &str, due_at: Millis, rev: &str) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), self.kind.as_str(), bucket(due_at), due_at, tenant, name, rev);
        self.session.execute_unpaged(&self.drop, v).await.map_err(q("drop due entry"))?;
        Ok(())
    }

    /// The entries due by `now` from `from` on (`None`: from the first bucket), oldest
    /// first, at most `limit`. A marker of a bucket before now's that the read covered
    /// whole and found holding nothing due is removed.
    pub async fn due(&self, now: Millis, from: Option<Millis>, limit: usize) -> Result<DueRead, StoreError> {
        let (scope, kind, now_bucket) = (self.scope.as_str(), self.kind.as_str(), bucket(now));
        let from_at = from.unwrap_or(Millis::MIN);
        let buckets: Vec<i64> = read_paged(
            &self.session,
            &self.buckets,
            (scope, kind, bucket(from_at), now_bucket),
            "read due buckets",
            BUCKETS_PER_READ,
            |(b,): (i64,)| Some(b),
        )
        .await?;
        let mut entries = Vec::new();
        for b in buckets {
            if entries.len() >= limit {
                break;
            }
            type Row = (i64, String, String, String, Option<i64>);
            let found = read_paged(
                &self.session,
                &self.in_bucket,
                (scope, kind, b, from_at, now),
                "read due entries",
                limit - entries.len(),
                |(due_at, tenant, name, rev, written_at): Row| {
                    Some(DueEntry { tenant, name, due_at, rev, written_at: written_at.unwrap_or(0) })
                },
            )
            .await?;
            let whole = b > bucket(from_at) || from.is_none();
            if found.is_empty() && whole && b < now_bucket {
                self.session.execute_unpaged(&self.unmark, (scope, kind, b)).await.map_err(q("unmark due bucket"))?;
            }
            entries.extend(found);
        }
        let stopped_at = (entries.len() >= limit).then(|| entries.last().map(|e| e.due_at)).flatten();
        Ok(DueRead { entries, stopped_at })
    }
}

/// What one read of the due index found: the entries, and where it stopped at its limit
/// (entries due from then on may be unread).
#[derive(Debug, Clone, Default)]
pub struct DueRead {
    pub entries: Vec<DueEntry>,
    pub stopped_at: Option<Millis>,
}
