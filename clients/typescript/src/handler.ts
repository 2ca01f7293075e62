/**
 * Jobs written in Node behind fairway's HTTP executor (`handler = "http"`, `url = ...` of a
 * job type). The executor POSTs the payload (`application/octet-stream`) with the job's
 * identity in headers and reads the answer:
 *
 * | request header | meaning |
 * |---|---|
 * | `Idempotency-Key`, `X-Fairway-Job-Id` | the job id (the same on every attempt) |
 * | `X-Fairway-Tenant`, `X-Fairway-Job-Type` | whose job, of which type |
 * | `X-Fairway-Attempt` | attempts used up before this one (0 on the first) |
 * | `X-Fairway-First-Attempt` | `1` on the first attempt, else `0` |
 * | `X-Fairway-Crash-Count`, `X-Fairway-Handoff-Count` | worker crashes / hand-offs during the job |
 * | `traceparent`, `tracestate` | the submitter's W3C trace context |
 *
 * | answer | outcome |
 * |---|---|
 * | 2xx | success; the body is the job's output (at most `worker.max_payload_bytes`) |
 * | 408, 429, 500, 501, 505+ | retryable application error (`Retry-After` honoured) |
 * | 502, 503, 504, no answer | dependency failure (retried; counts for the job type's breaker) |
 * | other 4xx, 3xx | permanent failure (dead-lettered, no retry) |
 *
 * {@link jobListener} maps a handler function onto that contract: its return value is the
 * output, a thrown {@link PermanentError} / {@link RetryableError} / {@link DependencyError}
 * picks the outcome, anything else thrown is a retryable error.
 */

import { createServer, IncomingMessage, Server, ServerResponse } from "node:http";
import { AddressInfo } from "node:net";

/** Which job, and which attempt of it, a handler runs. */
export interface JobIdentity {
  jobId: string;
  tenant: string;
  jobType: string;
  /** Attempts used up before this one. */
  attempt: number;
  firstAttempt: boolean;
  crashCount: number;
  handoffCount: number;
}

export interface JobRequest extends JobIdentity {
  /** The key to make side effects idempotent with (the job id). */
  idempotencyKey: string;
  traceparent?: string;
  tracestate?: string;
  /** The payload bytes as submitted. */
  payload: Buffer;
  /** The payload as UTF-8 text. */
  text(): string;
  /** The payload parsed as JSON. */
  json<T = unknown>(): T;
}

/** The job cannot succeed (bad input): no retry, dead-lettered. Answered 422. */
export class PermanentError extends Error {
  override readonly name = "PermanentError";
}

/** Worth another attempt (the job's own failure). Answered 500, with `Retry-After` if given. */
export class RetryableError extends Error {
  override readonly name: string = "RetryableError";
  constructor(message: string, readonly retryAfterSecs?: number) {
    super(message);
  }
}

/** A dependency the job needs failed or is overloaded. Answered 503, with `Retry-After` if given. */
export class DependencyError extends RetryableError {
  override readonly name = "DependencyError";
}

/** What a handler returns: the output (bytes, text, or a value sent as JSON); nothing for no output. */
export type JobHandler = (job: JobRequest) => unknown;

export interface ListenerOptions {
  /** Largest request body read (default 16 MiB); larger ones are answered 413 (permanent). */
  maxBodyBytes?: number;
  /** Called with errors answered 500 (default: console.error of the message only). */
  onError?: (e: unknown, job: JobRequest) => void;
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function int(req: IncomingMessage, name: string): number {
  const n = Number(header(req, name) ?? "0");
  return Number.isFinite(n) ? n : 0;
}

function answer(res: ServerResponse, status: number, body: Buffer | string, headers: Record<string, string> = {}): void {
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
  res.writeHead(status, { "content-length": String(bytes.length), ...headers });
  res.end(bytes);
}

async function readBody(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > max) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** A `node:http` request listener running `handler` by the executor's contract. */
export function jobListener(handler: JobHandler, options: ListenerOptions = {}): (req: IncomingMessage, res: ServerResponse) => void {
  const max = options.maxBodyBytes ?? 16 << 20;
  const onError = options.onError ?? ((e: unknown, job: JobRequest) => console.error(`job ${job.jobId} failed: ${e instanceof Error ? e.message : String(e)}`));
  return (req, res) => {
    void (async () => {
      if (req.method !== "POST") return answer(res, 405, "fairway's HTTP executor POSTs jobs", { allow: "POST" });
      const jobId = header(req, "x-fairway-job-id");
      if (!jobId) return answer(res, 400, "missing X-Fairway-Job-Id: this endpoint runs jobs sent by fairway's HTTP executor");
      const payload = await readBody(req, max);
      if (payload === undefined) return answer(res, 413, `payload above ${max} bytes`);
      const job: JobRequest = {
        jobId,
        idempotencyKey: header(req, "idempotency-key") ?? jobId,
        tenant: header(req, "x-fairway-tenant") ?? "",
        jobType: header(req, "x-fairway-job-type") ?? "",
        attempt: int(req, "x-fairway-attempt"),
        firstAttempt: header(req, "x-fairway-first-attempt") !== "0",
        crashCount: int(req, "x-fairway-crash-count"),
        handoffCount: int(req, "x-fairway-handoff-count"),
        ...(header(req, "traceparent") ? { traceparent: header(req, "traceparent") } : {}),
        ...(header(req, "tracestate") ? { tracestate: header(req, "tracestate") } : {}),
        payload,
        text: () => payload.toString("utf8"),
        json: <T>() => JSON.parse(payload.toString("utf8")) as T,
      };
      try {
        const out = await handler(job);
        if (out === undefined || out === null) return answer(res, 200, Buffer.alloc(0));
        if (Buffer.isBuffer(out) || out instanceof Uint8Array) return answer(res, 200, Buffer.from(out), { "content-type": "application/octet-stream" });
        if (typeof out === "string") return answer(res, 200, out, { "content-type": "text/plain; charset=utf-8" });
        return answer(res, 200, JSON.stringify(out), { "content-type": "application/json" });
      } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        if (e instanceof PermanentError) return answer(res, 422, message);
        const retry = e instanceof RetryableError && e.retryAfterSecs !== undefined ? { "retry-after": String(Math.ceil(e.retryAfterSecs)) } : undefined;
        if (e instanceof DependencyError) return answer(res, 503, message, retry);
        if (!(e instanceof RetryableError)) onError(e, job);
        return answer(res, 500, message, retry);
      }
    })().catch((e) => {
      if (!res.headersSent) answer(res, 500, `handler helper failed: ${e instanceof Error ? e.message : String(e)}`);
      else res.destroy();
    });
  };
}

export interface JobServer {
  server: Server;
  /** `http://host:port/`: the job type's `url`. */
  url: string;
  close(): Promise<void>;
}

/** Serves `handler` on `host:port` (default 127.0.0.1, a free port). */
export async function serveJobs(handler: JobHandler, opts: ListenerOptions & { host?: string; port?: number } = {}): Promise<JobServer> {
  const server = createServer(jobListener(handler, opts));
  const host = opts.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const shown = host.includes(":") ? `[${host}]` : host;
  return {
    server,
    url: `http://${shown}:${port}/`,
    close: () => new Promise<void>((resolve, reject) => server.close((e) => (e ? reject(e) : resolve()))),
  };
}

/**
 * A Node program run by fairway's process executor (`handler = "process"`,
 * docs/process-jobs.md): the payload is on stdin, the output is what goes to stdout, and
 * progress, checkpoints and heartbeats are lines on the control channel (fd 3).
 */
export interface ProcessJob extends JobIdentity {
  /** The job's last checkpoint (a retry, a hand-off or a crash re-dispatch resumes from it), if any. */
  lastCheckpoint(): Buffer | undefined;
  /** Saves `state` as the job's checkpoint (written to the checkpoint file atomically, then reported). */
  checkpoint(state: Buffer | string): void;
  /** Progress 0..1 and a short message. */
  progress(fraction: number, message?: string): void;
  /** Alive, nothing to report (resets the stuck detector). */
  heartbeat(): void;
}

/** Exit codes the process executor reads as outcomes. */
export const EXIT = { ok: 0, permanent: 65, dependency: 75, retryable: 1 } as const;

/** The running process job, from the executor's environment (`env`: for tests). */
export async function processJob(env: NodeJS.ProcessEnv = process.env): Promise<ProcessJob> {
  const { existsSync, readFileSync, renameSync, writeFileSync, writeSync } = await import("node:fs");
  const need = (name: string) => {
    const v = env[name];
    if (v === undefined) throw new Error(`${name} is not set: this program runs under fairway's process executor`);
    return v;
  };
  const fd = Number(env.FAIRWAY_CONTROL_FD ?? "3");
  const file = need("FAIRWAY_CHECKPOINT_FILE");
  const line = (text: string) => {
    if (text.includes("\n") || Buffer.byteLength(text) >= 64 * 1024) throw new RangeError("a control line is one line below 64 KiB");
    writeSync(fd, `${text}\n`);
  };
  return {
    jobId: need("FAIRWAY_JOB_ID"),
    tenant: env.FAIRWAY_TENANT ?? "",
    jobType: env.FAIRWAY_JOB_TYPE ?? "",
    attempt: Number(env.FAIRWAY_ATTEMPT ?? 0),
    firstAttempt: env.FAIRWAY_FIRST_ATTEMPT === "1",
    crashCount: Number(env.FAIRWAY_CRASH_COUNT ?? 0),
    handoffCount: Number(env.FAIRWAY_HANDOFF_COUNT ?? 0),
    lastCheckpoint: () => (existsSync(file) ? readFileSync(file) : undefined),
    checkpoint: (state) => {
      const tmp = `${file}.tmp`;
      writeFileSync(tmp, state);
      renameSync(tmp, file);
      line("checkpoint");
    },
    progress: (fraction, message) => line(`progress ${Math.min(1, Math.max(0, fraction))}${message ? ` ${message.replace(/\s+/g, " ")}` : ""}`),
    heartbeat: () => line("heartbeat"),
  };
}
