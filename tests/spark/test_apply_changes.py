"""``jobs apply-changes`` on changelog tables written with deltalake as the daemon writes them (no broker): the
target is each key's last change (hard and soft deletes); a replayed micro-batch, a late change and a duplicate
change leave it as it is and are counted; its MERGEs write deletion vectors; the changelog's new columns reach it;
the job refuses targets it must not write and sources that are no changelog; ``maintain optimize
--purge-deletion-vectors`` leaves no deletion vector; and the CLI runs it end to end."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql.types import LongType, MapType, StringType, StructField, StructType

from kafka2delta.changes import UNAVAILABLE_VALUE
from kafka2delta.changes.collapse import placeholders_of
from kafka2delta.cli import _parser
from kafka2delta.config import Config, load_config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.errors import ConfigError
from kafka2delta.spark import commands
from kafka2delta.spark.apply_changes import (
    ApplyChangesJob,
    ApplyOptions,
    apply_batch,
    missing_columns,
    resolve_options,
    sql_type,
)
from kafka2delta.spark.change_merge import merge_clauses, newer_condition
from kafka2delta.spark.errors import CheckpointMismatch, SourceSchemaChanged, TableNotWritable, translate
from kafka2delta.spark.report import Report
from kafka2delta.spark.tables import check_writable, table_stats

BEFORE = pa.struct([("id", pa.int64()), ("name", pa.string()), ("n", pa.int64())])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("_op", pa.string()),
        pa.field("_source_ts", pa.timestamp("us", tz="UTC")),
        pa.field("_lsn", pa.int64()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("_before", BEFORE),
    ]
)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Changelog:
    """A changelog table as the daemon appends it: one file per append, offsets counted per Kafka partition,
    source positions (``_lsn``) increasing unless a change names its own."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.offsets: dict[int, int] = defaultdict(int)
        self.lsn = 1000

    def row(self, op: str, key: int, name: str | None = None, n: int | None = None, **extra: Any) -> dict[str, Any]:
        partition = extra.pop("partition", 0)
        self.lsn += 10
        lsn = extra.pop("lsn", self.lsn)
        offset = self.offsets[partition]
        self.offsets[partition] += 1
        return {
            "id": key,
            "name": None if op == "d" else name,
            "n": None if op == "d" else n,
            "_op": op,
            "_source_ts": T0 + dt.timedelta(seconds=lsn),
            "_lsn": lsn,
            "kafka_partition": partition,
            "kafka_offset": offset,
            "_before": None if op in ("c", "r") else {"id": key, "name": "?", "n": None},
            **extra,
        }

    def append(self, *rows: dict[str, Any], schema: pa.Schema = SCHEMA) -> list[dict[str, Any]]:
        table = pa.Table.from_pylist(list(rows), schema)
        if schema == SCHEMA:
            write_deltalake(self.uri, table, mode="append")
        else:  # the daemon's schema evolution
            write_deltalake(self.uri, table, mode="append", schema_mode="merge")
        return list(rows)


def current(rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The target's row of a key whose last change is the last of ``rows`` (``_before`` is not kept)."""
    return {**{k: v for k, v in rows[-1].items() if k != "_before"}, **extra}


def _config(tmp_path: Path, source: str, **env: str) -> Config:
    return load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "events",
            "K2D_FORMAT__KEY": "json",
            "K2D_TABLE__URI": source,
            "K2D_TABLE__MODE": "changelog",
            "K2D_TABLE__KEY": "id",
            "K2D_JOBS__CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            **{f"K2D_{key.upper()}": value for key, value in env.items()},
        },
    )


def _run(spark: Any, config: Config, options: ApplyOptions) -> Report:
    report = ApplyChangesJob(spark, config, options, Coordinator(NoBackend(), "t")).run(available_now=True)
    print(f"\n{report.text()}")
    return report


def _state(spark: Any, uri: str) -> dict[int, dict[str, Any]]:
    """The target's rows by key, every column (Spark: deltalake 1.6 cannot read deletion vectors)."""
    return {r["id"]: r for r in spark.read.format("delta").load(uri).toArrow().to_pylist()}


def _figures(report: Report, *names: str) -> dict[str, Any]:
    return {name: report.details[name] for name in names}


COUNTS = ("batches", "changes", "collapsed", "inserted", "updated", "deleted", "ignored", "replayed_batches_skipped")


def test_the_position_guard_the_clauses_and_a_schema_change_under_the_query() -> None:
    assert newer_condition(False) == (
        "(coalesce(s.`kafka_partition`, -1) > coalesce(t.`kafka_partition`, -1) OR "
        "(coalesce(s.`kafka_partition`, -1) = coalesce(t.`kafka_partition`, -1) AND "
        "coalesce(s.`kafka_offset`, -1) > coalesce(t.`kafka_offset`, -1)))"
    )
    assert newer_condition(True).startswith("(coalesce(s.`_lsn`, -1) > coalesce(t.`_lsn`, -1) OR ")
    hard = merge_clauses(["id"], ["id", "name", "_op", "kafka_offset"], has_lsn=False, soft=False)
    assert [(c.kind, c.condition.split(" AND ")[0]) for c in hard] == [
        ("delete", "s.`__k2d_delete`"),
        ("update", "NOT s.`__k2d_delete`"),
        ("insert", "NOT s.`__k2d_delete`"),
    ]
    soft = merge_clauses(["id"], ["id", "name", "_op", "kafka_offset"], has_lsn=False, soft=True)
    # A soft delete with no upsert of its key in the batch keeps the data and moves the position; its marker for an
    # unknown key holds no data (tests/unit/test_apply_changes.py: the clauses of one after an upsert).
    assert soft[1].assignments == {"_op": "s.`_op`", "kafka_offset": "s.`kafka_offset`", "_deleted": "true"}
    assert soft[4].kind == "insert" and "name" not in soft[4].assignments and soft[4].assignments["_deleted"] == "true"
    # The changelog's new columns, nested ones too, as ALTER TABLE ADD COLUMNS takes them.
    x = StructField("x", LongType())
    old = StructType([StructField("id", LongType()), StructField("a", StructType([x]))])
    new = StructType(
        [
            StructField("id", LongType()),
            StructField("a", StructType([x, StructField("y b", StringType())])),
            StructField("m", MapType(StringType(), old)),
        ]
    )
    assert [(name, sql_type(kind)) for name, kind in missing_columns(new, old)] == [
        ("`a`.`y b`", "string"),
        ("`m`", "map<string,struct<`id`:bigint,`a`:struct<`x`:bigint>>>"),
    ]
    # Delta's streaming source asks for a restart when the changelog's schema changes under a running query:
    # that fails the turn (retried), not the job.
    changed = Exception("[DELTA_SCHEMA_CHANGED_WITH_VERSION] Detected schema change in version 7")
    error = translate(changed, "jobs x", "/lake/changelog")
    assert isinstance(error, SourceSchemaChanged) and isinstance(error, ApplyChangesJob.retryable)


def test_options_come_from_the_route_writing_the_source(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    config = _config(
        tmp_path,
        str(lake / "{topic}"),
        KAFKA__TOPIC="",
        KAFKA__TOPICS="orders,users",
        ROUTES=json.dumps([{"topic": "users", "uri": str(lake / "people"), "key": ["user_id"], "delete_mode": "soft"}]),
    )
    options = resolve_options(config, source=f"{lake}/orders/", target=str(tmp_path / "current" / "orders"))
    assert (options.key, options.delete_mode) == (("id",), "hard")
    options = resolve_options(config, source=str(lake / "people"), target=str(tmp_path / "people"))
    assert (options.key, options.delete_mode) == (("user_id",), "soft")
    # Routes without a URI of their own take [table]'s template, for their own topic or pattern only.
    templated = _config(
        tmp_path,
        str(lake / "{topic}"),
        KAFKA__TOPIC="",
        KAFKA__TOPICS="orders,lines,users",
        ROUTES=json.dumps([{"topic": "orders", "key": ["id"]}, {"topic_pattern": "^lin", "key": ["order_id", "line"]}]),
    )
    options = resolve_options(templated, source=str(lake / "lines"), target=str(tmp_path / "current" / "lines"))
    assert options.key == ("order_id", "line")
    options = resolve_options(templated, source=str(lake / "users"), target=str(tmp_path / "current" / "users"))
    assert options.key == ("id",)  # [table]'s
    with pytest.raises(ConfigError, match="--key"):
        resolve_options(config, source=str(tmp_path / "elsewhere"), target=str(tmp_path / "t"))
    assert resolve_options(config, source=str(tmp_path / "elsewhere"), target=str(tmp_path / "t"), key=["k"]).key == (
        "k",
    )
    for source, target, flag in (
        (None, "t", "--source"),
        ("s", None, "--target"),
        (str(lake / "orders"), f"{lake}/orders/", "--target"),  # the source itself
        (str(lake / "orders"), str(lake / "users"), "--target"),  # a table the daemon writes ({topic})
        (str(lake / "orders"), str(lake / "_dead_letters"), "--target"),
    ):
        with pytest.raises(ConfigError, match=flag) as info:
            resolve_options(config, source=source, target=target)
        print(info.value)


def test_hard_deletes_replays_late_and_duplicate_changes_and_new_columns(spark: Any, tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "changelog"))
    target = str(tmp_path / "current")
    config = _config(tmp_path, log.uri)
    options = resolve_options(config, source=log.uri, target=target, max_files_per_trigger=1)
    # Rows are made in the order of their changes (row() counts offsets and source positions).
    c4 = log.append(*(log.row("c", key, name) for key, name in ((1, "a"), (2, "b"), (3, "c"), (4, "d"))))[-1]
    u1, u1b, c5 = log.row("u", 1, "a2"), log.row("u", 1, "a3", 7), log.row("c", 5, "e")
    # Key 1 changes twice, key 3 is updated then deleted, 99 is a key never there.
    log.append(u1, u1b, log.row("d", 2), log.row("u", 3, "c2"), log.row("d", 3), c5, log.row("d", 99))

    report = _run(spark, config, options)
    expected = {1: current([u1, u1b]), 4: current([c4]), 5: current([c5])}
    assert _state(spark, target) == expected
    assert _figures(report, *COUNTS) == {
        "batches": 2,
        "changes": 11,
        "collapsed": 2,  # key 1's first update, key 3's update
        "inserted": 5,
        "updated": 1,
        "deleted": 2,
        "ignored": 1,  # the delete of a key the target does not hold
        "replayed_batches_skipped": 0,
    }
    assert report.rows_changed == 8 and report.rows_after == 3
    properties = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{target}`").collect()}
    assert properties["delta.enableDeletionVectors"] == "true" and properties["kafka2delta.sparkOnly"] == "true"
    schema = spark.read.format("delta").load(target).schema
    assert [f.name for f in schema.fields if not f.nullable] == ["id"] and "_before" not in schema.fieldNames()

    # Spark runs the last micro-batch again (a crash after its MERGE): its txn version is in the table.
    version = DeltaTable(target).version()
    checkpoint = tmp_path / "checkpoints" / "apply-changes"
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    replay = _run(spark, config, options)
    assert _figures(replay, "batches", "replayed_batches_skipped", "inserted", "updated", "deleted") == {
        "batches": 1,
        "replayed_batches_skipped": 1,
        "inserted": 0,
        "updated": 0,
        "deleted": 0,
    }
    assert DeltaTable(target).version() == version and _state(spark, target) == expected

    # A late change (a smaller source position than the row's, appended later), a duplicate change, and a
    # column the changelog gained (the daemon's schema evolution): the target gets it before the MERGE.
    wider = SCHEMA.append(pa.field("email", pa.string()))
    late = log.row("u", 1, "old", lsn=u1b["_lsn"] - 5)
    u4 = log.row("u", 4, "d2", 4, email="d@example.com")
    log.append({**late, "email": None}, {**c5, "email": None}, u4, schema=wider)
    evolved = _run(spark, config, options)
    assert _figures(evolved, "batches", "changes", "collapsed", "ignored", "inserted", "updated", "deleted") == {
        "batches": 1,
        "changes": 3,
        "collapsed": 0,
        "ignored": 2,  # the late change and the duplicate
        "inserted": 0,
        "updated": 1,
        "deleted": 0,
    }
    expected = {key: {**row, "email": None} for key, row in expected.items()}
    expected[4] = current([u4])
    assert _state(spark, target) == expected

    # No polling query when the changelog has nothing new: the checkpoint says where it is.
    job = ApplyChangesJob(spark, config, options, Coordinator(NoBackend(), "t"))
    assert not job.pending_work()
    # A new checkpoint would restart batch ids at 0 below the table's txn version; a checkpoint with applied
    # batches and no target would make a target without the earlier changes. Both refused.
    shutil.move(checkpoint, tmp_path / "old-checkpoint")
    log.append({**log.row("u", 5, "e2"), "email": None}, schema=wider)
    with pytest.raises(ConfigError, match=r"jobs\.checkpoint_dir.*new \(no batch yet\)"):
        _run(spark, config, options)
    shutil.move(tmp_path / "old-checkpoint", checkpoint)
    # A micro-batch older than the table's txn version is another checkpoint's: raised, never skipped.
    with pytest.raises(CheckpointMismatch, match=r"batch 1 .*events-apply-changes, but .* already has version 2"):
        apply_batch(spark, spark.createDataFrame([], "id bigint"), 1, options, job.txn_app_id)
    shutil.rmtree(target)
    with pytest.raises(ConfigError, match=r"jobs\.checkpoint_dir.*does not exist"):
        _run(spark, config, options)


def test_soft_deletes_keep_a_marker_that_late_changes_cannot_resurrect(spark: Any, tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "changelog"))
    target = str(tmp_path / "current")
    config = _config(tmp_path, log.uri, TABLE__DELETE_MODE="soft")
    options = resolve_options(config, source=log.uri, target=target, max_files_per_trigger=1)
    assert options.delete_mode == "soft"
    _, c2, d3 = log.append(log.row("c", 1, "a", 1), log.row("c", 2, "b", 2), log.row("d", 3))
    # A late change from before the delete of 3 (a smaller source position), on another Kafka partition.
    d1, u2, _ = log.append(
        log.row("d", 1), log.row("u", 2, "b2", 3), log.row("c", 3, "zombie", lsn=d3["_lsn"] - 1, partition=1)
    )

    report = _run(spark, config, options)
    assert _state(spark, target) == {
        1: current([d1], name="a", n=1, _deleted=True),  # the data of its last upsert, the delete's position
        2: current([c2, u2], _deleted=False),
        3: current([d3], _deleted=True),  # a marker: the key, the delete's position, no data
    }
    assert _figures(report, "batches", "changes", "inserted", "updated", "deleted", "ignored") == {
        "batches": 2,
        "changes": 6,
        "inserted": 3,  # 1, 2, and the marker of 3
        "updated": 2,  # the soft delete of 1, the update of 2
        "deleted": 0,
        "ignored": 1,  # the zombie
    }


def _commit(uri: str, version: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


def test_deletion_vectors_purge_and_the_cli(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = Changelog(str(tmp_path / "changelog"))
    target = str(tmp_path / "current")
    for part in range(3):
        log.append(*(log.row("r", key, f"k{key}", key) for key in range(part * 1000, part * 1000 + 1000)))
    config_path = tmp_path / "config.toml"
    config_path.write_text(
        "\n".join(
            [
                "[kafka]",
                'bootstrap_servers = "127.0.0.1:1"',
                'topic = "events"',
                "[format]",
                'key = "json"',
                "[table]",
                f"uri = {json.dumps(log.uri)}",
                'mode = "changelog"',
                'key = ["id"]',
                "[jobs]",
                f"checkpoint_dir = {json.dumps(str(tmp_path / 'checkpoints'))}",
            ]
        )
    )

    def main(*argv: str) -> int:
        """The CLI in-process (``kafka2delta.cli.main`` without its logging setup, as tests/spark/test_cli.py)."""
        return commands.run(_parser().parse_args([*argv, "-c", str(config_path)]), load_config(config_path, {}))

    argv = ["jobs", "apply-changes", "--source", log.uri, "--target", target, "--available-now"]
    assert main(*argv) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert printed.startswith(f"apply-changes {target}: ok in ") and " inserted=3000 " in printed
    files = table_stats(target).files

    # ~1% of the keys change: 20 updates and 10 deletes, spread over the target's files.
    changed = [log.row("u", key, f"new{key}", -key) for key in range(5, 3000, 150)]
    deleted = [log.row("d", key) for key in range(80, 3000, 300)]
    log.append(*changed, *deleted)
    assert main(*argv, "--json") == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["details"]["updated"], report["details"]["deleted"]) == (20, 10)
    assert report["details"]["deletion_vectors_added"] >= 1 and report["details"]["files_removed"] == 0
    actions = _commit(target, DeltaTable(target).version())
    assert next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a) == "MERGE"
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    vectors = {
        a["add"]["path"]: a["add"]["deletionVector"] for a in actions if "add" in a and a["add"].get("deletionVector")
    }
    new_files = [a["add"] for a in actions if "add" in a and not a["add"].get("deletionVector")]
    # Every file the MERGE touched got a deletion vector instead of being rewritten: the same path removed and
    # added back with its vector; the new files hold only the 20 updated rows.
    assert removed and removed == set(vectors) and len(removed) <= files
    assert sum(v["cardinality"] for v in vectors.values()) == 30
    assert sum(json.loads(f["stats"])["numRecords"] for f in new_files) == 20
    rows = _state(spark, target)
    assert len(rows) == 2990 and rows[5]["name"] == "new5" and 80 not in rows
    assert table_stats(target).rows == 2990  # numRecords less the vectors' deleted rows

    # The daemon-safe jobs refuse the Spark-only target; maintain works on it.
    with pytest.raises(TableNotWritable, match="Spark-only"):
        check_writable(target)
    check_writable(target, spark_only_ok=True)
    assert main("maintain", "optimize", "--table", target, "--purge-deletion-vectors") == 0
    printed = capsys.readouterr().out
    print(printed)
    assert "purge=REORG APPLY (PURGE)" in printed and "deletion_vectors_removed=" in printed
    assert pa.table(DeltaTable(target).deletion_vectors()).num_rows == 0
    assert table_stats(target).deletion_vectors == 0
    assert _state(spark, target) == rows
    assert main("maintain", "vacuum", "--table", target, "--retain-hours", "1", "--dry-run") == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"vacuum {target}: ok")
    # Not on a table the daemon writes (the changelog): it never has deletion vectors.
    with pytest.raises(ConfigError, match="--purge-deletion-vectors: only for Spark-only tables"):
        main("maintain", "optimize", "--table", log.uri, "--purge-deletion-vectors")


def test_refuses_targets_of_other_writers_and_sources_that_are_no_changelog(spark: Any, tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "changelog"))
    log.append(log.row("c", 1, "a"))
    config = _config(tmp_path, log.uri)

    def run(source: str, target: str) -> None:
        options = resolve_options(config, source=source, target=target, key=["id"])
        ApplyChangesJob(spark, config, options, Coordinator(NoBackend(), "t")).run(available_now=True)

    daemons = str(tmp_path / "daemons")
    txn = CommitProperties(app_transactions=[Transaction("events-0", 41)])
    write_deltalake(daemons, pa.table({"id": [1], "kafka_partition": [0], "kafka_offset": [1]}), commit_properties=txn)
    with pytest.raises(TableNotWritable, match=r"other writers \(txn app ids events-0;") as info:
        run(log.uri, daemons)
    print(info.value)
    plain = str(tmp_path / "plain")
    write_deltalake(plain, pa.table({"id": [1], "kafka_partition": [0], "kafka_offset": [1]}))
    with pytest.raises(TableNotWritable, match="not a Spark-only table"):
        run(log.uri, plain)
    events = str(tmp_path / "events")
    write_deltalake(events, pa.table({"id": [1], "name": ["a"]}))
    with pytest.raises(ConfigError, match=r"--source: .* not a changelog table .* _op, kafka_partition, kafka_offset"):
        run(events, str(tmp_path / "target"))
    with pytest.raises(ConfigError, match="--source: no Delta table"):
        run(str(tmp_path / "nothing"), str(tmp_path / "target"))
    with pytest.raises(ConfigError, match="--target: is the --source"):
        run(log.uri, log.uri + "/")
    assert not (tmp_path / "target").exists()


# -- a micro-batch ends the way separate micro-batches would (docs/DESIGN.md invariant 13)

PLACEHOLDER = UNAVAILABLE_VALUE
TOAST_SCHEMA = SCHEMA.append(pa.field("blob", pa.binary())).append(pa.field("tags", pa.list_(pa.string())))
UNCHANGED: dict[str, Any] = {"name": PLACEHOLDER, "blob": PLACEHOLDER.encode(), "tags": [PLACEHOLDER]}
"""Debezium's unchanged-TOAST placeholder as each column type holds it (text, bytea, text[])."""


def _apply(spark: Any, config: Config, source: str, target: str, mode: str, name: str) -> Report:
    options = resolve_options(
        config, source=source, target=target, key=["id"], delete_mode=mode, max_files_per_trigger=1
    )
    job = ApplyChangesJob(spark, config, options, Coordinator(NoBackend(), target), job_name=name)
    report = job.run(available_now=True)
    print(f"\n{report.text()}")
    return report


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_one_micro_batch_ends_as_one_per_change_would(spark: Any, tmp_path: Path, mode: str) -> None:
    """The same changes applied as one micro-batch and as one micro-batch per change of a key: the same target.
    Debezium's unchanged-TOAST placeholders take the key's latest earlier value in the batch, else keep the row's;
    a soft delete after an upsert of the same batch keeps that upsert's values (found by review: the placeholder
    overwrote the values, and the soft delete lost the upsert, or kept an older one)."""
    one, each = Changelog(str(tmp_path / "one")), Changelog(str(tmp_path / "each"))
    row = one.row  # one sequence of positions for both changelogs
    setup = [
        row("c", 1, "a", 1, blob=b"A", tags=["x"]),
        row("c", 2, "b", 1, blob=b"B", tags=["y"]),
        row("c", 4, "d", 1, blob=b"D", tags=["z"]),
        row("c", 10, "y0", 1),
        row("c", 14, "real", 1, blob=b"R", tags=["r"]),
    ]
    rounds = [  # the k-th change of each key
        [
            row("u", 1, n=2, **UNCHANGED),  # all three unchanged: the row's values stay
            row("u", 2, "b2", 2, blob=b"B2", tags=[PLACEHOLDER]),
            row("u", 3, n=3, **UNCHANGED),  # a key the target lacks: null
            row("d", 4),
            row("u", 10, "y", 2),
            row("c", 11, "a", 1),
            row("c", 12, "a", 1),
            row("d", 13),
            row("u", 14, n=2, **UNCHANGED),
        ],
        [
            row("u", 2, n=3, **UNCHANGED),  # the batch's earlier b2/B2; the row's [y]
            row("c", 4, n=4, **UNCHANGED),  # after a hard delete: null; after a soft one, the row's values
            row("d", 10),  # the values of its update of this batch, not the row's older ones
            row("d", 11),  # a key new to the target: its create's values, marked
            row("d", 12),
            row("d", 14),  # its update's values: the row's, which the placeholders kept
        ],
        [row("c", 12, "b", 2)],
        [row("d", 12)],  # the last upsert before the last delete
    ]
    one.append(*setup, schema=TOAST_SCHEMA)
    one.append(*(change for changes in rounds for change in changes), schema=TOAST_SCHEMA)
    each.append(*setup, schema=TOAST_SCHEMA)
    for changes in rounds:
        each.append(*changes, schema=TOAST_SCHEMA)
    config = _config(tmp_path, one.uri)
    targets = {name: str(tmp_path / f"current-{name}") for name in ("one", "each")}
    reports = {
        name: _apply(spark, config, log.uri, targets[name], mode, f"apply-{name}")
        for name, log in (("one", one), ("each", each))
    }
    assert (reports["one"].details["batches"], reports["each"].details["batches"]) == (2, 1 + len(rounds))
    last = {r["id"]: r for changes in rounds for r in changes}

    def kept(key: int, **values: Any) -> dict[str, Any]:
        return current([last[key]], **values, **({"_deleted": False} if mode == "soft" else {}))

    expected = {
        1: kept(1, name="a", blob=b"A", tags=["x"]),
        2: kept(2, name="b2", blob=b"B2", tags=["y"]),
        3: kept(3, name=None, blob=None, tags=None),
        4: kept(4, name=None, blob=None, tags=None) if mode == "hard" else kept(4, name="d", blob=b"D", tags=["z"]),
    }
    if mode == "soft":
        marked = {"_deleted": True}
        expected |= {
            10: current([last[10]], name="y", n=2, blob=None, tags=None, **marked),
            11: current([last[11]], name="a", n=1, blob=None, tags=None, **marked),
            12: current([last[12]], name="b", n=2, blob=None, tags=None, **marked),
            13: current([last[13]], blob=None, tags=None, **marked),
            14: current([last[14]], name="real", n=2, blob=b"R", tags=["r"], **marked),
        }
    states = {name: _state(spark, target) for name, target in targets.items()}
    assert states["each"] == expected
    assert states["one"] == expected


TYPED_TOAST_SCHEMA = (
    SCHEMA.append(pa.field("ints", pa.list_(pa.int32())))
    .append(pa.field("longs", pa.list_(pa.int64())))
    .append(pa.field("days", pa.list_(pa.date32())))
    .append(pa.field("uuids", pa.list_(pa.string())))
    .append(pa.field("blobs", pa.list_(pa.binary())))
    .append(pa.field("hstore", pa.map_(pa.string(), pa.string())))
    .append(pa.field("hstore_json", pa.string()))
)


def test_every_form_of_the_toast_placeholder_keeps_the_targets_value(spark: Any, tmp_path: Path) -> None:
    """Found by review: Debezium writes its placeholder by the column's type (int[]/bigint[]/date[] as its bytes,
    uuid[] as a name-based UUID, bytea[], an hstore map or JSON text); each was written over the target's value.
    Applied across micro-batches (the target's value) and within one (the batch's earlier value)."""
    log = Changelog(str(tmp_path / "log"))
    columns = [f.name for f in TYPED_TOAST_SCHEMA][len(SCHEMA) :]
    # The last form of each type: uuid[]'s (not text[]'s), an hstore's as JSON (not text's).
    forms = {c: placeholders_of(TYPED_TOAST_SCHEMA.field(c).type)[-1] for c in columns}
    values: dict[str, Any] = {
        "ints": [1, 2],
        "longs": [3],
        "days": [dt.date(2026, 1, 2)],
        "uuids": ["0f8fad5b-d9cb-469f-a165-70867728950e"],
        "blobs": [b"b"],
        "hstore": [("k", "v")],
        "hstore_json": '{"k":"v"}',
    }
    log.append(log.row("c", 1, "a", 1, **values), log.row("c", 2, "b", 1, **values), schema=TYPED_TOAST_SCHEMA)
    config = _config(tmp_path, log.uri)
    target = str(tmp_path / "current")
    _apply(spark, config, log.uri, target, "hard", "apply-typed")
    # Key 1: unchanged everywhere in the next micro-batch; key 2: a new value, then unchanged in the same batch.
    changed = {**values, "ints": [9], "hstore": [("k", "w")], "hstore_json": '{"k":"w"}'}
    log.append(
        log.row("u", 1, "a", 2, **forms),
        log.row("u", 2, "b", 2, **changed),
        log.row("u", 2, "b", 3, **forms),
        schema=TYPED_TOAST_SCHEMA,
    )
    _apply(spark, config, log.uri, target, "hard", "apply-typed")
    state = _state(spark, target)
    for key, want in ((1, values), (2, changed)):
        got = {c: state[key][c] for c in columns}
        assert got == {**want, "hstore": sorted(want["hstore"])}, (key, got)


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_a_late_change_in_a_micro_batch_gives_no_values(spark: Any, tmp_path: Path, mode: str) -> None:
    """Found by review: the values a collapse takes from an earlier change of the batch (a TOAST placeholder's, a
    soft delete's) came from a late change older than the row too, moving the row's values back. As separate
    micro-batches would: a late change gives nothing, the row's values stay (late: below the row's _lsn 2000)."""
    log = Changelog(str(tmp_path / "changes"))
    row = log.row
    setup = [row("c", key, "B", 1, blob=b"B", tags=["b"], lsn=2000 + key) for key in (1, 2, 3)]
    late = [
        row("u", 1, "A", 9, blob=b"A", tags=["a"], lsn=1500),  # late, then a delete
        row("d", 1, lsn=3001),
        row("u", 2, "A", 9, blob=b"A", tags=["a"], lsn=1500),  # late, then the placeholder
        row("u", 2, n=2, lsn=3002, **UNCHANGED),
        row("d", 3, lsn=1500),  # a late delete, then the placeholder
        row("u", 3, n=2, lsn=3003, **UNCHANGED),
    ]
    log.append(*setup, schema=TOAST_SCHEMA)
    log.append(*late, schema=TOAST_SCHEMA)
    target = str(tmp_path / "current")
    report = _apply(spark, _config(tmp_path, log.uri), log.uri, target, mode, "apply-late")
    assert report.details["batches"] == 2
    state = _state(spark, target)
    kept = {"name": "B", "blob": b"B", "tags": ["b"]}
    assert {key: {c: state[key][c] for c in kept} for key in (2, 3)} == {2: kept, 3: kept}
    assert state[2]["n"] == state[3]["n"] == 2
    if mode == "soft":
        assert {c: state[1][c] for c in (*kept, "n", "_deleted")} == {**kept, "n": 1, "_deleted": True}
    else:
        assert 1 not in state


def test_an_empty_first_micro_batch_makes_the_target(spark: Any, tmp_path: Path) -> None:
    """A changelog whose first versions hold no rows (made from its schema, then the daemon's empty start commit):
    an empty micro-batch is recorded done in the checkpoint like any, so it makes the target, and the next run goes
    on from it (found by review: it made nothing, and every later run refused the checkpoint without a target)."""
    log = Changelog(str(tmp_path / "changelog"))
    write_deltalake(log.uri, SCHEMA.empty_table())
    start = CommitProperties(app_transactions=[Transaction("events-0", 0)])
    write_deltalake(log.uri, SCHEMA.empty_table(), mode="append", commit_properties=start)
    target = str(tmp_path / "current")
    config = _config(tmp_path, log.uri)
    options = resolve_options(config, source=log.uri, target=target)
    empty = apply_batch(spark, spark.read.format("delta").load(log.uri), 0, options, "events-apply-changes")
    assert empty.changes == 0 and DeltaTable(target).version() == 0  # made, and nothing else
    assert DeltaTable(target).transaction_version("events-apply-changes") is None
    shutil.rmtree(target)

    first = _run(spark, config, options)
    done = sorted(p.name for p in (tmp_path / "checkpoints" / "apply-changes" / "commits").glob("[0-9]*"))
    print(f"batches done by the first run: {done}")
    assert first.status == "ok" and DeltaTable(target).version() >= 0
    c1 = log.append(log.row("c", 1, "a"))[0]
    second = _run(spark, config, options)
    assert second.details["inserted"] == 1 and _state(spark, target) == {1: current([c1])}


def test_a_target_made_with_another_key_is_refused(spark: Any, tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "changelog"))
    log.append(log.row("c", 1, "a"), log.row("c", 2, "a"))
    config = _config(tmp_path, log.uri)
    target = str(tmp_path / "current")
    assert _run(spark, config, resolve_options(config, source=log.uri, target=target)).details["inserted"] == 2
    options = resolve_options(config, source=log.uri, target=target, key=["id", "name"])
    with pytest.raises(
        ConfigError, match=r"--key: .* was made with key id \(its NOT NULL columns\), not id,name"
    ) as info:
        _run(spark, config, options)
    print(info.value)


def test_a_changelog_mixing_topics_without_source_positions_is_refused(spark: Any, tmp_path: Path) -> None:
    """Without ``_lsn`` changes are ordered by Kafka partition and offset, unrelated across topics: here the older
    change (of topic b) has the greater offset and would win."""
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("_op", pa.string())]
    kafka = [
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
    ]
    changes = [
        {"id": 1, "name": "old", "_op": "c", "_lsn": 10, "kafka_topic": "b", "kafka_partition": 0, "kafka_offset": 9},
        {"id": 1, "name": "new", "_op": "u", "_lsn": 20, "kafka_topic": "a", "kafka_partition": 0, "kafka_offset": 5},
    ]
    plain, positioned = str(tmp_path / "plain"), str(tmp_path / "positioned")
    write_deltalake(plain, pa.Table.from_pylist(changes, pa.schema([*fields, *kafka])))
    write_deltalake(
        positioned, pa.Table.from_pylist(changes, pa.schema([*fields, pa.field("_lsn", pa.int64()), *kafka]))
    )
    config = _config(tmp_path, plain)
    target = str(tmp_path / "current")
    with pytest.raises(
        ConfigError, match=r"--source: batch 0 of .*plain holds the changes of 2 topics .*no such column"
    ) as info:
        _run(spark, config, resolve_options(config, source=plain, target=target))
    print(info.value)
    assert not Path(target).exists()
    # With the source's own position the two topics' changes are ordered by it.
    options = resolve_options(config, source=positioned, target=str(tmp_path / "ordered"), key=["id"])
    ApplyChangesJob(spark, config, options, Coordinator(NoBackend(), "t"), job_name="apply-ordered").run(
        available_now=True
    )
    assert _state(spark, str(tmp_path / "ordered"))[1]["name"] == "new"
