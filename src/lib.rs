//! fairway: multi-tenant job processing on Kafka and ScyllaDB, fair in worker time.
//!
//! Module map (pure cores apart from the I/O edges):
//! - `model`     – the domain vocabulary (jobs, results, dead letters, classes).
//! - `codec`     – Avro single-object encoding of the wire records (`schemas/`).
//! - `config`    – the TOML configuration and its validation.
//! - `core`      – pure decisions, no I/O: offset tracking, fair scheduling, retry
//!                 policy, circuit breakers, poison detection, spilled-backlog
//!                 bookkeeping (`core::backlog`), W3C trace-context rules
//!                 (`core::trace`), fleet-wide limits (`core::quota`: allotments,
//!                 rate shares; `core::flow`: flow keys, their parallelism and
//!                 rate, and the gate;
//!                 `core::fleet_counts`: retry budget and poison detection on the
//!                 pool's counts), finished records grouped by submission second
//!                 (`core::finished`), the pool classifier (`core::classifier`), what one
//!                 API key may hold of an API process (`core::frontdoor`),
//!                 `process` jobs' limits and exit verdicts (`core::limits`), the
//!                 per-(tenant, pool) recycling cap (`core::recycling`), the stuck-job
//!                 rule (`core::stuck`).
//!                 recurring schedules' fire times, DST and catch-up (`core::recurring`),
//!                 unique-key scopes and debounce windows (`core::unique`).
//!                 `now` is an argument.
//! - `kafka`     – the Kafka edge (only module importing rdkafka); `kafka::Pauses` keeps a
//!   consumer's partition pauses in step with librdkafka across rebalances;
//!   `kafka::stall` restarts the fetchers of owned partitions librdkafka stopped fetching.
//! - `store`     – the ScyllaDB edge (only module importing scylla).
//! - `handlers`  – the `Handler` trait, job context, HTTP executor, the `process`
//!                 executor (child processes under limits: `handlers::process`), demo
//!                 handlers.
//! - `worker`    – consumer loops moving data between Kafka, the cores and the store
//!                 (a job's route: `check` → `exec` admit/run → `outcome`;
//!                 `worker::backlog`: the spill path of floods beyond the buffer;
//!                 `worker::quota`: the exchange of fleet-wide limits and counts;
//!                 `worker::classifier`: the pool classifier's leader).
//! - `events`    – watching a job: lifecycle/progress events on the events topic, the
//!                 history recorder and the live feed (rules: `core::events`, statements:
//!                 `store::events`, routes: `api::events`).
//! - `webhooks`  – result callbacks: the delivery loop of `fairway serve` POSTs each
//!                 result of a job type with a `webhook_url`, signed, retried with
//!                 backoff (rules: `core::webhooks`).
//! - `submit`    – producing jobs (CLI, HTTP API, demo).
//! - `admission` – the front door of the HTTP API and `fairway submit`: queue depth,
//!                 tenant and per-user rates, submission circuit breakers, quota alerts
//!                 (rules: `core::admission`, counts: `store::admission`).
//! - `classifier` – the pool classifier's submit side: new and replayed jobs of a
//!                 reclassified job type go to the pool its measured run times fit
//!                 (rules: `core::classifier`, tables: `store::classifier`, measuring and
//!                 deciding: `worker::classifier`).
//! - `tenants`   – the live tenants registry (store rows, polled; rules in `core::tenants`).
//! - `dedupe`    – unique jobs (`unique_key` + scope) and debounce (`debounce_key` + delay),
//!                 the submission side (rules: `core::unique`, windows: `store::debounce`).
//! - `schedules` – recurring schedules, the management shell of `fairway schedules` and the
//!                 API (rules: `core::recurring`, rows: `store::schedules`, firing by the
//!                 promoter's leader: `worker::schedules`).
//! - `replayer`  – the I/O shell of `fairway replay` (decisions: `core::replay`): dead
//!                 letters / retry records back to their pool.
//! - `rerunner`  – the I/O shell of `fairway rerun` (decisions: `core::rerun`): "rerun
//!                 all" of a tenant's jobs by generation numbers.
//! - `api`       – the HTTP API (axum) and the operator console (`api::console`: pages,
//!                 sessions and SSE at `/console`; pure parts in `core::console`);
//!                 `api::frontdoor`: per-key and total bounds on bodies, submissions and
//!                 streams in flight, connections and their idle time.
//! - `cqlbridge` – protocol-v4 bridge to the local Cassandra 2.1 test database.
//! - `netlab`    – the network-partition lab (a namespace, veth pairs, a broker and a CQL
//!                 bridge on the host ends) and its scenario, for `fairway bench
//!                 partitions` and the partition tests. Surviving partitions: fatal client
//!                 errors are handled by `kafka::Producer` (rebuilt in place) and
//!                 `worker::watchdog` (give up: leave the groups, exit non-zero), rules in
//!                 `core::vitals`.
//! - `metrics`   – metric names and the Prometheus exporter.
//! - `probes`    – readiness and liveness (`/readyz`, `/livez` on the metrics listener):
//!                 what a worker and `fairway serve` must have to be ready; `Liveness`, the
//!                 shared "cannot make progress" flag.
//! - `telemetry` – OpenTelemetry spans of a job's life (send, dispatch wait, process,
//!                 outcome) over OTLP/HTTP; off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

pub mod admission;
pub mod api;
pub mod classifier;
pub mod codec;
pub mod config;
pub mod core;
pub mod cqlbridge;
pub mod dedupe;
pub mod events;
pub mod handlers;
pub mod kafka;
pub mod metrics;
pub mod model;
pub mod netlab;
pub mod probes;
pub mod replayer;
pub mod rerunner;
pub mod schedules;
pub mod store;
pub mod submit;
pub mod telemetry;
pub mod tenants;
pub mod webhooks;
pub mod worker;

/// Milliseconds since the Unix epoch: the one clock the I/O edges read.
pub fn now_ms() -> model::Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
