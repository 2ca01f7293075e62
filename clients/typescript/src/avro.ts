/**
 * fairway's wire format: Avro single-object encoding of the records in `schemas/`.
 *
 * A message is `C3 01` + the 8-byte CRC-64-AVRO fingerprint of the writer schema's
 * parsing canonical form (little-endian) + the Avro binary body. Records are written with
 * the current schemas; a message is read with the schema version its fingerprint names
 * (the current one or any released one in `schemas/history`) and resolved into the
 * current schema, so fields added later get their defaults.
 */

import avro from "avsc";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { DecodeError } from "./errors.js";

export const MAGIC = Buffer.from([0xc3, 0x01]);
export const HEADER_LEN = 10;
export const KINDS = ["job_submitted", "job_result", "dead_letter", "job_event"] as const;
export type Kind = (typeof KINDS)[number];

const EMPTY = 0xc15d213aa4d7a795n;
const MASK = (1n << 64n) - 1n;
const TABLE: bigint[] = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & (-(fp & 1n) & MASK));
  return fp;
});

/** CRC-64-AVRO (Rabin) of `text`, as 8 little-endian bytes. */
export function rabin(text: string): Buffer {
  let fp = EMPTY;
  for (const b of Buffer.from(text, "utf8")) fp = (fp >> 8n) ^ (TABLE[Number((fp ^ BigInt(b)) & 0xffn)] as bigint);
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp & MASK);
  return out;
}

interface Version {
  type: avro.Type;
  fingerprint: Buffer;
  version: string;
}

/** The package's schemas folder (a copy of the repository's `schemas/`). */
function schemasDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    const candidate = join(dir, "schemas");
    if (existsSync(join(candidate, "job_result.avsc"))) return candidate;
    dir = dirname(dir);
  }
  throw new Error("the package's schemas/ folder is missing (run `npm run build`, which copies them)");
}

function typeOf(path: string): avro.Type {
  return avro.Type.forSchema(JSON.parse(readFileSync(path, "utf8")) as avro.Schema);
}

function fingerprintOf(t: avro.Type): Buffer {
  // avsc's schema() without attributes is the parsing canonical form.
  return rabin(JSON.stringify(t.schema()));
}

let loaded: { current: Map<Kind, Version>; known: Map<Kind, Map<string, Version>> } | undefined;

function versions() {
  if (loaded) return loaded;
  const root = schemasDir();
  const current = new Map<Kind, Version>();
  const known = new Map<Kind, Map<string, Version>>();
  for (const kind of KINDS) {
    const type = typeOf(join(root, `${kind}.avsc`));
    const v = { type, fingerprint: fingerprintOf(type), version: "current" };
    current.set(kind, v);
    known.set(kind, new Map([[v.fingerprint.toString("hex"), v]]));
  }
  const history = join(root, "history");
  for (const name of existsSync(history) ? readdirSync(history).sort() : []) {
    const m = /^(.+)\.(v\d+)\.avsc$/.exec(name);
    const byFp = m ? known.get(m[1] as Kind) : undefined;
    if (!m || !byFp) continue;
    const type = typeOf(join(history, name));
    const fp = fingerprintOf(type);
    if (!byFp.has(fp.toString("hex"))) byFp.set(fp.toString("hex"), { type, fingerprint: fp, version: m[2] as string });
  }
  loaded = { current, known };
  return loaded;
}

/** The schema versions of `kind` this client reads ("current", "v1", ...). */
export function schemaVersions(kind: Kind): string[] {
  return [...(versions().known.get(kind)?.values() ?? [])].map((v) => v.version).sort();
}

/** The fingerprint (hex, as on the wire) of the current schema of `kind`. */
export function currentFingerprint(kind: Kind): string {
  return (versions().current.get(kind) as Version).fingerprint.toString("hex");
}

/** `record` (the schema's field names) as a single-object message. */
export function encode(kind: Kind, record: Record<string, unknown>): Buffer {
  const v = versions().current.get(kind) as Version;
  return Buffer.concat([MAGIC, v.fingerprint, v.type.toBuffer(record)]);
}

/**
 * A single-object message of `kind` written with any released schema version, as an
 * object in the current schema's field names.
 */
export function decode<T = Record<string, unknown>>(kind: Kind, data: Uint8Array): T {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (buf.length < HEADER_LEN || buf[0] !== 0xc3 || buf[1] !== 0x01) {
    throw new DecodeError(`not an Avro single-object message (starts ${buf.subarray(0, 2).toString("hex")}, want c301)`);
  }
  const fp = buf.subarray(2, HEADER_LEN).toString("hex");
  const { current, known } = versions();
  const writer = known.get(kind)?.get(fp);
  if (!writer) {
    throw new DecodeError(
      `fingerprint ${fp} is no released ${kind} schema (known: ${schemaVersions(kind).join(", ")}); ` +
        `is this a ${kind} record, or is the client older than the writer?`,
    );
  }
  const reader = (current.get(kind) as Version).type;
  const body = buf.subarray(HEADER_LEN);
  try {
    return (writer === current.get(kind) ? reader.fromBuffer(body) : reader.fromBuffer(body, reader.createResolver(writer.type))) as T;
  } catch (e) {
    throw new DecodeError(`cannot read a ${kind} record (${writer.version} schema): ${e instanceof Error ? e.message : e}`);
  }
}
