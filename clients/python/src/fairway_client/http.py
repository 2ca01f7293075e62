"""fairway's HTTP API (`fairway serve`) with the standard library only: submit one job
or a batch, read and cancel jobs, follow a job's events over Server-Sent Events.
Every call sends ``Authorization: Bearer <API key>`` (`fairway keys create`), so the
client only talks to the origin it was given: over https (plain http only on loopback),
verified against the system's CAs or the caller's (`ca_file`, `ssl_context`), and it
never follows a redirect (see `RedirectRefused`)."""

import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Iterable, Iterator, List, Optional
from urllib.parse import quote, urljoin, urlsplit

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


class RedirectRefused(ApiError):
    """The server answered a redirect (`status` 3xx) to `location`; the client does not
    follow it.

    fairway's API never redirects, so a redirect comes from something in between (a
    proxy, a load balancer, a moved host) and means the base URL is not the API's.
    Following it would send the request, with its ``Authorization`` header, somewhere the
    caller did not name: urllib copies every header on a redirect, to any host. Dropping
    the key on a cross-origin hop instead (as requests does) would only turn the redirect
    into a puzzling 401, and urllib also rewrites a POST into a GET without its body on
    301/302/303, which would turn a submit into a read. So every redirect, same origin or
    not, is an error naming where it pointed: check that URL and give it as `base_url`
    if it is the API."""

    def __init__(self, status: int, location: Optional[str], url: str):
        where = location or "(no Location header)"
        super().__init__(
            status,
            "REDIRECT_REFUSED",
            f"{url} redirected to {where}; the client does not follow redirects (they could carry "
            "the API key to another host): if that is the API, use it as HttpClient's base_url",
        )
        self.location, self.url = location, url


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Declines every redirect; the 3xx then reaches `_request` as an HTTPError."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def _is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or the name ``localhost`` (nothing else: not other names that
    happen to resolve to loopback, not IPv4-mapped addresses)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip in _LOOPBACK_V4 if ip.version == 4 else ip == ipaddress.IPv6Address("::1")


class HttpClient:
    """A client of one fairway API at `base_url` (``https://host[:port][/prefix]``).

    `base_url` must be https, except for a loopback host (127.0.0.0/8, ``[::1]``,
    ``localhost``), where ``http://`` is allowed; `allow_insecure_http=True` allows plain
    http to any host (the API key then crosses the network in clear text).

    TLS verifies the server against the system's CAs, unless `ca_file` (a PEM file of CA
    certificates, e.g. a private CA) and/or `ssl_context` (an `ssl.SSLContext`) is given:
    with `ca_file` alone only its CAs are trusted; with `ssl_context` that context is used
    as is, and a `ca_file` given too is loaded into it (`load_verify_locations`). They are
    used for every request (submit, batch, status, cancel, events)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        *,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        allow_insecure_http: bool = False,
    ):
        self.base = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        parts = urlsplit(self.base)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"base_url {base_url!r} is not an http(s) URL with a host; give e.g. https://fairway.example.com "
                "(or http://127.0.0.1:8080 for a local API)"
            )
        if scheme == "http":
            if not (allow_insecure_http or _is_loopback(parts.hostname)):
                raise ValueError(
                    f"base_url {base_url!r} is plain http to a non-loopback host: the API key would cross the "
                    f"network unencrypted. Use https://{parts.netloc}{parts.path} (with ca_file= or ssl_context= "
                    "for a private CA); plain http is only allowed for 127.0.0.0/8, [::1] and localhost, or with "
                    "allow_insecure_http=True if you accept sending the key in clear text"
                )
            if ca_file is not None or ssl_context is not None:
                raise ValueError(
                    f"ca_file/ssl_context are given but base_url {base_url!r} is plain http, which uses no TLS; "
                    "use an https:// base_url"
                )
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(f"ssl_context must be an ssl.SSLContext, got {type(ssl_context).__name__}")
        try:
            if ssl_context is None:
                # With a cafile only its CAs are trusted (not the system's).
                ssl_context = ssl.create_default_context(cafile=ca_file)
            elif ca_file is not None:
                ssl_context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            if ca_file is None:
                raise
            raise ValueError(f"ca_file {ca_file!r}: cannot load CA certificates from it ({e}); give a PEM file") from e
        self.ssl_context = ssl_context
        # One opener for every request: TLS with this context, redirects refused. Proxies
        # come from the environment as with urllib.request.urlopen, except for a loopback
        # host (a proxy would get the key, in clear text over plain http, for nothing).
        handlers = [urllib.request.HTTPSHandler(context=ssl_context), _RefuseRedirects()]
        if _is_loopback(parts.hostname):
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def _request(self, method: str, path: str, body=None, timeout: Optional[float] = None, headers=None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        url = self.base + path
        req = urllib.request.Request(url, data=data, method=method)
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        req.add_header("Authorization", f"Bearer {self.api_key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            return self._opener.open(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            if e.code in (301, 302, 303, 307, 308):
                location = e.headers.get("Location") if e.headers else None
                e.close()
                raise RedirectRefused(e.code, urljoin(url, location) if location else None, url) from None
            text = e.read().decode("utf-8", "replace")
            try:
                err = json.loads(text)
            except ValueError:
                err = {"error": text, "code": "HTTP_ERROR"}
            retry = e.headers.get("Retry-After")
            raise ApiError(
                e.code, err.get("code", "HTTP_ERROR"), err.get("error", text), float(retry) if retry else None, err
            ) from None

    def _json(self, method: str, path: str, body=None, headers=None):
        with self._request(method, path, body, headers=headers) as r:
            return json.loads(r.read() or b"null")

    def submit(self, job: Job, headers=None) -> dict:
        """``POST /v1/jobs``: ``{"job_id", "pool", "duplicate", ...}``. `headers`: extra
        request headers (`RegionalClient` sends ``Fairway-Failover-From`` with it)."""
        job.check(need_pool=False)
        return self._json("POST", "/v1/jobs", job.to_json(), headers)

    def submit_batch(self, jobs: Iterable[Job], headers=None) -> List[dict]:
        """``POST /v1/jobs:batch`` (all or nothing on validation, at most MAX_BATCH_JOBS)."""
        jobs = list(jobs)
        if not jobs or len(jobs) > MAX_BATCH_JOBS:
            raise ValueError(f"a batch holds 1 to {MAX_BATCH_JOBS} jobs, got {len(jobs)}; split it")
        for job in jobs:
            job.check(need_pool=False)
        return self._json("POST", "/v1/jobs:batch", [j.to_json() for j in jobs], headers)

    def status(self, job_id: str, headers=None) -> dict:
        """``GET /v1/jobs/{id}``: the job's state (as `fairway status --json`)."""
        return self._json("GET", f"/v1/jobs/{quote(job_id, safe='')}", headers=headers)

    def cancel(self, job_id: str, headers=None) -> dict:
        """``DELETE /v1/jobs/{id}``: asks the job to stop."""
        return self._json("DELETE", f"/v1/jobs/{quote(job_id, safe='')}", headers=headers)

    def replay(
        self,
        *,
        source: str = "dlq",
        tenant: Optional[str] = None,
        job_type: Optional[str] = None,
        failure_class: Optional[str] = None,
        error: Optional[str] = None,
        since_ms: Optional[int] = None,
        until_ms: Optional[int] = None,
        job_ids: Optional[List[str]] = None,
        rate: Optional[int] = None,
        dry_run: bool = False,
    ) -> dict:
        """``POST /v1/replays``: replays dead letters (or a ``retry.<class>`` topic's
        records) that match, with fresh attempts. A dry run returns the report (counts and a
        sample); a real run returns ``{"run": id}`` to follow with `replay_progress`. A
        tenant key replays only its own jobs (one replay at a time, at most 10,000 jobs)."""
        body = {"source": source, "dry_run": dry_run}
        for name, value in [
            ("tenant", tenant),
            ("job_type", job_type),
            ("class", failure_class),
            ("error", error),
            ("since", since_ms),
            ("until", until_ms),
            ("job_ids", list(job_ids) if job_ids is not None else None),
            ("rate", rate),
        ]:
            if value is not None:
                body[name] = value
        return self._json("POST", "/v1/replays", body)

    def replay_progress(self, run: str) -> dict:
        """``GET /v1/replays/{run}``: progress (``done: False``), then the report (``done: True``)."""
        return self._json("GET", f"/v1/replays/{quote(run, safe='')}")

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
