import assert from "node:assert/strict";
import { test } from "node:test";
import { FairwayError, RegionalClient } from "../src/index.js";
import { closedPort, fakeApi, json } from "./fake.js";

const ok = (id: string) => json(201, { job_id: id, pool: "short", duplicate: false });
const once = { retry: { maxAttempts: 1 } };

test("the home failing with 503 sends the call to the secondary with Fairway-Failover-From, then home again after its retry time", async () => {
  const eu = await fakeApi([json(503, { error: "draining", code: "REGION_UNAVAILABLE" }, { "retry-after": "60" }), ok("j3")]);
  const us = await fakeApi([ok("j1"), ok("j2")]);
  let now = 0;
  try {
    const c = new RegionalClient([["eu", eu.url], ["us", us.url]], "k", { ...once, clock: () => now });
    const a = await c.submit({ tenant: "acme", job_type: "echo" });
    assert.equal(a.region, "us");
    assert.equal(us.seen[0]?.headers["fairway-failover-from"], "eu");
    // The home's Retry-After (60 s) is longer than homeRetryMs (30 s): skipped until then.
    now = 59_000;
    assert.equal((await c.submit({ tenant: "acme", job_type: "echo" })).region, "us");
    assert.equal(eu.seen.length, 1);
    now = 61_000;
    const b = await c.submit({ tenant: "acme", job_type: "echo" });
    assert.equal(b.region, "eu");
    assert.equal(eu.seen[1]?.headers["fairway-failover-from"], undefined);
  } finally {
    await eu.close();
    await us.close();
  }
});

test("a 421 is followed once, to the URL listed here for that region", async () => {
  const misdirected = json(421, { error: "home is us", code: "MISDIRECTED_REGION", home_region: "us", endpoint: "https://evil.example" });
  // fetch itself repeats a request answered 421 once, on a new connection (the Fetch standard).
  const eu = await fakeApi([misdirected, misdirected]);
  const us = await fakeApi([ok("j1")]);
  try {
    const c = new RegionalClient([["eu", eu.url], ["us", us.url]], "k", once);
    assert.equal((await c.submit({ tenant: "acme", job_type: "echo" })).region, "us");
  } finally {
    await eu.close();
    await us.close();
  }
});

test("a refused connection to the home fails over; other errors are thrown, not retried elsewhere", async () => {
  const port = await closedPort();
  const us = await fakeApi([ok("j1"), json(422, { error: "bad", code: "INVALID_JOB" })]);
  try {
    const c = new RegionalClient([["eu", `http://127.0.0.1:${port}`], ["us", us.url]], "k", once);
    assert.equal((await c.submit({ tenant: "acme", job_type: "echo" })).region, "us");
    const e = await c.submit({ tenant: "acme", job_type: "echo" }).catch((e: unknown) => e);
    assert.ok(e instanceof FairwayError && e.code === "INVALID_JOB");
  } finally {
    await us.close();
  }
  const home = await fakeApi([json(400, { error: "bad", code: "UNKNOWN_TENANT" })]);
  const other = await fakeApi([]);
  try {
    const c = new RegionalClient([["eu", home.url], ["us", other.url]], "k", once);
    await assert.rejects(c.submit({ tenant: "x", job_type: "echo" }), (e: unknown) => e instanceof FairwayError && e.code === "UNKNOWN_TENANT");
    assert.equal(other.seen.length, 0);
  } finally {
    await home.close();
    await other.close();
  }
});
