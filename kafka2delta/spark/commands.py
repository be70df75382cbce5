"""The ``maintain`` and ``jobs`` commands of the CLI. Importing this module must stay cheap: pyspark is
imported only when one of its commands runs (the daemon's container does not ship Spark).

::

    kafka2delta maintain optimize -c config.toml [--table URI|GLOB]... [--zorder-by c1,c2] [--where PRED]
                                  [--target-file-size BYTES] [--purge-deletion-vectors] [--engine auto|spark|deltalake]
    kafka2delta maintain vacuum   -c config.toml [--table URI|GLOB]... [--retain-hours N] [--dead-letters] [--dry-run]
                                  [--engine auto|spark|deltalake]
    kafka2delta jobs mutate       -c config.toml [--available-now | --max-turns N]
    kafka2delta jobs ttl          -c config.toml [--available-now | --max-turns N]
    kafka2delta jobs apply-changes -c config.toml --source URI --target URI [--key c1,c2] [--delete-mode hard|soft]
                                  [--max-files-per-trigger N] [--available-now | --max-turns N]

Each takes ``--master URL``, ``--conf k=v`` (repeatable) and ``--json``, prints one line per table (what it did:
files before/after, rows changed, duration) and exits 0 (done, or skipped because the coordinator gave no turn),
1 (failed) or 2 (bad configuration). ``maintain`` works on every table the config writes (``table.uri`` and the
routes' URIs, a ``{topic}`` matching every table beside it; never a dead-letter table, which ``--dead-letters``
adds) or on the ``--table`` URIs and globs given; one table's failure is reported and the others are still done
(exit 1 at the end, 2 if a failure was a configuration error). ``maintain`` runs through Spark, or through delta-rs
with no JVM (:mod:`kafka2delta.spark.maintenance_deltalake`) for Azure and GCS tables (``--engine auto``, the default)
or every table (``--engine deltalake``); Spark starts only if a table needs it. ``jobs apply-changes`` takes its
turns on the ``--target`` table (the coordinator's resource), the others on the table ``table.uri`` names (or, for
``ttl``'s dead-letter retention alone when that names no one table, on the daemon's dead-letter table:
:func:`~kafka2delta.spark.jobs.job_table`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from kafka2delta.config import Config
from kafka2delta.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafka2delta.coordinator import Coordinator
    from kafka2delta.spark.report import Report

logger = logging.getLogger(__name__)

COMMANDS = ("maintain", "jobs")
ENGINES = ("auto", "spark", "deltalake")
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="TOML config file (K2D_* environment variables override it)")
    parser.add_argument("--master", help="Spark master URL (default: spark.master, local[*])")
    parser.add_argument(
        "--conf", action="append", metavar="KEY=VALUE", help="a Spark setting (repeatable), after [spark.conf]"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object per table")
    parser.add_argument("--job-name", help="the name this run takes and registers in the coordinator")


def _columns(text: str) -> list[str]:
    columns = [c.strip() for c in text.split(",") if c.strip()]
    if not columns:
        raise argparse.ArgumentTypeError("expected column names separated by commas")
    return columns


_TABLE_HELP = (
    "a table to maintain, or a glob of tables (s3://lake/raw/*); repeatable. Default: every table the config writes"
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``maintain`` and ``jobs`` subcommands (and their arguments) to the CLI."""
    maintain = commands.add_parser("maintain", help="table maintenance: optimize, vacuum (Spark, or delta-rs)")
    maintain_commands = maintain.add_subparsers(dest="action", required=True)
    optimize = maintain_commands.add_parser("optimize", help="compact small files (bin-packing) or Z-order them")
    _common(optimize)
    optimize.add_argument("--zorder-by", type=_columns, default=[], metavar="C1,C2", help="Z-order by these columns")
    optimize.add_argument("--where", default="", metavar="PREDICATE", help="only partitions matching this predicate")
    optimize.add_argument("--target-file-size", type=int, metavar="BYTES", help="size of the files written")
    optimize.add_argument("--dead-letters", action="store_true", help="also the dead-letter table")
    optimize.add_argument("--table", action="append", default=[], metavar="URI", help=_TABLE_HELP)
    optimize.add_argument(
        "--purge-deletion-vectors",
        action="store_true",
        help="Spark-only tables (apply-changes targets): REORG … APPLY (PURGE), rewriting the files with deletion "
        "vectors, instead of compaction",
    )
    vacuum = maintain_commands.add_parser(
        "vacuum", help="delete files no recent version references, and a crashed daemon's uncommitted files"
    )
    _common(vacuum)
    vacuum.add_argument("--retain-hours", type=float, default=168.0, help="keep files younger than this (168)")
    vacuum.add_argument("--dead-letters", action="store_true", help="also the dead-letter table")
    vacuum.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    vacuum.add_argument("--table", action="append", default=[], metavar="URI", help=_TABLE_HELP)
    for action in (optimize, vacuum):
        action.add_argument(
            "--engine",
            choices=ENGINES,
            default="auto",
            help="spark, or deltalake (delta-rs, no JVM); auto (default): deltalake for Azure and GCS tables, which "
            "Spark cannot reach, spark for the others",
        )

    jobs = commands.add_parser("jobs", help="streaming jobs that change the table: mutate, ttl, apply-changes")
    jobs_commands = jobs.add_subparsers(dest="action", required=True)
    for name, text in (
        ("mutate", "apply mutation requests (update/delete by match) from jobs.mutation_topic"),
        ("ttl", "apply GDPR deletes from jobs.ttl_topic and the retention deletes (jobs.*retention_*)"),
        ("apply-changes", "keep a current-state table (one row per key) from a changelog table, with Spark"),
    ):
        job = jobs_commands.add_parser(name, help=text)
        _common(job)
        mode = job.add_mutually_exclusive_group()
        mode.add_argument(
            "--available-now", action="store_true", help="one turn: everything available now, then exit (cron)"
        )
        mode.add_argument("--max-turns", type=int, metavar="N", help="stop after N turns")
        if name == "apply-changes":
            _apply_changes_arguments(job)


def _apply_changes_arguments(job: argparse.ArgumentParser) -> None:
    job.add_argument("--source", metavar="URI", help="the changelog table (table.mode = 'changelog') to read")
    job.add_argument("--target", metavar="URI", help="the current-state table to keep (created at the first batch)")
    job.add_argument(
        "--key", type=_columns, metavar="C1,C2", help="the key columns (default: the key of the route writing --source)"
    )
    job.add_argument(
        "--delete-mode",
        choices=("hard", "soft"),
        help="hard: a delete removes the row; soft: it sets _deleted (default: the source route's delete_mode, else "
        "hard)",
    )
    job.add_argument(
        "--max-files-per-trigger", type=int, default=1000, metavar="N", help="most changelog files per micro-batch"
    )


def _session(args: argparse.Namespace, config: Config, what: str) -> SparkSession:
    from kafka2delta.spark.session import get_session, parse_conf

    return get_session(
        config.spark,
        master=args.master,
        conf=parse_conf(args.conf),
        app_name=f"{config.spark.app_name}-{what}",
    )


def _print(report: Report, as_json: bool) -> None:
    print(report.json() if as_json else report.text(), flush=True)


def run(args: argparse.Namespace, config: Config) -> int:
    """Run a ``maintain``/``jobs`` command; the exit code."""
    from kafka2delta.coordinator import open_coordinator

    if args.action in ("optimize", "vacuum") and args.command != "maintain":  # pragma: no cover - argparse
        raise ConfigError(args.command, f"unknown action {args.action}")
    job_name = args.job_name or args.action
    if args.command == "maintain":
        _check_maintain_arguments(args)
        tables = maintained_tables(config, args.table)
        if not tables and not args.dead_letters:
            raise ConfigError("table.uri", "no table to maintain: none of the config's tables or --table globs exists")
        return _maintain(args, config, lambda: _session(args, config, args.action), tables, job_name)
    from kafka2delta import faults
    from kafka2delta.config.validation import check_coordinator_order, job_tables
    from kafka2delta.spark.jobs import check_job_name, check_not_changelog, job_table

    faults.arm_from_environment()
    check_job_name(job_name)  # before the JVM starts (20 s)
    # The config's own check knows the jobs by their default names; this run's --job-name may be another.
    check_coordinator_order(config, {job_name: job_tables(config, args.action)})
    if args.action in ("mutate", "ttl"):
        check_not_changelog(config, args.action)
        resource = job_table(config, args.action)  # before the JVM starts: a ConfigError naming the key
    else:
        from kafka2delta.spark.apply_changes import resolve_options

        args.apply_options = resolve_options(
            config,
            source=args.source,
            target=args.target,
            key=args.key,
            delete_mode=args.delete_mode,
            max_files_per_trigger=args.max_files_per_trigger,
        )
        resource = args.apply_options.target.uri
    coordinator = open_coordinator(config.coordinator, resource)
    try:
        session = _session(args, config, args.action)
        return _job(args, config, session, coordinator, job_name)
    finally:
        coordinator.close()


def _check_maintain_arguments(args: argparse.Namespace) -> None:
    """Arguments that cannot work, refused at once: before the tables are listed and the JVM starts (20 s)."""
    from kafka2delta.spark import maintenance

    if args.action == "vacuum":
        maintenance.check_retention(args.retain_hours)
    else:
        maintenance.check_optimize_options(
            zorder_by=args.zorder_by,
            target_file_size=args.target_file_size,
            purge_deletion_vectors=args.purge_deletion_vectors,
        )


def maintained_tables(config: Config, explicit: list[str]) -> list[str]:
    """The tables ``maintain`` works on, each once: the ``--table`` URIs (globs expanded), else every table the
    config writes: ``table.uri`` and the routes' URIs, ``{topic}`` standing for any name. Never a dead-letter
    table (the daemon's or a route's, however spelled: its columns are not the topic tables', so neither are
    ``--zorder-by`` and ``--where``); ``--dead-letters`` adds them (``tables.dead_letter_tables``)."""
    from kafka2delta.config import TOPIC_PLACEHOLDER, table_key
    from kafka2delta.spark.tables import daemon_tables, expand

    tables = daemon_tables(config)
    patterns = explicit or [t.uri.replace(TOPIC_PLACEHOLDER, "*") for t in tables if not t.dead_letters]
    found = [uri for pattern in patterns for uri in expand(pattern, config.table.storage_options)]
    dead_letters = {table_key(t.uri) for t in tables if t.dead_letters}
    maintained: dict[str, str] = {}
    for uri in found:
        identity = table_key(uri)
        if identity not in dead_letters:
            maintained.setdefault(identity, uri)
    return list(maintained.values())


def _maintain(
    args: argparse.Namespace, config: Config, start_spark: Callable[[], SparkSession], tables: list[str], job_name: str
) -> int:
    """Each table in its own coordinator turn; a table that fails is reported and the next one is done. Spark is
    started first if a table needs it (not inside a turn: its 20 s would hold the table's lock), else never."""
    from kafka2delta.coordinator import open_coordinator
    from kafka2delta.errors import Kafka2DeltaError
    from kafka2delta.spark.maintenance_deltalake import uses_deltalake
    from kafka2delta.spark.report import Report
    from kafka2delta.spark.tables import dead_letter_tables

    failed = config_errors = 0
    letters = dead_letter_tables(config) if args.dead_letters else []
    uris = tables + letters
    session = start_spark() if any(not uses_deltalake(args.engine, uri) for uri in uris) else None
    for uri in uris:
        coordinator = open_coordinator(config.coordinator, uri)
        try:
            turn = coordinator.turn(job_name)
            if turn is None:
                _print(Report(args.action, uri, status="skipped", reason=coordinator.last_skip), args.json)
                continue
            with turn:
                report = _maintain_one(args, config, session, uri, dead_letters=uri in letters)
        except Kafka2DeltaError as exc:
            if len(uris) == 1:
                raise
            logger.error("%s %s failed: %s", args.action, uri, exc)
            report = Report(args.action, uri, status="failed", reason=str(exc))
            failed += 1
            config_errors += isinstance(exc, ConfigError)
        finally:
            coordinator.close()
        _print(report, args.json)
    if failed:
        logger.error("%s: %d of %d tables failed", args.action, failed, len(uris))
    return EXIT_CONFIG if config_errors else EXIT_FAILED if failed else EXIT_OK


def _maintain_one(
    args: argparse.Namespace, config: Config, session: SparkSession | None, uri: str, dead_letters: bool
) -> Report:
    from kafka2delta.spark import maintenance, maintenance_deltalake

    options = config.table.storage_options
    rs = maintenance_deltalake.uses_deltalake(args.engine, uri)
    if args.action == "optimize":
        optimize_options: dict[str, Any] = {
            "zorder_by": () if dead_letters else args.zorder_by,
            "where": "" if dead_letters else args.where,
            "target_file_size": args.target_file_size,
            "purge_deletion_vectors": args.purge_deletion_vectors,
        }
        if rs:
            return maintenance_deltalake.optimize(uri, options, **optimize_options)
        assert session is not None  # started for the tables Spark maintains
        return maintenance.optimize(session, uri, options, **optimize_options)
    if rs:
        return maintenance_deltalake.vacuum(uri, options, retain_hours=args.retain_hours, dry_run=args.dry_run)
    assert session is not None
    return maintenance.vacuum(session, uri, options, retain_hours=args.retain_hours, dry_run=args.dry_run)


def _job(
    args: argparse.Namespace, config: Config, session: SparkSession, coordinator: Coordinator, job_name: str
) -> int:
    from kafka2delta.spark.apply_changes import ApplyChangesJob
    from kafka2delta.spark.jobs import StreamingJob, TurnJob

    stop = threading.Event()

    def stop_after_this_turn(signal_name: str) -> None:
        logger.info("received %s: stopping after this turn", signal_name)
        stop.set()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        # Neither the Event's lock nor a log line in the handler: it interrupts the main thread anywhere, perhaps
        # inside that lock (taking it again hangs) or halfway through a log line (logging again raises, and the
        # stop is lost). Starting a thread takes only threading's own reentrant lock.
        name = signal.Signals(signum).name
        threading.Thread(target=stop_after_this_turn, args=(name,), name="k2d-stop", daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    job: TurnJob[Any]
    if args.action == "apply-changes":
        job = ApplyChangesJob(session, config, args.apply_options, coordinator, job_name=job_name)
    else:
        job = StreamingJob(session, config, args.action, coordinator, job_name=job_name)
    report = job.run(available_now=args.available_now, max_turns=args.max_turns, stop=stop)
    _print(report, args.json)
    sys.stdout.flush()
    return EXIT_FAILED if report.status == "failed" else EXIT_OK
