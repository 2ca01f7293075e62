// Copies the repository's Avro schemas (schemas/*.avsc and schemas/history) into the
// package, so the published tarball reads every released version; run by `npm run build`.
import { cpSync, existsSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const from = join(here, "..", "..", "schemas");
const to = join(here, "schemas");
if (!existsSync(join(from, "job_result.avsc"))) {
  console.error(`copy-schemas: ${from} has no job_result.avsc; build the client inside the fairway repository`);
  process.exit(1);
}
rmSync(to, { recursive: true, force: true });
cpSync(from, to, { recursive: true, filter: (p) => !p.endsWith(".md") });
