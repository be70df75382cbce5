"""The schema-registry client against a tiny fake registry (http.server on 127.0.0.1, port 0)."""

from __future__ import annotations

import base64
import json
import socket
import time
from typing import Any

import pytest

from kafka2delta.config import SchemaRegistryConfig
from kafka2delta.errors import ConfigError, FatalError, MessageError, RetryableError
from kafka2delta.registry import NEGATIVE_TTL_S, RegisteredSchema, SchemaReference, SchemaRegistry
from tests.support.registry import FakeRegistry, FakeRegistryHandler

PASSWORD = "s3cr3t-pw"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client(url: str, clock: Clock | None = None, **settings: Any) -> SchemaRegistry:
    config = SchemaRegistryConfig(url=url, **settings)
    return SchemaRegistry(config, clock=clock or Clock())


AVRO_TEXT = json.dumps({"type": "record", "name": "E", "fields": [{"name": "id", "type": "string"}]})


def test_schema_by_id_defaults_to_avro(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(42, AVRO_TEXT)
    found = client(fake_registry.url).schema(42)
    assert found == RegisteredSchema(42, "AVRO", AVRO_TEXT, ())
    assert fake_registry.state.requests == ["/schemas/ids/42"]


def test_protobuf_schema_with_references(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(7, 'syntax = "proto3";', "PROTOBUF", [("common.proto", "com/acme common", 3)])
    fake_registry.state.subjects[("com/acme common", 3)] = {
        "subject": "com/acme common",
        "version": 3,
        "id": 5,
        "schemaType": "PROTOBUF",
        "schema": "message M {}",
    }
    registry = client(fake_registry.url)
    found = registry.schema(7)
    assert found.schema_type == "PROTOBUF"
    assert found.references == (SchemaReference("common.proto", "com/acme common", 3),)
    _name, subject, version = found.references[0]  # a reference is a (name, subject, version) tuple
    referenced = registry.referenced(subject, version)
    assert referenced == RegisteredSchema(5, "PROTOBUF", "message M {}", ())
    # The subject is quoted as one path segment.
    assert fake_registry.state.requests[-1] == "/subjects/com%2Facme%20common/versions/3"
    registry.referenced(subject, version)
    assert len(fake_registry.state.requests) == 2  # cached by (subject, version)


def test_cache_hits_and_lru_bound(fake_registry: FakeRegistry) -> None:
    for schema_id in (1, 2, 3):
        fake_registry.state.register(schema_id, AVRO_TEXT)
    registry = client(fake_registry.url, cache_size=2)
    for _ in range(100):
        registry.schema(1)
    assert len(fake_registry.state.requests) == 1
    registry.schema(2)
    registry.schema(1)  # 1 is now the most recently used
    registry.schema(3)  # evicts 2
    assert len(fake_registry.state.requests) == 3
    registry.schema(1)
    assert len(fake_registry.state.requests) == 3
    registry.schema(2)
    assert len(fake_registry.state.requests) == 4
    assert registry.requests == 4


def test_unknown_id_is_a_message_error_and_is_remembered(fake_registry: FakeRegistry) -> None:
    clock = Clock()
    registry = client(fake_registry.url, clock)
    for _ in range(10_000):
        with pytest.raises(MessageError) as caught:
            registry.schema(42)
        assert caught.value.stage == "deserialize"
        assert caught.value.reason == "schema id 42 is not in the registry"
    assert len(fake_registry.state.requests) == 1
    # Registered meanwhile: after the negative TTL the registry is asked again.
    fake_registry.state.register(42, AVRO_TEXT)
    clock.now += NEGATIVE_TTL_S - 1
    with pytest.raises(MessageError):
        registry.schema(42)
    clock.now += 2
    assert registry.schema(42).schema == AVRO_TEXT
    assert len(fake_registry.state.requests) == 2


def test_unknown_subject_version_is_a_message_error(fake_registry: FakeRegistry) -> None:
    with pytest.raises(MessageError, match="subject 'common' version 2 is not in the registry"):
        client(fake_registry.url).referenced("common", 2)


def test_404_without_confluent_error_code_is_fatal(fake_registry: FakeRegistry) -> None:
    # A wrong base URL (no Confluent API there) must stop the daemon, not dead-letter the topic.
    fake_registry.state.status = 404
    fake_registry.state.body = b"<html>Not Found</html>"
    with pytest.raises(FatalError, match=r"schema_registry\.url"):
        client(fake_registry.url + "/wrong").schema(1)


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_are_retryable_and_not_cached(fake_registry: FakeRegistry, status: int) -> None:
    fake_registry.state.register(1, AVRO_TEXT)
    fake_registry.state.status = status
    registry = client(fake_registry.url)
    with pytest.raises(RetryableError, match=fake_registry.url) as caught:
        registry.schema(1)
    assert f"HTTP {status}" in str(caught.value)
    fake_registry.state.status = 200
    assert registry.schema(1).schema == AVRO_TEXT


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more.
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RetryableError, match=f"schema registry {url} is unreachable"):
        client(url, timeout_s=2).schema(1)


def test_timeout_is_retryable(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(1, AVRO_TEXT)
    fake_registry.state.sleep_s = 1.0
    started = time.monotonic()
    with pytest.raises(RetryableError, match=fake_registry.url):
        client(fake_registry.url, timeout_s=0.2).schema(1)
    assert time.monotonic() - started < 0.9


def test_basic_auth_header(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(1, AVRO_TEXT)
    fake_registry.state.credentials = ("alice", PASSWORD)
    client(fake_registry.url, username="alice", password=PASSWORD).schema(1)
    expected = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert fake_registry.state.authorizations == [expected]


def test_no_auth_header_without_username(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(1, AVRO_TEXT)
    client(fake_registry.url).schema(1)
    assert fake_registry.state.authorizations == [None]


def test_credentials_in_the_url_are_used_and_hidden(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(1, AVRO_TEXT)
    fake_registry.state.credentials = ("bob", PASSWORD)
    url = fake_registry.url.replace("http://", f"http://bob:{PASSWORD}@")
    registry = client(url)
    registry.schema(1)
    assert PASSWORD not in registry.url
    fake_registry.state.status = 500
    with pytest.raises(RetryableError) as caught:
        registry.schema(2)
    assert PASSWORD not in str(caught.value)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_fatal_naming_the_username(fake_registry: FakeRegistry, status: int) -> None:
    fake_registry.state.status = status
    with pytest.raises(FatalError) as caught:
        client(fake_registry.url, username="alice", password=PASSWORD).schema(1)
    message = str(caught.value)
    assert "schema_registry.username" in message
    assert "alice" in message
    assert PASSWORD not in message


def test_missing_credentials_are_fatal(fake_registry: FakeRegistry) -> None:
    fake_registry.state.credentials = ("alice", PASSWORD)
    with pytest.raises(FatalError, match=r"schema_registry\.username"):
        client(fake_registry.url).schema(1)


def test_password_never_in_any_error(fake_registry: FakeRegistry) -> None:
    registry = client(fake_registry.url, username="alice", password=PASSWORD)
    for status in (401, 404, 418, 500):
        fake_registry.state.status = status
        with pytest.raises((FatalError, MessageError, RetryableError)) as caught:
            registry.schema(status)
        assert PASSWORD not in str(caught.value)
        assert PASSWORD not in repr(caught.value.__cause__)


def test_answer_that_is_not_a_schema_is_fatal(fake_registry: FakeRegistry) -> None:
    fake_registry.state.schemas[1] = {"oops": True}
    with pytest.raises(FatalError, match="not a schema"):
        client(fake_registry.url).schema(1)
    fake_registry.state.schemas[2] = {"schema": AVRO_TEXT, "schemaType": "XML"}
    with pytest.raises(FatalError, match="not a schema"):
        client(fake_registry.url).schema(2)


def test_non_json_answer_is_fatal(fake_registry: FakeRegistry) -> None:
    fake_registry.state.status = 200
    # A proxy or another service answering 200 with HTML.
    server_url = fake_registry.url
    fake_registry.state.schemas.clear()

    class HtmlHandler(FakeRegistryHandler):
        def do_GET(self) -> None:
            self._send(200, b"<html>login</html>", "text/html")

    fake_registry.RequestHandlerClass = HtmlHandler
    with pytest.raises(FatalError, match="did not answer JSON"):
        client(server_url).schema(1)


def test_other_client_errors_are_fatal(fake_registry: FakeRegistry) -> None:
    fake_registry.state.status = 422
    with pytest.raises(FatalError, match="HTTP 422"):
        client(fake_registry.url).schema(1)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://[::1]:8081", "http://[::1]:8081"),
        (f"http://bob:{PASSWORD}@[fd00::2a]:8081/apis/ccompat/v7/", "http://[fd00::2a]:8081/apis/ccompat/v7"),
        ("https://[::1]/", "https://[::1]"),
        ("http://registry:8081/", "http://registry:8081"),
    ],
)
def test_an_ipv6_registry_keeps_its_brackets(url: str, expected: str) -> None:
    """Without its brackets ``https://[::1]`` would be sent to host ``:``, port 1 (``http.client`` splits at the last
    colon), and the base URL is no URL ``urlsplit`` can read a port from."""
    assert client(url).url == expected


@pytest.mark.parametrize("url", ["http://registry:80a1", f"http://bob:{PASSWORD}@registry:99999/", "http://[::1"])
def test_a_url_urllib_cannot_read_is_a_config_error_naming_the_key(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        client(url)
    assert caught.value.key == "schema_registry.url" and PASSWORD not in str(caught.value)
