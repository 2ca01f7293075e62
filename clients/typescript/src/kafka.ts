/**
 * fairway's records straight from Kafka (`@platformatic/kafka`, pure JavaScript): results
 * and dead letters as typed records, decoded with the project's Avro schemas (every
 * released version, `schemas/history`).
 *
 * Topics are `<prefix>results` and `<prefix>dlq` (prefix: the deployment's
 * `kafka.topic_prefix`, default `fairway.`). Reading commits the consumer group's
 * offsets as it goes, so a group resumes where it stopped.
 */

import { Consumer, MessagesStreamFallbackModes, MessagesStreamModes } from "@platformatic/kafka";
import { decode, Kind } from "./avro.js";
import { Pool, Priority } from "./types.js";

export type FailureClass = "app_error" | "timeout" | "dependency" | "worker_crash" | "poison" | "permanent" | "resource";

/** One terminal record per job (`schemas/job_result.avsc`). */
export interface JobResult {
  job_id: string;
  tenant: string;
  job_type: string;
  pool: Pool;
  status: "succeeded" | "failed" | "cancelled" | "expired";
  /** The handler's output bytes, if any. */
  output: Buffer | null;
  error: string | null;
  failure_class: FailureClass | null;
  attempts: number;
  generation: number;
  submitted_at: number;
  started_at: number | null;
  finished_at: number;
  worker_id: string;
  peak_memory_bytes: number | null;
  cpu_ms: number | null;
}

/** A job as submitted (`schemas/job_submitted.avsc`), as carried by a dead letter. */
export interface JobSubmitted {
  job_id: string;
  tenant: string;
  job_type: string;
  pool: Pool | null;
  priority: Priority;
  payload: Buffer;
  idempotency_key: string | null;
  execute_at: number | null;
  not_after: number | null;
  attempt: number;
  crash_count: number;
  generation: number;
  submitted_at: number;
  not_before: number | null;
  last_error: string | null;
  last_failure_class: FailureClass | null;
  first_failure_at: number | null;
  replay_count: number;
  replayed_from: string | null;
  traceparent: string | null;
  tracestate: string | null;
  flow_key: string | null;
  user_key: string | null;
  handoff_count: number;
}

/** A job that failed for good (`schemas/dead_letter.avsc`). */
export interface DeadLetter {
  /** The job (null when its record could not be read: see `raw`). */
  job: JobSubmitted | null;
  raw: Buffer | null;
  failure_class: FailureClass;
  reason: string;
  last_error: string | null;
  attempts: number;
  first_failure_at: number;
  last_failure_at: number;
  origin_topic: string;
  origin_partition: number;
  origin_offset: number;
  replay_count: number;
}

/** A result's output as text (UTF-8), or null. */
export function outputText(r: JobResult): string | null {
  return r.output === null ? null : r.output.toString("utf8");
}

/** A result's output parsed as JSON (null without output). */
export function outputJson<T = unknown>(r: JobResult): T | null {
  const t = outputText(r);
  return t === null ? null : (JSON.parse(t) as T);
}

export interface ReadOptions {
  /** The consumer group (a fresh name reads everything again from the beginning). */
  groupId: string;
  /** Without committed offsets: from the topic's beginning (default) or its end. */
  fromBeginning?: boolean;
  /** Stop after this long without a record (default: never). */
  idleTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface KafkaOptions {
  clientId?: string;
  /** Extra options of `@platformatic/kafka`'s Consumer (e.g. `sasl`, `tls`). */
  consumer?: Record<string, unknown>;
}

export class KafkaClient {
  readonly brokers: string[];
  constructor(brokers: string | string[], readonly topicPrefix = "fairway.", private readonly options: KafkaOptions = {}) {
    this.brokers = Array.isArray(brokers) ? brokers : brokers.split(",").map((b) => b.trim()).filter(Boolean);
    if (this.brokers.length === 0) throw new TypeError("brokers is empty; give host:port[,host:port]");
  }

  topic(suffix: string): string {
    return `${this.topicPrefix}${suffix}`;
  }

  /** Results as they come; ends after `idleTimeoutMs` without one, or on `signal`. */
  results(opts: ReadOptions): AsyncGenerator<JobResult> {
    return this.read<JobResult>("results", "job_result", opts);
  }

  /** Dead letters as they come; like `results`. */
  deadLetters(opts: ReadOptions): AsyncGenerator<DeadLetter> {
    return this.read<DeadLetter>("dlq", "dead_letter", opts);
  }

  private async *read<T>(suffix: string, kind: Kind, opts: ReadOptions): AsyncGenerator<T> {
    const consumer = new Consumer({
      ...this.options.consumer,
      groupId: opts.groupId,
      clientId: this.options.clientId ?? "fairway-ts",
      bootstrapBrokers: this.brokers,
    });
    let stopped = false;
    let timer: NodeJS.Timeout | undefined;
    try {
      const stream = await consumer.consume({
        topics: [this.topic(suffix)],
        mode: MessagesStreamModes.COMMITTED,
        fallbackMode: opts.fromBeginning === false ? MessagesStreamFallbackModes.LATEST : MessagesStreamFallbackModes.EARLIEST,
        autocommit: true,
      });
      const stop = () => {
        stopped = true;
        stream.close().catch(() => undefined);
      };
      const arm = () => {
        if (opts.idleTimeoutMs === undefined) return;
        clearTimeout(timer);
        timer = setTimeout(stop, opts.idleTimeoutMs);
      };
      opts.signal?.addEventListener("abort", stop, { once: true });
      arm();
      try {
        for await (const m of stream) {
          arm();
          yield decode<T>(kind, m.value as Buffer);
        }
      } catch (e) {
        if (!stopped) throw e;
      } finally {
        opts.signal?.removeEventListener("abort", stop);
        if (!stream.closed) await stream.close().catch(() => undefined);
      }
    } finally {
      clearTimeout(timer);
      try {
        await consumer.close(true);
      } catch {
        // Closing only: the read's own outcome stands.
      }
    }
  }
}
