// The client as a user installs it (from its packed tarball, in an empty folder), on the
// real services: submits 2,000 jobs over the HTTP API, follows one over Server-Sent
// Events to its result, and reads all 2,000 results from Kafka. Prints one JSON summary
// line and exits 1 when a result is missing or wrong. Run by tests/it/clients.rs (tests/it/typescript_client.rs).
import { FairwayClient, FairwayError } from "@fairway/client";
import { KafkaClient, outputJson } from "@fairway/client/kafka";

const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run through cargo test --test it clients::`);
  return v;
};
const api = new FairwayClient(need("FAIRWAY_TEST_API"), need("FAIRWAY_TEST_API_KEY"));
const kafka = new KafkaClient(need("FAIRWAY_TEST_BROKERS"), need("FAIRWAY_TEST_TOPIC_PREFIX"));
const N = Number(process.env.FAIRWAY_TEST_JOBS ?? 2000);
const run = `${Date.now()}-${process.pid}`;
const started = performance.now();
const secs = () => Number(((performance.now() - started) / 1000).toFixed(2));
const summary = { jobs: N };

// Typed errors: an unknown job type is refused with the API's code.
try {
  await api.submit({ tenant: "acme", job_type: "no-such-type" });
  throw new Error("a job of an unknown type was accepted");
} catch (e) {
  if (!(e instanceof FairwayError) || e.code !== "UNKNOWN_JOB_TYPE" || e.status !== 400) throw e;
}

const priorities = ["urgent", "normal", "low"];
const jobs = Array.from({ length: N }, (_, i) => ({
  tenant: "acme",
  job_type: "echo",
  payload: { i, run },
  idempotency_key: `ts-e2e-${run}-${i}`,
  priority: priorities[i % 3],
  user_key: `user-${i % 7}`,
  flow_key: i % 2 ? "flow-a" : undefined,
  ordering_key: `order-${i % 5}`,
}));
// The last one starts 2 s from now: followed over SSE, it is seen queued, then finishing.
jobs[N - 1].execute_at = new Date(Date.now() + 2000);
const accepted = await api.submitMany(jobs, 1000);
summary.submit_secs = secs();
const ids = accepted.map((a) => a.job_id);
if (new Set(ids).size !== N || accepted.some((a) => a.duplicate)) throw new Error("submitted ids are not 2,000 distinct new jobs");
// The same idempotency key again: the original job, not a new one.
const again = await api.submit(jobs[0]);
if (!again.duplicate || again.job_id !== ids[0]) throw new Error(`resubmitting an idempotency key made a new job: ${JSON.stringify(again)}`);

const followed = ids[N - 1];
const kinds = [];
for await (const e of api.events(followed, { timeoutMs: 120_000 })) kinds.push(e.kind);
summary.followed_events = kinds;
if (kinds.at(-1) !== "succeeded") throw new Error(`the followed job did not end succeeded over SSE: ${kinds}`);
// The job's row may be written after its terminal event was published: poll it, bounded.
const polled = performance.now();
let status = await api.status(followed);
while (status.status !== "succeeded" && performance.now() - polled < 30_000) {
  await new Promise((r) => setTimeout(r, 200));
  status = await api.status(followed);
}
if (status.status !== "succeeded") throw new Error(`status of the followed job 30 s after its terminal event: ${JSON.stringify(status)}`);
summary.status_lag_ms = Math.round(performance.now() - polled);
summary.follow_secs = secs();

const want = new Map(ids.map((id, i) => [id, i]));
const got = new Map();
let wrong = 0;
for await (const r of kafka.results({ groupId: `ts-e2e-${run}`, idleTimeoutMs: 90_000, signal: AbortSignal.timeout(240_000) })) {
  const i = want.get(r.job_id);
  if (i === undefined || got.has(r.job_id)) continue;
  got.set(r.job_id, r);
  const out = outputJson(r);
  if (r.status !== "succeeded" || out?.i !== i || out?.run !== run || r.tenant !== "acme") wrong += 1;
  if (got.size === N) break;
}
summary.results = got.size;
summary.missing = N - got.size;
summary.wrong = wrong;
summary.total_secs = secs();
// The dead-letter replay's dry run: none of these jobs failed, so none would be replayed.
const dry = await api.replay({ dry_run: true, job_ids: [...got.keys()].slice(0, 10) });
summary.replay_dry_run = { done: dry.done, would_replay: dry.would_replay };
console.log(JSON.stringify(summary));
process.exit(summary.missing === 0 && wrong === 0 ? 0 : 1);
