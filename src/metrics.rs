//! Metric names, in one place, with their descriptions registered at start-up.
//! Labels stay bounded: pool, status, failure class, configured job type, reason.

// The HTTP API's (labels stay bounded: route template, method, status code, pool, tier).
pub const API_REQUESTS: &str = "fairway_api_requests_total";
pub const API_REQUEST_SECONDS: &str = "fairway_api_request_seconds";
pub const API_JOBS_SUBMITTED: &str = "fairway_api_jobs_submitted_total";
pub const API_RATE_LIMITED: &str = "fairway_api_rate_limited_total";
pub const API_CONNECTIONS: &str = "fairway_api_connections";
pub const API_CONNECTIONS_REFUSED: &str = "fairway_api_connections_refused_total";
pub const API_REQUESTS_THROTTLED: &str = "fairway_api_requests_throttled_total";
pub const JOBS_RECEIVED: &str = "fairway_jobs_received_total";
pub const JOBS_FINISHED: &str = "fairway_jobs_finished_total";
pub const OUTCOME_WRITE_FAILURES: &str = "fairway_outcome_write_failures_total";
pub const JOBS_SKIPPED: &str = "fairway_jobs_skipped_total";
pub const JOBS_NOT_RUN: &str = "fairway_jobs_not_run_total";
pub const JOBS_RUNNING: &str = "fairway_jobs_running";
pub const QUEUED: &str = "fairway_jobs_queued";
pub const QUEUED_BYTES: &str = "fairway_jobs_queued_bytes";
pub const JOB_RUN_SECONDS: &str = "fairway_job_run_seconds";
pub const JOB_END_TO_END_SECONDS: &str = "fairway_job_end_to_end_seconds";
pub const JOB_WAIT_SECONDS: &str = "fairway_job_wait_seconds";
pub const JOB_FAILURES: &str = "fairway_job_failures_total";
pub const RETRIES: &str = "fairway_retries_total";
pub const DEAD_LETTERS: &str = "fairway_dead_letters_total";
pub const JOBS_DEFERRED: &str = "fairway_jobs_deferred_total";
pub const JOBS_HELD_STORE_DOWN: &str = "fairway_jobs_held_store_down_total";
pub const JOBS_EXPIRED_QUEUED: &str = "fairway_jobs_expired_queued_total";
pub const JOBS_TAKEN_OVER: &str = "fairway_jobs_taken_over_total";
pub const RUNS_FENCED: &str = "fairway_runs_fenced_total";
pub const JOBS_TAKEN_AGAIN: &str = "fairway_jobs_taken_again_total";
pub const OUTCOMES_NOT_SENT_UNOWNED: &str = "fairway_outcomes_not_sent_unowned_total";
pub const HEARTBEAT_AGE_SECONDS: &str = "fairway_heartbeat_age_seconds";
pub const HEARTBEATS: &str = "fairway_heartbeats_total";
pub const REAPED: &str = "fairway_jobs_reaped_total";
// Partitions and fatal client errors (`kafka::producer`, `worker::watchdog`).
pub const KAFKA_FATAL_ERRORS: &str = "fairway_kafka_fatal_errors_total";
pub const PRODUCER_REBUILDS: &str = "fairway_producer_rebuilds_total";
// Lanes (`core::lanes`, `submit`).
pub const PARTITION_COUNT_FAILURES: &str = "fairway_partition_count_failures_total";
pub const SUBMIT_LANES: &str = "fairway_submit_spread_jobs_total";
pub const STORE_UNREACHABLE_SECONDS: &str = "fairway_store_unreachable_seconds";
pub const WORKER_LIVE: &str = "fairway_worker_live";
pub const WORKER_GAVE_UP: &str = "fairway_worker_gave_up_total";
pub const CANCELLATIONS: &str = "fairway_cancellations_total";
pub const BREAKER_OPEN: &str = "fairway_breaker_open";
pub const PARTITION_PAUSES: &str = "fairway_partition_pauses_total";
pub const FAST_LANE_DISPATCHES: &str = "fairway_fast_lane_dispatches_total";
pub const STATE_READS_SKIPPED: &str = "fairway_state_reads_skipped_total";
pub const BREAKER_REJECTIONS: &str = "fairway_breaker_rejections_total";
pub const TIER_BACKLOG: &str = "fairway_tier_backlog";
pub const TIER_RUNNING: &str = "fairway_tier_running";
pub const TIER_SLOT_SECONDS_USED: &str = "fairway_tier_slot_seconds_used";
pub const TIER_FLEET_USAGE: &str = "fairway_tier_fleet_usage_slot_seconds";
pub const API_AUTH_REFUSED: &str = "fairway_api_auth_refused_total";
pub const USAGE_PASS_FAILURES: &str = "fairway_usage_pass_failures_total";
pub const QUOTA_PASS_FAILURES: &str = "fairway_quota_pass_failures_total";
pub const FLOW_PARKED: &str = "fairway_flow_parked";
pub const JOBS_SPILLED: &str = "fairway_jobs_spilled_total";
pub const JOBS_UNSPILLED: &str = "fairway_jobs_unspilled_total";
pub const SPILL_FAILURES: &str = "fairway_spill_failures_total";
pub const SPILLED_BACKLOG: &str = "fairway_spilled_backlog";
pub const JOBS_HELD_UNTIL_DUE: &str = "fairway_jobs_held_until_due";
pub const SPILL_ROWS: &str = "fairway_spill_rows_written_total";
pub const SPILL_WRITE_SECONDS: &str = "fairway_spill_write_seconds";
pub const SPILL_PAUSES: &str = "fairway_spill_pauses_total";
pub const SPILL_PAUSED_SECONDS: &str = "fairway_spill_paused_seconds_total";
pub const OLDEST_WAIT_SECONDS: &str = "fairway_oldest_wait_seconds";
pub const OLDEST_DUE_UNPROMOTED_AGE: &str = "fairway_oldest_due_unpromoted_age_seconds";
pub const JOBS_PROMOTED: &str = "fairway_jobs_promoted_total";
pub const TENANT_APPLY_FAILURES: &str = "fairway_tenant_apply_failures_total";
pub const SCHEDULER_TENANTS: &str = "fairway_scheduler_tenants";
pub const SCHEDULER_TENANTS_EVICTED: &str = "fairway_scheduler_tenants_evicted_total";
pub const POOL_UNASSIGNED_SECONDS: &str = "fairway_pool_unassigned_seconds";
pub const HAND_OFFS: &str = "fairway_hand_offs_total";
pub const RUNNING_WRITE_FAILURES: &str = "fairway_running_write_failures_total";
pub const SUPERSEDED_WRITES: &str = "fairway_superseded_writes_total";
pub const EVENTS_PUBLISHED: &str = "fairway_events_published_total";
pub const EVENTS_DROPPED: &str = "fairway_events_dropped_total";
pub const EVENTS_RECORDED: &str = "fairway_events_recorded_total";
pub const EVENT_RECORD_FAILURES: &str = "fairway_event_record_failures_total";
pub const EVENT_STREAMS: &str = "fairway_event_streams";
pub const EVENT_STREAM_GAPS: &str = "fairway_event_stream_gaps_total";
/// The usage ledger (`crate::ledger`): results tallied, undecodable records skipped,
/// failed writes (retried), whether this process leads, and results not yet tallied.
pub const LEDGER_RESULTS: &str = "fairway_ledger_results_total";
pub const LEDGER_UNDECODABLE: &str = "fairway_ledger_undecodable_total";
pub const LEDGER_WRITE_FAILURES: &str = "fairway_ledger_write_failures_total";
pub const LEDGER_LEADER: &str = "fairway_ledger_leader";
pub const LEDGER_LAG: &str = "fairway_ledger_lag_records";
pub const ALERT_DELIVERIES: &str = "fairway_alert_deliveries_total";
pub const ALERT_CHANGES: &str = "fairway_alert_changes_total";
pub const DEPENDENCY_CIRCUIT_OPEN: &str = "fairway_dependency_circuit_open";
pub const DEPENDENCY_CIRCUIT_CHANGES: &str = "fairway_dependency_circuit_changes_total";
pub const DEPENDENCY_HELD: &str = "fairway_dependency_held_total";
pub const DEPENDENCY_READ_FAILURES: &str = "fairway_dependency_read_failures_total";
pub const REFUSALS_UNTRACKED: &str = "fairway_refusals_untracked_total";
pub const ALERTS_UNTRACKED: &str = "fairway_alerts_untracked_results_total";
pub const WEBHOOK_ATTEMPTS: &str = "fairway_webhook_attempts_total";
pub const WEBHOOKS_IN_FLIGHT: &str = "fairway_webhooks_in_flight";
pub const SUBMIT_STATE_WRITE_SECONDS: &str = "fairway_submit_state_write_seconds";
pub const SUBMIT_STATE_WRITE_FAILURES: &str = "fairway_submit_state_write_failures_total";
pub const JOB_DISPATCH_WAIT_SECONDS: &str = "fairway_job_dispatch_wait_seconds";
pub const POOL_SLOTS: &str = "fairway_pool_slots";
pub const CONSUMER_LAG: &str = "fairway_consumer_lag";
pub const CONSUMER_REPLACEMENTS: &str = "fairway_consumer_replacements_total";
pub const PARTITIONS_NOT_FETCHING: &str = "fairway_partitions_not_fetching";
pub const FETCHER_RESTARTS: &str = "fairway_fetcher_restarts_total";
pub const CONSUMER_LAG_SECONDS: &str = "fairway_consumer_lag_seconds";
pub const TIER_ENTITLED_SHARE: &str = "fairway_tier_entitled_share";
pub const TIER_ACTUAL_SHARE: &str = "fairway_tier_actual_share";
pub const QUEUE_COUNT_FAILURES: &str = "fairway_queue_count_failures_total";
pub const QUOTA_ALERTS: &str = "fairway_quota_alerts_total";
pub const QUOTA_TENANTS_OVER: &str = "fairway_quota_tenants_over";
pub const SUBMIT_BREAKER_OPEN: &str = "fairway_submit_breaker_open";
pub const ADMISSION_REFUSED: &str = "fairway_admission_refused_total";
pub const OUTCOME_COUNT_FAILURES: &str = "fairway_outcome_count_failures_total";
pub const POOL_VIOLATIONS: &str = "fairway_pool_violations_total";
pub const POOL_RECLASSIFICATIONS: &str = "fairway_pool_reclassifications_total";
pub const POOL_CLASS: &str = "fairway_pool_class";
pub const RUN_TIME_WRITE_FAILURES: &str = "fairway_run_time_write_failures_total";
pub const CLASSIFIER_PASS_FAILURES: &str = "fairway_classifier_pass_failures_total";
pub const CLASSIFIER_UNTRACKED_RUNS: &str = "fairway_classifier_untracked_runs_total";
pub const POOL_CLASS_READ_FAILURES: &str = "fairway_pool_class_read_failures_total";
pub const STUCK_JOBS: &str = "fairway_stuck_jobs_total";
pub const PROCESS_RECYCLED: &str = "fairway_process_recycled_total";
pub const RECYCLING_HELD_TENANTS: &str = "fairway_recycling_held_tenants";
// Recurring schedules (`worker::schedules`, the promoter's leader; never by tenant).
pub const SCHEDULE_FIRES: &str = "fairway_schedule_fires_total";
pub const SCHEDULE_SKIPS: &str = "fairway_schedule_skips_total";
pub const SCHEDULE_FIRE_LAG_SECONDS: &str = "fairway_schedule_fire_lag_seconds";
pub const SCHEDULE_OLDEST_DUE_SECONDS: &str = "fairway_schedule_oldest_due_seconds";
pub const SCHEDULES: &str = "fairway_schedules";

/// Bucket bounds (seconds) of the job latency histograms: they include the pools' SLOs
/// (0.5 s, 5 s, 60 s) and the 30 s end-to-end alert threshold, up to the long pool's 6 h.
pub const LATENCY_BUCKETS: [f64; 20] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0, 21600.0,
];

/// Exports the job latency metrics as Prometheus histograms (buckets, aggregatable across
/// workers with `histogram_quantile`) instead of the exporter's per-process summaries.
pub fn with_buckets(
    b: metrics_exporter_prometheus::PrometheusBuilder,
) -> metrics_exporter_prometheus::PrometheusBuilder {
    use metrics_exporter_prometheus::Matcher;
    let timed = [
        JOB_END_TO_END_SECONDS,
        JOB_WAIT_SECONDS,
        JOB_DISPATCH_WAIT_SECONDS,
        JOB_RUN_SECONDS,
        SCHEDULE_FIRE_LAG_SECONDS,
    ];
    timed.iter().fold(b, |b, name| {
        b.set_buckets_for_metric(Matcher::Full(name.to_string()), &LATENCY_BUCKETS)
            .expect("LATENCY_BUCKETS is not empty")
    })
}

/// Registers descriptions (shown as HELP lines by the Prometheus exporter).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(API_REQUESTS, "HTTP API requests, by route, method and status");
    describe_histogram!(API_REQUEST_SECONDS, Unit::Seconds, "HTTP API request latency, by route");
    describe_counter!(
        API_JOBS_SUBMITTED,
        "Jobs accepted by the HTTP API, by pool and duplicate (idempotency key reused)"
    );
    describe_counter!(API_RATE_LIMITED, "Submissions refused with 429, by tenant tier");
    describe_gauge!(API_CONNECTIONS, "Open connections to the API listener");
    describe_counter!(
        API_CONNECTIONS_REFUSED,
        "Connections answered 503 and closed, by reason (per_ip: one address holds api.limits.connections_per_ip; \
         per_prefix: one IPv4 /24 or IPv6 /64 holds api.limits.connections_per_prefix; per_tenant: the \
         request's tenant or admin key has requests on api.limits.connections_per_tenant connections; total: \
         api.limits.connections are open)"
    );
    describe_counter!(
        API_REQUESTS_THROTTLED,
        "Requests refused 429 by the per-key or per-tenant request bucket (api.limits.requests_per_key, \
         requests_per_tenant), by scope"
    );
    describe_counter!(JOBS_RECEIVED, "Jobs consumed from pool topics, by pool");
    describe_counter!(JOBS_FINISHED, "Terminal outcomes recorded, by pool and status");
    describe_counter!(
        OUTCOME_WRITE_FAILURES,
        "Terminal results published whose state could not be written within the outage retries (a marked run's job runs again, a possible duplicate result; an unclaimed run's offset was committed with its result, and its state stays unrecorded)"
    );
    describe_counter!(JOBS_SKIPPED, "Redelivered jobs acknowledged without running, by reason");
    describe_counter!(JOBS_NOT_RUN, "Messages completed without running a handler");
    describe_gauge!(JOBS_RUNNING, "Jobs running now, by pool");
    describe_gauge!(QUEUED, "Jobs buffered in the worker waiting for a slot, by pool");
    describe_gauge!(QUEUED_BYTES, "Bytes of the jobs buffered in the worker (payloads and strings), by pool");
    describe_histogram!(JOB_RUN_SECONDS, Unit::Seconds, "Handler run time, by pool");
    describe_histogram!(JOB_END_TO_END_SECONDS, Unit::Seconds, "Submission to terminal outcome, by pool");
    describe_histogram!(
        JOB_WAIT_SECONDS,
        Unit::Seconds,
        "Submission to handler start by stage (fetch: submitted -> consumed, queue: consumed -> slot, check: slot -> handler), by pool"
    );
    describe_counter!(JOB_FAILURES, "Failed attempts, by pool and failure class");
    describe_counter!(RETRIES, "Jobs sent to a retry topic, by class and job type");
    describe_counter!(DEAD_LETTERS, "Jobs dead-lettered, by class and job type");
    describe_counter!(JOBS_DEFERRED, "Redelivered jobs deferred because another worker still heartbeats them");
    describe_counter!(JOBS_EXPIRED_QUEUED, "Queued jobs expired at their not_after without taking a slot, by pool");
    describe_counter!(
        JOBS_HELD_STORE_DOWN,
        "Jobs held back before running because the store was unreachable (no attempt, no crash)"
    );
    describe_counter!(JOBS_TAKEN_OVER, "Jobs taken over from a worker whose heartbeat lapsed");
    describe_counter!(
        RUNS_FENCED,
        "Runs that stopped themselves, outcome dropped, because no heartbeat of theirs was acknowledged for two intervals"
    );
    describe_counter!(
        JOBS_TAKEN_AGAIN,
        "Jobs whose outcome was not durable taken in again on the partition that still holds them, by pool"
    );
    describe_counter!(
        OUTCOMES_NOT_SENT_UNOWNED,
        "Outcome records (results, retries, hand-offs) not sent because the job's partition was lost meanwhile (session timed out); its next owner handles the job, by pool"
    );
    describe_gauge!(HEARTBEAT_AGE_SECONDS, Unit::Seconds, "Age of the oldest heartbeat of this worker's running jobs");
    describe_counter!(HEARTBEATS, "Heartbeats written, by pool");
    describe_counter!(REAPED, "Running jobs re-dispatched by the reaper after their heartbeat lapsed");
    describe_counter!(
        KAFKA_FATAL_ERRORS,
        "Fatal librdkafka errors (rd_kafka_fatal_error: fenced or invalid producer...), by client (producer, consumer)"
    );
    describe_counter!(
        PARTITION_COUNT_FAILURES,
        "Reads of a pool topic's partition count that failed (records placed by key hash meanwhile)"
    );
    describe_counter!(SUBMIT_LANES, "Submissions placed on a lane other than their tenant's home partition");
    describe_counter!(
        PRODUCER_REBUILDS,
        "Kafka producers replaced after a fatal error (unacknowledged records sent again on the new one)"
    );
    describe_gauge!(
        STORE_UNREACHABLE_SECONDS,
        Unit::Seconds,
        "How long this worker's store probe has been failing (0: the store answers)"
    );
    describe_gauge!(WORKER_LIVE, "1 while this worker can make progress, 0 while it cannot (store unreachable past the limit, a fatal client error): its liveness");
    describe_counter!(
        WORKER_GAVE_UP,
        "Times this worker gave up (left its groups to exit non-zero), by reason (producer, consumer, store)"
    );
    describe_counter!(CANCELLATIONS, "Cancellation requests seen by running jobs, by pool");
    describe_counter!(
        FAST_LANE_DISPATCHES,
        "Jobs started in a fast lane beyond the slots (light tenants while every slot was busy), by pool"
    );
    describe_counter!(
        STATE_READS_SKIPPED,
        "Jobs started without the effectively-once state read (never started by anyone: above the dispatch frontier), by pool"
    );
    describe_gauge!(SCHEDULER_TENANTS, "Tenants whose state this worker's scheduler holds (active lately), by pool");
    describe_counter!(
        SCHEDULER_TENANTS_EVICTED,
        "Idle tenants forgotten by this worker's scheduler (worker.tenant_idle_evict), by pool"
    );
    describe_counter!(PARTITION_PAUSES, "Partitions paused because a tenant's buffer in this worker was full");
    describe_gauge!(BREAKER_OPEN, "1 while the job type's circuit breaker is open or half-open, by job type");
    describe_counter!(BREAKER_REJECTIONS, "Jobs held back because their job type's breaker is open");
    describe_gauge!(TIER_BACKLOG, "Jobs queued in this worker's scheduler, by pool and tenant tier");
    describe_gauge!(TIER_RUNNING, "Jobs running in this worker's scheduler, by pool and tenant tier");
    describe_gauge!(TIER_SLOT_SECONDS_USED, "Slot-seconds used here since the worker started, by pool and tenant tier");
    describe_gauge!(TIER_FLEET_USAGE, "Decayed slot-seconds used elsewhere in the fleet, by pool and tenant tier");
    describe_counter!(
        JOBS_SPILLED,
        "Jobs spilled to the store's backlog because their tenant's buffer was full, by pool"
    );
    describe_counter!(JOBS_UNSPILLED, "Spilled jobs read back into the worker's buffer, by pool");
    describe_counter!(HAND_OFFS, "Running jobs handed off to another worker by a draining worker, by pool");
    describe_counter!(
        RUNNING_WRITE_FAILURES,
        "Running jobs stopped and handed back because the store did not take their running row and reaper entry, by pool"
    );
    describe_counter!(
        SUPERSEDED_WRITES,
        "State writes of superseded runs the store refused (a running mark over a finished job, a retrying state over another run's row), by pool and write"
    );
    describe_gauge!(
        POOL_UNASSIGNED_SECONDS,
        Unit::Seconds,
        "How long this worker's consumer of the pool has owned no partition (0 while it owns some), by pool"
    );
    describe_counter!(
        TENANT_APPLY_FAILURES,
        "Registry settings a worker's scheduler could not apply in full (a reservation the pool cannot hold is left out), by pool"
    );
    describe_counter!(SPILL_FAILURES, "Spills the store refused (the jobs stayed in memory), by pool");
    describe_gauge!(SPILLED_BACKLOG, "Jobs waiting in spilled backlogs this worker owns, by pool");
    describe_gauge!(
        JOBS_HELD_UNTIL_DUE,
        "Jobs held in this worker's memory, offsets uncommitted: delayed jobs due within a second until due, and jobs whose outcome was not durable until taken in again, by pool"
    );
    describe_counter!(SPILL_ROWS, "Store rows written by the spill path (many spilled jobs per row), by pool");
    describe_histogram!(
        SPILL_WRITE_SECONDS,
        Unit::Seconds,
        "Time of one spill write to the store (a bucket's rows), by pool"
    );
    describe_counter!(
        SPILL_PAUSES,
        "Times a partition paused because its spill writes in flight reached their bound (the store is behind), by pool"
    );
    describe_counter!(
        SPILL_PAUSED_SECONDS,
        Unit::Seconds,
        "Time partitions spent paused because their spill writes in flight reached their bound, by pool"
    );
    describe_gauge!(
        OLDEST_WAIT_SECONDS,
        Unit::Seconds,
        "Age of the oldest job waiting in this worker's buffer, by pool"
    );
    describe_gauge!(
        OLDEST_DUE_UNPROMOTED_AGE,
        Unit::Seconds,
        "How long the oldest due scheduled job still parked in the store has been due (promoter leader; 0 when none)"
    );
    describe_counter!(JOBS_PROMOTED, "Parked scheduled jobs and retries the promoter moved back to their pool topics");
    describe_counter!(EVENTS_PUBLISHED, "Job events queued for the events topic, by kind");
    describe_counter!(
        EVENTS_DROPPED,
        "Job events the producer could not queue (dropped; the job's row stays the truth)"
    );
    describe_counter!(EVENTS_RECORDED, "Job events written to the job_events history by the recorder");
    describe_counter!(EVENT_RECORD_FAILURES, "History writes the store refused (retried; offsets wait)");
    describe_gauge!(EVENT_STREAMS, "Server-Sent Event streams open now");
    describe_counter!(
        EVENT_STREAM_GAPS,
        "Gaps a live events stream (GET /v1/events?follow=1) fell behind the feed and told its reader"
    );
    describe_counter!(
        LEDGER_RESULTS,
        "Results the usage ledger tallied (counted again when a new leader re-reads a window)"
    );
    describe_counter!(LEDGER_UNDECODABLE, "Records of the results topic the usage ledger could not decode (skipped)");
    describe_counter!(
        LEDGER_WRITE_FAILURES,
        "Usage ledger writes that failed (retried; the ledger falls behind meanwhile)"
    );
    describe_gauge!(LEDGER_LEADER, "1 while this process leads the usage ledger");
    describe_gauge!(LEDGER_LAG, "Results published but not yet written to the usage ledger (leader only)");
    describe_counter!(ALERT_DELIVERIES, "Attempts to deliver tenant alert events, by result (no tenant label)");
    describe_counter!(ALERT_CHANGES, "Tenant alerts opened and resolved, by kind (no tenant label)");
    describe_gauge!(
        DEPENDENCY_CIRCUIT_OPEN,
        "1 while a dependency's fleet-wide breaker holds its job types, by dependency (set by the ledger's leader)"
    );
    describe_counter!(
        DEPENDENCY_CIRCUIT_CHANGES,
        "Fleet-wide dependency breakers' changes, by dependency and kind (opened, reopened, closed)"
    );
    describe_counter!(
        DEPENDENCY_HELD,
        "Jobs held (attempt unchanged) or submissions refused because a dependency's fleet-wide breaker is open, by dependency and where (worker, api)"
    );
    describe_counter!(
        REFUSALS_UNTRACKED,
        "Refusals or near-limit admissions not counted per tenant: the tenant's class (free or paying) or the tenant itself already held its cells of the hour (core::refusals)"
    );
    describe_counter!(
        DEPENDENCY_READ_FAILURES,
        "Failed reads of the dependency breakers' rows or outcome cells, by process role (the last states read are kept)"
    );
    describe_counter!(ALERTS_UNTRACKED, "Results not evaluated for alerts: their tenant would pass alerts.max_tenants");
    describe_counter!(
        WEBHOOK_ATTEMPTS,
        "Result callback attempts, by result (delivered, retry, refused, gave_up, not_sent)"
    );
    describe_gauge!(WEBHOOKS_IN_FLIGHT, "Results whose callback is being delivered (attempting or waiting to retry)");
    describe_histogram!(
        SUBMIT_STATE_WRITE_SECONDS,
        Unit::Seconds,
        "Time of the queued/scheduled row write at submission (runs alongside the Kafka produce)"
    );
    describe_counter!(
        SUBMIT_STATE_WRITE_FAILURES,
        "Submissions whose queued row could not be written (the job is accepted; visible once a worker starts it)"
    );
    describe_counter!(API_AUTH_REFUSED, "HTTP API requests refused with 401 (no, malformed, unknown or revoked key)");
    describe_counter!(
        USAGE_PASS_FAILURES,
        "Fleet usage passes that could not write or read the store, by pool and step"
    );
    describe_counter!(
        QUOTA_PASS_FAILURES,
        "Fleet-wide limit exchanges (quotas table) that could not read or write the store, by pool and step"
    );
    describe_gauge!(
        FLOW_PARKED,
        "Jobs held back here because their flow key is at its fleet-wide parallelism, by pool"
    );
    describe_histogram!(
        JOB_DISPATCH_WAIT_SECONDS,
        Unit::Seconds,
        "Submission (or scheduled time) to first dispatch of original submissions' first attempts (the wait the pools' SLOs bound), by pool"
    );
    describe_gauge!(
        POOL_SLOTS,
        "Configured slots of the pool in this worker (utilisation: fairway_jobs_running / this)"
    );
    describe_gauge!(
        CONSUMER_LAG_SECONDS,
        "Kafka lag in time: age of the oldest record on this worker's partitions of the pool topic whose offset is not yet committable (0 when caught up; spilled jobs are in fairway_spilled_backlog), by pool"
    );
    describe_gauge!(
        PARTITIONS_NOT_FETCHING,
        "Partitions of the pool topic this worker owns whose fetcher has not been active for 15 s or more (librdkafka's fetch_state, from its statistics): their jobs are not being read, by pool"
    );
    describe_counter!(
        FETCHER_RESTARTS,
        "Restarts of a pool consumer's fetchers (its assignment assigned again) because an owned partition was not being fetched, by pool"
    );
    describe_counter!(
        CONSUMER_REPLACEMENTS,
        "Pool consumers replaced by a new one because their group membership stayed unsettled for 60 s (librdkafka's group state, from its statistics), by pool"
    );
    describe_gauge!(
        CONSUMER_LAG,
        "Records on the pool topic's partitions this worker owns that are not yet committed (high watermark - committed offset), by pool"
    );
    describe_gauge!(
        TIER_ENTITLED_SHARE,
        "Share of the pool's slots the tier's tenants present in this worker's scheduler are entitled to (0-1), by pool and tier"
    );
    describe_counter!(
        QUEUE_COUNT_FAILURES,
        "Queue-depth counter writes that failed (enqueued at the front door or dequeued by a worker): the count drifts"
    );
    describe_counter!(
        QUOTA_ALERTS,
        "Tenants crossing an alert level of a limit (max_queued, tenant_rate, user_rate), by limit and level (percent)"
    );
    describe_gauge!(
        QUOTA_TENANTS_OVER,
        "Tenants at or above an alert level of a limit as this process last saw them, by limit and level (percent)"
    );
    describe_gauge!(
        SUBMIT_BREAKER_OPEN,
        "1 while the submission circuit breaker of a pool or job type is open or half-open (scope pool:<p> / job_type:<t>)"
    );
    describe_counter!(
        ADMISSION_REFUSED,
        "Jobs refused at the front door, by reason (max_queued, tenant_rate, user_rate, circuit_open, store_unavailable)"
    );
    describe_counter!(
        OUTCOME_COUNT_FAILURES,
        "Worker passes that could not write attempt outcome counts for the submission breakers, by pool"
    );
    describe_counter!(
        POOL_VIOLATIONS,
        "Runs outside the run-time range of the pool they ran in (pools.<p>.max_run), by pool, job type and \
         direction (over, under)"
    );
    describe_counter!(
        POOL_RECLASSIFICATIONS,
        "(Job type, tenant) subjects the pool classifier moved to another pool (that tenant's new jobs of the \
         type go there), by job type, from and to"
    );
    describe_gauge!(
        POOL_CLASS,
        "Tenants whose jobs of each job type the classifier assigns to each pool (the classifier's leader), by \
         job type and pool"
    );
    describe_counter!(
        RUN_TIME_WRITE_FAILURES,
        "Worker passes that could not write run-time cells for the pool classifier, by pool"
    );
    describe_counter!(CLASSIFIER_PASS_FAILURES, "Pool classifier passes that failed (store unreachable), by step");
    describe_counter!(
        CLASSIFIER_UNTRACKED_RUNS,
        "Runs not counted for the pool classifier: the bucket already counted classifier.max_tracked (job type, \
         tenant) subjects, by pool"
    );
    describe_counter!(
        POOL_CLASS_READ_FAILURES,
        "Reads of the pool classes by a submitting process that failed (it kept the classes it had)"
    );
    describe_gauge!(
        TIER_ACTUAL_SHARE,
        "Share of the pool's slot-time the tier's tenants actually got recently in this worker (0-1), by pool and tier"
    );
    describe_counter!(
        STUCK_JOBS,
        "Running jobs dead-lettered for no progress, checkpoint or heartbeat within stuck_after, by pool"
    );
    describe_counter!(
        PROCESS_RECYCLED,
        "Job child processes killed (limit, stuck, grace) or ended by a signal, by pool (the recycling cap counts these)"
    );
    describe_counter!(
        SCHEDULE_FIRES,
        "Recurring schedule fires, by outcome: on_time and caught_up (submitted; caught_up: older than 60 s, by \
         catch-up one or all), held (refused by the front door) and failed (invalid template or submit error); held \
         and failed fires are tried again on the next pass"
    );
    describe_counter!(
        SCHEDULE_SKIPS,
        "Times a schedule's missed fires were skipped by its catch-up policy, by policy (none: all of them; one: all \
         but one; all: those older than 24 h)"
    );
    describe_histogram!(
        SCHEDULE_FIRE_LAG_SECONDS,
        Unit::Seconds,
        "From a schedule fire's time to its job's submission (jitter not included)"
    );
    describe_gauge!(
        SCHEDULE_OLDEST_DUE_SECONDS,
        Unit::Seconds,
        "Age of the oldest schedule fire due but not submitted after the leader's last pass (0: none)"
    );
    describe_gauge!(SCHEDULES, "Schedules of the deployment as the leader last read them, by state (active, paused)");
    describe_gauge!(
        RECYCLING_HELD_TENANTS,
        "Tenants whose jobs wait in this pool because they reached the recycling cap (wait reason recycling_cap), by pool"
    );
}

/// Why the metrics listener or recorder could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("worker.metrics_listen {listen:?} is not host:port ({source}); write e.g. \"0.0.0.0:9464\"")]
    Listen { listen: String, source: std::net::AddrParseError },
    #[error("cannot install the Prometheus recorder: {0}")]
    Recorder(#[from] metrics_exporter_prometheus::BuildError),
}

/// The worker's metrics listener (`/metrics`, `/readyz`, `/livez`): `listen` (host:port,
/// e.g. "0.0.0.0:9464" for a remote Prometheus) when given, else 127.0.0.1:port; None
/// when off (no listen address and port 0).
pub fn listen_addr(listen: Option<&str>, port: u16) -> Result<Option<std::net::SocketAddr>, MetricsError> {
    match listen {
        Some(l) => l.parse().map(Some).map_err(|source| MetricsError::Listen { listen: l.to_string(), source }),
        None if port == 0 => Ok(None),
        None => Ok(Some(([127, 0, 0, 1], port).into())),
    }
}

/// Installs the global Prometheus recorder without a listener of its own (the caller
/// serves `/metrics`, see `probes::router`) and describes every metric.
pub fn install_recorder() -> Result<metrics_exporter_prometheus::PrometheusHandle, MetricsError> {
    let handle = with_buckets(metrics_exporter_prometheus::PrometheusBuilder::new()).install_recorder()?;
    describe();
    Ok(handle)
}

/// Handles of the metrics every job of a pool touches, registered once per pool: a
/// `metrics::*!` call builds its key and looks it up in the recorder each time, about a
/// dozen times per job. They belong to the recorder installed when they are made (a
/// worker installs its recorder before it starts; without one they record nothing).
pub struct PoolMetrics {
    pub jobs_received: metrics::Counter,
    pub state_reads_skipped: metrics::Counter,
    /// `fairway_job_wait_seconds` by stage: the broker hop, the fair queue, the check.
    pub wait_fetch: metrics::Histogram,
    pub wait_queue: metrics::Histogram,
    pub wait_check: metrics::Histogram,
    pub dispatch_wait: metrics::Histogram,
    pub jobs_running: metrics::Gauge,
    pub run_seconds: metrics::Histogram,
    /// `fairway_jobs_finished_total{status="succeeded"}` (other statuses are rare).
    pub succeeded: metrics::Counter,
    pub end_to_end: metrics::Histogram,
}

impl PoolMetrics {
    pub fn new(pool: &'static str) -> PoolMetrics {
        let wait = |stage: &'static str| metrics::histogram!(JOB_WAIT_SECONDS, "pool" => pool, "stage" => stage);
        PoolMetrics {
            jobs_received: metrics::counter!(JOBS_RECEIVED, "pool" => pool),
            state_reads_skipped: metrics::counter!(STATE_READS_SKIPPED, "pool" => pool),
            wait_fetch: wait("fetch"),
            wait_queue: wait("queue"),
            wait_check: wait("check"),
            dispatch_wait: metrics::histogram!(JOB_DISPATCH_WAIT_SECONDS, "pool" => pool),
            jobs_running: metrics::gauge!(JOBS_RUNNING, "pool" => pool),
            run_seconds: metrics::histogram!(JOB_RUN_SECONDS, "pool" => pool),
            succeeded: metrics::counter!(JOBS_FINISHED, "pool" => pool, "status" => "succeeded"),
            end_to_end: metrics::histogram!(JOB_END_TO_END_SECONDS, "pool" => pool),
        }
    }
}
