#!/usr/bin/env python3
"""A fairway `process` job in Python: N steps, progress after each, a checkpoint after
each, resumes from the last checkpoint after a hand-off or a retry.

Payload (stdin, JSON): {"steps": 20, "step_ms": 200}
Output (stdout, JSON): {"steps": 20, "resumed_at": 7, "ran": 13}

The protocol (docs/process-jobs.md): write lines to the file descriptor named by
FAIRWAY_CONTROL_FD - `progress <0..1> <message>`, `checkpoint` (after writing the file
named by FAIRWAY_CHECKPOINT_FILE), `heartbeat`. On SIGTERM (cancel, drain) finish the
step in hand, checkpoint, and exit.
"""
import json
import os
import signal
import sys
import time

control = os.fdopen(int(os.environ["FAIRWAY_CONTROL_FD"]), "w", buffering=1)
checkpoint_file = os.environ["FAIRWAY_CHECKPOINT_FILE"]
stop = False


def on_sigterm(_signum, _frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_sigterm)

params = json.load(sys.stdin)
steps, step_ms = int(params.get("steps", 10)), int(params.get("step_ms", 100))

start = 0
if os.path.exists(checkpoint_file):
    with open(checkpoint_file) as f:
        start = int(f.read() or 0)

for i in range(start, steps):
    if stop:
        print(f"stopped before step {i + 1}", file=sys.stderr)
        sys.exit(1)
    time.sleep(step_ms / 1000)
    # Write the checkpoint atomically, then tell the worker to save it.
    with open(checkpoint_file + ".tmp", "w") as f:
        f.write(str(i + 1))
    os.replace(checkpoint_file + ".tmp", checkpoint_file)
    control.write("checkpoint\n")
    control.write(f"progress {(i + 1) / steps:.3f} step {i + 1} of {steps}\n")

json.dump({"steps": steps, "resumed_at": start, "ran": steps - start}, sys.stdout)
