"""The client on the real services: submit over Kafka and over HTTP, read typed results
and dead letters, follow events over SSE, replay a dead letter."""

import json
import time

from fairway_client import HttpClient, Job, JobResult
from fairway_client.kafka import KafkaClient

TENANT = "acme"


def wait_for(it, want, timeout):
    """Records of `it` until `want(record)` has been true for every id wanted."""
    seen = {}
    deadline = time.monotonic() + timeout
    for rec in it:
        key = want(rec)
        if key:
            seen[key] = rec
        if time.monotonic() > deadline or want.done(seen):
            break
    return seen


class Ids:
    def __init__(self, ids, id_of):
        self.ids, self.id_of = set(ids), id_of

    def __call__(self, rec):
        i = self.id_of(rec)
        return i if i in self.ids else None

    def done(self, seen):
        return self.ids <= set(seen)


def test_submit_over_kafka_one_and_batch_and_read_results(env, group):
    kc = KafkaClient(env["brokers"], env["prefix"])
    one = kc.submit(Job(tenant=TENANT, job_type="echo", pool="short", payload={"n": 0}))
    batch = kc.submit_batch([Job(tenant=TENANT, job_type="echo", pool="short", payload={"n": i}) for i in (1, 2, 3)])
    ids = [one] + batch
    got = wait_for(kc.results(group, timeout=60), Ids(ids, lambda r: r.job_id), 90)
    assert set(got) == set(ids), f"results missing for {set(ids) - set(got)}"
    for n, job_id in enumerate(ids):
        r = got[job_id]
        assert isinstance(r, JobResult) and r.status == "succeeded" and r.attempts == 1
        assert r.output_json() == {"n": n} and r.tenant == TENANT and r.pool == "short"


def test_http_submit_follow_events_and_status(env):
    api = HttpClient(env["api"], env["key"])
    job = api.submit(Job(tenant=TENANT, job_type="echo", payload="hello"))
    assert job["pool"] == "short" and not job["duplicate"]
    events = list(api.events(job["job_id"], timeout=60))
    # The history may hold only the end already (a short job finishes within milliseconds).
    assert events and events[-1].kind == "succeeded", [e.kind for e in events]
    assert all(e.job_id == job["job_id"] and e.tenant == TENANT for e in events)
    # The terminal event is the job's result record; its worker writes the state right
    # after the broker acknowledged it (gathered for up to 80 ms), so a status read just
    # after the event may still show the state before it (docs/events-and-webhooks.md).
    deadline = time.monotonic() + 10
    while (status := api.status(job["job_id"])["status"]) != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == "succeeded", status
    batch = api.submit_batch([Job(tenant=TENANT, job_type="echo", payload=str(i), idempotency_key=f"k{i}-{time.time()}") for i in range(3)])
    assert len(batch) == 3 and len({b["job_id"] for b in batch}) == 3


def test_dead_letters_are_typed_and_replayed_with_fresh_attempts(env, group):
    kc = KafkaClient(env["brokers"], env["prefix"])
    api = HttpClient(env["api"], env["key"])
    # The sleep handler refuses a payload that is not its JSON object: a permanent failure.
    job_id = api.submit(Job(tenant=TENANT, job_type="sleep", payload="not json"))["job_id"]
    first = wait_for(kc.dead_letters(group, timeout=60), Ids([job_id], lambda d: d.job and d.job.job_id), 90)
    dl = first[job_id]
    assert dl.failure_class == "permanent" and dl.replay_count == 0 and dl.job.tenant == TENANT
    (replayed,) = kc.replay([dl])
    assert replayed != job_id
    # Replayed as a new job: it runs (fresh attempts) and dead-letters again, as replay 1.
    again = wait_for(kc.dead_letters(group + "-2", timeout=60), Ids([replayed], lambda d: d.job and d.job.job_id), 90)
    job = again[replayed].job
    assert job.replay_count == 1 and job.replayed_from == env["prefix"] + "dlq", json.dumps(str(job))
    assert job.tenant == TENANT and job.payload == b"not json"


def test_dead_letters_are_replayed_through_the_api_after_a_dry_run(env, group):
    kc = KafkaClient(env["brokers"], env["prefix"])
    api = HttpClient(env["api"], env["key"])
    payload = f"not json {time.time_ns()}".encode()
    job_id = api.submit(Job(tenant=TENANT, job_type="sleep", payload=payload.decode()))["job_id"]
    wait_for(kc.dead_letters(group, timeout=60), Ids([job_id], lambda d: d.job and d.job.job_id), 90)
    dry = api.replay(job_ids=[job_id], dry_run=True)
    assert dry["would_replay"] == 1 and dry["replayed"] == 0, dry
    run = api.replay(job_ids=[job_id], rate=10)["run"]
    deadline = time.monotonic() + 60
    while not (progress := api.replay_progress(run))["done"]:
        assert time.monotonic() < deadline, progress
        time.sleep(0.2)
    assert progress["replayed"] == 1, progress

    # The replayed copy runs and dead-letters again, as replay 1 of the same payload.
    class Replayed:
        def __call__(self, d):
            ok = d.job and d.job.payload == payload and d.job.replay_count == 1
            return d.job.job_id if ok else None

        def done(self, seen):
            return bool(seen)

    again = wait_for(kc.dead_letters(group + "-api", timeout=60), Replayed(), 90)
    assert again, "the replayed job did not dead-letter again within 90 s"
