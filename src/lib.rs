//! fairway: multi-tenant job processing on Kafka and ScyllaDB, fair in worker time.
//!
//! # Module map
//!
//! Pure decisions live in `core` (no I/O; `now` is an argument); `kafka` and `store` are
//! the only modules that talk to the broker and the database (held by `tests/it/edges.rs`);
//! everything else moves data between them.
//!
//! | module | what it is |
//! |---|---|
//! | `model` | the domain vocabulary: jobs, results, dead letters, failure classes |
//! | `codec` | Avro single-object encoding of the wire records (`schemas/`) |
//! | `config` | the TOML configuration and its validation |
//! | `core` | pure decisions: scheduling, retry, breakers, limits, schedules... (map in `core`) |
//! | `kafka` | the Kafka edge: clients, topics, `kafka::Producer` (rebuilt after fatal errors), `kafka::Pauses`, `kafka::stall` (owned partitions without progress: a stopped fetcher, or records waiting that never arrive; restarted and resumed), `kafka::socket` (every producer's TCP sockets drop data unacknowledged past the process's shortest delivery timeout: a cut-off produce request never lands later) |
//! | `store` | the ScyllaDB edge: schema, statements, tables per concept; reaching the database at a start (`reach`: what heals is waited for, up to `scylla.connect_wait`) |
//! | `store::due` | the due index of schedules and debounce windows: what the promoter's leader reads, only what is due |
//! | `store::slots` | a tenant's numbered slots claimed by LWT: the atomic per-tenant count of schedules and open debounce windows |
//! | `store::dependencies` | the fleet-wide dependency breakers' rows: one per dependency, written by the ledger's leader, read every second by workers and API processes |
//! | `store::refusals` | what held each tenant's work: per hour, each process's cumulative count per (tenant, code) (`core::refusals`) |
//! | `store::alerts` | tenant alerts' rows: every alert per tenant (TTL'd) and the alerts open or with a delivery unfinished |
//! | `store::regions` | a deployment's region state (up, draining, down), what `fairway region` writes and the API polls |
//! | `handlers` | the `Handler` trait and job context; the HTTP executor, the `process` executor (one-shot and pooled children, `handlers::process::pooled`), demo handlers |
//! | `seams` | the narrow traits a job's route reaches the store (`RouteStore`), the broker (`RouteBroker`) and time (`Clock`) through, and the pool loop its topic's group (`PoolGroup`, `PoolConsumer`), spill rows (`BacklogStore`) and tenants (`TenantsView`); implemented by `store`, `kafka` and `ops::tenants`, and in memory by `sim::doubles` and `sim::broker` |
//! | `worker` | a worker process; its tasks are below |
//! | `worker::context` | the worker's shared state: `RouteContext` (what a job's route needs) and `Shared` (what the pool's loops add) |
//! | `worker::pool` | one pool's consumer loop: messages in, scheduling, executions out; a job whose outcome was not durable is taken in again |
//! | `worker::route` | a job's route top to bottom (intake → check → run → settle → commit) and the types its stages pass (`Durable` among them); stages in `worker::check`, `worker::exec`, `worker::settle`, their durable writes in `worker::durable` |
//! | `worker::frontier` | the dispatch frontier of each partition (which jobs skip the effectively-once read; rules in `core::frontier`) and the cancel feed |
//! | `worker::admission` | what a worker reports to submission admission every second: dequeued jobs, outcomes, run times |
//! | `worker::backlog` | the spill path of floods beyond the buffer |
//! | `worker::relay` | the retry relay (retry topics back to their pool) and the promoter (jobs parked for later) |
//! | `worker::liveness` | heartbeats, cancellation, and the reaper of jobs whose worker died |
//! | `worker::ownership` | whether this worker still owns the partition a job came from: a lost partition's jobs start nothing and publish nothing more here |
//! | `worker::early_commit` | a result out whose state write the store refused: its offset committed at once, offsets above the commit point in the commit's metadata for the partition's next owner |
//! | `worker::usage`, `worker::quota` | the fleet usage exchange and the fleet-wide limits and counts exchange |
//! | `worker::classifier` | the pool classifier's leader |
//! | `worker::schedules` | recurring schedules fired by the promoter's lease holder |
//! | `worker::watchdog` | no zombie workers: give up (leave the groups, exit non-zero) when progress is impossible |
//! | `submit` | the submission path (CLI, HTTP API, demo, fired schedules): validation, idempotency keys, the job's row and its produce |
//! | `submit::dedupe` | unique jobs (`unique_key` + scope) and debounce (`debounce_key` + delay) at submission |
//! | `submit::many` | a batch's submissions: the common jobs produced together (`kafka::Producer::send_many`), the others one by one |
//! | `submit::payload` | a job's payload as submitted: JSON read without building its tree, kept as the bytes the job carries |
//! | `admission` | the front door (submission admission): queue depth, tenant and per-user rates, submission breakers, quota alerts |
//! | `dependencies` | the fleet-wide dependency breakers as a worker or API process reads them: which job types are held (workers) or refused (the front door), and until when (rules in `core::dependency`, rows in `store::dependencies`) |
//! | `classifier` | the pool classifier's submit side: a reclassified job type's jobs go to the pool their run times fit |
//! | `watch` | watching a job from outside, run by `fairway serve`: |
//! | `watch::events` | lifecycle and progress events, the history recorder, the live feed |
//! | `watch::webhooks` | result callbacks: signed POSTs of results, retried with backoff |
//! | `watch::alerts` | alert callbacks: signed `alert.opened` / `alert.resolved` POSTs to a tenant's receiver, in lanes, retried with backoff |
//! | `ledger` | the usage ledger: the results topic tallied per tenant, pool and job type into 15-minute windows (one writer by lease, in `fairway serve`), and its reports (`GET /v1/usage`, `fairway usage`; rules in `core::ledger`) |
//! | `ledger::dependencies` | the fleet-wide dependency breakers stepped by the ledger's leader from every worker's outcome cells: their rows, `dependency_circuit_open` / `_closed` events, metrics and the affected tenants' alerts |
//! | `ledger::alerts` | tenant-facing alerts evaluated by the ledger's leader from the results it reads (rules in `core::alerts`, rows in `store::alerts`, events sent by `watch::alerts`) |
//! | `ops` | the operators' commands' I/O shells (CLI, admin API, console): |
//! | `ops::backup` | `fairway backup` / `fairway restore`: a consistent online copy to a directory, restored onto an empty cluster (rules in `core::dr`, I/O in `kafka::copy` and `store`'s `dr` statements) |
//! | `ops::replay` | `fairway replay`: dead letters and retry records back to their pool |
//! | `ops::rerun` | `fairway rerun`: "rerun all" of a tenant's jobs by generation |
//! | `ops::schedules` | `fairway schedules`: recurring schedules' management (firing: `worker::schedules`) |
//! | `ops::tenants` | `fairway tenants`: the tenants registry's rows and every process's live view of them (rules in `core::tenants`) |
//! | `api` | the HTTP API (axum), its per-key limits (`api::limits`), its listener's per-address, per-prefix and total connection bounds (`api::listener`) and the operator console (`api::console`) |
//! | `api::connection` | one open API connection shared by its I/O and its requests: the head deadline for bytes read while no request is open (HTTP/1 and HTTP/2), the tenants and admin keys it carries (`api.limits.connections_per_tenant`) |
//! | `api::replays` | dead-letter replays started through the API (`POST /v1/replays`) or the console, by an admin or a tenant for its own jobs, with per-tenant and per-process bounds |
//! | `api::console::charts` | the console's server-rendered SVG charts (pure: series in, markup out) |
//! | `api::console::tenant` | a tenant's console page: the usage ledger's charts (`ledger::tenant_charts`) and its alerts |
//! | `api::starting` | `fairway serve`'s metrics listener from the process's start: live, and not ready with what the start waits for (the database, up to `scylla.connect_wait`), until the API's state exists |
//! | `api::regions` | a tenant's home region at the API: 421 to its home, 503 while this region is draining or down (`fairway region`; rules in `core::regions`, state in `store`'s `region_states`) |
//! | `observe` | watching a process: |
//! | `observe::probes` | readiness and liveness (`/readyz`, `/livez`) |
//! | `observe::telemetry` | OpenTelemetry spans of a job's life over OTLP/HTTP (off unless configured) |
//! | `metrics` | metric names and the Prometheus exporter |
//! | `sim` | the deterministic fleet simulator: the shipping pool loop, route and heartbeat loop of every worker over in-memory doubles of the store and the broker (`sim::doubles`, `sim::broker`; `sim::contract` holds the double to the real store), on paused time in one thread, workload and faults from one seed (`sim::fleet`); invariants checked after every run, the usage ledger's leader simulated over its results (`sim::ledger`) for the usage counted once (`fairway-sim`, feature `sim-route`; docs/simulation.md) |
//! | `netlab` | the network-partition lab and its scenario (`fairway-bench bench partitions`, partition tests) |

pub mod admission;
pub mod api;
pub mod classifier;
pub mod codec;
pub mod config;
pub mod core;
pub mod dependencies;
pub mod handlers;
pub mod kafka;
pub mod ledger;
pub mod metrics;
pub mod model;
pub mod netlab;
pub mod observe;
pub mod ops;
pub mod seams;
pub mod sim;
pub mod store;
pub mod submit;
pub mod watch;
pub mod worker;

/// Milliseconds since the Unix epoch: the one clock the I/O edges read.
pub fn now_ms() -> model::Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
