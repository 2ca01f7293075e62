#!/usr/bin/env python3
"""A pooled process job (job_types.<name>.mode = "pooled"; docs/process-jobs.md,
"Pooled mode"): one long-lived process takes jobs one after another. Each job is a
frame on stdin: `job <header bytes> <payload bytes>\\n`, the header (a JSON object of
the job's FAIRWAY_* variables), then the payload. The job ends with a `result <exit
code> <output bytes>\\n` line on fd 3 followed by exactly that many bytes of output.
Progress, checkpoint and heartbeat lines go on fd 3 before the result, as in one-shot
mode. This one counts the words of its payload (a UTF-8 text) and reports progress.
Start-up work (imports, loading a model, opening files) is paid once per process,
not once per job; the state kept between jobs is only ever one tenant's."""
import json
import os
import sys

control = os.fdopen(int(os.environ["FAIRWAY_CONTROL_FD"]), "wb", buffering=0)
stdin = sys.stdin.buffer


def count_words(job, payload):
    words = payload.decode("utf-8", "replace").split()
    control.write(b"progress 0.5 counted\n")
    return 0, json.dumps({"job": job["FAIRWAY_JOB_ID"], "words": len(words)}).encode()


while True:
    head = stdin.readline()
    if not head:
        break  # the worker closed stdin: no more jobs
    _, header_len, payload_len = head.split()
    job = json.loads(stdin.read(int(header_len)))
    payload = stdin.read(int(payload_len))
    try:
        code, output = count_words(job, payload)
    except Exception as e:  # a bug in one job fails that job, not the process
        code, output = 1, str(e).encode()
    control.write(b"result %d %d\n" % (code, len(output)) + output)
