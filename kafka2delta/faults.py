"""Fault injection for crash tests: SIGKILL this process at a named step.

Off by default. The CLI arms it from ``K2D_FAULT_INJECT=<point>[:<nth hit>]``; when it is not
armed a :func:`point` call is one comparison. Points: ``after_parquet_write``,
``after_dead_letter_commit``, ``before_merge`` (upsert tables: the MERGE's changes are computed, the
call that writes its files and commits them not made), ``after_delta_commit``, ``before_kafka_commit``,
``after_kafka_commit``,
``in_revoke`` (a rebalance took partitions from us, before their buffers are committed) and ``in_assign``
(partitions given to us, before their start offsets are read from the table); in ``jobs apply-changes``,
``after_apply_merge`` (a micro-batch's MERGE committed, Spark's checkpoint not yet told). The chaos suite
(``tests/chaos``) kills the daemon and the job at each of them.
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

POINTS = frozenset(
    {
        "after_parquet_write",
        "after_dead_letter_commit",
        "between_table_commits",
        "before_merge",
        "after_delta_commit",
        "before_kafka_commit",
        "after_kafka_commit",
        "in_revoke",
        "in_assign",
        "after_apply_merge",
    }
)
_armed: str | None = None
_remaining_hits = 0


def arm(spec: str) -> None:
    """Arm ``point[:n]``: kill the process at the n-th time (default first) the point is reached."""
    global _armed, _remaining_hits
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r} (known: {', '.join(sorted(POINTS))})")
    _armed, _remaining_hits = name, int(count or 1)
    logger.warning("fault injection armed: SIGKILL at hit %d of %s", _remaining_hits, name)


def arm_from_environment() -> None:
    """Arm what ``K2D_FAULT_INJECT`` names, if anything (the daemon and the Spark jobs, at start)."""
    spec = os.environ.get("K2D_FAULT_INJECT")
    if spec:
        arm(spec)


def point(name: str) -> None:
    global _remaining_hits
    if _armed != name:
        return
    _remaining_hits -= 1
    if _remaining_hits <= 0:
        logger.critical("fault injection: SIGKILL at %s", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
