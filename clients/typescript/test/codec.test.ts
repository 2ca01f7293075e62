import assert from "node:assert/strict";
import { test } from "node:test";
import { currentFingerprint, decode, DecodeError, encode, rabin, schemaVersions } from "../src/index.js";
import { outputJson } from "../src/kafka.js";

test("CRC-64-AVRO fingerprints match fastavro's for every current schema", () => {
  // Printed by fastavro (the Python client's codec) for schemas/*.avsc.
  assert.equal(currentFingerprint("job_result"), "e1176a52166366db");
  assert.equal(currentFingerprint("dead_letter"), "af34f1dc41a5e637");
  assert.equal(currentFingerprint("job_submitted"), "544d9ba32e64f602");
  assert.equal(currentFingerprint("job_event"), "94314e4fbb8ae975");
  // The Avro specification's value for the empty-ish schema "null".
  assert.equal(rabin('"null"').readBigUInt64LE().toString(16), "63dd24e7cc258f8a");
});

test("every released version is read, and records resolve into the current schema", () => {
  assert.deepEqual(schemaVersions("job_result"), ["current", "v1", "v2"]);
  assert.ok(schemaVersions("dead_letter").length >= 5);
  const r = {
    job_id: "j1", tenant: "acme", job_type: "echo", pool: "short", status: "succeeded", output: Buffer.from('{"n":1}'),
    error: null, failure_class: null, attempts: 1, generation: 0, submitted_at: 1, started_at: 2, finished_at: 3,
    worker_id: "w", peak_memory_bytes: null, cpu_ms: null,
  };
  const bytes = encode("job_result", r);
  assert.equal(bytes.subarray(0, 2).toString("hex"), "c301");
  const back = decode<typeof r>("job_result", bytes);
  assert.deepEqual({ ...back, output: back.output?.toString() }, { ...r, output: '{"n":1}' });
  assert.deepEqual(outputJson(back as never), { n: 1 });
  assert.throws(() => decode("job_result", Buffer.from("nope-not-avro")), DecodeError);
  assert.throws(() => decode("dead_letter", bytes), /no released dead_letter schema/);
});
