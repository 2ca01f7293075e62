/**
 * fairway's HTTP API (`fairway serve`): submit one job or a batch, read and cancel jobs,
 * follow events over Server-Sent Events, schedules, usage and alerts.
 *
 * Every call sends `Authorization: Bearer <API key>`, so the client only talks to the
 * origin it was given: https (plain http only to a loopback host unless
 * `allowInsecureHttp`), and it never follows a redirect ({@link RedirectRefusedError}).
 * Calls the server refused without doing anything (429/503 with `Retry-After`, 408) and
 * calls that never reached it are retried by a bounded {@link RetryPolicy}; a call that may
 * have been processed is retried only when repeating it is safe (reads, and submissions
 * whose jobs all carry idempotency keys).
 */

import { FairwayError, RedirectRefusedError, TransportError } from "./errors.js";
import { parseSse } from "./sse.js";
import {
  Alert, CancelAccepted, JobEvent, JobHistory, JobStatus, MAX_BATCH_JOBS, NewJob, Schedule, ScheduleSpec,
  ReplayRequest, ReplayState, Submitted, TERMINAL_KINDS, UsageReport,
} from "./types.js";

/** How the client retries a call. */
export interface RetryPolicy {
  /** Tries per call, the first included (1: never retry). */
  maxAttempts: number;
  /** First backoff without a `Retry-After`, doubled per try, with full jitter. */
  baseDelayMs: number;
  /** Longest backoff without a `Retry-After`. */
  maxDelayMs: number;
  /** A `Retry-After` longer than this is not waited for: the error is thrown. */
  maxRetryAfterMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 3, baseDelayMs: 200, maxDelayMs: 5_000, maxRetryAfterMs: 30_000 };

export interface ClientOptions {
  /** Per-request timeout (not for event streams), default 30 s. */
  timeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  /** Allow plain http to a host that is not loopback (the key then crosses the network in clear). */
  allowInsecureHttp?: boolean;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** For tests: the fetch to use, and how to sleep. */
  fetch?: typeof fetch;
  sleep?: (ms: number) => Promise<void>;
}

/** Options of one call. */
export interface CallOptions {
  /** Extra request headers (e.g. `Fairway-Failover-From`). */
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

export interface EventsOptions extends CallOptions {
  /** Give up after this long (default 300 s): the stream then just ends. */
  timeoutMs?: number;
  /** Most reconnections of a stream that ended or broke before the job did (default 20). */
  maxReconnects?: number;
}

function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/\.$/, "").replace(/^\[|\]$/g, "");
  if (h === "localhost" || h === "::1") return true;
  const m = /^(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(h);
  return m !== null && m[1] === "127" && m.slice(1).every((p) => Number(p) <= 255);
}

/** Errors of the network layer that mean the request never left (nothing was sent). */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"]);

function transportError(e: unknown, url: string): TransportError {
  let cause: unknown = e;
  let code: string | undefined;
  for (let i = 0; i < 4 && cause && typeof cause === "object"; i++) {
    const c = (cause as { code?: unknown }).code;
    if (typeof c === "string") {
      code = c;
      break;
    }
    cause = (cause as { cause?: unknown }).cause;
  }
  const sent = !(code && NOT_SENT.has(code));
  const what = e instanceof Error && e.name === "TimeoutError" ? "timed out" : (code ?? (e instanceof Error ? e.message : String(e)));
  return new TransportError(`${url}: no response (${what})${sent ? "" : "; nothing was sent"}`, sent, e);
}

function millis(t: number | Date | undefined): number | undefined {
  return t instanceof Date ? t.getTime() : t;
}

/** A job as the API reads it (dates as epoch ms). */
function wire(job: NewJob): Record<string, unknown> {
  if (!job.job_type) throw new TypeError("a job needs job_type (a non-empty string)");
  const out: Record<string, unknown> = { ...job };
  for (const k of ["execute_at", "not_after"] as const) {
    if (job[k] !== undefined) out[k] = millis(job[k]);
  }
  return out;
}

/** A client of one fairway API at `baseUrl` (`https://host[:port][/prefix]`). */
export class FairwayClient {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly headers: Record<string, string>;

  constructor(baseUrl: string, private readonly apiKey: string, options: ClientOptions = {}) {
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new TypeError(`base URL ${JSON.stringify(baseUrl)} is not a URL; give e.g. https://fairway.example.com`);
    }
    if (url.protocol !== "https:" && url.protocol !== "http:") {
      throw new TypeError(`base URL ${baseUrl} is not http(s)`);
    }
    if (url.protocol === "http:" && !options.allowInsecureHttp && !isLoopback(url.hostname)) {
      throw new TypeError(
        `base URL ${baseUrl} is plain http to a host that is not loopback: the API key would cross the network ` +
          "unencrypted. Use https, or allowInsecureHttp: true if you accept that",
      );
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    if (!(this.retry.maxAttempts >= 1)) throw new TypeError("retry.maxAttempts is at least 1");
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.sleep = options.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
    this.headers = { ...options.headers };
  }

  /** One HTTP exchange, no retries: the response, or a typed error. */
  private async send(method: string, path: string, body: unknown, opts: CallOptions & { timeoutMs?: number; accept?: string }): Promise<Response> {
    const url = this.baseUrl + path;
    const headers: Record<string, string> = { ...this.headers, ...opts.headers, authorization: `Bearer ${this.apiKey}` };
    if (opts.accept) headers.accept = opts.accept;
    if (body !== undefined) headers["content-type"] = "application/json";
    const signals = [opts.signal, opts.timeoutMs === undefined ? undefined : AbortSignal.timeout(opts.timeoutMs)];
    const live = signals.filter((s): s is AbortSignal => s !== undefined);
    let resp: Response;
    try {
      resp = await this.fetch(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        redirect: "manual",
        signal: live.length ? AbortSignal.any(live) : undefined,
      });
    } catch (e) {
      if (opts.signal?.aborted) throw e;
      throw transportError(e, url);
    }
    if (resp.status >= 300 && resp.status < 400) {
      await resp.body?.cancel();
      const loc = resp.headers.get("location");
      throw new RedirectRefusedError(resp.status, loc ? new URL(loc, url).toString() : null, url);
    }
    if (!resp.ok) throw await errorOf(resp);
    return resp;
  }

  /** Whether `e` of a call is retried, and after how long (ms); undefined: not retried. */
  retryDelay(e: unknown, attempt: number, idempotent: boolean): number | undefined {
    if (attempt >= this.retry.maxAttempts) return undefined;
    const backoff = () => Math.random() * Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** (attempt - 1));
    if (e instanceof RedirectRefusedError) return undefined;
    if (e instanceof FairwayError) {
      const refused = e.status === 429 || e.status === 503 || e.status === 408;
      if (!refused || (e.code === "PARTIAL_SUBMIT" && !idempotent)) return undefined;
      if (e.retryAfter === undefined) return backoff();
      const ms = e.retryAfter * 1000;
      return ms <= this.retry.maxRetryAfterMs ? ms : undefined;
    }
    if (e instanceof TransportError) return !e.sent || idempotent ? backoff() : undefined;
    return undefined;
  }

  private async call(method: string, path: string, body: unknown, opts: CallOptions & { idempotent: boolean; accept?: string; stream?: boolean }): Promise<Response> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.send(method, path, body, { ...opts, timeoutMs: opts.stream ? undefined : this.timeoutMs });
      } catch (e) {
        const wait = this.retryDelay(e, attempt, opts.idempotent);
        if (wait === undefined || opts.signal?.aborted) throw e;
        await this.sleep(wait);
      }
    }
  }

  private async json<T>(method: string, path: string, body: unknown, opts: CallOptions & { idempotent: boolean }): Promise<T> {
    const resp = await this.call(method, path, body, opts);
    const text = await resp.text();
    return (text ? JSON.parse(text) : null) as T;
  }

  /** `POST /v1/jobs`. Retried after a refusal; after a lost answer only with an idempotency key. */
  submit(job: NewJob, opts: CallOptions = {}): Promise<Submitted> {
    return this.json("POST", "/v1/jobs", wire(job), { ...opts, idempotent: !!job.idempotency_key });
  }

  /** `POST /v1/jobs:batch`: 1 to 1000 jobs, validated and admitted all or nothing. */
  submitBatch(jobs: NewJob[], opts: CallOptions = {}): Promise<Submitted[]> {
    if (jobs.length < 1 || jobs.length > MAX_BATCH_JOBS) {
      return Promise.reject(new RangeError(`a batch holds 1 to ${MAX_BATCH_JOBS} jobs, got ${jobs.length}; split it (submitMany does)`));
    }
    const body = jobs.map(wire);
    return this.json("POST", "/v1/jobs:batch", body, { ...opts, idempotent: jobs.every((j) => !!j.idempotency_key) });
  }

  /** Any number of jobs, in batches of at most `batchSize` (≤ 1000), one batch at a time; the answers in order. */
  async submitMany(jobs: NewJob[], batchSize = MAX_BATCH_JOBS, opts: CallOptions = {}): Promise<Submitted[]> {
    const size = Math.max(1, Math.min(batchSize, MAX_BATCH_JOBS));
    const out: Submitted[] = [];
    for (let i = 0; i < jobs.length; i += size) out.push(...(await this.submitBatch(jobs.slice(i, i + size), opts)));
    return out;
  }

  /** `GET /v1/jobs/{id}`. */
  status(jobId: string, opts: CallOptions = {}): Promise<JobStatus> {
    return this.json("GET", `/v1/jobs/${encodeURIComponent(jobId)}`, undefined, { ...opts, idempotent: true });
  }

  /** `DELETE /v1/jobs/{id}`: a cooperative cancel (409 JOB_ALREADY_FINISHED once it ended). */
  cancel(jobId: string, opts: CallOptions = {}): Promise<CancelAccepted> {
    return this.json("DELETE", `/v1/jobs/${encodeURIComponent(jobId)}`, undefined, { ...opts, idempotent: true });
  }

  /** `GET /v1/jobs/{id}/events`: the job's history so far. */
  history(jobId: string, opts: CallOptions = {}): Promise<JobHistory> {
    return this.json("GET", `/v1/jobs/${encodeURIComponent(jobId)}/events`, undefined, { ...opts, idempotent: true });
  }

  /**
   * The job's events over Server-Sent Events: its history, then live ones, until it ends
   * (a terminal event) or `timeoutMs` passes. A stream that breaks or ends early (the
   * server drains: `shutdown`) is reopened with `Last-Event-ID`; events already seen are
   * dropped, so each is yielded once.
   */
  events(jobId: string, opts: EventsOptions = {}): AsyncGenerator<JobEvent> {
    return this.follow(`/v1/jobs/${encodeURIComponent(jobId)}/events?follow=1`, true, opts);
  }

  /** Live events of the caller's tenant (an admin key: every tenant, or `tenant`) until `signal` or `timeoutMs`. */
  tenantEvents(opts: EventsOptions & { tenant?: string } = {}): AsyncGenerator<JobEvent> {
    const q = opts.tenant ? `&tenant=${encodeURIComponent(opts.tenant)}` : "";
    return this.follow(`/v1/events?follow=1${q}`, false, opts);
  }

  private async *follow(path: string, endsWithJob: boolean, opts: EventsOptions): AsyncGenerator<JobEvent> {
    const deadline = AbortSignal.timeout(opts.timeoutMs ?? 300_000);
    const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
    const seen = new Set<string>();
    let lastId: string | undefined;
    const maxReconnects = opts.maxReconnects ?? 20;
    for (let reconnects = 0; ; reconnects++) {
      const headers = { ...opts.headers, ...(lastId ? { "last-event-id": lastId } : {}) };
      let resp: Response;
      try {
        resp = await this.call("GET", path, undefined, { headers, signal, idempotent: true, accept: "text/event-stream", stream: true });
      } catch (e) {
        if (deadline.aborted) return;
        throw e;
      }
      try {
        for await (const m of parseSse(resp.body as AsyncIterable<Uint8Array>)) {
          if (m.event === "shutdown") break;
          if (m.id) lastId = m.id;
          if (!m.data) continue;
          const ev = JSON.parse(m.data) as JobEvent;
          if (seen.has(ev.event_id)) continue;
          seen.add(ev.event_id);
          yield ev;
          if (endsWithJob && TERMINAL_KINDS.includes(ev.kind)) return;
        }
      } catch (e) {
        if (deadline.aborted) return;
        if (opts.signal?.aborted) throw e;
        // The connection broke: reconnect below.
      } finally {
        await resp.body?.cancel().catch(() => undefined);
      }
      if (signal.aborted) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        return;
      }
      if (reconnects >= maxReconnects) {
        throw new TransportError(`${this.baseUrl}${path}: the stream ended ${reconnects + 1} times before the job did`, true);
      }
      await this.sleep(Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** Math.min(reconnects, 8)));
    }
  }

  /** `GET /v1/schedules` (an admin key: every tenant's, or `tenant`'s). */
  listSchedules(tenant?: string, opts: CallOptions = {}): Promise<Schedule[]> {
    return this.json("GET", `/v1/schedules${tenantQuery(tenant)}`, undefined, { ...opts, idempotent: true });
  }
  /** `POST /v1/schedules`. */
  addSchedule(spec: ScheduleSpec, opts: CallOptions = {}): Promise<Schedule> {
    return this.json("POST", "/v1/schedules", spec, { ...opts, idempotent: false });
  }
  getSchedule(name: string, tenant?: string, opts: CallOptions = {}): Promise<Schedule> {
    return this.json("GET", `/v1/schedules/${encodeURIComponent(name)}${tenantQuery(tenant)}`, undefined, { ...opts, idempotent: true });
  }
  /** `PUT /v1/schedules/{name}`: replaces the definition (same name). */
  replaceSchedule(spec: ScheduleSpec, opts: CallOptions = {}): Promise<Schedule> {
    const { tenant, ...rest } = spec;
    return this.json("PUT", `/v1/schedules/${encodeURIComponent(spec.name)}${tenantQuery(tenant)}`, rest, { ...opts, idempotent: true });
  }
  async removeSchedule(name: string, tenant?: string, opts: CallOptions = {}): Promise<void> {
    await this.call("DELETE", `/v1/schedules/${encodeURIComponent(name)}${tenantQuery(tenant)}`, undefined, { ...opts, idempotent: true });
  }
  pauseSchedule(name: string, tenant?: string, opts: CallOptions = {}): Promise<Schedule> {
    return this.json("POST", `/v1/schedules/${encodeURIComponent(name)}:pause${tenantQuery(tenant)}`, undefined, { ...opts, idempotent: true });
  }
  resumeSchedule(name: string, tenant?: string, opts: CallOptions = {}): Promise<Schedule> {
    return this.json("POST", `/v1/schedules/${encodeURIComponent(name)}:resume${tenantQuery(tenant)}`, undefined, { ...opts, idempotent: true });
  }

  /** `GET /v1/usage`: usage per hour or day of [from, to) (epoch ms, Date, or RFC 3339 / date text). */
  usage(q: { from: number | Date | string; to: number | Date | string; granularity?: "hour" | "day"; tenant?: string }, opts: CallOptions = {}): Promise<UsageReport> {
    const t = (v: number | Date | string) => String(v instanceof Date ? v.getTime() : v);
    const p = new URLSearchParams({ from: t(q.from), to: t(q.to) });
    if (q.granularity) p.set("granularity", q.granularity);
    if (q.tenant) p.set("tenant", q.tenant);
    return this.json("GET", `/v1/usage?${p}`, undefined, { ...opts, idempotent: true });
  }

  /** `GET /v1/alerts`: open ones by default. */
  alerts(q: { state?: "open" | "all"; tenant?: string } = {}, opts: CallOptions = {}): Promise<{ tenant: string; alerts: Alert[] }> {
    const p = new URLSearchParams();
    if (q.state) p.set("state", q.state);
    if (q.tenant) p.set("tenant", q.tenant);
    const qs = p.size ? `?${p}` : "";
    return this.json("GET", `/v1/alerts${qs}`, undefined, { ...opts, idempotent: true });
  }

  /** `POST /v1/replays`: a dry run answers its report; a real run `{ run }` to follow with `replayProgress`. */
  replay(req: ReplayRequest, opts: CallOptions = {}): Promise<ReplayState | { run: string }> {
    return this.json("POST", "/v1/replays", req, { ...opts, idempotent: !!req.dry_run });
  }

  /** `GET /v1/replays/{run}`: progress, then the report (`done: true`). */
  replayProgress(run: string, opts: CallOptions = {}): Promise<ReplayState> {
    return this.json("GET", `/v1/replays/${encodeURIComponent(run)}`, undefined, { ...opts, idempotent: true });
  }

  /** `GET /v1/openapi.json`: the API's OpenAPI 3.1 description. */
  openapi(opts: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.json("GET", "/v1/openapi.json", undefined, { ...opts, idempotent: true });
  }
}

function tenantQuery(tenant?: string): string {
  return tenant ? `?tenant=${encodeURIComponent(tenant)}` : "";
}

/** The typed error of a non-2xx answer. */
async function errorOf(resp: Response): Promise<FairwayError> {
  const text = await resp.text().catch(() => "");
  let body: Record<string, unknown> | undefined;
  try {
    const v = JSON.parse(text);
    if (v && typeof v === "object" && !Array.isArray(v)) body = v as Record<string, unknown>;
  } catch {
    body = undefined;
  }
  const header = resp.headers.get("retry-after");
  let retryAfter: number | undefined;
  if (header !== null && header.trim() !== "") {
    const secs = Number(header);
    retryAfter = Number.isFinite(secs) ? secs : Math.max(0, (Date.parse(header) - Date.now()) / 1000) || undefined;
  }
  const code = typeof body?.code === "string" ? body.code : "HTTP_ERROR";
  const detail = typeof body?.error === "string" ? body.error : text.slice(0, 500) || resp.statusText;
  return new FairwayError(resp.status, code, detail, retryAfter, body);
}
