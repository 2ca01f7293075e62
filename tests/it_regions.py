"""The client side of tests/it/regions.rs: a tenant homed in region a (secondary b)
drives fairway_client.RegionalClient against two `fairway serve` processes standing for
two regions, while this script puts region a down and up again with the `fairway region`
command. Prints one JSON object: {"accepted": [[job_id, region], ...], "steps": {...}}.

Environment: IT_A, IT_B (API base URLs), IT_A_READY (region a's /readyz URL), IT_KEY,
IT_TENANT, IT_FAIRWAY (the binary), IT_A_CONFIG (region a's config file)."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from fairway_client import ApiError, HttpClient, Job, RegionalClient

A, B, KEY, TENANT = os.environ["IT_A"], os.environ["IT_B"], os.environ["IT_KEY"], os.environ["IT_TENANT"]
accepted, steps = [], {}


def job(i):
    return Job(tenant=TENANT, job_type="echo", payload={"i": i})


def region_a(state):
    cmd = [os.environ["IT_FAIRWAY"], "--config", os.environ["IT_A_CONFIG"], "region", state]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def wait_ready(want_ready, timeout=20.0):
    """Until region a's /readyz answers 200 (want_ready) or 503."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(os.environ["IT_A_READY"], timeout=2) as r:
                ready = r.status == 200
        except urllib.error.HTTPError as e:
            ready = e.code != 503 and e.code < 500
        if ready == want_ready:
            return
        time.sleep(0.2)
    sys.exit(f"region a's /readyz did not turn {'ready' if want_ready else 'not ready'} within {timeout}s")


# 1. Through b's endpoint: b answers 421 naming a; a plain client sees it ...
try:
    HttpClient(B, KEY).submit(job(-1))
    sys.exit("region b accepted a submission of a tenant homed in region a (no 421)")
except ApiError as e:
    steps["b_answers"] = [e.status, e.code, e.body.get("home_region"), e.body.get("endpoint")]

# ... and a regional client listing b first follows it to a.
stale = RegionalClient([("b", B), ("a", A)], KEY)
out = stale.submit(job(0))
accepted.append([out["job_id"], out["region"]])
steps["followed_to"] = out["region"]

# 2. At home: a.
api = RegionalClient([("a", A), ("b", B)], KEY, home_retry_secs=3)
for i in range(1, 11):
    out = api.submit(job(i))
    accepted.append([out["job_id"], out["region"]])

# 3. Region a down: submissions move to b, the secondary.
region_a("down")
wait_ready(False)
for i in range(11, 21):
    out = api.submit(job(i))
    accepted.append([out["job_id"], out["region"]])
batch = api.submit_batch([job(i) for i in range(21, 26)])
accepted.extend([o["job_id"], o["region"]] for o in batch)

# 4. Region a up again: once the home's retry time has passed, back home.
region_a("up")
wait_ready(True)
time.sleep(3.2)
for i in range(26, 31):
    out = api.submit(job(i))
    accepted.append([out["job_id"], out["region"]])

print(json.dumps({"accepted": accepted, "steps": steps}))
