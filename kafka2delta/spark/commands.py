"""The ``maintain`` and ``jobs`` commands of the CLI. Importing this module must stay cheap: pyspark is
imported only when one of its commands runs (the daemon's container does not ship Spark).

::

    kafka2delta maintain optimize -c config.toml [--zorder-by c1,c2] [--where PRED] [--target-file-size BYTES]
    kafka2delta maintain vacuum   -c config.toml [--retain-hours N] [--dead-letters] [--dry-run]
    kafka2delta jobs mutate       -c config.toml [--available-now | --max-turns N]
    kafka2delta jobs ttl          -c config.toml [--available-now | --max-turns N]

Each takes ``--master URL``, ``--conf k=v`` (repeatable) and ``--json``, prints one line per table (what it did:
files before/after, rows changed, duration) and exits 0 (done, or skipped because the coordinator gave no turn),
1 (failed) or 2 (bad configuration).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from kafka2delta.config import Config
from kafka2delta.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafka2delta.coordinator import Coordinator
    from kafka2delta.spark.report import Report

logger = logging.getLogger(__name__)

COMMANDS = ("maintain", "jobs")
EXIT_OK, EXIT_FAILED = 0, 1


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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``maintain`` and ``jobs`` subcommands (and their arguments) to the CLI."""
    maintain = commands.add_parser("maintain", help="table maintenance with Spark: optimize, vacuum")
    maintain_commands = maintain.add_subparsers(dest="action", required=True)
    optimize = maintain_commands.add_parser("optimize", help="compact small files (bin-packing) or Z-order them")
    _common(optimize)
    optimize.add_argument("--zorder-by", type=_columns, default=[], metavar="C1,C2", help="Z-order by these columns")
    optimize.add_argument("--where", default="", metavar="PREDICATE", help="only partitions matching this predicate")
    optimize.add_argument("--target-file-size", type=int, metavar="BYTES", help="size of the files written")
    optimize.add_argument("--dead-letters", action="store_true", help="also the dead-letter table")
    vacuum = maintain_commands.add_parser(
        "vacuum", help="delete files no recent version references, and a crashed daemon's uncommitted files"
    )
    _common(vacuum)
    vacuum.add_argument("--retain-hours", type=float, default=168.0, help="keep files younger than this (168)")
    vacuum.add_argument("--dead-letters", action="store_true", help="also the dead-letter table")
    vacuum.add_argument("--dry-run", action="store_true", help="only count what would be deleted")

    jobs = commands.add_parser("jobs", help="streaming jobs that change the table: mutate, ttl")
    jobs_commands = jobs.add_subparsers(dest="action", required=True)
    for name, text in (
        ("mutate", "apply mutation requests (update/delete by match) from jobs.mutation_topic"),
        ("ttl", "apply GDPR deletes from jobs.ttl_topic and the retention delete (jobs.retention_*)"),
    ):
        job = jobs_commands.add_parser(name, help=text)
        _common(job)
        mode = job.add_mutually_exclusive_group()
        mode.add_argument(
            "--available-now", action="store_true", help="one turn: everything available now, then exit (cron)"
        )
        mode.add_argument("--max-turns", type=int, metavar="N", help="stop after N turns")


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
    coordinator = open_coordinator(config.coordinator, config.table.uri)
    try:
        session = _session(args, config, args.action)
        if args.command == "maintain":
            return _maintain(args, config, session, coordinator, job_name)
        return _job(args, config, session, coordinator, job_name)
    finally:
        coordinator.close()


def _maintain(
    args: argparse.Namespace, config: Config, session: SparkSession, coordinator: Coordinator, job_name: str
) -> int:
    from kafka2delta.spark import maintenance
    from kafka2delta.spark.report import Report

    uris = [config.table.uri] + ([config.dead_letter_table_uri] if args.dead_letters else [])
    turn = coordinator.turn(job_name)
    if turn is None:
        for uri in uris:
            _print(Report(args.action, uri, status="skipped", reason=coordinator.last_skip), args.json)
        return EXIT_OK
    with turn:
        for uri in uris:
            if args.action == "optimize":
                report = maintenance.optimize(
                    session,
                    uri,
                    config.table.storage_options,
                    zorder_by=args.zorder_by if uri == config.table.uri else (),
                    where=args.where,
                    target_file_size=args.target_file_size,
                )
            else:
                report = maintenance.vacuum(
                    session, uri, config.table.storage_options, retain_hours=args.retain_hours, dry_run=args.dry_run
                )
            _print(report, args.json)
    return EXIT_OK


def _job(
    args: argparse.Namespace, config: Config, session: SparkSession, coordinator: Coordinator, job_name: str
) -> int:
    from kafka2delta.spark.jobs import StreamingJob

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s: stopping after this turn", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    job = StreamingJob(session, config, args.action, coordinator, job_name=job_name)
    report = job.run(available_now=args.available_now, max_turns=args.max_turns, stop=stop)
    _print(report, args.json)
    sys.stdout.flush()
    return EXIT_OK
