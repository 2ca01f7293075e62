"""The client's service tests (test_services.py, through the `env` fixture) run against
real local services that tests/it/clients.rs (in the repository) starts: a broker,
the CQL database, a `fairway worker` for the short pool and `fairway serve`. It passes
where they are in the environment. test_codec.py, test_http_security.py and test_regions.py need none (they serve fakes on
127.0.0.1, so proxies from the environment are turned off for every test)."""

import os
import uuid

import pytest


def _need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: run these tests through `cargo test --test it clients::` "
            "(it starts the services, a worker and the API, and sets FAIRWAY_TEST_*)"
        )
    return value


@pytest.fixture(scope="session")
def env():
    return {
        "brokers": _need("FAIRWAY_TEST_BROKERS"),
        "prefix": _need("FAIRWAY_TEST_TOPIC_PREFIX"),
        "api": _need("FAIRWAY_TEST_API"),
        "key": _need("FAIRWAY_TEST_API_KEY"),
    }


@pytest.fixture
def group():
    """A fresh consumer group name (the local broker wedges reused ones)."""
    return f"pyclient-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch):
    """The test servers are on 127.0.0.1: a proxy from the environment must not get between."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "*")
