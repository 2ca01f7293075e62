"""RegionalClient's rules against small fake regional APIs on 127.0.0.1 (no fairway
services needed): a 421 is followed once to a listed region, a home that answers 503 or
refuses the connection is left for the secondary (with ``Fairway-Failover-From``), and
the client goes back home once the home's retry time has passed."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fairway_client import ApiError, Job, RegionalClient

KEY = "fw_test_secret_key"


class FakeRegion:
    """A fake regional API: `answer` is ("ok",), ("421", home region) or ("503", code,
    retry after); `seen` holds (method, path, Fairway-Failover-From header)."""

    def __init__(self, name):
        self.name, self.answer, self.seen = name, ("ok",), []
        region = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                region.seen.append((self.command, self.path, self.headers.get("Fairway-Failover-From")))
                kind = region.answer[0]
                if kind == "421":
                    home = region.answer[1]
                    return self._send(421, {"code": "MISDIRECTED_REGION", "error": "elsewhere", "home_region": home,
                                            "endpoint": "http://attacker.invalid"})
                if kind == "503":
                    _, code, retry = region.answer
                    return self._send(503, {"code": code, "error": "down"}, {"Retry-After": str(retry)})
                if self.path == "/v1/jobs:batch":
                    return self._send(201, [{"job_id": f"{region.name}-0", "pool": "short"}])
                self._send(201, {"job_id": f"{region.name}-job", "pool": "short", "duplicate": False})

            do_GET = do_POST = do_DELETE = _handle

            def _send(self, status, obj, headers=None):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def regions():
    a, b = FakeRegion("a"), FakeRegion("b")
    yield a, b
    a.close()
    b.close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def job():
    return Job(tenant="acme", job_type="echo", payload="x")


def test_a_421_is_followed_once_to_the_listed_home(regions):
    a, b = regions
    b.answer = ("421", "a")
    # The client was given b first (e.g. a stale home): b names a, the call goes to a's listed URL.
    api = RegionalClient([("b", b.url), ("a", a.url)], KEY)
    out = api.submit(job())
    assert out["region"] == "a" and out["job_id"] == "a-job"
    assert [s[0] for s in b.seen] == ["POST"] and len(a.seen) == 1


def test_a_421_loop_is_raised_not_followed_again(regions):
    a, b = regions
    a.answer, b.answer = ("421", "b"), ("421", "a")
    api = RegionalClient([("a", a.url), ("b", b.url)], KEY)
    with pytest.raises(ApiError) as e:
        api.submit(job())
    assert e.value.status == 421
    assert len(a.seen) == 1 and len(b.seen) == 1


def test_a_421_naming_an_unlisted_region_is_raised(regions):
    a, b = regions
    a.answer = ("421", "zz")
    api = RegionalClient([("a", a.url), ("b", b.url)], KEY)
    with pytest.raises(ApiError) as e:
        api.submit(job())
    assert e.value.body["home_region"] == "zz" and not b.seen


def test_a_home_answering_503_fails_over_and_the_client_goes_back_after_its_retry_time(regions):
    a, b = regions
    clock = Clock()
    api = RegionalClient([("a", a.url), ("b", b.url)], KEY, home_retry_secs=10, clock=clock)
    a.answer = ("503", "REGION_UNAVAILABLE", 20)
    assert api.submit(job())["region"] == "b"
    assert b.seen[-1][2] == "a", "a failed-over call names the home it left"
    # Within the home's Retry-After (20 s, longer than home_retry_secs): straight to b.
    clock.now += 15
    assert api.submit(job())["region"] == "b"
    assert len(a.seen) == 1
    # Past it: the home first again, and it answers.
    a.answer = ("ok",)
    clock.now += 10
    assert api.submit(job())["region"] == "a"
    assert a.seen[-1][2] is None
    assert api.submit(job())["region"] == "a"
    assert len(b.seen) == 2


def test_a_home_refusing_connections_fails_over(regions):
    _, b = regions
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    api = RegionalClient([("a", closed), ("b", b.url)], KEY)
    assert [r["region"] for r in api.submit_batch([job()])] == ["b"]
    assert b.seen[-1] == ("POST", "/v1/jobs:batch", "a")


def test_a_partly_accepted_batch_is_raised_never_sent_elsewhere(regions):
    a, b = regions
    a.answer = ("503", "PARTIAL_SUBMIT", 5)
    api = RegionalClient([("a", a.url), ("b", b.url)], KEY)
    with pytest.raises(ApiError) as e:
        api.submit_batch([job()])
    assert e.value.code == "PARTIAL_SUBMIT" and not b.seen


def test_endpoints_are_checked():
    with pytest.raises(ValueError):
        RegionalClient([], KEY)
    with pytest.raises(ValueError):
        RegionalClient([("a", "http://127.0.0.1:1"), ("a", "http://127.0.0.1:2")], KEY)
