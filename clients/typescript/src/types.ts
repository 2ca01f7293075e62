/**
 * The API's shapes, with the field names of the wire (openapi/openapi.json).
 */

export type Pool = "short" | "medium" | "long";
export type Priority = "urgent" | "normal" | "low";
export type JobState =
  | "queued" | "scheduled" | "waiting" | "running" | "retrying"
  | "succeeded" | "failed" | "cancelled" | "expired";
export type EventKind =
  | "queued" | "scheduled" | "waiting" | "started" | "progress" | "retrying" | "succeeded" | "failed"
  | "cancelled" | "expired" | "late_execution" | "dead_lettered" | "webhook_delivered" | "webhook_failed"
  | "pool_reclassified" | "replayed" | "dependency_circuit_open" | "dependency_circuit_closed";

/** A job to submit (`POST /v1/jobs`). */
export interface NewJob {
  /** Required with an admin key; a tenant key may omit it. */
  tenant?: string;
  job_type: string;
  /** Any JSON: a string reaches the handler as its text, anything else as its JSON. */
  payload?: unknown;
  priority?: Priority;
  pool?: Pool;
  /** A second submission with the key answers the first job (`duplicate: true`). */
  idempotency_key?: string;
  /** Do not start before (epoch ms, or a Date). */
  execute_at?: number | Date;
  exact_schedule?: boolean;
  /** Expire the job if it has not started by then (epoch ms, or a Date). */
  not_after?: number | Date;
  flow_key?: string;
  user_key?: string;
  /** Jobs of a tenant with one ordering key keep their submission order. */
  ordering_key?: string;
  unique_key?: string;
  unique_scope?: "queued" | "queued_or_running" | "window";
  unique_window?: string;
  debounce_key?: string;
  debounce_delay?: string;
  debounce_max_delay?: string;
  debounce_mode?: "replace" | "keep_first";
  traceparent?: string;
  tracestate?: string;
}

/** An accepted submission. */
export interface Submitted {
  job_id: string;
  pool: Pool;
  /** The idempotency key was used already: nothing was produced; `job_id` is the original's. */
  duplicate: boolean;
  state?: JobState | null;
  result?: {
    status: string | null; output: string | null; error: string | null; failure_class: string | null;
    attempts: number | null; finished_at: number | null; peak_memory_bytes: number | null; cpu_ms: number | null;
  };
  /** Set by {@link RegionalClient}: the region that accepted the job. */
  region?: string;
}

/** `GET /v1/jobs/{id}`. */
export interface JobStatus {
  job_id: string;
  tenant?: string | null;
  job_type?: string | null;
  pool?: string | null;
  status: string | null;
  state?: JobState;
  wait_reason?: string | null;
  next_attempt_at?: number | null;
  attempts?: number | null;
  crash_count?: number | null;
  generation?: number | null;
  submitted_at?: number | null;
  started_at?: number | null;
  finished_at?: number | null;
  worker?: string | null;
  error?: string | null;
  failure_class?: string | null;
  cancel_requested?: boolean;
  peak_memory_bytes?: number | null;
  cpu_ms?: number | null;
  output?: string | null;
  progress?: number | null;
  progress_message?: string | null;
  heartbeat_age_ms?: number | null;
  source?: string;
}

export interface CancelAccepted {
  job_id: string;
  cancel_requested: true;
  status: string | null;
  message: string;
}

/** One step of a job's life (history, SSE `data`). */
export interface JobEvent {
  event_id: string;
  job_id: string;
  tenant: string;
  job_type: string;
  kind: EventKind;
  at: number;
  attempt: number;
  worker: string | null;
  progress: number | null;
  message: string | null;
  next_attempt_at: number | null;
}

export interface JobHistory {
  job_id: string;
  state: JobState | null;
  events: JobEvent[];
}

export interface ScheduleSpec {
  name: string;
  tenant?: string;
  job_type: string;
  cron?: string;
  every?: string;
  tz?: string;
  payload?: unknown;
  priority?: Priority;
  pool?: Pool;
  flow_key?: string;
  start_at?: number;
  end_at?: number;
  catch_up?: "none" | "one" | "all";
  jitter?: string;
}

export interface Schedule extends ScheduleSpec {
  tenant: string;
  id: string;
  paused: boolean;
  next_fires: number[];
  created_at: number;
  updated_at: number;
}

export interface Usage {
  results: number; succeeded: number; failed: number; cancelled: number; expired: number;
  attempts: number; retries: number; run_ms: number; bytes_out: number; cpu_ms: number; peak_memory_bytes: number;
}

export interface UsageLine extends Usage {
  tenant: string;
  period_start: number;
  pool: Pool;
  job_type: string;
}

export interface UsageReport {
  tenant: string;
  from: number;
  to: number;
  granularity: "hour" | "day";
  lines: UsageLine[];
  total: Usage;
}

export interface Alert {
  tenant: string; alert_id: string; rule: string; opened_at: number; resolved_at: number | null;
  value: number; threshold: number;
}

/** `POST /v1/replays`'s filters: a tenant key's replay is always its own tenant's. */
export interface ReplayRequest {
  /** `dlq` (the default) or a retry topic's failure class. */
  source?: string;
  /** An admin key's filter. */
  tenant?: string;
  job_type?: string;
  class?: string;
  /** Text of the last error or the reason (case-insensitive). */
  error?: string;
  /** Dead-lettered at or after / before (epoch ms). */
  since?: number;
  until?: number;
  /** At most 1,000. */
  job_ids?: string[];
  /** Jobs per second (a tenant's at most 100). */
  rate?: number;
  dry_run?: boolean;
}

/** A replay's progress (`done: false`) or its report (`done: true`). */
export interface ReplayState {
  done: boolean;
  scanned: number;
  matched?: number;
  replayed?: number;
  would_replay?: number;
  dry_run?: boolean;
  replay_id?: string;
  sample?: Array<Record<string, unknown>>;
  error?: string;
  [k: string]: unknown;
}

/** Statuses a job ends in. */
export const TERMINAL_KINDS: readonly EventKind[] = ["succeeded", "failed", "cancelled", "expired"];

/** Most jobs in one `POST /v1/jobs:batch` (the API's `MAX_BATCH_JOBS`). */
export const MAX_BATCH_JOBS = 1000;
