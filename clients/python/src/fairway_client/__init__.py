"""fairway client: submit jobs (over the HTTP API or straight to Kafka), read results
and dead letters as typed records, follow a job's events, replay dead letters.

    from fairway_client import HttpClient, Job
    api = HttpClient("https://fairway-api.example.com", api_key)   # http only on loopback
    job_id = api.submit(Job(tenant="acme", job_type="email.send", payload={"to": "a@b.c"}))["job_id"]
    for event in api.events(job_id):
        print(event.kind, event.progress)

`RegionalClient` follows a tenant's home region and fails over to its secondary
(`fairway_client.regions`). `KafkaClient` (in `fairway_client.kafka`) needs the `kafka` extra (confluent-kafka).
"""

from .codec import DecodeError, decode, encode, versions
from .http import ApiError, HttpClient, RedirectRefused
from .regions import RegionalClient
from .records import DeadLetter, Job, JobEvent, JobResult, JobSubmitted
from .replay import ReplayRefused, prepare_replay

__all__ = [
    "ApiError",
    "DeadLetter",
    "DecodeError",
    "HttpClient",
    "Job",
    "JobEvent",
    "JobResult",
    "JobSubmitted",
    "RedirectRefused",
    "RegionalClient",
    "ReplayRefused",
    "decode",
    "encode",
    "prepare_replay",
    "versions",
]
