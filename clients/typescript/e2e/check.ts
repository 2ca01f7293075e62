// Type-checked against the installed tarball's declarations (tests/it/typescript_client.rs):
// the package's exports resolve and carry types.
import { FairwayClient, FairwayError, RegionalClient, type NewJob, type Submitted } from "@fairway/client";
import { KafkaClient, outputJson, type JobResult } from "@fairway/client/kafka";
import { serveJobs, PermanentError } from "@fairway/client/handler";

const job: NewJob = { tenant: "acme", job_type: "echo", priority: "urgent", execute_at: new Date(), idempotency_key: "k" };
export async function use(c: FairwayClient, r: RegionalClient, k: KafkaClient): Promise<number> {
  const s: Submitted = await c.submit(job);
  const t = await r.submit(job);
  for await (const e of c.events(s.job_id)) if (e.kind === "succeeded") break;
  for await (const res of k.results({ groupId: "g", idleTimeoutMs: 1 })) {
    const x: JobResult = res;
    outputJson<{ n: number }>(x);
  }
  const srv = await serveJobs((j) => {
    if (j.attempt > 3) throw new PermanentError("enough");
    return { ok: j.jobId };
  });
  await srv.close();
  try {
    await c.cancel(t.job_id);
  } catch (e) {
    if (e instanceof FairwayError && e.code === "JOB_ALREADY_FINISHED") return e.status;
  }
  return 0;
}
