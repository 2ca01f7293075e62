#!/usr/bin/env node
// A fairway `process` job in Node: counts the words of the payload (stdin, text),
// reporting progress per chunk on the control fd (docs/process-jobs.md).
// Output (stdout, JSON): {"words": N, "lines": M, "job_id": "...", "attempt": 0}
// Exit 65 (permanent) on an empty payload: retrying cannot help.
const fs = require("fs");

const control = Number(process.env.FAIRWAY_CONTROL_FD);
const report = (line) => fs.writeSync(control, line + "\n");

const text = fs.readFileSync(0, "utf8");
if (text.trim() === "") {
  process.stderr.write("empty payload: nothing to count\n");
  process.exit(65);
}
const lines = text.split("\n");
let words = 0;
lines.forEach((line, i) => {
  words += line.split(/\s+/).filter(Boolean).length;
  if (i % 1000 === 0) report(`progress ${(i / lines.length).toFixed(3)} line ${i}`);
});
report("progress 1 done");
process.stdout.write(
  JSON.stringify({
    words,
    lines: lines.length,
    job_id: process.env.FAIRWAY_JOB_ID,
    attempt: Number(process.env.FAIRWAY_ATTEMPT),
  })
);
