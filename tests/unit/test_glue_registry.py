"""The AWS Glue Schema Registry: its wire format, the registry edge (moto's Glue API in process, botocore's
Stubber for the errors moto does not make), the Avro lane through it, and the config keys."""

from __future__ import annotations

import json
import socket
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from moto import mock_aws

from kafka2delta import registry_glue
from kafka2delta.cli import open_registry
from kafka2delta.config import FormatConfig, SchemaRegistryConfig, load_config
from kafka2delta.errors import ConfigError, FatalError, MessageError, RetryableError
from kafka2delta.registry import NEGATIVE_TTL_S
from kafka2delta.registry_glue import GlueRegistry
from kafka2delta.serialization import MAX_DECOMPRESSED_BYTES, build_deserializer, framing, split_glue
from kafka2delta.serialization import avro as avro_format
from kafka2delta.serialization import json as json_format
from kafka2delta.serialization.avro_batch import PADDING
from kafka2delta.serialization.framing import GlueFraming
from kafka2delta.serialization.json import JsonDeserializer
from tests.support.glue import REGION, GlueSchemas, glue_avro, glue_client, glue_environment, glue_frame
from tests.support.serialization import avro_datum, framed_avro, messages

V1: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"}],
}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "color", "type": ["null", "string"], "default": None}]}
UNKNOWN = uuid.UUID("00000000-0000-4000-8000-00000000beef")


# --- the wire format -----------------------------------------------------------------------------


def test_split_glue_reads_plain_and_zlib_payloads() -> None:
    version = uuid.uuid4()
    assert split_glue(glue_frame(version, b"\x02a")) == (version, b"\x02a")
    assert split_glue(glue_frame(version, b"\x02a" * 100, zlib_compressed=True)) == (version, b"\x02a" * 100)
    assert split_glue(glue_frame(version, b"")) == (version, b"")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\x00\x00\x00\x01\x02a", "not Glue wire format: header version byte 0x00, expected 0x03"),
        (b"", "not Glue wire format: header version byte nothing, expected 0x03"),
        (b"\x03\x00" + bytes(10), "truncated: 12 bytes, the Glue header needs 18"),
        (b"\x03\x01" + bytes(16) + b"x", "compression byte 0x01, expected 0x00 (none) or 0x05 (zlib)"),
        (b"\x03\x05" + bytes(16) + b"not zlib", "the Glue payload is not valid zlib"),
        (b"\x03\x05" + bytes(16) + zlib.compress(b"abc")[:-3], "zlib stream is truncated"),
        (b"\x03\x05" + bytes(16) + zlib.compress(b"abc") + b"xy", "2 trailing bytes after the Glue payload's zlib"),
        (b"\x03\x05" + bytes(16) + zlib.compress(bytes(MAX_DECOMPRESSED_BYTES + 1), 1), "inflates beyond 64 MiB"),
    ],
)
def test_split_glue_refuses_what_is_not_its_wire_format(payload: bytes, reason: str) -> None:
    with pytest.raises(MessageError) as caught:
        split_glue(payload)
    assert caught.value.stage == "deserialize" and reason in caught.value.reason


def test_glue_lay_out_finds_what_unframe_finds() -> None:
    """The column lanes' view of a batch (every datum and its schema version at once) agrees with the
    per-message split, whatever the payloads around it."""
    first, second = uuid.uuid4(), uuid.uuid4()
    payloads: list[bytes | None] = [
        glue_frame(first, b"\x02a"),
        glue_frame(second, b"\x02bb" * 40, zlib_compressed=True),
        None,
        b"",
        glue_frame(first, b""),
        glue_frame(second, b"\x02c"),
        b"\x03\x00" + bytes(10),  # truncated header
        b"\x03\x05" + first.bytes + b"not zlib",
        b"\x03\x01" + first.bytes + b"x",  # unknown compression
        framed_avro(1, V1, {"id": "a", "n": 1}),  # Confluent's
        glue_frame(UNKNOWN, b"\x02d", zlib_compressed=True),
        glue_frame(first, b"\x02e", zlib_compressed=True),
    ]
    framing = GlueFraming(object())  # type: ignore[arg-type]  # lay_out never asks the registry
    for batch in [payloads, *([payload] for payload in payloads), []]:
        datums = framing.lay_out(batch)
        assert (datums.starts <= datums.ends).all() and (datums.ends <= len(datums.buffer) - PADDING).all()
        for row, payload in enumerate(batch):
            try:
                version, datum = split_glue(payload) if payload is not None else (None, b"")
            except MessageError:
                version = None
            if version is None:
                assert datums.schemas[row] == -1, row
                continue
            assert uuid.UUID(int=datums.schema_ids[datums.schemas[row]]) == version, row
            assert datums.buffer[datums.starts[row] : datums.ends[row]] == datum, row
        assert datums.buffer.endswith(bytes(PADDING))
    assert len(framing.lay_out(payloads).schema_ids) == 3


# --- the registry edge ---------------------------------------------------------------------------


@pytest.fixture
def glue() -> Iterator[GlueSchemas]:
    """moto's Glue API in this process (no network), with one registry."""
    with mock_aws():
        yield GlueSchemas(glue_client())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock | None = None, client: Any = None) -> GlueRegistry:
    config = SchemaRegistryConfig(type="glue", region=REGION)
    return GlueRegistry(config, client=client, clock=clock or Clock())


def test_a_schema_version_is_fetched_once_and_cached(glue: GlueSchemas) -> None:
    version = glue.register("events", V1)
    edge = registry()
    found = edge.schema_version(version)
    assert found.schema_type == "AVRO" and found.id == 1 and '"name": "Event"' in found.schema
    assert edge.schema_version(version) is found
    assert edge.requests == 1


def test_an_unknown_version_is_a_message_error_remembered_for_a_while(glue: GlueSchemas) -> None:
    clock = Clock()
    edge = registry(clock)
    for _ in range(3):
        with pytest.raises(MessageError) as caught:
            edge.schema_version(UNKNOWN)
        assert caught.value.reason == f"schema version {UNKNOWN} is not in the Glue schema registry"
    assert edge.requests == 1  # a burst of messages naming it costs one request
    clock.now += NEGATIVE_TTL_S + 1
    with pytest.raises(MessageError):
        edge.schema_version(UNKNOWN)
    assert edge.requests == 2


@pytest.mark.parametrize(
    ("code", "status", "error", "words"),
    [
        ("ThrottlingException", 400, RetryableError, "ThrottlingException (HTTP 400)"),
        ("InternalServiceException", 500, RetryableError, "InternalServiceException (HTTP 500)"),
        ("SomethingNew", 503, RetryableError, "(HTTP 503)"),
        ("AccessDeniedException", 400, FatalError, "refused the AWS credentials"),
        ("ExpiredTokenException", 400, FatalError, "refused the AWS credentials"),
        ("ValidationException", 400, FatalError, "schema_registry.type: the Glue schema registry answered Valid"),
        # The id sent is a well-formed UUID: a refusal is systemic, never one message's fault.
        ("InvalidInputException", 400, FatalError, "answered InvalidInputException (HTTP 400)"),
    ],
)
def test_glue_errors_are_translated(code: str, status: int, error: type[Exception], words: str) -> None:
    client = glue_client()
    edge = registry(client=client)
    with Stubber(client) as stub:
        stub.add_client_error("get_schema_version", code, "said Glue", status)
        with pytest.raises(error) as caught:
            edge.schema_version(UNKNOWN)
    assert words in str(caught.value)


def test_an_unreachable_glue_is_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in glue_environment().items():
        monkeypatch.setenv(name, value)
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = SchemaRegistryConfig(type="glue", region=REGION, endpoint_url=f"http://127.0.0.1:{port}", timeout_s=2)
    edge = GlueRegistry(config, client=None)
    with pytest.raises(RetryableError) as caught:
        edge.schema_version(UNKNOWN)
    assert f"Glue schema registry at http://127.0.0.1:{port} is unreachable" in str(caught.value)


def test_missing_credentials_are_retried_with_a_new_client(glue: GlueSchemas, monkeypatch: pytest.MonkeyPatch) -> None:
    """An instance-metadata blip at start leaves a client without credentials for good: retry with a new one."""
    version = glue.register("events", V1)
    monkeypatch.setattr(registry_glue, "_SESSION", None)  # no credentials cached from other tests
    saved = {name: value for name, value in glue_environment().items() if name != "AWS_REGION"}
    for name in saved:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    edge = GlueRegistry(SchemaRegistryConfig(type="glue", region=REGION))
    with pytest.raises(RetryableError, match="no AWS credentials found"):
        edge.schema_version(version)
    for name, value in saved.items():  # the credentials arrive (the metadata endpoint answers again)
        monkeypatch.setenv(name, value)
    assert edge.schema_version(version).id == 1  # Glue's version number


def test_glue_refusing_the_request_is_fatal_never_a_dead_letter() -> None:
    """InvalidInputException for a well-formed version id (any 16 bytes are one) is the setup's problem: it stops
    the daemon (exit 1) instead of dead-lettering every message, and is not remembered as a missing version."""
    client = glue_client()
    edge = registry(client=client)
    with Stubber(client) as stub:
        for _ in range(2):
            stub.add_client_error("get_schema_version", "InvalidInputException", "said Glue", 400)
            with pytest.raises(FatalError, match=r"^schema_registry\.type: .*InvalidInputException"):
                edge.schema_version(UNKNOWN)
    assert edge.requests == 2  # asked again: nothing was cached as "not in the registry"


def test_credentials_the_provider_cannot_fetch_yet_are_retried() -> None:
    """A credential endpoint not answering (a Pod Identity agent starting) may heal: RetryableError, as no
    credentials found is (the retry budget then bounds the wait); refused credentials are fatal (above)."""
    import botocore.exceptions

    class NoCredentialsYet:
        def get_schema_version(self, **kwargs: Any) -> Any:
            raise botocore.exceptions.CredentialRetrievalError(provider="container-role", error_msg="refused")

    with pytest.raises(RetryableError, match="AWS credentials could not be fetched"):
        registry(client=NoCredentialsYet()).schema_version(UNKNOWN)


@pytest.mark.parametrize("region", ["eu west 1", "eu-west-1/"])
def test_a_region_botocore_refuses_is_a_config_error_naming_the_region(
    region: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in glue_environment().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        GlueRegistry(SchemaRegistryConfig(type="glue", region=region))
    assert caught.value.key == "schema_registry.region" and repr(region) in caught.value.problem


def test_an_answer_that_is_not_a_schema_is_fatal() -> None:
    client = glue_client()
    edge = registry(client=client)
    with Stubber(client) as stub:
        stub.add_response("get_schema_version", {"SchemaVersionId": str(UNKNOWN), "VersionNumber": 1})
        with pytest.raises(FatalError, match="not a schema"):
            edge.schema_version(UNKNOWN)


def test_an_answer_cut_short_is_retried() -> None:
    """Found by review: botocore returns what it parsed of a body the connection dropped (no schema fields at all)."""
    client = glue_client()
    edge = registry(client=client)
    with Stubber(client) as stub:
        stub.add_response("get_schema_version", {})
        with pytest.raises(RetryableError, match="cut short"):
            edge.schema_version(UNKNOWN)


# --- the Avro lane through Glue ------------------------------------------------------------------


def test_avro_in_glue_wire_format_is_decoded_per_schema_version(glue: GlueSchemas) -> None:
    v1, v2 = glue.register("events", V1), glue.register("events", V2)
    edge = registry()
    deserializer = build_deserializer(FormatConfig(type="avro"), edge, "events")
    payloads = [
        glue_avro(v1, V1, {"id": "a", "n": 1}),
        glue_avro(v2, V2, {"id": "b", "n": 2, "color": "red"}, zlib_compressed=True),
        glue_avro(v1, V1, {"id": "c", "n": 3}, zlib_compressed=True),
        glue_frame(UNKNOWN, avro_datum(V1, {"id": "d", "n": 4})),
        framed_avro(1, V1, {"id": "e", "n": 5}),  # Confluent framing: not Glue's
        glue_frame(v1, avro_datum(V1, {"id": "f", "n": 6}) + b"\x00"),
        glue_avro(v2, V2, {"id": "g", "n": 7, "color": None}),
    ]
    decoded = deserializer.decode(messages(payloads), range(len(payloads)))
    rows = dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))
    assert rows == {
        0: {"id": "a", "n": 1, "color": None},
        1: {"id": "b", "n": 2, "color": "red"},
        2: {"id": "c", "n": 3, "color": None},
        6: {"id": "g", "n": 7, "color": None},
    }
    assert decoded.typed and decoded.table.schema.field("color").nullable
    assert {position: error.reason for position, error in decoded.failures} == {
        3: f"schema version {UNKNOWN} is not in the Glue schema registry",
        4: "not Glue wire format: header version byte 0x00, expected 0x03",
        5: "1 trailing bytes after the Avro datum",
    }
    assert edge.requests == 3  # v1, v2 and the unknown one, each once
    # The reference lane agrees with the batch lane.
    assert deserializer.document(messages(payloads), 1) == {"id": "b", "n": 2, "color": "red"}


def test_a_glue_schema_that_is_not_avro_is_a_dead_letter(glue: GlueSchemas) -> None:
    version = glue.register("json-events", {"type": "object"}, "JSON")
    deserializer = build_deserializer(FormatConfig(type="avro"), registry(), "events")
    with pytest.raises(MessageError) as caught:
        deserializer.document(messages([glue_frame(version, b"{}")]), 0)
    assert caught.value.reason == f"schema version {version} is a JSON schema, not AVRO"


def test_a_glue_outage_is_raised_never_a_dead_letter(glue: GlueSchemas) -> None:
    version = glue.register("events", V1)
    client = glue_client()
    edge = registry(client=client)
    deserializer = build_deserializer(FormatConfig(type="avro"), edge, "events")
    payload = glue_avro(version, V1, {"id": "a", "n": 1})
    with Stubber(client) as stub:
        stub.add_client_error("get_schema_version", "ThrottlingException", "slow down", 400)
        with pytest.raises(RetryableError):
            deserializer.decode(messages([payload]), [0])
    # Nothing was cached: once Glue answers, the same message decodes.
    decoded = deserializer.decode(messages([payload]), [0])
    assert decoded.table.to_pylist() == [{"id": "a", "n": 1}] and decoded.failures == []


def test_avro_keys_in_glue_wire_format(glue: GlueSchemas) -> None:
    key_schema: dict[str, Any] = {"type": "record", "name": "Key", "fields": [{"name": "tenant", "type": "int"}]}
    version = glue.register("events-key", key_schema)
    deserializer = build_deserializer(FormatConfig(type="raw", key="avro"), registry(), "events")
    key = glue_avro(version, key_schema, {"tenant": 7}, zlib_compressed=True)
    decoded = deserializer.decode(messages([b"anything", b"else"], [key, glue_frame(UNKNOWN, b"")]), [0, 1])
    assert decoded.keys == [{"tenant": 7}, None]
    assert [(position, error.reason) for position, error in decoded.failures] == [
        (1, f"key: schema version {UNKNOWN} is not in the Glue schema registry")
    ]


# --- JSON (Schema) payloads through Glue ---------------------------------------------------------


def test_json_in_glue_wire_format_goes_through_the_json_lane(glue: GlueSchemas) -> None:
    version = glue.register("json-events", {"type": "object", "properties": {"id": {"type": "string"}}}, "JSON")
    avro_version = glue.register("events", V1)
    edge = registry()
    deserializer = build_deserializer(FormatConfig(type="json"), edge, "events")
    payloads = [
        glue_frame(version, b'{"id": "a", "n": 1}'),
        glue_frame(version, b'{"id": "b", "n": 2, "color": "red"}', zlib_compressed=True),
        glue_frame(UNKNOWN, b'{"id": "c"}'),
        b'{"id": "d"}',  # plain JSON: not Glue's wire format
        glue_frame(version, b'{"id": "e",'),
        glue_frame(avro_version, b'{"id": "f"}'),
        glue_frame(version, b'{"id": "g", "n": 7}'),
    ]
    decoded = deserializer.decode(messages(payloads), range(len(payloads)))
    rows = dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))
    assert rows == {
        0: {"id": "a", "n": 1, "color": None},
        1: {"id": "b", "n": 2, "color": "red"},
        6: {"id": "g", "n": 7, "color": None},
    }
    found = {position: error.reason for position, error in decoded.failures}
    assert found.keys() == {2, 3, 4, 5}
    assert found[2] == f"schema version {UNKNOWN} is not in the Glue schema registry"
    assert found[3] == "not Glue wire format: header version byte 0x7b, expected 0x03"
    assert "JSON" in found[4]
    assert found[5] == f"schema version {avro_version} is a AVRO schema, not JSON"
    assert edge.requests == 3
    # The reference lane agrees, and a Glue outage is raised there too.
    assert deserializer.document(messages(payloads), 1) == {"id": "b", "n": 2, "color": "red"}
    for position in found:
        with pytest.raises(MessageError) as caught:
            deserializer.document(messages(payloads), position)
        assert caught.value.reason == found[position]


def test_a_batch_holds_a_bounded_number_of_inflated_bytes_in_either_lane(
    glue: GlueSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: each payload's inflated size was capped, the batch's not (200 zlib bombs of 64 KB each held
    12.8 GiB inflated); what is left over takes the per-message lane, one payload at a time, with the same rows."""
    avro_version = glue.register("events", V1)
    json_version = glue.register("json-events", {"type": "object"}, "JSON")
    monkeypatch.setattr(framing, "GLUE_INFLATED_BATCH_BYTES", 50)
    monkeypatch.setattr(avro_format, "COLUMN_LANE_MIN_MESSAGES", 1)  # six messages take the column lane too
    monkeypatch.setattr(json_format, "GZIP_ROUND_BYTES", 30)
    rows = [{"id": f"{n:020d}", "n": n} for n in range(6)]
    avro = [glue_avro(avro_version, V1, row, zlib_compressed=True) for row in rows]
    laid = GlueFraming(registry()).lay_out(avro)
    assert (laid.schemas >= 0).tolist() == [True, True, False, False, False, False]  # 22 inflated bytes each
    json_payloads = [glue_frame(json_version, json.dumps(row).encode(), zlib_compressed=True) for row in rows]
    for format, payloads in ((FormatConfig(type="avro"), avro), (FormatConfig(type="json"), json_payloads)):
        deserializer = build_deserializer(format, registry(), "events")
        decoded = deserializer.decode(messages(payloads), range(len(payloads)))
        by_position = dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))
        by_position.update(decoded.documents)
        assert by_position == dict(enumerate(rows)) and decoded.failures == [], format.type
        if isinstance(deserializer, JsonDeserializer):
            assert deserializer.reads == len(rows)  # a round per payload: each is past 30 bytes


# --- configuration -------------------------------------------------------------------------------

MINIMAL = """
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topic = "events"
[table]
uri = "/tmp/events"
"""


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(MINIMAL + text)
    return path


def test_glue_config_loads_and_opens_the_glue_edge(tmp_path: Path) -> None:
    text = '[format]\ntype = "avro"\n[schema_registry]\ntype = "glue"\nregion = "eu-west-1"\n'
    config = load_config(config_file(tmp_path, text), environ={})
    assert config.schema_registry.type == "glue" and config.schema_registry.enabled
    assert "schema registry glue (eu-west-1)" in "\n".join(config.summary())
    assert isinstance(open_registry(config), GlueRegistry)
    environ = {"K2D_SCHEMA_REGISTRY__TYPE": "glue", "K2D_SCHEMA_REGISTRY__ENDPOINT_URL": "http://127.0.0.1:5000"}
    config = load_config(config_file(tmp_path, '[format]\ntype = "avro"\n'), environ=environ)
    assert config.schema_registry.endpoint_url == "http://127.0.0.1:5000"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('[format]\ntype = "avro"\n[schema_registry]\ntype = "glue"\nurl = "http://r:8081"\n', "schema_registry.url", "boto3"),
        ('[format]\ntype = "protobuf"\n', "format.type", "schema_registry.url, or type = 'glue'"),
        ('[format]\ntype = "raw"\n[schema_registry]\ntype = "glue"\n', "schema_registry.type", "avro, protobuf and json values"),
        ('[format]\ntype = "json"\ngzip = true\n[schema_registry]\ntype = "glue"\n', "format.gzip", "zlib"),
        ('[format]\ntype = "avro"\n[schema_registry]\ntype = "glue"\nendpoint_url = "glue:1"\n', "schema_registry.endpoint_url", "http"),
        ('[format]\ntype = "avro"\n[schema_registry]\nurl = "http://r:8081"\nregion = "eu-west-1"\n', "schema_registry.region", "'glue'"),
        ('[format]\ntype = "avro"\n[schema_registry]\ntype = "azure"\n', "schema_registry.type", "one of"),
    ],
)  # fmt: skip
def test_glue_config_errors_name_the_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path, text), environ={})
    assert caught.value.key == key and words in caught.value.problem


def test_without_boto3_glue_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name == "botocore" or name.startswith(("botocore.", "boto3"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "botocore", None)  # import botocore → ImportError
    with pytest.raises(ConfigError) as caught:
        GlueRegistry(SchemaRegistryConfig(type="glue", region=REGION))
    assert caught.value.key == "schema_registry.type" and "kafka2delta[glue]" in caught.value.problem


def test_glue_without_a_region_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-such-file"))
    with pytest.raises(ConfigError) as caught:
        GlueRegistry(SchemaRegistryConfig(type="glue"))
    assert caught.value.key == "schema_registry.region"
