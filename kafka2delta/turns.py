"""The ingest lane's turns at the job coordinator (``[coordinator] join_ingest``): a table's commit waits for
its ``ingest`` turn (a lock on the table and the expected predecessor, shared with the Spark jobs), and a quiet
table registers an empty turn now and then so that a strict order does not wait for it. While a turn is
refused the loop does not poll Kafka, so the wait is bounded (docs/DESIGN.md, "The job coordinator").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial

from kafka2delta.coordinator import Turn
from kafka2delta.metrics import Metrics
from kafka2delta.retries import Retrier
from kafka2delta.status import StatusBoard
from kafka2delta.tables import TableSink

logger = logging.getLogger(__name__)

_TURN_RETRY_S = 0.2  # between two refused coordinator turns (not our turn yet)
# Flushes that give up instead of waiting for a refused turn: what they hold is replayed (by the next owner).
_ONE_TURN_REASONS = frozenset({"revoke", "shutdown"})


class IngestTurns:
    """Asks each table's coordinator for the ``ingest`` turn, for the loop's commits and its quiet spells."""

    def __init__(
        self,
        *,
        retrier: Retrier,
        metrics: Metrics,
        board: StatusBoard,
        max_wait_s: float,
        idle_interval_s: float,
        stopping: Callable[[], bool],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self._retrier = retrier
        self._metrics = metrics
        self._board = board
        self._max_wait_s = max_wait_s
        """Half of Kafka's ``max.poll.interval.ms``: the consumer is not polled while we wait."""
        self._idle_interval_s = idle_interval_s
        self._stopping = stopping
        self._clock = clock
        self._sleep = sleep

    def wait(self, reason: str, table: TableSink) -> Turn | None:
        """The table's ``ingest`` turn; waits while it is refused (lock busy, another job's turn). None (give the
        flush up) for a revoke or shutdown flush, once a stop is requested, or after ``max_wait_s``."""
        coordinator = table.coordinator
        assert coordinator is not None
        started, refusals = self._clock(), 0
        while True:
            turn = self._retrier.run("coordinator turn", lambda: coordinator.turn("ingest"))
            if turn is not None:
                if refusals:
                    logger.info("coordinator: got the ingest turn after %.1f s", self._clock() - started)
                return turn
            refusals += 1
            refused_by = "lock_busy" if coordinator.last_skip == "lock busy" else "order"
            self._metrics.coordinator_skip(table.name, refused_by)
            if reason in _ONE_TURN_REASONS or self._stopping():
                return None
            if self._clock() - started >= self._max_wait_s:
                logger.warning(
                    "coordinator: no ingest turn in %.0f s (half of max.poll.interval.ms): %s",
                    self._clock() - started,
                    coordinator.last_skip,
                )
                return None
            if refusals == 1 or refusals % 50 == 0:
                logger.info("coordinator: waiting for the ingest turn (%s flush): %s", reason, coordinator.last_skip)
            self._board.loop_turned()  # waiting for our turn on purpose is alive
            self._sleep(_TURN_RETRY_S)

    def committed(self, table: TableSink) -> None:
        """A turn was used: the table's next empty turn is due a latency period from now."""
        table.next_idle_turn = self._clock() + self._idle_interval_s

    def idle(self, tables: Iterable[TableSink]) -> None:
        """Nothing to commit: register an empty ``ingest`` turn now and then, so that a strict order does not
        wait for ingestion on a quiet topic. Never waits for the lock."""
        now = self._clock()
        for table in tables:
            coordinator = table.coordinator
            if coordinator is None or "ingest" not in coordinator.order or now < table.next_idle_turn:
                continue
            table.next_idle_turn = now + self._idle_interval_s
            turn = self._retrier.run("coordinator turn", partial(coordinator.turn, "ingest", lock_timeout_s=0.0))
            if turn is not None:
                with turn:
                    pass
