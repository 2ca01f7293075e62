"""Typed records: what fairway publishes (results, dead letters, events) and what it
reads (submissions), with the fields of the current schemas in ``schemas/``."""

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

#: Statuses a job ends in (results topic).
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled", "expired")
POOLS = ("short", "medium", "long")
PRIORITIES = ("urgent", "normal", "low")


def _from(cls, record: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in record.items() if k in names})


def now_ms() -> int:
    return int(time.time() * 1000)


def uuid7() -> str:
    """A UUID v7 (time-ordered) in canonical text form, as fairway's job ids."""
    value = (now_ms() & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def payload_bytes(payload: Union[bytes, str, Any, None]) -> bytes:
    """Handler input as fairway's API encodes it: bytes as they are, a string as UTF-8,
    None as empty, anything else as JSON."""
    if payload is None:
        return b""
    if isinstance(payload, (bytes, bytearray)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


@dataclass
class Job:
    """A job to submit. `pool` is needed over Kafka (it picks the topic: the job type's
    pool in the deployment's fairway.toml); the HTTP API finds it itself."""

    tenant: str
    job_type: str
    payload: Union[bytes, str, Any, None] = None
    pool: Optional[str] = None
    priority: str = "normal"
    idempotency_key: Optional[str] = None
    execute_at: Optional[int] = None
    not_after: Optional[int] = None
    flow_key: Optional[str] = None
    user_key: Optional[str] = None
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None

    def check(self, need_pool: bool) -> None:
        """Raises ValueError naming the field and the fix."""
        if not self.tenant or not self.job_type:
            raise ValueError("Job.tenant and Job.job_type are required (non-empty strings)")
        if need_pool and self.pool not in POOLS:
            raise ValueError(
                f"Job.pool is {self.pool!r}: over Kafka give the job type's pool ({', '.join(POOLS)}), "
                "as configured in the deployment's fairway.toml [job_types.<name>].pool"
            )
        if self.priority not in PRIORITIES:
            raise ValueError(f"Job.priority is {self.priority!r}; use one of {', '.join(PRIORITIES)}")

    def to_submitted(self, job_id: Optional[str] = None) -> "JobSubmitted":
        return JobSubmitted(
            job_id=job_id or uuid7(),
            tenant=self.tenant,
            job_type=self.job_type,
            pool=self.pool,
            priority=self.priority,
            payload=payload_bytes(self.payload),
            idempotency_key=self.idempotency_key,
            execute_at=self.execute_at,
            not_after=self.not_after,
            submitted_at=now_ms(),
            traceparent=self.traceparent,
            tracestate=self.tracestate,
            flow_key=self.flow_key,
            user_key=self.user_key,
        )

    def to_json(self) -> dict:
        """The job object of `POST /v1/jobs` (a bytes payload is sent as UTF-8 text)."""
        body = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if isinstance(self.payload, (bytes, bytearray)):
            body["payload"] = bytes(self.payload).decode("utf-8")
        return body


@dataclass
class JobSubmitted:
    """A job as on a pool or retry topic (schemas/job_submitted.avsc)."""

    job_id: str
    tenant: str
    job_type: str
    submitted_at: int
    pool: Optional[str] = None
    priority: str = "normal"
    payload: bytes = b""
    idempotency_key: Optional[str] = None
    execute_at: Optional[int] = None
    not_after: Optional[int] = None
    attempt: int = 0
    crash_count: int = 0
    generation: int = 0
    not_before: Optional[int] = None
    last_error: Optional[str] = None
    last_failure_class: Optional[str] = None
    first_failure_at: Optional[int] = None
    replay_count: int = 0
    replayed_from: Optional[str] = None
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    flow_key: Optional[str] = None
    user_key: Optional[str] = None
    handoff_count: int = 0

    @classmethod
    def from_record(cls, record: dict) -> "JobSubmitted":
        return _from(cls, record)

    def to_record(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class JobResult:
    """The one terminal record of a job (schemas/job_result.avsc)."""

    job_id: str
    tenant: str
    job_type: str
    pool: str
    status: str
    attempts: int
    generation: int
    submitted_at: int
    finished_at: int
    worker_id: str
    output: Optional[bytes] = None
    error: Optional[str] = None
    failure_class: Optional[str] = None
    started_at: Optional[int] = None
    peak_memory_bytes: Optional[int] = None
    cpu_ms: Optional[int] = None

    @classmethod
    def from_record(cls, record: dict) -> "JobResult":
        return _from(cls, record)

    def output_json(self) -> Any:
        return json.loads(self.output) if self.output else None


@dataclass
class DeadLetter:
    """A job that will not run again without a replay (schemas/dead_letter.avsc). `job`
    is None when the original message could not be decoded (`raw` holds its bytes)."""

    failure_class: str
    reason: str
    attempts: int
    first_failure_at: int
    last_failure_at: int
    origin_topic: str
    origin_partition: int
    origin_offset: int
    job: Optional[JobSubmitted] = None
    raw: Optional[bytes] = None
    last_error: Optional[str] = None
    replay_count: int = 0

    @classmethod
    def from_record(cls, record: dict) -> "DeadLetter":
        dl = _from(cls, record)
        if isinstance(dl.job, dict):
            dl.job = JobSubmitted.from_record(dl.job)
        return dl


@dataclass
class JobEvent:
    """A lifecycle or progress event of a job (schemas/job_event.avsc; over SSE the
    API's JSON form of it)."""

    job_id: str
    kind: str
    at: int
    event_id: str = ""
    tenant: str = ""
    job_type: str = ""
    attempt: int = 0
    worker: Optional[str] = None
    progress: Optional[float] = None
    message: Optional[str] = None
    next_attempt_at: Optional[int] = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict) -> "JobEvent":
        ev = _from(cls, record)
        names = {f.name for f in dataclasses.fields(cls)}
        ev.extra = {k: v for k, v in record.items() if k not in names}
        return ev
