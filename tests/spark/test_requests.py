"""Pure parts of the jobs: request parsing and grouping, Spark session settings, config checks."""

from __future__ import annotations

import dataclasses
import fcntl
from pathlib import Path

import pytest

from kafka2delta.config import SparkConfig, load_config
from kafka2delta.errors import ConfigError
from kafka2delta.spark.errors import ConflictingCommit, SparkJobError, translate
from kafka2delta.spark.mutations import group_requests, parse_mutation, parse_subject
from kafka2delta.spark.session import maven_packages, parse_conf, resolving_alone, session_conf

SCHEMA = {"id": "string", "lead_id": "string", "contact_id": "string", "n": "bigint", "meta": "struct<a:int>"}


def test_parse_mutation_requests() -> None:
    update = parse_mutation(b'{"op":"update","match":{"lead_id":"L1"},"set":{"contact_id":"C9"}}', SCHEMA, "t[0]@1")
    assert (update.op, update.match, update.set) == ("update", (("lead_id", "L1"),), (("contact_id", "C9"),))
    delete = parse_mutation(b'{"op":"delete","match":{"n":3,"lead_id":"L2"}}', SCHEMA, "t[0]@2")
    assert delete.match == (("lead_id", "L2"), ("n", 3))
    cleared = parse_mutation(b'{"op":"update","match":{"lead_id":"L1"},"set":{"contact_id":null}}', SCHEMA, "w")
    assert cleared.set == (("contact_id", None),)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "empty"),
        (b"{", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"op":"merge","match":{"lead_id":"L1"}}', "'op' must be"),
        (b'{"op":"delete","match":{}}', "non-empty"),
        (b'{"op":"delete","match":{"nope":1}}', "not a top-level column"),
        (b'{"op":"delete","match":{"meta":1}}', "scalars only"),
        (b'{"op":"delete","match":{"lead_id":null}}', "not null"),
        (b'{"op":"update","match":{"lead_id":"L1"}}', "'set' must be"),
        (b'{"op":"delete","match":{"lead_id":"L1"},"set":{"n":1}}', "has no 'set'"),
        (b'{"op":"delete","match":{"lead_id":"L1"},"x":1}', "unknown keys"),
    ],
)
def test_invalid_mutation_requests(payload: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_mutation(payload, SCHEMA, "t[0]@0")


def test_a_null_set_on_a_not_null_column_is_invalid() -> None:
    payload = b'{"op":"update","match":{"lead_id":"L1"},"set":{"id":null}}'
    assert parse_mutation(payload, SCHEMA, "t[0]@0").set == (("id", None),)
    with pytest.raises(ValueError, match="NOT NULL"):
        parse_mutation(payload, SCHEMA, "t[0]@0", frozenset({"id"}))


def test_keys_equal_once_cast_are_never_in_one_group() -> None:
    """``1`` and ``"01"`` of a bigint column match the same rows: one MERGE with both would fail (several source
    rows for one target row), so the canonical keys (check_values) decide."""
    one = parse_mutation(b'{"op":"update","match":{"n":1},"set":{"contact_id":"A"}}', SCHEMA, "t[0]@0")
    quoted = parse_mutation(b'{"op":"update","match":{"n":"01"},"set":{"contact_id":"B"}}', SCHEMA, "t[0]@1")
    assert len(group_requests([one, quoted])) == 1  # as written they differ
    canonical = [dataclasses.replace(r, canonical=("1",)) for r in (one, quoted)]
    assert [[r.where for r in g] for g in group_requests(canonical)] == [["t[0]@0"], ["t[0]@1"]]


def test_parse_subject() -> None:
    assert parse_subject(b'{"subject_id":"U1"}') == "U1"
    assert parse_subject(b'{"subject_id":42}') == "42"
    for bad in (b"", b'{"subject":"U1"}', b'{"subject_id":null}', b'{"subject_id":""}'):
        with pytest.raises(ValueError):
            parse_subject(bad)


def _update(lead: str, contact: str) -> bytes:
    return f'{{"op":"update","match":{{"lead_id":"{lead}"}},"set":{{"contact_id":"{contact}"}}}}'.encode()


def test_groups_are_equivalent_to_one_by_one() -> None:
    requests = [
        parse_mutation(p, SCHEMA, f"t[0]@{i}")
        for i, p in enumerate(
            [
                _update("L1", "C1"),
                _update("L2", "C2"),
                _update("L1", "C3"),  # same key again: a new group (applied after the first)
                b'{"op":"delete","match":{"lead_id":"L3"}}',  # another shape: a new group
                b'{"op":"delete","match":{"lead_id":"L4"}}',
                b'{"op":"update","match":{"lead_id":"L5"},"set":{"lead_id":"L6"}}',  # sets its match column
                b'{"op":"update","match":{"lead_id":"L6"},"set":{"lead_id":"L7"}}',  # chained: never grouped
            ]
        )
    ]
    groups = group_requests(requests)
    assert [[r.where for r in g] for g in groups] == [
        ["t[0]@0", "t[0]@1"],
        ["t[0]@2", "t[0]@3", "t[0]@4"],  # L1 again starts a group; deletes of other keys mix in
        ["t[0]@5"],
        ["t[0]@6"],
    ]
    other_columns = parse_mutation(b'{"op":"update","match":{"lead_id":"L9"},"set":{"n":1}}', SCHEMA, "x")
    by_n = parse_mutation(b'{"op":"delete","match":{"n":1}}', SCHEMA, "y")
    assert len(group_requests([requests[0], other_columns, by_n])) == 3  # other set columns, other match columns


def test_session_conf_online_offline_and_overrides(tmp_path: object) -> None:
    online = session_conf(SparkConfig(conf={"spark.x": "1"}), {"spark.x": "2"}, submitted=False)
    assert online["spark.jars.packages"].split(",") == maven_packages()
    assert maven_packages()[0] == "io.delta:delta-spark_2.13:4.0.0"
    assert maven_packages()[1] == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    assert online["spark.x"] == "2" and "spark.jars" not in online
    with pytest.raises(ConfigError, match=r"spark\.jars"):
        session_conf(SparkConfig(jars=("/nope/delta.jar",)), {}, submitted=False)
    jar = __import__("pathlib").Path(str(tmp_path)) / "delta.jar"
    jar.write_bytes(b"")
    offline = session_conf(SparkConfig(jars=(str(jar),)), {}, submitted=False)
    assert offline["spark.jars"] == str(jar) and "spark.jars.packages" not in offline
    globbed = session_conf(SparkConfig(jars=(str(jar.parent / "*"),)), {}, submitted=False)
    assert globbed["spark.jars"] == str(jar)  # the container's K2D_SPARK__JARS=/opt/kafka2delta/jars/*
    assert session_conf(SparkConfig(jars=(str(jar.parent),)), {}, submitted=False)["spark.jars"] == str(jar)
    with pytest.raises(ConfigError, match=r"spark\.jars"):
        session_conf(SparkConfig(jars=(str(jar.parent / "*.nothing"),)), {}, submitted=False)
    local = session_conf(SparkConfig(), {}, submitted=False, master="local[*]")
    assert local["spark.sql.shuffle.partitions"] == str(min(16, 2 * (__import__("os").cpu_count() or 2)))
    assert "spark.sql.shuffle.partitions" not in session_conf(SparkConfig(), {}, submitted=False, master="yarn")
    submitted = session_conf(SparkConfig(), {}, submitted=True)
    assert "spark.jars.packages" not in submitted
    assert submitted["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert parse_conf(["a=b", "c=d=e"]) == {"a": "b", "c": "d=e"}
    with pytest.raises(ConfigError, match="--conf"):
        parse_conf(["novalue"])


def test_a_session_that_fetches_packages_starts_alone(tmp_path: Path) -> None:
    """Two sessions fetching jars into one Ivy directory take turns: the second waits for the first's lock."""
    ivy = tmp_path / "ivy"
    online = {"spark.jars.packages": ",".join(maven_packages()), "spark.jars.ivy": str(ivy)}
    with resolving_alone(online), open(ivy / ".kafka2delta-resolve.lock") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(ivy / ".kafka2delta-resolve.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released once the session started
    offline = tmp_path / "offline-ivy"
    with resolving_alone({"spark.jars": "/opt/jars/delta.jar", "spark.jars.ivy": str(offline)}):
        assert not offline.exists()  # nothing fetched, nothing locked


def test_spark_errors_are_translated() -> None:
    appended = RuntimeError("io.delta.exceptions.ConcurrentAppendException: Files were added\n\tat x")
    conflict = translate(appended, "s", "/lake/t")
    assert isinstance(conflict, ConflictingCommit) and "ConcurrentAppendException" in str(conflict)
    assert isinstance(translate(RuntimeError("boom"), "s", "/lake/t"), SparkJobError)


BASE = {"K2D_KAFKA__BOOTSTRAP_SERVERS": "x:1", "K2D_KAFKA__TOPIC": "t", "K2D_TABLE__URI": "/tmp/t"}


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"K2D_COORDINATOR__BACKEND": "file"}, "coordinator.lock_dir"),
        ({"K2D_COORDINATOR__BACKEND": "zk"}, "coordinator.backend"),
        ({"K2D_COORDINATOR__LOCK_TIMEOUT_S": "0"}, "coordinator.lock_timeout_s"),
        ({"K2D_COORDINATOR__ORDER": "a,b,a"}, "coordinator.order"),
        ({"K2D_COORDINATOR__RESOURCE": "a/b"}, "coordinator.resource"),
        ({"K2D_JOBS__RETENTION_DAYS": "30"}, "jobs.retention_column"),
        ({"K2D_JOBS__MAX_REQUESTS_PER_BATCH": "-1"}, "jobs.max_requests_per_batch"),
        ({"K2D_SPARK__LOG_LEVEL": "LOUD"}, "spark.log_level"),
    ],
)
def test_config_errors_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {**BASE, **env})
    assert key in str(info.value)


def test_spark_conf_from_environment_and_masking() -> None:
    config = load_config(None, {**BASE, "K2D_SPARK__CONF__spark.hadoop.fs.s3a.secret.key": "hunter22"})
    assert config.spark.conf == {"spark.hadoop.fs.s3a.secret.key": "hunter22"}
    assert "hunter22" in config.secret_values()
    assert config.masked()["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == "***"
