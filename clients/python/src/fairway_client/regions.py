"""A client of a tenant's regions (fairway's docs/regions.md): the tenant's home region
first, then the regions to fail over to, in order.

    from fairway_client import Job, RegionalClient
    api = RegionalClient([("eu", "https://eu.fairway.example.com"),
                          ("us", "https://us.fairway.example.com")], api_key)
    accepted = api.submit(Job(tenant="acme", job_type="email.send", payload={}))
    api.status(accepted["job_id"], region=accepted["region"])

The rules, per call:

* It goes to the home region (the first endpoint), unless the home failed less than
  `home_retry_secs` ago (or the longer `Retry-After` the home gave): then to the first
  other endpoint, in order, with the header ``Fairway-Failover-From: <home>`` (a region
  serves a tenant homed elsewhere only as its secondary, and only when told so).
* A ``421 MISDIRECTED_REGION`` naming a region of `endpoints` sends the call there, once
  per call (a second 421 is raised: no loops). The call goes to the URL given here for
  that region, never to the one in the answer, so the API key only reaches endpoints the
  caller listed; a 421 naming a region not listed is raised.
* The home answering 503 (any code but ``PARTIAL_SUBMIT``, where some jobs were accepted)
  or refusing the connection (nothing was sent) makes the call fail over to the next
  endpoint and marks the home failed. Other failures (a timeout after the request was
  sent: it may have been accepted) are raised, never retried elsewhere, so a job is
  never submitted to two regions by the client.
* Going back: once the home's retry time has passed, the next call tries the home first
  again; if it answers, the client stays there.

Each answer of `submit` carries ``"region"``: where the job was accepted (and so where to
read it: ``status(job_id, region=...)``)."""

import time
import urllib.error
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from .http import ApiError, HttpClient
from .records import Job

#: The request header of a failed-over call: the region the client left.
FAILOVER_HEADER = "Fairway-Failover-From"


def _refused(e: urllib.error.URLError) -> bool:
    """The connection was refused or the host not found: nothing was sent."""
    reason = getattr(e, "reason", None)
    return isinstance(reason, (ConnectionRefusedError,)) or type(reason).__name__ == "gaierror"


class RegionalClient:
    """`endpoints`: ``[(region, base_url), ...]``, the tenant's home first; `api_key` and
    the keyword arguments go to each region's `HttpClient`. `clock` (seconds,
    monotonic) is for tests."""

    def __init__(
        self,
        endpoints: Sequence[Tuple[str, str]],
        api_key: str,
        *,
        home_retry_secs: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        **http_options,
    ):
        endpoints = list(endpoints)
        if not endpoints:
            raise ValueError("endpoints is empty; give [(home region, base_url), (secondary region, base_url), ...]")
        names = [r for r, _ in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoints names a region twice ({names}); list each region once")
        self.order = names
        self.clients = {region: HttpClient(url, api_key, **http_options) for region, url in endpoints}
        self.home = names[0]
        self.home_retry_secs = home_retry_secs
        self.clock = clock
        #: Until when (clock seconds) the home is skipped; None: the home is tried first.
        self.home_failed_until: Optional[float] = None

    def _start(self) -> List[str]:
        """The regions to try, in order, for this call."""
        if self.home_failed_until is not None and self.clock() < self.home_failed_until:
            return self.order[1:]
        return list(self.order)

    def _headers(self, region: str) -> dict:
        return {} if region == self.home else {FAILOVER_HEADER: self.home}

    def _call(self, do):
        """Runs `do(client, headers)` by the rules above; returns (region, answer)."""
        todo = self._start()
        if not todo:
            raise ApiError(
                503,
                "NO_REGION",
                f"home region {self.home} failed and no other endpoint is listed; retry later",
                self.home_failed_until - self.clock(),
            )
        followed = False
        last_error: Optional[Exception] = None
        while todo:
            region = todo.pop(0)
            try:
                answer = do(self.clients[region], self._headers(region))
            except ApiError as e:
                if e.status == 421 and not followed:
                    target = (e.body or {}).get("home_region")
                    if target in self.clients:
                        followed = True
                        todo = [target] + [r for r in todo if r != target]
                        continue
                    raise
                if e.status == 503 and e.code != "PARTIAL_SUBMIT" and region == self.home:
                    self._home_failed(e.retry_after)
                    last_error = e
                    continue
                raise
            except urllib.error.URLError as e:
                if _refused(e) and region == self.home:
                    self._home_failed(None)
                    last_error = e
                    continue
                raise
            if region == self.home:
                self.home_failed_until = None
            return region, answer
        raise last_error

    def _home_failed(self, retry_after: Optional[float]):
        self.home_failed_until = self.clock() + max(self.home_retry_secs, retry_after or 0.0)

    def submit(self, job: Job) -> dict:
        """``POST /v1/jobs`` in the region the rules choose; the answer plus ``"region"``."""
        region, answer = self._call(lambda c, h: c.submit(job, headers=h))
        return dict(answer, region=region)

    def submit_batch(self, jobs: Iterable[Job]) -> List[dict]:
        """``POST /v1/jobs:batch`` in one region; each answer plus ``"region"``."""
        jobs = list(jobs)
        region, answers = self._call(lambda c, h: c.submit_batch(jobs, headers=h))
        return [dict(a, region=region) for a in answers]

    def status(self, job_id: str, region: Optional[str] = None) -> dict:
        """The job's state from `region` (where it was accepted), else by the rules."""
        if region is not None:
            return self._client(region).status(job_id, headers=self._headers(region))
        return self._call(lambda c, h: c.status(job_id, headers=h))[1]

    def cancel(self, job_id: str, region: Optional[str] = None) -> dict:
        """Asks the job to stop, in `region` (where it was accepted), else by the rules."""
        if region is not None:
            return self._client(region).cancel(job_id, headers=self._headers(region))
        return self._call(lambda c, h: c.cancel(job_id, headers=h))[1]

    def _client(self, region: str) -> HttpClient:
        if region not in self.clients:
            raise ValueError(f"region {region!r} is not one of this client's endpoints ({', '.join(self.order)})")
        return self.clients[region]
