//! The ScyllaDB edge: the only module that imports the `scylla` driver. It owns the
//! keyspace's schema and every statement fairway runs. The CQL stays inside what both
//! ScyllaDB and Apache Cassandra 2.1 accept (no date/time types, JSON, GROUP BY, MVs),
//! so the same code runs against production ScyllaDB and the local test database.

mod admission;
mod alerts;
mod backlog;
mod classifier;
mod coalesce;
#[cfg(test)]
pub(crate) use coalesce::FINISHED_GATHER_MAX;
mod debounce;
mod dependencies;
mod dr;
mod due;
mod events;
mod keys;
mod ledger;
mod parked;
mod quota;
mod reach;
mod refusals;
mod regions;
mod requests;
mod rerun;
mod schedules;
mod schema;
mod seam;
mod slots;
mod tenants;
mod tls;

use crate::config::Config;
use crate::core::finished;
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use std::sync::Arc;

pub use admission::{AdmissionStatements, OutcomeCell};
pub use alerts::{AlertRow, AlertStatements, OpenAlert, MAX_RECENT as MAX_RECENT_ALERTS};
pub use backlog::{BacklogKey, BacklogStatements};
pub use classifier::{ClassRow, ClassifierStatements, RunTimeCell};
pub use debounce::{DebounceDue, DebounceRow, DebounceStatements};
pub use dependencies::{DependencyRow, DependencyStatements};
pub use due::{DueEntry, DueIndex, DueKind, DueRead};
pub use events::{EventStatements, IdempotencyClaim, Submitted as SubmittedRow, HISTORY_LIMIT};
pub use keys::{ApiKeyRow, KeyStatements};
pub use ledger::{LedgerPosition, LedgerReadError, LedgerStatements};
pub use quota::QuotaStatements;
pub use reach::{open_waiting, Waiting};
pub use refusals::{HourRead, RefusalCell, RefusalStatements};
pub use regions::RegionStateRow;
pub use requests::RequestCounts;
pub use rerun::{JobFacts, RerunStatements, FACTS_CHUNK};
pub use schedules::{ScheduleCursor, ScheduleRow, ScheduleStatements};
pub use schema::TABLES;
pub use slots::{contended, contention_pause, Claimed, Slot, SlotKind, Slots, LWT_TRIES};
pub use tenants::TenantStatements;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("cannot connect to the CQL database at {contact_points}: {message} (is it running? `scripts/services up` starts the local one)")]
    Connect { contact_points: String, message: String },
    /// The database does not answer (down, restarting, not yet started): this heals, so a
    /// long-running process waits for it at its start (`store::reach`).
    #[error("the CQL database at {contact_points} does not answer: {message} (is it running? `scripts/services up` starts the local one)")]
    Unreachable { contact_points: String, message: String },
    #[error("CQL statement failed ({what}): {message}")]
    Query { what: &'static str, message: String },
    #[error("{0}")]
    Config(String),
    #[error("checkpoint for job {job_id} is {size} bytes, above the {limit}-byte limit; save less state (e.g. a cursor, not the data)")]
    CheckpointTooLarge { job_id: String, size: usize, limit: usize },
}

/// Maps any driver error (execution, rows, deserialisation) to a query error naming `what`.
fn q<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Query { what, message: e.to_string() }
}

/// A statement could not be prepared. No node answering heals
/// ([`StoreError::Unreachable`]: a process's start waits for it, `store::reach`); a
/// keyspace from an older fairway lacks newer tables (or there is no keyspace yet): say
/// how to fix it.
fn prepare_failed(session: &Session, what: &'static str, e: scylla::errors::PrepareError) -> StoreError {
    let message = e.to_string();
    if reach::prepare_heals(&e) {
        let nodes =
            session.get_cluster_state().get_nodes_info().iter().map(|n| n.address.to_string()).collect::<Vec<_>>();
        return StoreError::Unreachable {
            contact_points: format!(
                "{} (its nodes as the cluster names them, before scylla.address_map)",
                nodes.join(",")
            ),
            message: format!("{what}: no node answered: {message}"),
        };
    }
    let hint = if message.contains("unconfigured") || message.contains("does not exist") {
        "; run `fairway init` to create what is missing (it never touches what exists)"
    } else {
        ""
    };
    StoreError::Query { what, message: format!("{message}{hint}") }
}

/// Prepares a statement at LOCAL_QUORUM (with SERIAL for lightweight transactions),
/// explaining a failure (`prepare_failed`).
async fn prepare_statement(
    session: &Session,
    cql: String,
    what: &'static str,
    lwt: bool,
) -> Result<PreparedStatement, StoreError> {
    let mut p = session.prepare(cql).await.map_err(|e| prepare_failed(session, what, e))?;
    p.set_consistency(Consistency::LocalQuorum);
    if lwt {
        p.set_serial_consistency(Some(scylla::statement::SerialConsistency::Serial));
    }
    Ok(p)
}

/// Reads a paged statement's rows, keeping those `keep` maps to `Some`, until `limit`
/// are kept (the one paged read of every per-tenant listing: schedules, debounce windows,
/// the due index).
async fn read_paged<R, T>(
    session: &Session,
    stmt: &PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow,
    what: &'static str,
    limit: usize,
    mut keep: impl FnMut(R) -> Option<T>,
) -> Result<Vec<T>, StoreError>
where
    R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
{
    use futures::TryStreamExt;
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let pager = session.execute_iter(stmt.clone(), values).await.map_err(q(what))?;
    let mut rows = pager.rows_stream::<R>().map_err(q(what))?;
    while let Some(r) = rows.try_next().await.map_err(q(what))? {
        if let Some(t) = keep(r) {
            out.push(t);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// What the store knows about one job.
#[derive(Debug, Clone, Default, PartialEq, scylla::DeserializeRow)]
pub struct JobRow {
    pub job_id: String,
    pub tenant: Option<String>,
    pub job_type: Option<String>,
    pub pool: Option<String>,
    pub status: Option<String>,
    pub attempts: Option<i32>,
    pub crash_count: Option<i32>,
    pub generation: Option<i64>,
    pub submitted_at: Option<i64>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub worker: Option<String>,
    pub error: Option<String>,
    pub failure_class: Option<String>,
    pub output: Option<Vec<u8>>,
    pub cancel_requested: Option<bool>,
    /// The last write's time (the writer's clock): orders this row against the job's
    /// finished record (`core::finished`).
    pub updated_at: Option<i64>,
    /// Process jobs: what the last attempt's process tree used (`model::ProcessUsage`).
    pub peak_memory_bytes: Option<i64>,
    pub cpu_ms: Option<i64>,
}

impl JobRow {
    /// Its submission's facts, for the history to tell its `queued` / `scheduled` event
    /// (`core::events::with_submission`); None for a row missing them.
    pub fn submitted_state(&self) -> Option<crate::core::events::SubmittedState<'_>> {
        Some(crate::core::events::SubmittedState {
            job_id: &self.job_id,
            tenant: self.tenant.as_deref()?,
            job_type: self.job_type.as_deref()?,
            generation: self.generation?,
            submitted_at: self.submitted_at?,
            status: self.status.as_deref()?,
        })
    }

    /// Terminal statuses: a redelivered job in one of these is never run again.
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_deref(), Some("succeeded" | "failed" | "cancelled" | "expired"))
    }
}

/// A terminal (or retrying) state to record for a job.
#[derive(Debug, Clone)]
pub struct StateUpdate<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub job_type: &'a str,
    pub pool: &'a str,
    pub status: &'a str,
    pub attempts: i32,
    pub crash_count: i32,
    pub generation: i64,
    pub submitted_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub worker: &'a str,
    pub error: Option<&'a str>,
    pub failure_class: Option<&'a str>,
    pub output: Option<&'a [u8]>,
    /// Process jobs: what the attempt's process tree used.
    pub usage: Option<crate::model::ProcessUsage>,
}

/// A run's own running mark, as it wrote it to the job's row (worker, attempt and crash
/// count: a take-over counts a crash, so a run taken over never matches its successor's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunMark<'a> {
    pub worker: &'a str,
    pub attempts: i32,
    pub crash_count: i32,
}

/// A job's row as a run's check read it: the worker it named and when it was last
/// written (none of either: no row). A take-over's claim and a running mark hold only
/// while the row is still that very write: a row its worker wrote again since (it took
/// its own lapsed run over, or marked another copy's run) names the same worker but is
/// another run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenRow<'a> {
    pub worker: Option<&'a str>,
    pub written_at: Option<Millis>,
}

/// Heartbeat of a running job, as read back by status, the reaper and new partition owners.
#[derive(Debug, Clone, PartialEq, scylla::DeserializeRow)]
pub struct HeartbeatRow {
    pub job_id: String,
    pub worker: Option<String>,
    pub at: Option<i64>,
    pub progress: Option<f64>,
    pub message: Option<String>,
}

struct Prepared {
    put_state: PreparedStatement,
    request_cancel: PreparedStatement,
    put_heartbeat: PreparedStatement,
    get_heartbeat: PreparedStatement,
    put_checkpoint: PreparedStatement,
    get_checkpoint: PreparedStatement,
    put_running_job: PreparedStatement,
    delete_running_job: PreparedStatement,
    list_running_jobs: PreparedStatement,
    cancel_flags: PreparedStatement,
    lease_acquire: PreparedStatement,
    lease_renew: PreparedStatement,
    lease_release: PreparedStatement,
    get_frontier: PreparedStatement,
    raise_frontier: PreparedStatement,
    put_cancellation: PreparedStatement,
    get_cancellations: PreparedStatement,
}

/// Cancellation feed entries live this long (seconds); workers read the last few minutes.
pub const CANCELLATION_TTL_SECS: i32 = 600;

/// Cancellation feed buckets are minutes.
pub fn cancellation_bucket(at: Millis) -> i64 {
    at.div_euclid(60_000)
}

/// A connected store bound to fairway's keyspace.
#[derive(Clone)]
pub struct Store {
    session: Arc<Session>,
    keyspace: String,
    prepared: Arc<Prepared>,
    parked: Arc<parked::Parked>,
    coalescer: coalesce::Coalescer,
    lookup: Arc<coalesce::Lookup>,
    /// The deployment this store serves (its topic prefix): keeps the reaper, the
    /// promoter and their leases of deployments sharing a keyspace apart.
    scope: String,
    /// TTL (seconds) of every write to a job's row: `retention.results`.
    row_ttl: i32,
}

pub const CHECKPOINT_LIMIT: usize = 1 << 20;

/// Scheduled jobs are bucketed by minute: the promoter reads one partition per minute.
pub fn schedule_bucket(at: Millis) -> i64 {
    at.div_euclid(60_000)
}

fn get_jobs_cql(ks: &str) -> String {
    format!(
        "SELECT job_id, tenant, job_type, pool, status, attempts, crash_count, generation, submitted_at, \
         started_at, finished_at, worker, error, failure_class, output, cancel_requested, updated_at, \
         peak_memory_bytes, cpu_ms FROM {ks}.jobs WHERE job_id IN ?"
    )
}

/// The `[applied]` column of an LWT result.
fn applied(res: scylla::response::query_result::QueryResult) -> Result<bool, StoreError> {
    let rows = res.into_rows_result().map_err(q("lwt"))?;
    let row = rows.maybe_first_row::<scylla::value::Row>().map_err(q("lwt"))?;
    Ok(matches!(row.and_then(|r| r.columns.into_iter().next()), Some(Some(scylla::value::CqlValue::Boolean(true)))))
}

/// `scylla.address_map` as the driver's translator (node address -> address to connect to).
fn address_map(
    map: &std::collections::BTreeMap<String, String>,
) -> Result<std::collections::HashMap<std::net::SocketAddr, std::net::SocketAddr>, StoreError> {
    let parse = |s: &str| {
        s.parse::<std::net::SocketAddr>().map_err(|_| {
            StoreError::Config(format!("scylla.address_map: {s:?} is not an ip:port address (e.g. \"10.0.0.5:9042\")"))
        })
    };
    map.iter().map(|(from, to)| Ok((parse(from)?, parse(to)?))).collect()
}

/// Opens a session (no keyspace yet): used by `init` and by `Store::open`.
pub async fn connect(cfg: &Config) -> Result<Session, StoreError> {
    let mut b = SessionBuilder::new();
    for cp in &cfg.scylla.contact_points {
        b = b.known_node(cp);
    }
    if !cfg.scylla.address_map.is_empty() {
        b = b.address_translator(std::sync::Arc::new(address_map(&cfg.scylla.address_map)?));
    }
    if let Some(user) = &cfg.scylla.username {
        b = b.user(user, cfg.scylla.password.as_ref().map(|p| p.expose()).unwrap_or(""));
    }
    if let Some(t) = &cfg.scylla.tls {
        b = b.tls_context(Some(tls::context(t)?));
    }
    b.build().await.map_err(|e| {
        let message = e.to_string();
        let (contact_points, hint) = (cfg.scylla.contact_points.join(","), tls::connect_hint(&message, cfg));
        let message = format!("{message}{hint}");
        if reach::heals(&e) {
            StoreError::Unreachable { contact_points, message }
        } else {
            StoreError::Connect { contact_points, message }
        }
    })
}

/// Creates the keyspace and tables that are missing; returns what it created.
pub async fn ensure_schema(cfg: &Config) -> Result<Vec<String>, StoreError> {
    let session = connect(cfg).await?;
    let replication = schema::replication(cfg.scylla.replication_factor, &cfg.scylla.datacenters);
    schema::ensure(&session, &cfg.scylla.keyspace, &replication).await
}

impl Store {
    /// Does the database answer? (One read of `system.local`: readiness probes and
    /// `worker::watchdog`'s probe.)
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.session.query_unpaged("SELECT key FROM system.local", &[]).await.map_err(q("ping system.local"))?;
        Ok(())
    }

    pub async fn open(cfg: &Config) -> Result<Store, StoreError> {
        let session = connect(cfg).await?;
        let ks = cfg.scylla.keyspace.clone();
        let ttl = crate::core::events::row_ttl_secs(cfg.retention.results, 0, None);
        let prep = |cql: String, what: &'static str| {
            let session = &session;
            async move { prepare_statement(session, cql, what, false).await }
        };
        let prepared = Prepared {
            put_state: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET tenant = ?, job_type = ?, pool = ?, status = ?, attempts = ?, crash_count = ?, \
                     generation = ?, submitted_at = ?, started_at = ?, finished_at = ?, worker = ?, error = ?, \
                     failure_class = ?, output = ?, peak_memory_bytes = ?, cpu_ms = ?, updated_at = ? WHERE job_id = ?"
                ),
                "prepare put_state",
            )
            .await?,
            request_cancel: prep(
                format!("UPDATE {ks}.jobs USING TTL {ttl} SET cancel_requested = true, updated_at = ? WHERE job_id = ?"),
                "prepare request_cancel",
            )
            .await?,
            put_heartbeat: prep(
                format!(
                    "INSERT INTO {ks}.heartbeats (job_id, worker, at, progress, message) VALUES (?, ?, ?, ?, ?) \
                     USING TTL ? AND TIMESTAMP ?"
                ),
                "prepare put_heartbeat",
            )
            .await?,
            get_heartbeat: prep(
                format!("SELECT job_id, worker, at, progress, message FROM {ks}.heartbeats WHERE job_id = ?"),
                "prepare get_heartbeat",
            )
            .await?,
            put_checkpoint: prep(
                format!(
                    "INSERT INTO {ks}.job_checkpoints (job_id, generation, data, at) VALUES (?, ?, ?, ?) USING TTL ?"
                ),
                "prepare put_checkpoint",
            )
            .await?,
            get_checkpoint: prep(
                format!("SELECT data FROM {ks}.job_checkpoints WHERE job_id = ? AND generation = ?"),
                "prepare get_checkpoint",
            )
            .await?,
            put_running_job: prep(
                format!(
                    "INSERT INTO {ks}.running_index (scope, pool, job_id, worker, started_at, job) VALUES (?, ?, ?, ?, ?, ?)"
                ),
                "prepare put_running_job",
            )
            .await?,
            delete_running_job: prep(
                format!("DELETE FROM {ks}.running_index WHERE scope = ? AND pool = ? AND job_id = ?"),
                "prepare delete_running_job",
            )
            .await?,
            list_running_jobs: prep(
                format!("SELECT job_id, worker, started_at, job FROM {ks}.running_index WHERE scope = ? AND pool = ?"),
                "prepare list_running_jobs",
            )
            .await?,
            get_frontier: prep(
                format!("SELECT next FROM {ks}.dispatch_frontier WHERE topic = ? AND partition = ?"),
                "prepare get_frontier",
            )
            .await?,
            raise_frontier: prep(
                format!("UPDATE {ks}.dispatch_frontier USING TIMESTAMP ? SET next = ? WHERE topic = ? AND partition = ?"),
                "prepare raise_frontier",
            )
            .await?,
            put_cancellation: prep(
                format!("INSERT INTO {ks}.cancellations (bucket, job_id, at) VALUES (?, ?, ?) USING TTL ?"),
                "prepare put_cancellation",
            )
            .await?,
            get_cancellations: prep(
                format!("SELECT job_id FROM {ks}.cancellations WHERE bucket IN ?"),
                "prepare get_cancellations",
            )
            .await?,
            cancel_flags: prep(
                format!("SELECT job_id, cancel_requested FROM {ks}.jobs WHERE job_id IN ?"),
                "prepare cancel_flags",
            )
            .await?,
            lease_acquire: prep(
                format!("INSERT INTO {ks}.leases (name, holder, expires_at) VALUES (?, ?, ?) IF NOT EXISTS USING TTL ?"),
                "prepare lease_acquire",
            )
            .await?,
            lease_renew: prep(
                // `holder` is written again so its TTL is renewed too (else it expires one TTL after
                // the lease was taken, and nobody holds it until `expires_at` lapses as well).
                format!("UPDATE {ks}.leases USING TTL ? SET holder = ?, expires_at = ? WHERE name = ? IF holder = ?"),
                "prepare lease_renew",
            )
            .await?,
            lease_release: prep(
                format!("DELETE FROM {ks}.leases WHERE name = ? IF holder = ?"),
                "prepare lease_release",
            )
            .await?,
        };
        let get_jobs = prep(get_jobs_cql(&ks), "prepare get_jobs").await?;
        let get_finished = prep(
            format!("SELECT job_id, record FROM {ks}.finished_jobs WHERE bucket = ? AND job_id IN ?"),
            "prepare get_finished",
        )
        .await?;
        let get_packs =
            prep(format!("SELECT body FROM {ks}.finished_packs WHERE bucket = ?"), "prepare get_packs").await?;
        let put_pack = prep(
            format!("INSERT INTO {ks}.finished_packs (bucket, pack, body) VALUES (?, ?, ?) USING TTL {ttl}"),
            "prepare put_pack",
        )
        .await?;
        let put_finished_row = prep(
            format!("INSERT INTO {ks}.finished_jobs (bucket, job_id, record) VALUES (?, ?, ?) USING TTL {ttl}"),
            "prepare put_finished_row",
        )
        .await?;
        let session = Arc::new(session);
        let lookup = Arc::new(coalesce::Lookup { session: session.clone(), get_jobs, get_finished, get_packs });
        let writes = coalesce::Writes { put_state: prepared.put_state.clone(), put_pack, put_finished_row };
        let coalescer = coalesce::Coalescer::start(session.clone(), writes, lookup.clone());
        let scope = cfg.kafka.topic_prefix.clone();
        let parked = Arc::new(parked::Parked::prepare(&session, &ks, ttl).await?);
        Ok(Store {
            session,
            keyspace: ks,
            prepared: Arc::new(prepared),
            parked,
            coalescer,
            lookup,
            scope,
            row_ttl: ttl,
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }
    pub fn keyspace(&self) -> &str {
        &self.keyspace
    }

    /// A job's state (coalesced with concurrent lookups into one `IN` query).
    pub async fn job(&self, job_id: &str) -> Result<Option<JobRow>, StoreError> {
        self.coalescer.job(job_id).await
    }

    /// A job's state by a query of its own (for tools; workers use `job`).
    pub async fn job_direct(&self, job_id: &str) -> Result<Option<JobRow>, StoreError> {
        Ok(self.lookup.fetch(vec![job_id.to_string()]).await?.remove(job_id))
    }

    /// Writes a job's state (coalesced with concurrent writes into one unlogged batch).
    pub async fn put_state(&self, u: &StateUpdate<'_>, now: Millis) -> Result<(), StoreError> {
        let v = coalesce::StateValues {
            tenant: u.tenant.to_string(),
            job_type: u.job_type.to_string(),
            pool: u.pool.to_string(),
            status: u.status.to_string(),
            attempts: u.attempts,
            crash_count: u.crash_count,
            generation: u.generation,
            submitted_at: u.submitted_at,
            started_at: u.started_at,
            finished_at: u.finished_at,
            worker: u.worker.to_string(),
            error: u.error.map(str::to_string),
            failure_class: u.failure_class.map(str::to_string),
            output: u.output.map(<[u8]>::to_vec),
            peak_memory_bytes: u.usage.map(|x| x.peak_memory_bytes),
            cpu_ms: u.usage.map(|x| x.cpu_ms),
            updated_at: now,
            job_id: u.job_id.to_string(),
        };
        self.coalescer.put_state(v).await
    }

    /// Records a job that succeeded on a plain run as its finished record in a pack (or a
    /// row of its own if large, see `core::finished`) instead of a `jobs` row. The caller
    /// makes sure the job has a UUIDv7 id and that no `jobs` row holds a claim on it (see
    /// `worker::durable`).
    pub async fn put_finished(&self, u: &StateUpdate<'_>, now: Millis) -> Result<(), StoreError> {
        finished::pack_bucket(u.job_id).ok_or_else(|| coalesce::not_v7(u.job_id))?;
        let record = finished::FinishedRecord {
            status: u.status.into(),
            tenant: u.tenant.into(),
            job_type: u.job_type.into(),
            pool: u.pool.into(),
            attempts: u.attempts,
            crash_count: u.crash_count,
            generation: u.generation,
            submitted_at: u.submitted_at,
            started_at: u.started_at,
            finished_at: u.finished_at,
            worker: u.worker.into(),
            updated_at: now,
            peak_memory_bytes: u.usage.map(|x| x.peak_memory_bytes),
            cpu_ms: u.usage.map(|x| x.cpu_ms),
        };
        self.coalescer.put_finished((u.job_id.to_string(), record.encode(u.output))).await
    }

    /// Records a submission as a queued record in a pack (`core::finished`) instead of a
    /// `jobs` row. The caller makes sure the job has a UUIDv7 id and writes it only once
    /// the job is on its pool topic (a pack cannot be taken back).
    pub async fn put_queued(&self, s: &events::Submitted<'_>) -> Result<(), StoreError> {
        finished::pack_bucket(s.job_id).ok_or_else(|| coalesce::not_v7(s.job_id))?;
        let record = finished::FinishedRecord::queued(s.tenant, s.job_type, s.pool, s.generation, s.submitted_at);
        self.coalescer.put_queued((s.job_id.to_string(), record.encode(None))).await
    }

    /// Marks a job running: its state row (a lightweight transaction), then a first
    /// heartbeat and its entry in the reaper's index (one unlogged batch). The row is
    /// marked only if it is not terminal, or is of an older generation (a rerun): false,
    /// and nothing else written, when the job finished meanwhile (the run is superseded,
    /// docs/correctness.md, "Superseded runs").
    pub async fn put_running_with_heartbeat(
        &self,
        u: &StateUpdate<'_>,
        encoded_job: &[u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
    ) -> Result<bool, StoreError> {
        self.put_running(u, encoded_job, now, heartbeat_ttl_secs, None).await
    }

    /// [`Store::put_running_with_heartbeat`], only while the row is still the one the
    /// run's check read (`seen`: its worker and last write): of two copies that read the
    /// same row and started (a partition moved within a run's running grace), one marks
    /// the job running; the other finds it changed and is superseded.
    pub async fn put_running_as_seen(
        &self,
        u: &StateUpdate<'_>,
        encoded_job: &[u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
        seen: SeenRow<'_>,
    ) -> Result<bool, StoreError> {
        self.put_running(u, encoded_job, now, heartbeat_ttl_secs, Some(seen)).await
    }

    async fn put_running(
        &self,
        u: &StateUpdate<'_>,
        encoded_job: &[u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
        seen: Option<SeenRow<'_>>,
    ) -> Result<bool, StoreError> {
        let (pk, mark) = (&self.parked, "mark running");
        let row = (
            u.tenant,
            u.job_type,
            u.pool,
            u.attempts,
            u.crash_count,
            u.generation,
            u.submitted_at,
            u.started_at,
            u.worker,
            now,
            u.job_id,
        );
        let applied = match seen {
            None => self.conditional(&pk.mark_running, row, mark).await?,
            Some(seen) => {
                let (t, jt, pool, a, c, g, s, st, w, n, id) = row;
                let values = (t, jt, pool, a, c, g, s, st, w, n, id, seen.worker, seen.written_at);
                self.conditional(&pk.mark_running_seen, values, mark).await?
            }
        };
        if !applied {
            let (t, jt, pool, a, c, g, s, st, w, n, id) = row;
            let rerun = (t, jt, pool, a, c, g, s, st, w, n, id, u.generation);
            if !self.conditional(&pk.mark_running_rerun, rerun, mark).await? {
                return Ok(false);
            }
        }
        let p = &self.prepared;
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(p.put_heartbeat.clone());
        batch.append_statement(p.put_running_job.clone());
        let values = (
            (u.job_id, u.worker, now, 0.0f64, "started", heartbeat_ttl_secs, beat_timestamp(now)),
            (self.scope.as_str(), u.pool, u.job_id, u.worker, u.started_at.unwrap_or(now), encoded_job),
        );
        self.session.batch(&batch, values).await.map_err(q("put running"))?;
        Ok(true)
    }

    /// Writes a job's state only while its row still shows the run `mark` running (a
    /// lightweight transaction): false when another run took the job over, or it ended,
    /// meanwhile (the run is superseded; its write would regress the row).
    pub async fn put_state_if_marked(
        &self,
        u: &StateUpdate<'_>,
        mark: RunMark<'_>,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let values = (
            u.status,
            u.attempts,
            u.crash_count,
            u.started_at,
            u.finished_at,
            u.error,
            u.failure_class,
            now,
            u.job_id,
            mark.worker,
            mark.attempts,
            mark.crash_count,
        );
        self.conditional(&self.parked.put_state_if_marked, values, "put state if marked").await
    }

    pub async fn delete_running_job(&self, pool: &str, job_id: &str) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.prepared.delete_running_job, (self.scope.as_str(), pool, job_id))
            .await
            .map_err(q("delete running job"))?;
        Ok(())
    }

    /// Jobs marked running in a pool: (job id, worker, started_at, encoded job).
    pub async fn running_jobs(&self, pool: &str) -> Result<Vec<(String, String, i64, Vec<u8>)>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.prepared.list_running_jobs, (self.scope.as_str(), pool))
            .await
            .map_err(q("list running"))?;
        let rows = res.into_rows_result().map_err(q("list running"))?;
        let it = rows.rows::<(String, Option<String>, Option<i64>, Option<Vec<u8>>)>().map_err(q("list running"))?;
        it.map(|r| r.map(|(id, w, s, j)| (id, w.unwrap_or_default(), s.unwrap_or(0), j.unwrap_or_default())))
            .collect::<Result<_, _>>()
            .map_err(q("list running"))
    }

    /// Heartbeats of many running jobs in one unlogged batch.
    pub async fn put_heartbeats(
        &self,
        beats: &[(String, f64, String)],
        worker: &str,
        at: Millis,
        ttl_secs: i32,
    ) -> Result<(), StoreError> {
        if beats.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new(BatchType::Unlogged);
        let mut values = Vec::with_capacity(beats.len());
        for (id, progress, msg) in beats {
            batch.append_statement(self.prepared.put_heartbeat.clone());
            values.push((id.as_str(), worker, at, *progress, msg.as_str(), ttl_secs, beat_timestamp(at)));
        }
        self.session.batch(&batch, values).await.map_err(q("put heartbeats"))?;
        Ok(())
    }

    /// Which of these jobs have a cancellation request (read with the heartbeat round trip).
    pub async fn cancel_requested(&self, job_ids: &[String]) -> Result<Vec<String>, StoreError> {
        if job_ids.is_empty() {
            return Ok(Vec::new());
        }
        let res = self
            .session
            .execute_unpaged(&self.prepared.cancel_flags, (job_ids.to_vec(),))
            .await
            .map_err(q("read cancel flags"))?;
        let rows = res.into_rows_result().map_err(q("read cancel flags"))?;
        let it = rows.rows::<(String, Option<bool>)>().map_err(q("cancel flags"))?;
        let flags: Vec<(String, Option<bool>)> = it.collect::<Result<_, _>>().map_err(q("cancel flags"))?;
        Ok(flags.into_iter().filter(|(_, c)| *c == Some(true)).map(|(id, _)| id).collect())
    }

    /// Takes or renews the named lease for `ttl_secs` (LWT). True while we hold it.
    /// Leases are per deployment (topic prefix): `name` is scoped by it.
    pub async fn lease(&self, name: &str, holder: &str, ttl_secs: i32, now: Millis) -> Result<bool, StoreError> {
        let expires = now + i64::from(ttl_secs) * 1000;
        let scoped = format!("{}{name}", self.scope);
        let name = scoped.as_str();
        let res = self
            .session
            .execute_unpaged(&self.prepared.lease_acquire, (name, holder, expires, ttl_secs))
            .await
            .map_err(q("acquire lease"))?;
        if applied(res)? {
            return Ok(true);
        }
        let res = self
            .session
            .execute_unpaged(&self.prepared.lease_renew, (ttl_secs, holder, expires, name, holder))
            .await
            .map_err(q("renew lease"))?;
        applied(res)
    }

    /// Gives the named lease up if `holder` holds it (a leader stopping cleanly: the next
    /// one takes over at once instead of after the lease's TTL).
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        let scoped = format!("{}{name}", self.scope);
        let res = self
            .session
            .execute_unpaged(&self.prepared.lease_release, (scoped.as_str(), holder))
            .await
            .map_err(q("release lease"))?;
        applied(res)
    }

    /// Parks a job until `execute_at` in the scheduled table (minute buckets), its bucket
    /// named in `scheduled_buckets` first (so no parked job is ever out of the index).
    pub async fn put_scheduled(&self, execute_at: Millis, job_id: &str, job: &[u8]) -> Result<(), StoreError> {
        let (scope, bucket) = (self.scope.as_str(), schedule_bucket(execute_at));
        self.session
            .execute_unpaged(&self.parked.index_scheduled_bucket, (scope, bucket))
            .await
            .map_err(q("index scheduled bucket"))?;
        self.session
            .execute_unpaged(&self.parked.put_scheduled, (scope, bucket, execute_at, job_id, job))
            .await
            .map_err(q("put scheduled"))?;
        Ok(())
    }

    /// Parked jobs of `bucket` due by `upto`, oldest first, at most `limit`:
    /// (execute_at, job id, encoded job).
    pub async fn scheduled_due(
        &self,
        bucket: i64,
        upto: Millis,
        limit: usize,
    ) -> Result<Vec<(i64, String, Vec<u8>)>, StoreError> {
        let limit = limit.clamp(1, i32::MAX as usize) as i32;
        let res = self
            .session
            .execute_unpaged(&self.parked.scheduled_due, (self.scope.as_str(), bucket, upto, limit))
            .await
            .map_err(q("read scheduled"))?;
        let rows = res.into_rows_result().map_err(q("read scheduled"))?;
        let it = rows.rows::<(i64, String, Option<Vec<u8>>)>().map_err(q("read scheduled"))?;
        it.map(|r| r.map(|(t, id, j)| (t, id, j.unwrap_or_default())))
            .collect::<Result<_, _>>()
            .map_err(q("read scheduled"))
    }

    /// Buckets of parked jobs from `from` to `upto` (both included), oldest first, at most `limit`.
    pub async fn scheduled_buckets(&self, from: i64, upto: i64, limit: usize) -> Result<Vec<i64>, StoreError> {
        let limit = limit.clamp(1, i32::MAX as usize) as i32;
        let res = self
            .session
            .execute_unpaged(&self.parked.scheduled_buckets, (self.scope.as_str(), from, upto, limit))
            .await
            .map_err(q("read scheduled buckets"))?;
        let rows = res.into_rows_result().map_err(q("read scheduled buckets"))?;
        let it = rows.rows::<(i64,)>().map_err(q("read scheduled buckets"))?;
        it.map(|r| r.map(|(b,)| b)).collect::<Result<_, _>>().map_err(q("read scheduled buckets"))
    }

    /// Forgets a bucket whose parked jobs were all promoted.
    pub async fn delete_scheduled_bucket(&self, bucket: i64) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.parked.delete_scheduled_bucket, (self.scope.as_str(), bucket))
            .await
            .map_err(q("delete scheduled bucket"))?;
        Ok(())
    }

    pub async fn delete_scheduled(&self, execute_at: Millis, job_id: &str) -> Result<(), StoreError> {
        let values = (self.scope.as_str(), schedule_bucket(execute_at), execute_at, job_id);
        self.session.execute_unpaged(&self.parked.delete_scheduled, values).await.map_err(q("delete scheduled"))?;
        Ok(())
    }

    /// Claims a job another worker handed off (LWT on its status): true for exactly one
    /// of the copies that find it `handed_off`; the row then says `running` by `worker`.
    pub async fn claim_hand_off(&self, job_id: &str, worker: &str, now: Millis) -> Result<bool, StoreError> {
        self.conditional(&self.parked.claim_hand_off, (worker, now, job_id), "claim hand-off").await
    }

    /// Takes over a job whose run `from` stopped heartbeating, for `worker`, only while its
    /// row is still the one read: running on that worker, last written then (LWT). Of the
    /// copies that find the same lapsed run, one takes it over. False: another copy took
    /// it over, its worker wrote the row again, or it ended.
    pub async fn claim_take_over(
        &self,
        job_id: &str,
        from: SeenRow<'_>,
        worker: &str,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let values = (worker, now, job_id, from.worker, from.written_at);
        self.conditional(&self.parked.claim_take_over, values, "claim take-over").await
    }

    /// Records that generation `generation` of a job was handed off `count` times so far
    /// (written by the draining worker before it marks the hand-off).
    pub async fn put_handoff_count(&self, job_id: &str, generation: i64, count: i32) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.parked.put_handoff_count, (job_id, generation, count))
            .await
            .map_err(q("put hand-off count"))?;
        Ok(())
    }

    /// How often generation `generation` of a job was handed off (0 if never).
    pub async fn handoff_count(&self, job_id: &str, generation: i64) -> Result<i32, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.parked.handoff_count, (job_id, generation))
            .await
            .map_err(q("read hand-off count"))?;
        let rows = res.into_rows_result().map_err(q("read hand-off count"))?;
        let row = rows.maybe_first_row::<(Option<i32>,)>().map_err(q("read hand-off count"))?;
        Ok(row.and_then(|(n,)| n).unwrap_or(0))
    }

    /// Marks a job `handed_off` only while its row shows it running on `worker` (LWT):
    /// a slow dying worker never overwrites the state of a newer owner. False: not
    /// marked (another worker took it over, it ended, or it has no running row yet).
    pub async fn mark_handed_off(&self, job_id: &str, worker: &str, now: Millis) -> Result<bool, StoreError> {
        self.conditional(&self.parked.mark_handed_off, (now, job_id, worker), "mark hand-off").await
    }

    /// Runs a lightweight transaction: whether its condition held and it applied.
    async fn conditional(
        &self,
        stmt: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
        what: &'static str,
    ) -> Result<bool, StoreError> {
        applied(self.session.execute_unpaged(stmt, values).await.map_err(q(what))?)
    }

    /// Flags the job cancelled, then announces it on the cancellation feed (workers that
    /// skip the state read for fresh jobs learn of it there).
    pub async fn request_cancel(&self, job_id: &str, now: Millis) -> Result<(), StoreError> {
        self.session.execute_unpaged(&self.prepared.request_cancel, (now, job_id)).await.map_err(q("cancel"))?;
        let feed = (cancellation_bucket(now), job_id, now, CANCELLATION_TTL_SECS);
        self.session.execute_unpaged(&self.prepared.put_cancellation, feed).await.map_err(q("cancel feed"))?;
        Ok(())
    }

    /// Job ids on the cancellation feed in the given minute buckets.
    pub async fn recent_cancellations(&self, buckets: &[i64]) -> Result<Vec<String>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.prepared.get_cancellations, (buckets.to_vec(),))
            .await
            .map_err(q("read cancellation feed"))?;
        let rows = res.into_rows_result().map_err(q("read cancellation feed"))?;
        let it = rows.rows::<(String,)>().map_err(q("cancellation feed"))?;
        it.map(|r| r.map(|(id,)| id)).collect::<Result<_, _>>().map_err(q("cancellation feed"))
    }

    /// The highest offset of a topic partition any worker may have started, if recorded.
    pub async fn dispatch_frontier(&self, topic: &str, partition: i32) -> Result<Option<i64>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.prepared.get_frontier, (topic, partition))
            .await
            .map_err(q("read dispatch frontier"))?;
        let rows = res.into_rows_result().map_err(q("read dispatch frontier"))?;
        let row = rows.maybe_first_row::<(Option<i64>,)>().map_err(q("dispatch frontier"))?;
        Ok(row.and_then(|(n,)| n))
    }

    /// Raises the frontier to `offset`. Never lowers it: the write's timestamp is the
    /// offset itself, so of concurrent or reordered writes the highest one wins.
    pub async fn raise_dispatch_frontier(&self, topic: &str, partition: i32, offset: i64) -> Result<(), StoreError> {
        let ts = offset.max(0) + 1;
        self.session
            .execute_unpaged(&self.prepared.raise_frontier, (ts, offset, topic, partition))
            .await
            .map_err(q("raise dispatch frontier"))?;
        Ok(())
    }

    /// A heartbeat stamped `at`. Every heartbeat write carries its stamp as its write
    /// timestamp ([`beat_timestamp`]), so an older beat that lands late never replaces a
    /// newer one.
    pub async fn put_heartbeat(
        &self,
        job_id: &str,
        worker: &str,
        at: Millis,
        progress: f64,
        message: &str,
        ttl_secs: i32,
    ) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(
                &self.prepared.put_heartbeat,
                (job_id, worker, at, progress, message, ttl_secs, beat_timestamp(at)),
            )
            .await
            .map_err(q("put heartbeat"))?;
        Ok(())
    }

    pub async fn heartbeat(&self, job_id: &str) -> Result<Option<HeartbeatRow>, StoreError> {
        let res =
            self.session.execute_unpaged(&self.prepared.get_heartbeat, (job_id,)).await.map_err(q("get heartbeat"))?;
        let rows = res.into_rows_result().map_err(q("get heartbeat"))?;
        rows.maybe_first_row::<HeartbeatRow>().map_err(q("get heartbeat"))
    }

    /// Saves a job's resumable state for its `generation` (a rerun's new generation
    /// never sees an older one's).
    pub async fn put_checkpoint(
        &self,
        job_id: &str,
        generation: i64,
        data: &[u8],
        now: Millis,
    ) -> Result<(), StoreError> {
        if data.len() > CHECKPOINT_LIMIT {
            return Err(StoreError::CheckpointTooLarge {
                job_id: job_id.into(),
                size: data.len(),
                limit: CHECKPOINT_LIMIT,
            });
        }
        // Checkpoints outlive any sane job; a week keeps the table from growing forever.
        let ttl: i32 = 7 * 24 * 3600;
        self.session
            .execute_unpaged(&self.prepared.put_checkpoint, (job_id, generation, data, now, ttl))
            .await
            .map_err(q("put checkpoint"))?;
        Ok(())
    }

    /// The job's last checkpoint in `generation`, if any.
    pub async fn checkpoint(&self, job_id: &str, generation: i64) -> Result<Option<Vec<u8>>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.prepared.get_checkpoint, (job_id, generation))
            .await
            .map_err(q("get checkpoint"))?;
        let rows = res.into_rows_result().map_err(q("get checkpoint"))?;
        let row = rows.maybe_first_row::<(Option<Vec<u8>>,)>().map_err(q("get checkpoint"))?;
        Ok(row.and_then(|r| r.0))
    }
}

// ---------------------------------------------------------------------------------------
// `fairway replay` (src/ops/replay.rs): per-partition resume points in `replays`, and the
// reset of a replayed job's state row. Kept in its own block and struct so it stays
// apart from the worker's prepared statements.
// ---------------------------------------------------------------------------------------

/// Statements of `fairway replay`, prepared once per replay run ([`Store::replay_statements`]).
#[derive(Clone)]
pub struct ReplayStatements {
    session: Arc<Session>,
    get_offsets: PreparedStatement,
    put_offset: PreparedStatement,
    reset_job: PreparedStatement,
}

impl Store {
    /// Prepares the statements `fairway replay` uses.
    pub async fn replay_statements(&self) -> Result<ReplayStatements, StoreError> {
        let (ks, ttl) = (&self.keyspace, self.row_ttl);
        let prep = |cql: String, what: &'static str| {
            let session = &self.session;
            async move { prepare_statement(session, cql, what, false).await }
        };
        Ok(ReplayStatements {
            session: self.session.clone(),
            get_offsets: prep(
                format!("SELECT partition, next_offset FROM {ks}.replays WHERE replay_id = ? AND topic = ?"),
                "prepare replay offsets",
            )
            .await?,
            put_offset: prep(
                format!("INSERT INTO {ks}.replays (replay_id, topic, partition, next_offset) VALUES (?, ?, ?, ?)"),
                "prepare put replay offset",
            )
            .await?,
            // Status `replayed` is not terminal and attempts 0 is not ahead of the replayed
            // copy's attempt 0, so the worker's effectively-once check runs the job again
            // instead of acknowledging it as already finished (or as a stale attempt).
            reset_job: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET status = 'replayed', attempts = 0, crash_count = 0, started_at = null, \
                     finished_at = null, worker = null, error = null, failure_class = null, output = null, \
                     cancel_requested = false, updated_at = ? WHERE job_id = ?"
                ),
                "prepare reset replayed job",
            )
            .await?,
        })
    }
}

impl ReplayStatements {
    /// The resume point of each partition of `topic` for a replay: partition -> the
    /// next offset to read (everything below it was already decided).
    pub async fn offsets(
        &self,
        replay_id: &str,
        topic: &str,
    ) -> Result<std::collections::HashMap<i32, i64>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.get_offsets, (replay_id, topic))
            .await
            .map_err(q("get replay offsets"))?;
        let rows = res.into_rows_result().map_err(q("get replay offsets"))?;
        let it = rows.rows::<(i32, Option<i64>)>().map_err(q("get replay offsets"))?;
        let mut out = std::collections::HashMap::new();
        for r in it {
            let (p, o) = r.map_err(q("get replay offsets"))?;
            if let Some(o) = o {
                out.insert(p, o);
            }
        }
        Ok(out)
    }

    pub async fn put_offset(
        &self,
        replay_id: &str,
        topic: &str,
        partition: i32,
        next_offset: i64,
    ) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.put_offset, (replay_id, topic, partition, next_offset))
            .await
            .map_err(q("put replay offset"))?;
        Ok(())
    }

    /// Resets a job's state row before its replayed copy is produced (see `reset_job`).
    pub async fn reset_job(&self, job_id: &str, now: Millis) -> Result<(), StoreError> {
        self.session.execute_unpaged(&self.reset_job, (now, job_id)).await.map_err(q("reset replayed job"))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Fleet accounting and introspection (src/worker/usage.rs, `fairway stats` / `top`):
// per-tenant slot-time cells in `usage` and per-worker scheduler snapshots in
// `worker_stats`. Both are keyed by a *pool key*, the pool's topic name
// (`Config::pool_topic`), so deployments sharing a keyspace (different topic prefixes)
// never mix their accounting. Approximate data: read and written at LOCAL_ONE.
// ---------------------------------------------------------------------------------------

/// Statements of the fleet usage reporter and the stats CLI ([`Store::fleet_statements`]).
#[derive(Clone)]
pub struct FleetStatements {
    session: Arc<Session>,
    put_usage: PreparedStatement,
    get_usage: PreparedStatement,
    put_worker_stats: PreparedStatement,
    get_worker_stats: PreparedStatement,
}

/// Most statements in one unlogged batch of usage cells (all of one partition).
const USAGE_BATCH: usize = 100;

impl Store {
    /// Prepares the statements of fleet accounting and introspection.
    pub async fn fleet_statements(&self) -> Result<FleetStatements, StoreError> {
        let ks = &self.keyspace;
        let prep = |cql: String, what: &'static str, page_size: Option<i32>| {
            let session = &self.session;
            async move {
                let mut p = prepare_statement(session, cql, what, false).await?;
                p.set_consistency(Consistency::LocalOne);
                if let Some(n) = page_size {
                    p.set_page_size(n);
                }
                Ok::<_, StoreError>(p)
            }
        };
        Ok(FleetStatements {
            session: self.session.clone(),
            put_usage: prep(
                format!(
                    "INSERT INTO {ks}.usage (pool, bucket, tenant, worker, slot_ms) VALUES (?, ?, ?, ?, ?) USING TTL ?"
                ),
                "prepare put usage",
                None,
            )
            .await?,
            get_usage: prep(
                format!("SELECT tenant, worker, slot_ms FROM {ks}.usage WHERE pool = ? AND bucket = ?"),
                "prepare get usage",
                Some(1000),
            )
            .await?,
            put_worker_stats: prep(
                format!("INSERT INTO {ks}.worker_stats (pool, worker, at, stats) VALUES (?, ?, ?, ?) USING TTL ?"),
                "prepare put worker stats",
                None,
            )
            .await?,
            get_worker_stats: prep(
                format!("SELECT worker, at, stats FROM {ks}.worker_stats WHERE pool = ?"),
                "prepare get worker stats",
                Some(100),
            )
            .await?,
        })
    }
}

impl FleetStatements {
    /// Writes this worker's cumulative slot-ms cells `(bucket, tenant, slot_ms)` of one
    /// pool, in unlogged batches of one partition each.
    pub async fn put_usage(
        &self,
        pool_key: &str,
        worker: &str,
        cells: &[(Millis, String, i64)],
        ttl_secs: i32,
    ) -> Result<(), StoreError> {
        let mut by_bucket: std::collections::BTreeMap<Millis, Vec<(&str, i64)>> = Default::default();
        for (b, t, v) in cells {
            by_bucket.entry(*b).or_default().push((t.as_str(), *v));
        }
        for (bucket, cells) in by_bucket {
            for chunk in cells.chunks(USAGE_BATCH) {
                let mut batch = Batch::new(BatchType::Unlogged);
                batch.set_consistency(Consistency::LocalOne);
                let mut values = Vec::with_capacity(chunk.len());
                for (tenant, slot_ms) in chunk {
                    batch.append_statement(self.put_usage.clone());
                    values.push((pool_key, bucket, *tenant, worker, *slot_ms, ttl_secs));
                }
                self.session.batch(&batch, values).await.map_err(q("put usage"))?;
            }
        }
        Ok(())
    }

    /// Every worker's cells of one (pool, bucket) partition (paged).
    pub async fn usage_bucket(
        &self,
        pool_key: &str,
        bucket: Millis,
    ) -> Result<Vec<crate::core::fleet::UsageCell>, StoreError> {
        use futures::TryStreamExt;
        let pager = self
            .session
            .execute_iter(self.get_usage.clone(), (pool_key, bucket))
            .await
            .map_err(|e| StoreError::Query { what: "read usage", message: e.to_string() })?;
        let mut rows = pager
            .rows_stream::<(String, String, Option<i64>)>()
            .map_err(|e| StoreError::Query { what: "read usage", message: e.to_string() })?;
        let mut out = Vec::new();
        while let Some((tenant, worker, slot_ms)) =
            rows.try_next().await.map_err(|e| StoreError::Query { what: "read usage", message: e.to_string() })?
        {
            out.push(crate::core::fleet::UsageCell {
                pool: pool_key.to_string(),
                bucket,
                tenant,
                worker,
                slot_ms: slot_ms.unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Publishes a worker's scheduler snapshot of one pool (expires after `ttl_secs`).
    pub async fn put_worker_stats(
        &self,
        pool_key: &str,
        worker: &str,
        at: Millis,
        stats: &str,
        ttl_secs: i32,
    ) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.put_worker_stats, (pool_key, worker, at, stats, ttl_secs))
            .await
            .map_err(q("put worker stats"))?;
        Ok(())
    }

    /// The live workers' snapshots of one pool.
    pub async fn worker_stats(&self, pool_key: &str) -> Result<Vec<crate::core::fleet::SnapshotRow>, StoreError> {
        use futures::TryStreamExt;
        let pager = self
            .session
            .execute_iter(self.get_worker_stats.clone(), (pool_key,))
            .await
            .map_err(|e| StoreError::Query { what: "read worker stats", message: e.to_string() })?;
        let mut rows = pager
            .rows_stream::<(String, Option<i64>, Option<String>)>()
            .map_err(|e| StoreError::Query { what: "read worker stats", message: e.to_string() })?;
        let mut out = Vec::new();
        while let Some((worker, at, stats)) = rows
            .try_next()
            .await
            .map_err(|e| StoreError::Query { what: "read worker stats", message: e.to_string() })?
        {
            out.push(crate::core::fleet::SnapshotRow {
                pool: pool_key.to_string(),
                worker,
                at: at.unwrap_or(0),
                stats: stats.unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// The fleet's scheduling state of `pools` (`fairway stats`, the console): the live
    /// snapshots of each pool (rows keyed by the deployment's pool topic, shown under the
    /// pool's name) merged, leaving out those older than `max_age_ms`.
    pub async fn fleet(
        &self,
        cfg: &crate::config::Config,
        pools: &[crate::model::Pool],
        max_age_ms: i64,
    ) -> Result<crate::core::fleet::FleetStats, StoreError> {
        let mut rows = Vec::new();
        for p in pools {
            for mut r in self.worker_stats(&cfg.pool_topic(*p)).await? {
                r.pool = p.as_str().to_string();
                rows.push(r);
            }
        }
        Ok(crate::core::fleet::aggregate(&rows, crate::now_ms(), max_age_ms))
    }
}

/// The write timestamp of a heartbeat stamped `at` (epoch ms), in the microseconds the
/// store orders writes by: a beat sent before the lease lapsed but landing after a
/// take-over's newer beat (a cut-off worker's write, retried by the driver once its link
/// is back) loses to it, instead of making the live take-over look lapsed (issue 62).
pub fn beat_timestamp(at: Millis) -> i64 {
    at.saturating_mul(1_000)
}
