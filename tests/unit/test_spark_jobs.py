"""The parts of ``maintain`` and ``jobs`` that need no Spark session: where the jobs list a table's storage, how
Spark's errors are translated, vacuum's retention against the table's own, the retention delete's bound on a date
column, which tables ``maintain`` takes, the report of a job stopped after a failed turn, and the coordinator orders
that cannot cycle. A stand-in session records the SQL where a command would run it."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pa_fs
import pytest
from deltalake import write_deltalake
from pyspark.errors import PySparkException

from kafka2delta.config import Config, load_config
from kafka2delta.config.validation import check_coordinator_order, job_tables
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.errors import ConfigError
from kafka2delta.spark import commands, maintenance, maintenance_deltalake, tables
from kafka2delta.spark.errors import ConflictingCommit, SourceSchemaChanged, SparkJobError, translate
from kafka2delta.spark.jobs import StreamingJob, TurnJob, job_table, may_hold_rows_before
from kafka2delta.spark.maintenance import interval_hours, retention_check_off, vacuum
from kafka2delta.spark.mutations import retention_bound, retention_predicate
from kafka2delta.spark.report import Report
from kafka2delta.spark.session import spark_path
from kafka2delta.writer import table_filesystem
from tests.support.spark_turns import FlakyTurn


def _config(**env: str) -> Config:
    return load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "events",
            "K2D_TABLE__URI": "/lake/events",
            **{f"K2D_{key.upper()}": value for key, value in env.items()},
        },
    )


def _table(uri: str | Path, **columns: pa.Array) -> str:
    write_deltalake(str(uri), pa.table(columns or {"id": pa.array([1, 2])}))
    return str(uri)


class _Conf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def collect(self) -> list[Any]:
        return self._rows


class _Affected:
    def asDict(self) -> dict[str, int]:
        return {"num_affected_rows": 3}


class Session:
    """Records each SQL statement with the settings it ran under; ``fail`` makes ``sql`` raise it."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.conf = _Conf()
        self.statements: list[tuple[str, dict[str, str]]] = []
        self.fail = fail

    def newSession(self) -> Session:
        return self

    def sql(self, statement: str) -> _Rows:
        if self.fail is not None:
            raise self.fail
        self.statements.append((statement, dict(self.conf.values)))
        return _Rows([_Affected()] if statement.startswith("DELETE") else [])


# -- 1. the jobs list a table's storage with its storage options


def test_the_jobs_reach_storage_with_the_tables_storage_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _table(tmp_path / "lake" / "raw" / "events")  # s3://lake/raw/events, as a bucket's keys are named
    options = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_REGION": "eu-west-1"}
    calls: list[tuple[str, Mapping[str, str]]] = []

    def recording(uri: str, storage_options: Mapping[str, str]) -> tuple[pa_fs.FileSystem, str]:
        calls.append((uri, storage_options))
        return pa_fs.LocalFileSystem(), uri.removeprefix("s3://")

    monkeypatch.setattr(tables, "table_filesystem", recording)
    assert tables.expand("s3://lake/raw/*", options) == ["s3://lake/raw/events"]
    assert tables.data_files("s3://lake/raw/events", options, partition_columns=[])  # delta-rs is not the fake
    assert tables.logged_adds("s3://lake/raw/events", options)
    assert tables.txn_versions("s3://lake/raw/events", options) == {}
    assert calls and all(given == options for _, given in calls)
    # The daemon's own filesystem: the endpoint, keys and region, as deltalake reads them.
    monkeypatch.undo()
    filesystem, root = table_filesystem("s3://lake/raw/events", {**options, "AWS_SECRET_ACCESS_KEY": "s"})
    settings = filesystem.__reduce__()[1][0]
    assert root == "lake/raw/events"
    assert (settings["endpoint_override"], settings["scheme"], settings["access_key"], settings["region"]) == (
        "127.0.0.1:9000",
        "http",
        "AKIA",
        "eu-west-1",
    )


# -- 2 and 6. Spark's errors: a schema changed since analysis is retryable; every error names its table


def test_a_schema_changed_since_analysis_fails_the_turn_not_the_job() -> None:
    changed = PySparkException(
        "[DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS] The schema of your Delta table has changed in an incompatible way "
        "since your DataFrame or DeltaTable object was created."
    )
    error = translate(changed, "jobs mutate batch 3 group 0", "s3://AKIA:secret@lake/events")
    assert isinstance(error, SourceSchemaChanged) and isinstance(error, TurnJob.retryable)
    assert "jobs mutate batch 3 group 0 on s3://AKIA:***@lake/events" in str(error) and "secret" not in str(error)
    streaming = translate(Exception("[DELTA_SCHEMA_CHANGED_WITH_VERSION] Detected schema change"), "s", "/t")
    assert isinstance(streaming, SourceSchemaChanged)
    assert isinstance(translate(RuntimeError("boom"), "optimize", "/lake/t"), SparkJobError)
    assert "optimize on /lake/t failed" in str(translate(RuntimeError("boom"), "optimize", "/lake/t"))


def _job(error: Exception, failures: int = 1, stop: threading.Event | None = None) -> FlakyTurn:
    return FlakyTurn(Session(), _config(), error, failures=failures, stop=stop, target="s3://AKIA:secret@lake/events")


def test_a_jobs_spark_error_names_its_table() -> None:
    job = _job(PySparkException("[DELTA_CONCURRENT_APPEND] Files were added"))
    with pytest.raises(ConflictingCommit, match=r"jobs flaky on s3://AKIA:\*\*\*@lake/events: conflicting"):
        job.run_turn()


# -- 7. a job stopped right after a failed turn says so, and exits 1


def test_a_job_stopped_after_a_failed_turn_reports_failed() -> None:
    conflict = PySparkException("[DELTA_CONCURRENT_APPEND] Files were added")
    report = _job(conflict, failures=3).run(interval_s=0, max_turns=3)
    assert report.status == "failed" and "the last turn failed" in report.reason and "conflicting" in report.reason
    stop = threading.Event()
    stopped = _job(conflict, failures=1, stop=stop).run(interval_s=0, stop=stop)
    assert stopped.status == "failed" and stopped.details["conflicts"] == 1
    # A failed turn made up for by a later one is no failure.
    assert _job(conflict, failures=2).run(interval_s=0, max_turns=3).status == "ok"


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.mark.usefixtures("signal_handlers")
@pytest.mark.parametrize(("status", "code"), [("failed", 1), ("ok", 0), ("skipped", 0)])
def test_the_jobs_exit_code_follows_the_report(monkeypatch: pytest.MonkeyPatch, status: str, code: int) -> None:
    from kafka2delta.spark import jobs

    class Finished:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run(self, **kwargs: Any) -> Report:
            return Report("mutate", "/lake/t", status=status)

    monkeypatch.setattr(jobs, "StreamingJob", Finished)
    args = argparse.Namespace(action="mutate", available_now=False, max_turns=1, json=False)
    assert commands._job(args, _config(), Session(), Coordinator(NoBackend(), "t"), "mutate") == code  # type: ignore[arg-type]


# -- 3. vacuum keeps a table's own longer retention


@pytest.mark.parametrize(
    ("text", "hours"),
    [
        ("interval 1 week", 168),
        ("interval 30 days", 720),
        ("INTERVAL 2 Weeks", 336),
        ("1 day 12 hours", 36),
        ("interval 90 minutes", 1.5),
        ("1 day -2 hours", 22),
        ("interval 1.5 seconds", 1.5 / 3600),
        ("1.5 days", None),  # Spark takes a fraction for seconds only
        ("interval 1 month", None),  # Delta refuses months and years
        ("interval", None),
        ("30 dayz", None),
        ("-1 day", None),
    ],
)
def test_delta_interval_properties_are_read_as_delta_reads_them(text: str, hours: float | None) -> None:
    assert interval_hours(text) == (None if hours is None else pytest.approx(hours))


def test_vacuum_turns_deltas_check_off_only_below_the_default_week() -> None:
    assert retention_check_off("/t", 24, {}) is True
    assert retention_check_off("/t", 168, {}) is False
    assert retention_check_off("/t", 24, {"delta.deletedFileRetentionDuration": "interval 1 day"}) is False
    assert retention_check_off("/t", 720, {"delta.deletedFileRetentionDuration": "interval 30 days"}) is False
    # Not understood: the check stays on, and Delta applies the table's retention itself.
    assert retention_check_off("/t", 24, {"delta.deletedFileRetentionDuration": "interval 1 month"}) is False
    with pytest.raises(ConfigError) as refused:
        retention_check_off("s3://k:secret@lake/t", 168, {"delta.deletedFileRetentionDuration": "interval 30 days"})
    assert refused.value.key == "--retain-hours"
    message = str(refused.value)
    assert "s3://k:***@lake/t" in message and "delta.deletedFileRetentionDuration" in message and "720" in message


def test_vacuum_refuses_a_retention_below_the_tables_own(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    write_deltalake(
        uri,
        pa.table({"id": pa.array([1])}),
        configuration={"delta.deletedFileRetentionDuration": "interval 30 days"},
    )
    session = Session()
    with pytest.raises(ConfigError, match=r"--retain-hours: .*events keeps removed files for 'interval 30 days'"):
        vacuum(session, uri, retain_hours=168)  # type: ignore[arg-type]
    assert session.statements == []  # nothing ran
    vacuum(session, uri, retain_hours=720, dry_run=True)  # type: ignore[arg-type]
    assert session.statements[0][1] == {maintenance.RETENTION_CHECK_CONF: "true"}
    # A table on Delta's default week: below it, the check is off for the call only.
    default = _table(tmp_path / "plain")
    session = Session()
    vacuum(session, default, retain_hours=24, dry_run=True)  # type: ignore[arg-type]
    assert session.statements[0][1] == {maintenance.RETENTION_CHECK_CONF: "false"}
    assert session.conf.values == {}
    failing = Session(fail=PySparkException("boom"))
    with pytest.raises(SparkJobError, match=r"vacuum on .*plain failed"):
        vacuum(failing, default, retain_hours=200)  # type: ignore[arg-type]


# -- 4. the retention delete and its pre-check agree on a date column


def test_the_retention_of_a_date_column_keeps_the_cutoffs_day() -> None:
    cutoff = dt.datetime(2024, 5, 10, 13, 30, tzinfo=dt.UTC)
    bound = retention_bound("date", cutoff)
    assert bound == dt.date(2024, 5, 10)
    assert retention_predicate("day", "date", cutoff) == "`day` < DATE '2024-05-10'"
    assert retention_predicate("ts", "timestamp", cutoff) == "`ts` < CAST('2024-05-10 13:30:00.000000' AS TIMESTAMP)"
    assert retention_bound("timestamp", cutoff.astimezone(dt.timezone(dt.timedelta(hours=2)))) == cutoff

    def actions(*lows: dt.date) -> pa.Table:
        return pa.table({"min.day": pa.array(lows, pa.date32())})

    # The pre-check skips exactly when the DELETE would remove nothing: the oldest day is the cutoff's.
    assert not may_hold_rows_before(actions(dt.date(2024, 5, 10), dt.date(2024, 6, 1)), "day", bound)
    assert may_hold_rows_before(actions(dt.date(2024, 5, 9)), "day", bound)


def _ttl_turn(config: Config, now: dt.datetime) -> tuple[StreamingJob, list[str]]:
    """One ``jobs ttl`` turn's work at ``now`` on a stand-in session; the SQL it ran."""
    session = Session()
    job = StreamingJob(session, config, "ttl", Coordinator(NoBackend(), "t"), clock=lambda: now)  # type: ignore[arg-type]
    job.prepare()
    job.work()
    return job, [statement for statement, _ in session.statements]


def test_the_ttl_job_deletes_the_days_before_the_cutoffs_day(tmp_path: Path) -> None:
    days = [dt.date(2024, 5, 9), dt.date(2024, 5, 10), dt.date(2024, 5, 11)]
    uri = _table(tmp_path / "events", day=pa.array(days, pa.date32()), id=pa.array([1, 2, 3]))
    config = _config(TABLE__URI=uri, JOBS__RETENTION_COLUMN="day", JOBS__RETENTION_DAYS="1")
    now = dt.datetime(2024, 5, 11, 13, 30, tzinfo=dt.UTC)  # cutoff: 2024-05-10 13:30
    job, statements = _ttl_turn(config, now)
    assert statements == [f"DELETE FROM delta.`{spark_path(uri)}` WHERE `day` < DATE '2024-05-10'"]
    assert job.stats.retention_deleted == 3  # what the (stand-in) DELETE reported
    # Once only the cutoff's day is left, nothing is run: the pre-check and the DELETE keep the same day.
    kept = _table(tmp_path / "kept", day=pa.array(days[1:], pa.date32()))
    _, statements = _ttl_turn(_config(TABLE__URI=kept, JOBS__RETENTION_COLUMN="day", JOBS__RETENTION_DAYS="1"), now)
    assert statements == []


def test_the_ttl_job_deletes_dead_letters_past_their_retention_from_every_dead_letter_table(tmp_path: Path) -> None:
    events = _table(tmp_path / "events")
    own = _table(tmp_path / "b_letters", date=pa.array([dt.date(2024, 4, 1)], pa.date32()))
    _table(f"{events}_dead_letters", date=pa.array([dt.date(2024, 4, 1)], pa.date32()))
    routes = [{"topic": "events", "uri": events, "dead_letter_table_uri": own}]
    config = _config(TABLE__URI=events, ROUTES=json.dumps(routes), JOBS__DEAD_LETTER_RETENTION_DAYS="30")
    now = dt.datetime(2024, 5, 11, 13, 30, tzinfo=dt.UTC)  # cutoff: 2024-04-11 13:30, its day kept
    job, statements = _ttl_turn(config, now)
    assert statements == [
        f"DELETE FROM delta.`{spark_path(path)}` WHERE `date` < DATE '2024-04-11'"
        for path in (f"{events}_dead_letters", own)
    ]
    assert job.stats.dead_letters_deleted == 6 and job.details()["dead_letters_deleted"] == 6  # 3 a stand-in DELETE
    with pytest.raises(ConfigError, match=r"jobs\.ttl_topic.*jobs\.dead_letter_retention_days"):
        StreamingJob(Session(), _config(), "ttl", Coordinator(NoBackend(), "t"))  # type: ignore[arg-type]


def test_a_ttl_job_without_one_table_keeps_the_dead_letter_retention_on_the_dead_letter_table(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for name in ("a", "b"):
        _table(lake / name)
    old = {"date": pa.array([dt.date(2024, 4, 1)], pa.date32())}
    daemons, own = _table(lake / "_dead_letters", **old), _table(tmp_path / "b_letters", **old)
    routes = json.dumps(
        [{"topic": "a", "uri": f"{lake}/a"}, {"topic": "b", "uri": f"{lake}/b", "dead_letter_table_uri": own}]
    )
    env = {"KAFKA__TOPIC": "", "KAFKA__TOPICS": "a,b", "ROUTES": routes, "JOBS__DEAD_LETTER_RETENTION_DAYS": "30"}
    now = dt.datetime(2024, 5, 11, 13, 30, tzinfo=dt.UTC)
    for uri in (f"{lake}/{{topic}}", ""):  # a template two topics fill; routes alone (table.uri empty)
        config = _config(TABLE__URI=uri, DEAD_LETTERS__TABLE_URI="" if uri else daemons, **env)
        assert config.main_table_uri == "" and job_table(config, "ttl") == daemons
        job, statements = _ttl_turn(config, now)
        assert job.target.uri == daemons and job.details()["dead_letters_deleted"] == 6
        assert statements == [
            f"DELETE FROM delta.`{spark_path(path)}` WHERE `date` < DATE '2024-04-11'" for path in (daemons, own)
        ]
    # What needs one table is refused, naming the key; a template one topic fills is that topic's table.
    template = {**env, "TABLE__URI": f"{lake}/{{topic}}"}
    refusals = [
        ("mutate", {"JOBS__MUTATION_TOPIC": "m"}, r"table\.uri: 'jobs mutate' changes one table, and table\.uri is a"),
        ("ttl", {"JOBS__TTL_TOPIC": "g", "JOBS__SUBJECT_COLUMN": "id"}, r"jobs\.ttl_topic: .* from one table"),
        ("ttl", {"JOBS__RETENTION_COLUMN": "d", "JOBS__RETENTION_DAYS": "3"}, r"jobs\.retention_column: .*one table"),
    ]
    for action, more, refused in refusals:
        with pytest.raises(ConfigError, match=refused):
            StreamingJob(Session(), _config(**template, **more), action, Coordinator(NoBackend(), "t"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^jobs\.dead_letter_retention_days: is what 'jobs ttl' can do"):
        nothing = _config(**{**template, "JOBS__DEAD_LETTER_RETENTION_DAYS": "0"})
        StreamingJob(Session(), nothing, "ttl", Coordinator(NoBackend(), "t"))  # type: ignore[arg-type]
    one = _config(**{**template, "KAFKA__TOPICS": "a", "ROUTES": "[]"}, JOBS__MUTATION_TOPIC="m")
    assert job_table(one, "mutate") == job_table(one, "ttl") == f"{lake}/a"
    # ... as the daemon routes it: through the first route that takes the topic.
    for route, table in (
        ({"topic": "a", "uri": "/x/t"}, "/x/t"),
        ({"topic_pattern": "^a", "uri": "/p/{topic}"}, "/p/a"),
    ):
        assert _config(**{**template, "KAFKA__TOPICS": "a", "ROUTES": json.dumps([route])}).main_table_uri == table
    # Before the daemon made its dead-letter table there is nothing to take turns on: refused, naming it.
    missing = _config(TABLE__URI=str(tmp_path / "new" / "{topic}"), **env)
    with pytest.raises(ConfigError, match=r"dead_letters\.table_uri: no Delta table at .*new/_dead_letters"):
        _ttl_turn(missing, now)


# -- 5. maintain never takes a dead-letter table for a topic table


def test_maintain_leaves_every_dead_letter_table_out_however_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b", "_dead_letters", "b_letters"):
        _table(tmp_path / "data" / name)
    config = _config(
        KAFKA__TOPIC="",
        KAFKA__TOPICS="a,b",
        TABLE__URI="./data/{topic}",
        ROUTES=json.dumps([{"topic": "b", "dead_letter_table_uri": "./data/b_letters/"}]),
    )
    data = tmp_path / "data"
    assert commands.maintained_tables(config, []) == [str(data / "a"), str(data / "b")]
    assert commands.maintained_tables(config, ["./data/*", str(data / "a")]) == [str(data / "a"), str(data / "b")]
    assert tables.dead_letter_tables(config) == ["./data/_dead_letters", "./data/b_letters/"]


def test_maintain_gives_a_dead_letter_table_neither_zorder_nor_where(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}

    def optimize(session: Any, uri: str, storage_options: Any, **kwargs: Any) -> Report:
        given.update(kwargs)
        return Report("optimize", uri)

    monkeypatch.setattr(maintenance, "optimize", optimize)
    args = argparse.Namespace(
        action="optimize",
        zorder_by=["id"],
        where="day = '2024-05-10'",
        target_file_size=None,
        purge_deletion_vectors=False,
        engine="auto",
    )
    session: Any = object()
    commands._maintain_one(args, _config(), session, "/data/_dead_letters", dead_letters=True)
    assert given["zorder_by"] == () and given["where"] == ""
    commands._maintain_one(args, _config(), session, "/data/events", dead_letters=False)
    assert given["zorder_by"] == ["id"] and given["where"] == "day = '2024-05-10'"


def test_maintain_reaches_azure_and_gcs_tables_through_delta_rs_without_starting_spark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lanes: list[tuple[str, str]] = []

    def lane(name: str) -> Any:
        def run(*given: Any, **kwargs: Any) -> Report:
            uri = next(a for a in given if isinstance(a, str))
            lanes.append((name, uri))
            return Report("optimize", uri)

        return run

    monkeypatch.setattr(maintenance, "optimize", lane("spark"))
    monkeypatch.setattr(maintenance_deltalake, "optimize", lane("deltalake"))

    started: list[str] = []

    def start_spark() -> Any:
        started.append("spark")
        return object()

    args = argparse.Namespace(
        action="optimize",
        zorder_by=[],
        where="",
        target_file_size=None,
        purge_deletion_vectors=False,
        engine="auto",
        dead_letters=False,
        json=True,
    )
    cloud = ["az://lake/events", "abfss://lake@acct.dfs.core.windows.net/events", "gs://lake/events"]
    assert commands._maintain(args, _config(), start_spark, cloud, "optimize") == 0
    assert started == []  # no JVM for tables delta-rs maintains
    args.engine = "deltalake"
    assert commands._maintain(args, _config(), start_spark, ["/data/events"], "optimize") == 0
    assert started == []
    args.engine = "spark"
    assert commands._maintain(args, _config(), start_spark, ["s3://lake/events"], "optimize") == 0
    assert started == ["spark"]
    assert [name for name, _ in lanes] == ["deltalake"] * 4 + ["spark"]


# -- 8. a coordinator order that cannot cycle on some table is refused


def _coordinated(order: str, **env: str) -> dict[str, str]:
    return {
        "COORDINATOR__BACKEND": "file",
        "COORDINATOR__LOCK_DIR": "/tmp/k2d-locks",
        "COORDINATOR__ORDER": order,
        "COORDINATOR__JOIN_INGEST": "true",
        **env,
    }


ROUTED = {"KAFKA__TOPIC": "", "KAFKA__TOPICS": "a,b", "TABLE__URI": "/lake/{topic}"}


@pytest.mark.parametrize(
    ("env", "stalled"),
    [
        # The daemon registers ingest on /lake/b too, where mutate and ttl never run: optimize waits for ttl.
        ({**ROUTED, **_coordinated("ingest,mutate,ttl,optimize")}, "optimize waits for ttl"),
        (
            {
                "TABLE__URI": "/lake/t",
                "ROUTES": json.dumps([{"topic": "events", "uri": "/lake/r"}]),
                **_coordinated("ingest,mutate,optimize"),
            },
            "optimize waits for mutate",
        ),
        # order_timeout_s cannot help: the daemon's registrations are never that old.
        ({**ROUTED, **_coordinated("ingest,ttl,optimize", COORDINATOR__ORDER_TIMEOUT_S="600")}, "waits for ttl"),
        # Without the daemon: two maintain jobs on a routed table, with a strict order.
        ({**ROUTED, **_coordinated("mutate,ttl,optimize,vacuum", COORDINATOR__JOIN_INGEST="false")}, "waits for"),
        # apply-changes never runs on a table the daemon writes, nor ingest on its target.
        ({"TABLE__URI": "/lake/t", **_coordinated("ingest,apply-changes,optimize")}, "waits for apply-changes"),
        # With no one table, ttl (the dead-letter retention alone) runs on the daemon's dead-letter table, where
        # mutate never does (nor anywhere): maintain --dead-letters would wait there for mutate.
        (
            {
                **ROUTED,
                **_coordinated("mutate,ttl,optimize", COORDINATOR__JOIN_INGEST="false"),
                "JOBS__DEAD_LETTER_RETENTION_DAYS": "30",
            },
            "cannot cycle on the daemon's dead-letter table: only ttl, optimize take turns there, never mutate",
        ),
        # Routes alone writing one table: mutate runs nowhere, so optimize would wait for it there.
        (
            {
                "TABLE__URI": "",
                "DEAD_LETTERS__TABLE_URI": "/lake/_dlq",
                "ROUTES": json.dumps([{"topic": "events", "uri": "/lake/x"}]),
                **_coordinated("ingest,mutate,optimize"),
            },
            "cannot cycle on the daemon's other tables (routes, {topic}): only ingest, optimize",
        ),
    ],
)
def test_an_order_that_cannot_cycle_on_some_table_is_refused(env: dict[str, str], stalled: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(**env)
    assert refused.value.key == "coordinator.order" and stalled in str(refused.value)


@pytest.mark.parametrize(
    "env",
    [
        {"TABLE__URI": "/lake/t", **_coordinated("ingest,mutate,ttl,optimize")},  # one table
        {"KAFKA__TOPIC": "a", "TABLE__URI": "/lake/{topic}", **_coordinated("ingest,mutate,ttl,optimize")},
        {**ROUTED, **_coordinated("ingest,mutate,ttl,optimize", COORDINATOR__RESOURCE="lake")},  # one cycle
        {**ROUTED, **_coordinated("ingest,optimize")},  # jobs that run on every table
        # Each alone where it runs: ttl on the dead-letter table.
        {**ROUTED, **_coordinated("ingest,ttl"), "JOBS__DEAD_LETTER_RETENTION_DAYS": "30"},
        {  # optimize alone on the routed table
            "TABLE__URI": "/lake/t",
            "ROUTES": json.dumps([{"topic": "events", "uri": "/lake/r"}]),
            **_coordinated("mutate,ttl,optimize", COORDINATOR__JOIN_INGEST="false"),
        },
        # No one table and no dead-letter retention: mutate and ttl run nowhere, optimize alone everywhere.
        {**ROUTED, **_coordinated("mutate,ttl,optimize", COORDINATOR__JOIN_INGEST="false")},
        # Two maintain jobs on a routed table, but order_timeout_s: it waits, never for good.
        {
            **ROUTED,
            **_coordinated("mutate,ttl,optimize,vacuum", COORDINATOR__JOIN_INGEST="false"),
            "COORDINATOR__ORDER_TIMEOUT_S": "3600",
        },
    ],
)
def test_orders_that_cycle_on_every_table_are_accepted(env: dict[str, str]) -> None:
    _config(**env)


def test_a_job_name_in_the_order_counts_where_its_job_runs() -> None:
    config = _config(**ROUTED, **_coordinated("ingest,gdpr,optimize"))  # gdpr could be any job: accepted
    with pytest.raises(ConfigError, match=r"coordinator.order: .* never gdpr"):
        check_coordinator_order(config, {"gdpr": job_tables(config, "ttl")})  # jobs ttl --job-name gdpr


def test_the_jobs_lock_the_table_they_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``jobs mutate``/``ttl`` take the coordinator's lock of their table (the one the daemon takes on it), before
    Spark starts: the dead-letter table for the dead-letter retention alone, refused naming the key otherwise."""
    from kafka2delta import coordinator

    locked: list[str] = []

    def open_coordinator(config: Any, uri: str) -> Coordinator:
        locked.append(uri)
        return Coordinator(NoBackend(), uri)

    monkeypatch.setattr(coordinator, "open_coordinator", open_coordinator)
    monkeypatch.setattr(commands, "_session", lambda *args: None)
    monkeypatch.setattr(commands, "_job", lambda *args: 0)

    def run(action: str, **env: str) -> None:
        commands.run(argparse.Namespace(command="jobs", action=action, job_name=None), _config(**env))

    run("ttl", **ROUTED, JOBS__DEAD_LETTER_RETENTION_DAYS="30")
    run("mutate", KAFKA__TOPIC="a", TABLE__URI="/lake/{topic}", JOBS__MUTATION_TOPIC="m")
    assert locked == ["/lake/_dead_letters", "/lake/a"]
    with pytest.raises(ConfigError, match=r"^table\.uri: 'jobs mutate' changes one table"):
        run("mutate", **ROUTED, JOBS__MUTATION_TOPIC="m")
    assert len(locked) == 2
