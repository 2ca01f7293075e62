"""fairway's HTTP API (`fairway serve`) with the standard library only: submit one job
or a batch, read and cancel jobs, follow a job's events over Server-Sent Events.
Every call sends ``Authorization: Bearer <API key>`` (`fairway keys create`)."""

import json
import time
import urllib.error
import urllib.request
from typing import Iterable, Iterator, List, Optional
from urllib.parse import quote

from .records import TERMINAL_STATUSES, Job, JobEvent

#: Most jobs in one batch (the API's limit, `MAX_BATCH_JOBS`).
MAX_BATCH_JOBS = 1000
#: Event kinds after which a job's stream ends.
TERMINAL_EVENTS = TERMINAL_STATUSES + ("dead_lettered",)


class ApiError(Exception):
    """An error answer: `status`, fairway's error `code` and its message (what is wrong
    and how to fix it); `retry_after` in seconds for 429/503."""

    def __init__(self, status: int, code: str, message: str, retry_after: Optional[float] = None, body=None):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message, self.retry_after, self.body = status, code, message, retry_after, body


class HttpClient:
    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0):
        self.base = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def _request(self, method: str, path: str, body=None, timeout: Optional[float] = None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.api_key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                err = json.loads(text)
            except ValueError:
                err = {"error": text, "code": "HTTP_ERROR"}
            retry = e.headers.get("Retry-After")
            raise ApiError(
                e.code, err.get("code", "HTTP_ERROR"), err.get("error", text), float(retry) if retry else None, err
            ) from None

    def _json(self, method: str, path: str, body=None):
        with self._request(method, path, body) as r:
            return json.loads(r.read() or b"null")

    def submit(self, job: Job) -> dict:
        """``POST /v1/jobs``: ``{"job_id", "pool", "duplicate", ...}``."""
        job.check(need_pool=False)
        return self._json("POST", "/v1/jobs", job.to_json())

    def submit_batch(self, jobs: Iterable[Job]) -> List[dict]:
        """``POST /v1/jobs:batch`` (all or nothing on validation, at most MAX_BATCH_JOBS)."""
        jobs = list(jobs)
        if not jobs or len(jobs) > MAX_BATCH_JOBS:
            raise ValueError(f"a batch holds 1 to {MAX_BATCH_JOBS} jobs, got {len(jobs)}; split it")
        for job in jobs:
            job.check(need_pool=False)
        return self._json("POST", "/v1/jobs:batch", [j.to_json() for j in jobs])

    def status(self, job_id: str) -> dict:
        """``GET /v1/jobs/{id}``: the job's state (as `fairway status --json`)."""
        return self._json("GET", f"/v1/jobs/{quote(job_id, safe='')}")

    def cancel(self, job_id: str) -> dict:
        """``DELETE /v1/jobs/{id}``: asks the job to stop."""
        return self._json("DELETE", f"/v1/jobs/{quote(job_id, safe='')}")

    def events(self, job_id: str, follow: bool = True, timeout: float = 300.0) -> Iterator[JobEvent]:
        """The job's events: its history, then (with `follow`) live ones until it ends or
        `timeout` seconds pass (then the stream just stops)."""
        path = f"/v1/jobs/{quote(job_id, safe='')}/events" + ("?follow=1" if follow else "")
        if not follow:
            body = self._json("GET", path)
            for e in body.get("events", body) if isinstance(body, dict) else body:
                yield JobEvent.from_record(e)
            return
        deadline = time.monotonic() + timeout
        with self._request("GET", path, timeout=min(timeout, 60.0)) as stream:
            for kind, data in _sse(stream):
                if time.monotonic() > deadline:
                    return
                if not data:
                    continue
                ev = JobEvent.from_record(json.loads(data))
                yield ev
                if ev.kind in TERMINAL_EVENTS or kind in TERMINAL_EVENTS:
                    return


def _sse(stream) -> Iterator[tuple]:
    """(event name, data) of a Server-Sent Events stream; comments and ids skipped."""
    kind, data = "message", []
    for raw in stream:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield kind, "\n".join(data)
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)
