// A job type written in Node behind fairway's HTTP executor. Run it (after `npm run build`:
// `node build-test/examples/handler.js`, or with the published package from
// "@fairway/client/handler"), then point a job type at it in fairway.toml:
//
//   [job_types.thumbnail]
//   pool = "short"
//   handler = "http"
//   url = "http://127.0.0.1:18661/"
//
// The job's id is its idempotency key: a retried attempt (after a crash or a timeout)
// must not do its side effect twice.
import { DependencyError, PermanentError, serveJobs } from "../src/handler.js";

interface Thumbnail {
  url: string;
  width: number;
}

const done = new Map<string, unknown>();

const server = await serveJobs(
  async (job) => {
    const input = job.json<Thumbnail>();
    if (typeof input.url !== "string" || !(input.width > 0)) {
      throw new PermanentError("payload needs {url: string, width: number > 0}");
    }
    const earlier = done.get(job.idempotencyKey);
    if (earlier !== undefined) return earlier;
    const resp = await fetch(input.url, { method: "HEAD" }).catch(() => undefined);
    if (!resp || resp.status >= 500) throw new DependencyError(`${input.url} is not answering`, 30);
    if (!resp.ok) throw new PermanentError(`${input.url} answered ${resp.status}`);
    const out = { source: input.url, width: input.width, bytes: Number(resp.headers.get("content-length") ?? 0), attempt: job.attempt };
    done.set(job.idempotencyKey, out);
    return out;
  },
  { port: Number(process.env.PORT ?? 18661) },
);
console.log(`serving jobs at ${server.url}`);
process.once("SIGTERM", () => void server.close());
