"""Loopback-server fixtures shared by the service, judge and simulator tests."""

import pytest

from slca_exp.services.loopback import Behaviour, serve_in_thread

KEY_ENV = "SLCA_TEST_API_KEY"
KEY = "sk-PLANTED-9f3c1e7a-do-not-leak"


@pytest.fixture(scope="module")
def loopback():
    with serve_in_thread() as server:
        yield server


@pytest.fixture
def server(loopback):
    """The module's server, reset to answering the default content."""
    loopback.reset()
    loopback.behaviour = Behaviour()
    loopback.route = None
    return loopback


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY
