//! fairway's keyspace. Timestamps are bigint epoch milliseconds (Cassandra 2.1 has no
//! date/time types and ScyllaDB accepts both). Idempotent: only what is missing is created.

use super::StoreError;
use scylla::client::session::Session;

/// (table name, CQL body after `CREATE TABLE IF NOT EXISTS <ks>.<name>`).
pub const TABLES: &[(&str, &str)] = &[
    // One row per job: the effectively-once check reads it before running.
    (
        "jobs",
        "(job_id text PRIMARY KEY, tenant text, job_type text, pool text, status text, attempts int, \
         crash_count int, generation bigint, submitted_at bigint, started_at bigint, finished_at bigint, \
         worker text, error text, failure_class text, output blob, cancel_requested boolean, updated_at bigint)",
    ),
    // Jobs that succeeded on a plain run, one blob per job by submission second and shard
    // (`core::finished`). Now written only for records too large to pack
    // (`PACK_ENTRY_MAX`); packs (`finished_packs`) take the rest.
    ("finished_jobs", "(bucket bigint, job_id text, record blob, PRIMARY KEY ((bucket), job_id))"),
    // Jobs that succeeded on a plain run, many per row: packs by 100 ms of submission and
    // shard (`core::finished`), written once, found by reading the bucket.
    ("finished_packs", "(bucket bigint, pack uuid, body blob, PRIMARY KEY ((bucket), pack))"),
    // Liveness of running jobs; rows expire (TTL ~3 intervals) when a worker dies.
    ("heartbeats", "(job_id text PRIMARY KEY, worker text, at bigint, progress double, message text)"),
    // No longer written (keyed by job only, a rerun resumed the previous generation's
    // checkpoint); its rows expire. Kept so the schema only ever grows.
    ("checkpoints", "(job_id text PRIMARY KEY, data blob, at bigint)"),
    // A job's resumable state per (job, generation): hand-offs and crash re-dispatches of
    // a generation resume from it, a rerun (new generation) starts clean.
    ("job_checkpoints", "(job_id text, generation bigint, data blob, at bigint, PRIMARY KEY ((job_id, generation)))"),
    // Hand-offs per (job, generation): written by the draining worker, read by whichever
    // copy claims the job (the hand-off copy or a redelivered older one), so the next
    // run is told how often it was handed off (`JobContext::handoff_count`).
    ("job_handoffs", "(job_id text, generation bigint, handoff_count int, PRIMARY KEY ((job_id), generation))"),
    // Jobs running for more than a moment, by deployment (topic prefix) and pool: what
    // the reaper watches for lapsed heartbeats (the encoded job lets it re-dispatch).
    (
        "running_index",
        "(scope text, pool text, job_id text, worker text, started_at bigint, job blob, \
         PRIMARY KEY ((scope, pool), job_id))",
    ),
    // LWT IF NOT EXISTS with TTL: the dedupe window of idempotent submission.
    ("idempotency", "(tenant text, key text, job_id text, at bigint, PRIMARY KEY ((tenant, key)))"),
    // Jobs parked until later (scheduled or long backoff), by deployment and minute, so
    // the promoter reads one partition per minute.
    (
        "scheduled_jobs",
        "(scope text, bucket bigint, execute_at bigint, job_id text, job blob, \
         PRIMARY KEY ((scope, bucket), execute_at, job_id))",
    ),
    // Per-tenant slot-time by worker and time bucket: fleet-wide fair-share accounting.
    (
        "usage",
        "(pool text, bucket bigint, tenant text, worker text, slot_ms bigint, PRIMARY KEY ((pool, bucket), tenant, worker))",
    ),
    // Fleet-wide limits (`core::quota`): each worker's want and held units per pool and
    // scope (a tenant's max_concurrency, a flow key's parallelism), short TTL.
    ("quotas", "(pool text, scope text, worker text, want int, held int, PRIMARY KEY (pool, scope, worker))"),
    // Fleet-wide retry budgets and poison detection (`core::fleet_counts`): each worker's
    // counts per pool and scope (a tenant's budget, a job type's window, its presence).
    (
        "fleet_counts",
        "(pool text, scope text, worker text, at bigint, a double, b double, c double, PRIMARY KEY (pool, scope, worker))",
    ),
    // Which minute buckets of `scheduled_jobs` may hold parked jobs, per deployment: a
    // new promoter leader starts at the oldest, however old (rows go once promoted).
    ("scheduled_buckets", "(scope text, bucket bigint, PRIMARY KEY ((scope), bucket))"),
    // Single-leader loops (reaper, promoter) hold a lease taken with LWT.
    ("leases", "(name text PRIMARY KEY, holder text, expires_at bigint)"),
    // Rerun-all by generation: the target generation per tenant and job type.
    ("generations", "(tenant text, job_type text, generation bigint, PRIMARY KEY (tenant, job_type))"),
    // Resumable DLQ/retry replays: the last replayed offset per replay run and partition.
    ("replays", "(replay_id text, topic text, partition int, next_offset bigint, PRIMARY KEY (replay_id, topic, partition))"),
    // Per topic partition, the highest offset any worker may have started (written with
    // the offset as its timestamp, so the highest write wins): offsets above it were
    // never started and skip the effectively-once read.
    ("dispatch_frontier", "(topic text, partition int, next bigint, PRIMARY KEY ((topic, partition)))"),
    // Recent cancellation requests by minute (short TTL): the feed workers poll so they
    // can skip the read for fresh jobs yet still honour a cancel of a queued job.
    ("cancellations", "(bucket bigint, job_id text, at bigint, PRIMARY KEY ((bucket), job_id))"),
    // Spilled backlogs (`core::backlog`): jobs a tenant submitted beyond its buffer in a
    // worker, per pool topic partition, tenant and bucket of offsets, read back in order.
    (
        "backlog",
        "(topic text, partition int, tenant text, bucket bigint, offset bigint, job blob, \
         PRIMARY KEY ((topic, partition, tenant, bucket), offset))",
    ),
    // Spilled jobs in packs (`core::backlog::encode_pack`): many per row, clustered by
    // the pack's last offset; what the spill path writes since one row per job fell
    // behind the broker (docs/design/floods.md). `backlog` is still read and dropped.
    (
        "backlog_packs",
        "(topic text, partition int, tenant text, bucket bigint, last bigint, jobs blob, \
         PRIMARY KEY ((topic, partition, tenant, bucket), last))",
    ),
    // Which (tenant, bucket) backlogs exist per topic partition: what a new owner reads.
    (
        "backlog_index",
        "(topic text, partition int, tenant text, bucket bigint, PRIMARY KEY ((topic, partition), tenant, bucket))",
    ),
    // The tenants registry (`crate::ops::tenants`), per deployment (topic prefix): live data,
    // seeded from the config file by `fairway init`.
    (
        "tenants",
        "(scope text, name text, tier text, weight double, max_concurrency int, rate_per_sec int, \
         reserved_slots int, max_queued int, suspended boolean, labels map<text, text>, updated_at bigint, \
         PRIMARY KEY (scope, name))",
    ),
    // A tenant's home and secondary region (`core::regions`), per deployment: a row only
    // for tenants with a home, written and deleted with the tenant's `tenants` row.
    (
        "tenant_regions",
        "(scope text, name text, home text, secondary text, updated_at bigint, PRIMARY KEY (scope, name))",
    ),
    // A deployment's region state for its API (`fairway region up|draining|down`).
    ("region_states", "(scope text PRIMARY KEY, state text, retry_after_secs int, reason text, at bigint)"),
    // Bumped by every registry change; processes poll it and then read the change feed.
    ("registry_versions", "(scope text PRIMARY KEY, version counter)"),
    // The registry's change feed (`core::tenants::TenantChange` as JSON) per deployment
    // and minute, rows with a 1 h TTL: processes apply the changes since they last looked
    // instead of re-reading every tenant.
    (
        "tenant_changes",
        "(scope text, bucket bigint, at bigint, name text, change text, PRIMARY KEY ((scope, bucket), at, name))",
    ),
    // Each live worker's scheduler snapshot per pool (JSON, short TTL): `fairway stats` / `top`.
    ("worker_stats", "(pool text, worker text, at bigint, stats text, PRIMARY KEY (pool, worker))"),
    // HTTP API keys per deployment (topic prefix): the SHA-256 of each key's secret,
    // never the secret; role admin or tenant (`core::auth`).
    (
        "api_keys",
        "(scope text, key_id text, hash blob, role text, tenant text, label text, created_at bigint, \
         revoked_at bigint, PRIMARY KEY (scope, key_id))",
    ),
    // Which tenant submitted a job through the API (TTL 30 days): lets a tenant key read
    // and cancel its own job before any worker wrote the job's row.
    ("job_owners", "(job_id text PRIMARY KEY, tenant text)"),
    // A job's event history (`crate::watch::events`; TTL retention.results): one partition per
    // job, in time order, written by the history recorder from the events topic.
    (
        "job_events",
        "(job_id text, at bigint, event_id text, tenant text, job_type text, kind text, attempt int, \
         worker text, progress double, message text, next_attempt_at bigint, PRIMARY KEY (job_id, at, event_id))",
    ),
    // Front-door queue depth (`crate::admission`): per deployment and tenant, per pool,
    // jobs accepted (enqueued, by the API / CLI) and first dispatched (dequeued, by workers).
    (
        "queue_depth",
        "(scope text, tenant text, pool text, enqueued counter, dequeued counter, PRIMARY KEY ((scope, tenant), pool))",
    ),
    // Attempt outcomes per deployment and 10 s bucket, pool, job type and worker
    // (cumulative cells, TTL): what the API's submission circuit breaker reads.
    (
        "outcome_counts",
        "(scope text, bucket bigint, pool text, job_type text, worker text, ok bigint, failed bigint, \
         PRIMARY KEY ((scope, bucket), pool, job_type, worker))",
    ),
    // No longer written (its rows expire): attempt outcomes per tenant without timeouts
    // apart; `tenant_outcome_cells` took its place.
    (
        "tenant_outcome_counts",
        "(scope text, bucket bigint, pool text, job_type text, tenant text, worker text, ok bigint, \
         failed bigint, infra bigint, PRIMARY KEY ((scope, bucket), pool, job_type, tenant, worker))",
    ),
    // Attempt outcomes per deployment and 10 s bucket, pool, job type, tenant and worker
    // (cumulative cells, TTL): failed attempts, the infrastructure failures among them and
    // the timeouts among those; what the API's submission circuit breakers read (per
    // tenant, and shared: `core::admission::breaker`).
    (
        "tenant_outcome_cells",
        "(scope text, bucket bigint, pool text, job_type text, tenant text, worker text, ok bigint, \
         failed bigint, infra bigint, timeouts bigint, PRIMARY KEY ((scope, bucket), pool, job_type, tenant, worker))",
    ),
    // Run times per deployment and 10 s bucket, job type, pool run in and worker
    // (cumulative cells, TTL): runs, pool-range violations and a log-scale histogram
    // (`core::classifier`), which the classifier's leader reads.
    (
        "run_times",
        "(scope text, bucket bigint, job_type text, pool text, worker text, runs bigint, over bigint, \
         under bigint, hist map<int, bigint>, PRIMARY KEY ((scope, bucket), job_type, pool, worker))",
    ),
    // The classifier's decisions per deployment: the pool each reclassified job type's
    // new jobs go to, since when, sticky until when, and why (submitters read it).
    (
        "pool_classes",
        "(scope text, job_type text, pool text, since bigint, sticky_until bigint, reason text, \
         PRIMARY KEY (scope, job_type))",
    ),
    // Run times per deployment and 10 s bucket, job type, tenant, pool run in and worker
    // (cumulative cells, TTL; `core::classifier`): the classifier judges each tenant's
    // jobs of a type apart. (`run_times` above is no longer written.)
    (
        "tenant_run_times",
        "(scope text, bucket bigint, job_type text, tenant text, pool text, worker text, runs bigint, \
         over bigint, under bigint, hist map<int, bigint>, \
         PRIMARY KEY ((scope, bucket), job_type, tenant, pool, worker))",
    ),
    // The classifier's decisions per deployment: the pool each reclassified (job type,
    // tenant)'s new jobs go to, since when, sticky until when, and why (submitters read
    // it; at most `classifier.max_tracked` rows). (`pool_classes` above is no longer written.)
    (
        "tenant_pool_classes",
        "(scope text, job_type text, tenant text, pool text, since bigint, sticky_until bigint, reason text, \
         PRIMARY KEY (scope, job_type, tenant))",
    ),
    // No longer written: recurring schedules in one partition per deployment (every
    // tenant's LWTs and the leader's reads on one partition). Its rows move once to
    // `tenant_schedules` (the promoter's leader, `ops::schedules::Schedules::migrate`).
    (
        "schedules",
        "(scope text, tenant text, name text, id text, spec text, paused boolean, next_fire_at bigint, \
         created_at bigint, updated_at bigint, PRIMARY KEY ((scope), tenant, name))",
    ),
    // Each tenant's schedule slots (`store::schedules`): an add claims a free slot by
    // LWT (`IF NOT EXISTS`) before it inserts the schedule, so a tenant never holds more
    // than `schedules.max_per_tenant` however many adds race (one partition per slot:
    // racing claims of different slots are separate Paxos rounds).
    (
        "schedule_slots",
        "(scope text, tenant text, slot int, name text, at bigint, PRIMARY KEY ((scope, tenant, slot)))",
    ),
    // No longer written: open debounce windows in one partition per deployment. Its rows
    // move once to `tenant_debounces` (the promoter's leader, `worker::schedules`).
    (
        "debounces",
        "(scope text, tenant text, key text, window_id text, first_at bigint, due_at bigint, rev text, job blob, \
         PRIMARY KEY ((scope), tenant, key))",
    ),
    // Recurring schedules per (deployment, tenant) (`crate::ops::schedules`): the
    // definition as JSON, paused or not, and the first fire not yet submitted (moved by
    // LWT; one tenant's LWTs are Paxos rounds on its own partition). Found when due
    // through `due_index`.
    (
        "tenant_schedules",
        "(scope text, tenant text, name text, id text, spec text, paused boolean, next_fire_at bigint, \
         created_at bigint, updated_at bigint, PRIMARY KEY ((scope, tenant), name))",
    ),
    // Open debounce windows per (deployment, tenant) (`crate::submit::dedupe`): the
    // pending job, when the window opened and when its job is due, the revision every
    // change replaces (LWT), and the tenant's slot (`debounce_slots`) it holds.
    (
        "tenant_debounces",
        "(scope text, tenant text, key text, window_id text, first_at bigint, due_at bigint, rev text, job blob, \
         slot int, slot_at bigint, PRIMARY KEY ((scope, tenant), key))",
    ),
    // Each tenant's debounce window slots (`store::debounce`): an open claims a free slot
    // by LWT before it opens the window, so a tenant never holds more than
    // `debounce.max_open_per_tenant` open windows however many opens race.
    (
        "debounce_slots",
        "(scope text, tenant text, slot int, key text, at bigint, PRIMARY KEY ((scope, tenant, slot)))",
    ),
    // When schedules and debounce windows come due (`store::due`): per deployment, kind
    // and minute, the (tenant, name) whose main row is due then; the leader reads only
    // what is due.
    (
        "due_index",
        "(scope text, kind text, bucket bigint, due_at bigint, tenant text, name text, rev text, written_at bigint, \
         PRIMARY KEY ((scope, kind, bucket), due_at, tenant, name, rev))",
    ),
    // Which minute buckets of `due_index` may hold rows, per deployment and kind.
    ("due_buckets", "(scope text, kind text, bucket bigint, PRIMARY KEY ((scope, kind), bucket))"),
    // The usage ledger (`crate::ledger`, rules `core::ledger`): an account's totals per
    // 15-minute window of the results topic and per partition of it, one store partition
    // per tenant and day; cells written with the offset their prefix ends at as timestamp.
    (
        "ledger",
        "(scope text, tenant text, day bigint, window bigint, pool text, job_type text, part int, \
         results bigint, succeeded bigint, failed bigint, cancelled bigint, expired bigint, attempts bigint, \
         retries bigint, run_ms bigint, bytes_out bigint, PRIMARY KEY ((scope, tenant, day), window, pool, job_type, part))",
    ),
    // The fleet's usage (every tenant's together) per window, pool and partition of the
    // results topic, one store partition per day: what the console's shares are of.
    // Written like `ledger`, with the offset the prefix ends at as timestamp.
    (
        "ledger_fleet",
        "(scope text, day bigint, window bigint, pool text, part int, results bigint, run_ms bigint, \
         PRIMARY KEY ((scope, day), window, pool, part))",
    ),
    // Tenants with ledger rows per deployment and day: what a month's export walks.
    ("ledger_tenants", "(scope text, day bigint, tenant text, PRIMARY KEY ((scope, day), tenant))"),
    // Where the ledger's reader of each results partition starts again (its window's first offset).
    (
        "ledger_positions",
        "(scope text, topic text, part int, first bigint, next bigint, at bigint, PRIMARY KEY ((scope), topic, part))",
    ),
    // Tenant-facing alerts (`crate::ledger` evaluates, `watch::alerts` delivers; rules
    // `core::alerts`): every alert of a tenant, newest first, TTL'd (`alerts.retention`).
    (
        "tenant_alerts",
        "(scope text, tenant text, opened_at bigint, rule text, alert_id text, resolved_at bigint, value double, \
         threshold double, PRIMARY KEY ((scope, tenant), opened_at, rule)) WITH CLUSTERING ORDER BY (opened_at DESC, rule ASC)",
    ),
    // Alerts open, or resolved with their resolution not yet delivered: the evaluator's
    // state a new ledger leader starts from, and the deliveries it finishes.
    (
        "tenant_alerts_open",
        "(scope text, tenant text, rule text, alert_id text, opened_at bigint, resolved_at bigint, value double, \
         threshold double, opened_sent boolean, PRIMARY KEY ((scope), tenant, rule))",
    ),
    // `fairway restore`'s bookkeeping (`ops::backup`): the steps of restoring a backup done
    // here (tables, topic partitions, "complete"), so a second restore changes nothing.
    ("restores", "(backup_id text, step text, at bigint, PRIMARY KEY ((backup_id), step))"),
    // The deployment's schedule count (`ops::schedules`): what an add checks
    // `schedules.max_total` against in one read; the leader's sweep corrects it.
    ("schedule_totals", "(scope text PRIMARY KEY, n counter)"),
    // The fleet-wide dependency breakers (`core::dependency`, `store::dependencies`): one
    // row per dependency, written by the ledger's leader, read every second by workers
    // and API processes.
    // What held each tenant's submissions back (`core::refusals`, `store::refusals`): per
    // deployment and hour, each process's cumulative count per (tenant, code), TTL 8 days.
    (
        "tenant_refusals",
        "(scope text, hour bigint, tenant text, code text, process text, n bigint, \
         PRIMARY KEY ((scope, hour), tenant, code, process))",
    ),
    (
        "dependency_breakers",
        "(scope text, dependency text, state text, opened_at bigint, until bigint, since bigint, failed bigint, \
         attempts bigint, affected list<text>, changed_at bigint, PRIMARY KEY ((scope), dependency))",
    ),
];

/// Columns added to tables after they were first created: (table, column, CQL type).
/// `ensure` adds the ones a table lacks (`ALTER TABLE ... ADD`), so a keyspace created by
/// an older release gains them on the next start; a column is never dropped or retyped.
pub const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    // What a process job's last attempt used over its process tree (`model::ProcessUsage`).
    ("jobs", "peak_memory_bytes", "bigint"),
    ("jobs", "cpu_ms", "bigint"),
    // The ledger's charges of process jobs: CPU time summed, peak memory the maximum.
    ("ledger", "cpu_ms", "bigint"),
    ("ledger", "peak_memory_bytes", "bigint"),
    // The queue waits of an account's results per window (`core::alerts::WaitHistogram`'s
    // counts, one cell): the console's wait charts.
    ("ledger", "waits", "frozen<list<int>>"),
    // Failures of class `dependency` among an outcome cell's infrastructure failures: what
    // the fleet-wide dependency breakers count (`core::dependency`).
    ("tenant_outcome_cells", "dependency", "bigint"),
];

/// The keyspace's replication: NetworkTopologyStrategy with replicas per datacenter when
/// any are configured (`scylla.datacenters`), else SimpleStrategy with `rf`.
pub fn replication(rf: i32, datacenters: &std::collections::BTreeMap<String, i32>) -> String {
    if datacenters.is_empty() {
        return format!("{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}");
    }
    let dcs: Vec<String> = datacenters.iter().map(|(dc, n)| format!("'{dc}': {n}")).collect();
    format!("{{'class': 'NetworkTopologyStrategy', {}}}", dcs.join(", "))
}

pub async fn ensure(session: &Session, keyspace: &str, replication: &str) -> Result<Vec<String>, StoreError> {
    let existing = existing_tables(session, keyspace).await?;
    let mut created = Vec::new();
    if existing.is_none() {
        let cql = format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}");
        session
            .query_unpaged(cql, ())
            .await
            .map_err(|e| StoreError::Query { what: "create keyspace", message: e.to_string() })?;
        created.push(format!("keyspace {keyspace}"));
    }
    let existing = existing.unwrap_or_default();
    for (name, body) in TABLES {
        if existing.iter().any(|t| t == name) {
            continue;
        }
        let cql = format!("CREATE TABLE IF NOT EXISTS {keyspace}.{name} {body}");
        if let Err(e) = session.query_unpaged(cql, ()).await {
            // Two processes creating the same table at once can race on Cassandra
            // ("Column family ID mismatch"); fine if the table exists now.
            let now = existing_tables(session, keyspace).await?.unwrap_or_default();
            if !now.iter().any(|t| t == name) {
                return Err(StoreError::Query { what: "create table", message: e.to_string() });
            }
            continue;
        }
        created.push(format!("table {keyspace}.{name}"));
    }
    for (table, column, kind) in ADDED_COLUMNS {
        if columns(session, keyspace, table).await?.iter().any(|c| c == column) {
            continue;
        }
        let cql = format!("ALTER TABLE {keyspace}.{table} ADD {column} {kind}");
        if let Err(e) = session.query_unpaged(cql, ()).await {
            // Another process may have added it at the same moment: fine if it is there now.
            if !columns(session, keyspace, table).await?.iter().any(|c| c == column) {
                return Err(StoreError::Query { what: "add column", message: format!("{table}.{column}: {e}") });
            }
            continue;
        }
        created.push(format!("column {keyspace}.{table}.{column}"));
    }
    Ok(created)
}

/// The columns of `table`: ScyllaDB / Cassandra 3+ (system_schema) first, then Cassandra 2.x.
async fn columns(session: &Session, keyspace: &str, table: &str) -> Result<Vec<String>, StoreError> {
    let probes = [
        "SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?",
        "SELECT column_name FROM system.schema_columns WHERE keyspace_name = ? AND columnfamily_name = ?",
    ];
    let mut last_err = String::new();
    for cql in probes {
        match session.query_unpaged(cql, (keyspace, table)).await {
            Ok(r) => {
                let rows = r
                    .into_rows_result()
                    .map_err(|e| StoreError::Query { what: "read columns", message: e.to_string() })?;
                let names = rows
                    .rows::<(String,)>()
                    .map_err(|e| StoreError::Query { what: "read columns", message: e.to_string() })?
                    .filter_map(|r| r.ok().map(|r| r.0))
                    .collect();
                return Ok(names);
            }
            Err(e) => last_err = e.to_string(),
        }
    }
    Err(StoreError::Query { what: "read columns", message: last_err })
}

/// Tables of the keyspace, or None when the keyspace does not exist. Tries ScyllaDB /
/// Cassandra 3+ (system_schema) first, then Cassandra 2.x (system.schema_columnfamilies).
async fn existing_tables(session: &Session, keyspace: &str) -> Result<Option<Vec<String>>, StoreError> {
    let probes = [
        (
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
        ),
        (
            "SELECT keyspace_name FROM system.schema_keyspaces WHERE keyspace_name = ?",
            "SELECT columnfamily_name FROM system.schema_columnfamilies WHERE keyspace_name = ?",
        ),
    ];
    let mut last_err = None;
    for (ks_q, tables_q) in probes {
        let ks = match session.query_unpaged(ks_q, (keyspace,)).await {
            Ok(r) => r,
            Err(e) => {
                last_err = Some(e.to_string());
                continue;
            }
        };
        let ks_rows =
            ks.into_rows_result().map_err(|e| StoreError::Query { what: "read schema", message: e.to_string() })?;
        if ks_rows.rows_num() == 0 {
            return Ok(None);
        }
        let t = session
            .query_unpaged(tables_q, (keyspace,))
            .await
            .map_err(|e| StoreError::Query { what: "read schema", message: e.to_string() })?;
        let rows =
            t.into_rows_result().map_err(|e| StoreError::Query { what: "read schema", message: e.to_string() })?;
        let names = rows
            .rows::<(String,)>()
            .map_err(|e| StoreError::Query { what: "read schema", message: e.to_string() })?
            .filter_map(|r| r.ok().map(|r| r.0))
            .collect();
        return Ok(Some(names));
    }
    Err(StoreError::Query { what: "read schema", message: last_err.unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    #[test]
    fn replication_strategy_follows_datacenters() {
        let none = Default::default();
        assert_eq!(super::replication(1, &none), "{'class': 'SimpleStrategy', 'replication_factor': 1}");
        let dcs = [("dc1".to_string(), 3), ("dc2".to_string(), 2)].into_iter().collect();
        assert_eq!(super::replication(1, &dcs), "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}");
    }
}
