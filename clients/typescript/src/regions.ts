/**
 * A client of a tenant's regions (fairway's docs/regions.md): the tenant's home region
 * first, then the regions to fail over to, in order. The rules, per call (as the Python
 * client's `RegionalClient`):
 *
 * - It goes to the home region, unless the home failed less than `homeRetryMs` ago (or
 *   the longer `Retry-After` it gave): then to the other endpoints in order, with the
 *   header `Fairway-Failover-From: <home>`.
 * - A `421 MISDIRECTED_REGION` naming a listed region sends the call there, once per call;
 *   the call goes to the URL given here for that region, never to one in the answer.
 * - The home answering 503 (but `PARTIAL_SUBMIT`, where some jobs were accepted) or
 *   refusing the connection (nothing was sent) fails the call over and marks the home
 *   failed. Other failures are thrown, never retried elsewhere, so a job is never
 *   submitted to two regions by the client.
 * - Once the home's retry time has passed, the next call tries the home first again.
 *
 * Each region's client applies its own retry policy first; pass `retry: {maxAttempts: 1}`
 * to fail over at the first refusal.
 */

import { FairwayError, TransportError } from "./errors.js";
import { CallOptions, ClientOptions, FairwayClient } from "./http.js";
import { CancelAccepted, JobStatus, NewJob, Submitted } from "./types.js";

/** The request header of a failed-over call: the region the client left. */
export const FAILOVER_HEADER = "Fairway-Failover-From";

export interface RegionalOptions extends ClientOptions {
  /** How long a failed home is skipped (default 30 s). */
  homeRetryMs?: number;
  /** Milliseconds, monotonic (for tests). */
  clock?: () => number;
}

export class RegionalClient {
  readonly order: string[];
  readonly home: string;
  private readonly clients = new Map<string, FairwayClient>();
  private readonly homeRetryMs: number;
  private readonly clock: () => number;
  /** Until when (clock ms) the home is skipped. */
  homeFailedUntil: number | undefined;

  constructor(endpoints: Array<[region: string, baseUrl: string]>, apiKey: string, options: RegionalOptions = {}) {
    if (endpoints.length === 0) throw new TypeError("endpoints is empty; give [[home, url], [secondary, url], ...]");
    this.order = endpoints.map(([r]) => r);
    if (new Set(this.order).size !== this.order.length) throw new TypeError(`endpoints names a region twice (${this.order})`);
    for (const [region, url] of endpoints) this.clients.set(region, new FairwayClient(url, apiKey, options));
    this.home = this.order[0] as string;
    this.homeRetryMs = options.homeRetryMs ?? 30_000;
    this.clock = options.clock ?? (() => performance.now());
  }

  private headers(region: string): Record<string, string> {
    return region === this.home ? {} : { [FAILOVER_HEADER]: this.home };
  }

  private client(region: string): FairwayClient {
    const c = this.clients.get(region);
    if (!c) throw new TypeError(`region ${region} is not one of this client's endpoints (${this.order.join(", ")})`);
    return c;
  }

  private failed(retryAfterSecs?: number): void {
    this.homeFailedUntil = this.clock() + Math.max(this.homeRetryMs, (retryAfterSecs ?? 0) * 1000);
  }

  /** Runs `call` by the rules above; the region that answered, and its answer. */
  async call<T>(call: (c: FairwayClient, opts: CallOptions) => Promise<T>): Promise<[string, T]> {
    let todo = this.homeFailedUntil !== undefined && this.clock() < this.homeFailedUntil ? this.order.slice(1) : [...this.order];
    if (todo.length === 0) {
      const wait = ((this.homeFailedUntil ?? 0) - this.clock()) / 1000;
      throw new FairwayError(503, "NO_REGION", `home region ${this.home} failed and no other endpoint is listed; retry later`, wait);
    }
    let followed = false;
    let last: unknown;
    while (todo.length) {
      const region = todo.shift() as string;
      try {
        const answer = await call(this.client(region), { headers: this.headers(region) });
        if (region === this.home) this.homeFailedUntil = undefined;
        return [region, answer];
      } catch (e) {
        if (e instanceof FairwayError && e.status === 421 && !followed) {
          const target = e.body?.home_region;
          if (typeof target === "string" && this.clients.has(target)) {
            followed = true;
            todo = [target, ...todo.filter((r) => r !== target)];
            continue;
          }
          throw e;
        }
        const homeDown =
          region === this.home &&
          ((e instanceof FairwayError && e.status === 503 && e.code !== "PARTIAL_SUBMIT") || (e instanceof TransportError && !e.sent));
        if (!homeDown) throw e;
        this.failed(e instanceof FairwayError ? e.retryAfter : undefined);
        last = e;
      }
    }
    throw last;
  }

  /** `POST /v1/jobs` in the region the rules choose; the answer with `region`. */
  async submit(job: NewJob): Promise<Submitted> {
    const [region, answer] = await this.call((c, o) => c.submit(job, o));
    return { ...answer, region };
  }

  async submitBatch(jobs: NewJob[]): Promise<Submitted[]> {
    const [region, answers] = await this.call((c, o) => c.submitBatch(jobs, o));
    return answers.map((a) => ({ ...a, region }));
  }

  /** The job's state from `region` (where it was accepted), else by the rules. */
  async status(jobId: string, region?: string): Promise<JobStatus> {
    if (region !== undefined) return this.client(region).status(jobId, { headers: this.headers(region) });
    return (await this.call((c, o) => c.status(jobId, o)))[1];
  }

  async cancel(jobId: string, region?: string): Promise<CancelAccepted> {
    if (region !== undefined) return this.client(region).cancel(jobId, { headers: this.headers(region) });
    return (await this.call((c, o) => c.cancel(jobId, o)))[1];
  }
}
