"""HttpClient's transport safety, against small fake APIs on 127.0.0.1 (no fairway
services needed): redirects are refused and never carry the API key, plain http only to
loopback, and a private CA (`ca_file`, `ssl_context`) for every request over https.
Certificates are made with the `openssl` command line."""

import json
import shutil
import ssl
import subprocess
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fairway_client import ApiError, HttpClient, Job, RedirectRefused

KEY = "fw_test_secret_key"
JOB = "01890a5d-ac96-774b-bcce-b302099a8057"


class FakeApi:
    """A thread serving a tiny imitation of fairway's API on 127.0.0.1; `redirect` (a
    (status, location) pair) makes it answer every request with that redirect instead.
    `seen` holds (method, path, Authorization header, over TLS) of each request."""

    def __init__(self, tls: ssl.SSLContext = None):
        self.seen, self.redirect, self.tls = [], None, tls
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                api.seen.append((self.command, self.path, self.headers.get("Authorization"), api.tls is not None))
                if api.redirect:
                    status, location = api.redirect
                    self.send_response(status)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self._send(401, {"code": "UNAUTHORIZED", "error": "no or wrong API key"})
                path, _, query = self.path.partition("?")
                if self.command == "POST" and path == "/v1/jobs":
                    return self._send(200, {"job_id": JOB, "pool": "short", "duplicate": False})
                if self.command == "POST" and path == "/v1/jobs:batch":
                    jobs = json.loads(body)
                    return self._send(200, [{"job_id": f"{JOB[:-1]}{i}", "pool": "short"} for i in range(len(jobs))])
                if path == f"/v1/jobs/{JOB}/events":
                    events = [_event("started", 1), _event("succeeded", 2)]
                    if query != "follow=1":
                        return self._send(200, {"events": events})
                    stream = "".join(f"event: {e['kind']}\ndata: {json.dumps(e)}\n\n" for e in events)
                    return self._send(200, None, stream.encode(), "text/event-stream")
                if path == f"/v1/jobs/{JOB}" and self.command == "GET":
                    return self._send(200, {"job_id": JOB, "status": "succeeded"})
                if path == f"/v1/jobs/{JOB}" and self.command == "DELETE":
                    return self._send(200, {"job_id": JOB, "cancel_requested": True})
                self._send(404, {"code": "NOT_FOUND", "error": self.path})

            do_GET = do_POST = do_DELETE = _handle

            def _send(self, status, obj, raw=None, ctype="application/json"):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _event(kind, at):
    return {"job_id": JOB, "kind": kind, "at": at, "tenant": "acme", "job_type": "echo"}


#: Every call the client makes over HTTP, consuming what it returns.
CALLS = {
    "submit": lambda api: api.submit(Job(tenant="acme", job_type="echo", payload="x")),
    "submit_batch": lambda api: api.submit_batch([Job(tenant="acme", job_type="echo", payload=str(i)) for i in range(2)]),
    "status": lambda api: api.status(JOB),
    "cancel": lambda api: api.cancel(JOB),
    "events_follow": lambda api: list(api.events(JOB, follow=True, timeout=10)),
    "events_history": lambda api: list(api.events(JOB, follow=False)),
}


@pytest.fixture(scope="module")
def plain_servers():
    a, b = FakeApi(), FakeApi()
    yield a, b
    a.close()
    b.close()


# --- redirects ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_redirect_to_another_origin_is_refused_and_never_gets_the_key(plain_servers, call, status):
    a, b = plain_servers
    a.seen.clear(), b.seen.clear()
    a.redirect = (status, f"{b.url}/v1/jobs/{JOB}")
    try:
        CALLS[call](HttpClient(a.url, KEY, timeout=10))
        raised = None
    except Exception as e:
        raised = e
    finally:
        a.redirect = None
    assert len(a.seen) == 1 and a.seen[0][2] == f"Bearer {KEY}"
    assert not any(auth for _, _, auth, _ in b.seen), f"the API key was forwarded to the redirect target: {b.seen}"
    assert b.seen == [], f"the redirect target was contacted: {b.seen}"
    assert isinstance(raised, RedirectRefused), f"expected RedirectRefused, got {raised!r}"
    assert isinstance(raised, ApiError) and raised.status == status
    assert raised.location == f"{b.url}/v1/jobs/{JOB}" and b.url in str(raised) and "base_url" in str(raised)


def test_a_same_origin_redirect_is_refused_too_with_the_location_resolved(plain_servers):
    a, _ = plain_servers
    a.seen.clear()
    a.redirect = (302, "/elsewhere/v1/jobs")
    try:
        with pytest.raises(RedirectRefused) as info:
            HttpClient(a.url + "/", KEY, timeout=10).submit(Job(tenant="acme", job_type="echo"))
    finally:
        a.redirect = None
    assert info.value.location == f"{a.url}/elsewhere/v1/jobs" and info.value.url == f"{a.url}/v1/jobs"
    assert [s[:2] for s in a.seen] == [("POST", "/v1/jobs")], "the redirect was followed"


def test_the_fake_api_answers_without_a_redirect(plain_servers):
    """The redirect tests' servers really serve the calls (so a refusal is the redirect's)."""
    a, _ = plain_servers
    api = HttpClient(a.url, KEY, timeout=10)
    assert api.submit(Job(tenant="acme", job_type="echo"))["job_id"] == JOB
    assert [e.kind for e in api.events(JOB, timeout=10)] == ["started", "succeeded"]
    with pytest.raises(ApiError) as info:
        HttpClient(a.url, "wrong", timeout=10).status(JOB)
    assert info.value.status == 401 and not isinstance(info.value, RedirectRefused)


def test_a_proxy_from_the_environment_is_not_used_for_loopback(plain_servers, monkeypatch):
    a, proxy = plain_servers
    a.seen.clear(), proxy.seen.clear()
    monkeypatch.delenv("no_proxy")
    monkeypatch.setenv("http_proxy", proxy.url)
    assert HttpClient(a.url, KEY, timeout=10).status(JOB)["status"] == "succeeded"
    assert proxy.seen == [] and [s[:3] for s in a.seen] == [("GET", f"/v1/jobs/{JOB}", f"Bearer {KEY}")]


# --- https required off loopback ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://fairway.example.com",
        "http://10.0.0.5:8080",
        "http://192.168.1.1/api",
        "http://[2001:db8::1]:8080",
        "http://[::ffff:127.0.0.1]:8080",
        "http://localhost.example.com",
        "http://127.0.0.1.nip.io",
        "HTTP://fairway.example.com",
    ],
)
def test_plain_http_to_a_non_loopback_host_is_refused(url):
    with pytest.raises(ValueError, match="plain http to a non-loopback host") as info:
        HttpClient(url, KEY)
    assert "https://" in str(info.value) and "allow_insecure_http=True" in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080", "http://127.8.9.10", "http://[::1]:8080/", "http://localhost:8080", "http://LOCALHOST"],
)
def test_plain_http_is_allowed_to_loopback(url):
    assert HttpClient(url, KEY).base == url.rstrip("/")


def test_allow_insecure_http_is_an_explicit_opt_out():
    assert HttpClient("http://fairway.example.com", KEY, allow_insecure_http=True).base == "http://fairway.example.com"
    assert HttpClient("https://fairway.example.com", KEY).base == "https://fairway.example.com"


@pytest.mark.parametrize("url", ["ftp://fairway.example.com", "fairway.example.com:8080", "https://", "127.0.0.1:8080"])
def test_base_url_must_be_an_http_url_with_a_host(url):
    with pytest.raises(ValueError, match="not an http\\(s\\) URL with a host"):
        HttpClient(url, KEY)


def test_tls_options_on_plain_http_are_refused(pki):
    with pytest.raises(ValueError, match="plain http, which uses no TLS"):
        HttpClient("http://127.0.0.1:8080", KEY, ca_file=pki["ca"])
    with pytest.raises(ValueError, match="plain http, which uses no TLS"):
        HttpClient("http://127.0.0.1:8080", KEY, ssl_context=ssl.create_default_context())


def test_a_bad_ca_file_or_ssl_context_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="ca_file .*missing.pem.*cannot load CA certificates"):
        HttpClient("https://127.0.0.1:1", KEY, ca_file=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="cannot load CA certificates"):
        HttpClient("https://127.0.0.1:1", KEY, ca_file=str(tmp_path / "junk.pem"))
    with pytest.raises(TypeError, match="ssl.SSLContext"):
        HttpClient("https://127.0.0.1:1", KEY, ssl_context="/etc/ssl/ca.pem")


# --- a private CA --------------------------------------------------------------------


def _openssl(*args, cwd):
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, f"openssl {' '.join(args)} failed:\n{out.stderr}"


def _make_ca(d, name):
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=fairway test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    return str(d / f"{name}.pem")


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A private CA, a server certificate it signed for 127.0.0.1, and an unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests need the openssl command line on PATH")
    d = tmp_path_factory.mktemp("pki")
    ca, other = _make_ca(d, "ca"), _make_ca(d, "other-ca")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "2",
        "-days", "2", "-out", "server.pem", "-extfile", "server.ext", cwd=d,
    )  # fmt: skip
    return {"ca": ca, "other_ca": other, "cert": str(d / "server.pem"), "key": str(d / "server.key")}


@pytest.fixture(scope="module")
def tls_server(pki):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["cert"], pki["key"])
    server = FakeApi(tls=ctx)
    yield server
    server.close()


def _with_ca(pki, how):
    if how == "ca_file":
        return {"ca_file": pki["ca"]}
    if how == "ssl_context":
        return {"ssl_context": ssl.create_default_context(cafile=pki["ca"])}
    # Both: the caller's context (system CAs only) plus the private CA loaded into it.
    return {"ssl_context": ssl.create_default_context(), "ca_file": pki["ca"]}


@pytest.mark.parametrize("how", ["ca_file", "ssl_context", "both"])
def test_every_call_verifies_the_server_with_the_private_ca(pki, tls_server, how):
    tls_server.seen.clear()
    api = HttpClient(tls_server.url, KEY, timeout=10, **_with_ca(pki, how))
    assert CALLS["submit"](api)["job_id"] == JOB
    assert len(CALLS["submit_batch"](api)) == 2
    assert CALLS["status"](api)["status"] == "succeeded"
    assert CALLS["cancel"](api)["cancel_requested"] is True
    assert [e.kind for e in CALLS["events_follow"](api)] == ["started", "succeeded"]
    assert [e.kind for e in CALLS["events_history"](api)] == ["started", "succeeded"]
    assert [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _, _ in tls_server.seen] == [
        ("POST", "jobs"), ("POST", "jobs:batch"), ("GET", JOB), ("DELETE", JOB), ("GET", "events"), ("GET", "events"),
    ]  # fmt: skip
    assert all(auth == f"Bearer {KEY}" and tls for _, _, auth, tls in tls_server.seen)


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("trust", ["system", "other_ca"])
def test_without_the_private_ca_the_server_is_not_trusted(pki, tls_server, trust, call):
    tls_server.seen.clear()
    api = HttpClient(tls_server.url, KEY, timeout=10, **({"ca_file": pki["other_ca"]} if trust == "other_ca" else {}))
    with pytest.raises(urllib.error.URLError) as info:
        CALLS[call](api)
    assert isinstance(info.value.reason, ssl.SSLCertVerificationError), info.value
    assert tls_server.seen == [], "a request reached the server over an unverified connection"


def test_a_redirect_over_https_is_refused_too(pki, tls_server, plain_servers):
    _, b = plain_servers
    b.seen.clear()
    tls_server.redirect = (307, f"{b.url}/v1/jobs")
    try:
        with pytest.raises(RedirectRefused, match="redirected to http://127.0.0.1"):
            HttpClient(tls_server.url, KEY, timeout=10, ca_file=pki["ca"]).submit(Job(tenant="acme", job_type="echo"))
    finally:
        tls_server.redirect = None
    assert b.seen == []
