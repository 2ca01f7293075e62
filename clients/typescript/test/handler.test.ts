import assert from "node:assert/strict";
import { test } from "node:test";
import { DependencyError, PermanentError, serveJobs } from "../src/handler.js";

const headers = {
  "content-type": "application/octet-stream",
  "idempotency-key": "j1",
  "x-fairway-job-id": "j1",
  "x-fairway-tenant": "acme",
  "x-fairway-job-type": "resize",
  "x-fairway-attempt": "2",
  "x-fairway-first-attempt": "0",
  "x-fairway-crash-count": "1",
  "x-fairway-handoff-count": "0",
  traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
};

test("the helper answers by the HTTP executor's contract", async () => {
  const srv = await serveJobs(
    (job) => {
      const input = job.json<{ op: string }>();
      if (input.op === "bad") throw new PermanentError("op bad is unknown");
      if (input.op === "busy") throw new DependencyError("the image service is overloaded", 7);
      if (input.op === "boom") throw new Error("unexpected");
      return { jobId: job.jobId, key: job.idempotencyKey, tenant: job.tenant, type: job.jobType, attempt: job.attempt, first: job.firstAttempt, crashes: job.crashCount, trace: job.traceparent };
    },
    { onError: () => undefined },
  );
  try {
    const post = (op: string) => fetch(srv.url, { method: "POST", headers, body: JSON.stringify({ op }) });
    const ok = await post("resize");
    assert.equal(ok.status, 200);
    assert.deepEqual(await ok.json(), { jobId: "j1", key: "j1", tenant: "acme", type: "resize", attempt: 2, first: false, crashes: 1, trace: headers.traceparent });
    const bad = await post("bad");
    assert.equal(bad.status, 422, "permanent: a 4xx the executor does not retry");
    assert.equal(await bad.text(), "op bad is unknown");
    const busy = await post("busy");
    assert.equal(busy.status, 503, "dependency");
    assert.equal(busy.headers.get("retry-after"), "7");
    assert.equal((await post("boom")).status, 500, "retryable app error");
    const notFromFairway = await fetch(srv.url, { method: "POST", body: "{}" });
    assert.equal(notFromFairway.status, 400);
    assert.equal((await fetch(srv.url)).status, 405);
  } finally {
    await srv.close();
  }
});

test("a process job reports progress and checkpoints on its control channel", async () => {
  const { mkdtempSync, openSync, readFileSync, closeSync } = await import("node:fs");
  const { join } = await import("node:path");
  const { tmpdir } = await import("node:os");
  const { processJob } = await import("../src/handler.js");
  const dir = mkdtempSync(join(tmpdir(), "fairway-ts-"));
  const control = join(dir, "control");
  const fd = openSync(control, "w");
  try {
    const env = { FAIRWAY_JOB_ID: "j1", FAIRWAY_ATTEMPT: "1", FAIRWAY_FIRST_ATTEMPT: "0", FAIRWAY_CONTROL_FD: String(fd), FAIRWAY_CHECKPOINT_FILE: join(dir, "checkpoint") };
    const job = await processJob(env);
    assert.equal(job.lastCheckpoint(), undefined);
    job.progress(0.5, "half\nway");
    job.checkpoint("step 5");
    job.heartbeat();
    assert.equal(job.lastCheckpoint()?.toString(), "step 5");
    assert.equal(job.attempt, 1);
    assert.equal(job.firstAttempt, false);
  } finally {
    closeSync(fd);
  }
  assert.equal(readFileSync(control, "utf8"), "progress 0.5 half way\ncheckpoint\nheartbeat\n");
});
