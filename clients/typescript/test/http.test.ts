import assert from "node:assert/strict";
import { test } from "node:test";
import { FairwayClient, FairwayError, RedirectRefusedError, TransportError, JobEvent } from "../src/index.js";
import { closedPort, fakeApi, json } from "./fake.js";

const submitted = { job_id: "j1", pool: "short", duplicate: false };
const noSleep = (waits: number[]) => async (ms: number) => {
  waits.push(ms);
};

test("a refusal with Retry-After is retried after that wait, within the policy's bound", async () => {
  const api = await fakeApi([
    json(429, { error: "over rate", code: "TENANT_RATE_LIMIT_EXCEEDED", retry_after_secs: 2 }, { "retry-after": "2" }),
    json(201, submitted),
  ]);
  const waits: number[] = [];
  try {
    const c = new FairwayClient(api.url, "k1", { sleep: noSleep(waits) });
    const s = await c.submit({ tenant: "acme", job_type: "echo", payload: { n: 1 }, execute_at: new Date(5000), priority: "urgent", flow_key: "f", user_key: "u", ordering_key: "o" });
    assert.deepEqual(s, submitted);
    assert.deepEqual(waits, [2000]);
    assert.equal(api.seen.length, 2);
    assert.equal(api.seen[0]?.headers.authorization, "Bearer k1");
    assert.deepEqual(JSON.parse(api.seen[1]?.body ?? ""), {
      tenant: "acme", job_type: "echo", payload: { n: 1 }, execute_at: 5000, priority: "urgent", flow_key: "f", user_key: "u", ordering_key: "o",
    });
  } finally {
    await api.close();
  }
});

test("errors are typed with the API's code and Retry-After; client errors are not retried", async () => {
  const api = await fakeApi([json(422, { error: "field `priority`: bad", code: "INVALID_JOB" })]);
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep([]) });
    const e = await c.submit({ job_type: "echo" }).catch((e: unknown) => e);
    assert.ok(e instanceof FairwayError);
    assert.equal(e.status, 422);
    assert.equal(e.code, "INVALID_JOB");
    assert.equal(e.detail, "field `priority`: bad");
    assert.equal(api.seen.length, 1);
  } finally {
    await api.close();
  }
});

test("retries stop at maxAttempts and the last error is thrown", async () => {
  const busy = json(503, { error: "down", code: "KAFKA_UNAVAILABLE", retry_after_secs: 5 }, { "retry-after": "5" });
  const api = await fakeApi([busy, busy, busy, busy]);
  const waits: number[] = [];
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep(waits), retry: { maxAttempts: 3 } });
    const e = await c.status("j1").catch((e: unknown) => e);
    assert.ok(e instanceof FairwayError && e.code === "KAFKA_UNAVAILABLE" && e.retryAfter === 5);
    assert.equal(api.seen.length, 3);
    assert.deepEqual(waits, [5000, 5000]);
  } finally {
    await api.close();
  }
});

test("a Retry-After above the policy's longest wait is not waited for", async () => {
  const api = await fakeApi([json(429, { error: "full", code: "TENANT_QUEUE_FULL" }, { "retry-after": "120" })]);
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep([]) });
    const e = await c.submit({ tenant: "a", job_type: "echo" }).catch((e: unknown) => e);
    assert.ok(e instanceof FairwayError && e.retryAfter === 120);
    assert.equal(api.seen.length, 1);
  } finally {
    await api.close();
  }
});

test("a partly submitted batch is retried only when every job has an idempotency key", async () => {
  const partial = json(503, { error: "1 of 2", code: "PARTIAL_SUBMIT", results: [submitted, { error: "x", code: "KAFKA_UNAVAILABLE" }] }, { "retry-after": "1" });
  const api = await fakeApi([partial, partial, json(201, [submitted, submitted])]);
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep([]) });
    const e = await c.submitBatch([{ tenant: "a", job_type: "echo" }, { tenant: "a", job_type: "echo" }]).catch((e: unknown) => e);
    assert.ok(e instanceof FairwayError && e.code === "PARTIAL_SUBMIT");
    assert.equal((e.body?.results as unknown[]).length, 2);
    assert.equal(api.seen.length, 1);
    const keyed = [{ tenant: "a", job_type: "echo", idempotency_key: "k1" }, { tenant: "a", job_type: "echo", idempotency_key: "k2" }];
    assert.equal((await c.submitBatch(keyed)).length, 2);
    assert.equal(api.seen.length, 3);
    assert.equal(api.seen[2]?.url, "/v1/jobs:batch");
  } finally {
    await api.close();
  }
});

test("batches hold 1 to 1000 jobs and submitMany splits", async () => {
  const c = new FairwayClient("http://127.0.0.1:1", "k");
  await assert.rejects(c.submitBatch([]), RangeError);
  const api = await fakeApi([
    (_q, res, body) => res.writeHead(201, { "content-type": "application/json" }).end(JSON.stringify((JSON.parse(body) as unknown[]).map(() => submitted))),
    (_q, res, body) => res.writeHead(201, { "content-type": "application/json" }).end(JSON.stringify((JSON.parse(body) as unknown[]).map(() => submitted))),
  ]);
  try {
    const jobs = Array.from({ length: 1500 }, (_, i) => ({ tenant: "a", job_type: "echo", payload: i }));
    const out = await new FairwayClient(api.url, "k").submitMany(jobs);
    assert.equal(out.length, 1500);
    assert.deepEqual(api.seen.map((s) => (JSON.parse(s.body) as unknown[]).length), [1000, 500]);
  } finally {
    await api.close();
  }
});

test("redirects are refused, plain http only to loopback", async () => {
  const api = await fakeApi([(_q, res) => res.writeHead(302, { location: "https://elsewhere.example/v1/jobs/j" }).end()]);
  try {
    const e = await new FairwayClient(api.url, "k").status("j").catch((e: unknown) => e);
    assert.ok(e instanceof RedirectRefusedError);
    assert.equal(e.location, "https://elsewhere.example/v1/jobs/j");
  } finally {
    await api.close();
  }
  assert.throws(() => new FairwayClient("http://fairway.example.com", "k"), /plain http/);
  new FairwayClient("http://fairway.example.com", "k", { allowInsecureHttp: true });
  new FairwayClient("https://fairway.example.com", "k");
  new FairwayClient("http://[::1]:8080", "k");
});

test("a connection refused is a TransportError that says nothing was sent, and is retried", async () => {
  const port = await closedPort();
  const waits: number[] = [];
  const c = new FairwayClient(`http://127.0.0.1:${port}`, "k", { sleep: noSleep(waits), retry: { maxAttempts: 2 } });
  const e = await c.submit({ tenant: "a", job_type: "echo" }).catch((e: unknown) => e);
  assert.ok(e instanceof TransportError, String(e));
  assert.equal(e.sent, false);
  assert.equal(waits.length, 1);
});

function sse(events: Array<Partial<JobEvent> & { event_id: string; kind: JobEvent["kind"] }>, end: boolean) {
  return (_q: unknown, res: import("node:http").ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(": keep-alive\n\n");
    for (const e of events) res.write(`id: ${e.event_id}\nevent: ${e.kind}\ndata: ${JSON.stringify({ job_id: "j1", ...e })}\n\n`);
    if (end) res.end();
    else setTimeout(() => res.destroy(), 100);
  };
}

test("events reconnect with Last-Event-ID after a broken stream and yield each event once", async () => {
  const queued = { event_id: "e1", kind: "queued" as const };
  const started = { event_id: "e2", kind: "started" as const };
  const done = { event_id: "e3", kind: "succeeded" as const };
  const api = await fakeApi([sse([queued, started], false), sse([queued, started, done], true)]);
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep([]) });
    const kinds: string[] = [];
    for await (const e of c.events("j1", { timeoutMs: 10_000 })) kinds.push(e.kind);
    assert.deepEqual(kinds, ["queued", "started", "succeeded"]);
    assert.equal(api.seen.length, 2);
    assert.equal(api.seen[0]?.url, "/v1/jobs/j1/events?follow=1");
    assert.equal(api.seen[0]?.headers["last-event-id"], undefined);
    assert.equal(api.seen[1]?.headers["last-event-id"], "e2");
  } finally {
    await api.close();
  }
});

test("a shutdown event makes the stream reconnect", async () => {
  const shutdown = (_q: unknown, res: import("node:http").ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(`id: e1\nevent: queued\ndata: ${JSON.stringify({ event_id: "e1", kind: "queued" })}\n\n`);
    res.end(`event: shutdown\ndata: {"reason":"draining"}\n\n`);
  };
  const api = await fakeApi([shutdown, sse([{ event_id: "e1", kind: "queued" }, { event_id: "e9", kind: "cancelled" }], true)]);
  try {
    const c = new FairwayClient(api.url, "k", { sleep: noSleep([]) });
    const ids: string[] = [];
    for await (const e of c.events("j1")) ids.push(e.event_id);
    assert.deepEqual(ids, ["e1", "e9"]);
  } finally {
    await api.close();
  }
});
