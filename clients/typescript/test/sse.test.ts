import assert from "node:assert/strict";
import { test } from "node:test";
import { parseSse } from "../src/sse.js";

async function* chunks(parts: string[]) {
  for (const p of parts) yield Buffer.from(p, "utf8");
}

async function all(parts: string[]) {
  const out = [];
  for await (const m of parseSse(chunks(parts))) out.push(m);
  return out;
}

test("messages split anywhere, CRLF and CR line ends, comments, multi-line data, ids", async () => {
  const got = await all([": hi\r\n\r", "\nid: 1\r\nevent: queued\r\nda", "ta: {\"a\":\ndata: 1}\n\n", "data: x\rid: 2\r\r", "data: dropped"]);
  assert.deepEqual(got, [
    { event: "queued", data: "{\"a\":\n1}", id: "1" },
    { event: "message", data: "x", id: "2" },
  ]);
});

test("multi-byte characters split between chunks", async () => {
  const bytes = Buffer.from("data: é€\n\n", "utf8");
  async function* split() {
    yield bytes.subarray(0, 7);
    yield bytes.subarray(7);
  }
  const out = [];
  for await (const m of parseSse(split())) out.push(m.data);
  assert.deepEqual(out, ["é€"]);
});
