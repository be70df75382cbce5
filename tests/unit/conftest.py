"""Fixtures of the unit tests (no network beyond loopback servers they start themselves)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.support.registry import FakeRegistry


@pytest.fixture
def fake_registry() -> Iterator[FakeRegistry]:
    """A fake Confluent-API schema registry on 127.0.0.1 (port 0), served from a thread."""
    server = FakeRegistry()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
