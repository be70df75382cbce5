"""Retrying what storage or the broker refuse for a while: backoff, counted, visible, bounded.

An operation that raises :class:`RetryableError` is tried again after 0.5 s, 1 s, 2 s … (at most 30 s),
up to ``ingest.max_commit_retries`` retries; then :class:`FatalError` names the operation and the
daemon exits non-zero (a restart replays from the Delta log). Offsets stay where they are meanwhile.

Once a stop has been requested (SIGTERM), retries go on for ``ingest.retry_after_stop_s`` more at most: an
orchestrator kills a pod that outlives its grace period anyway, and a person pressing Ctrl-C during an outage
should not wait minutes. A backoff is slept in slices of at most 1 s (``time.sleep`` resumes after a signal
handler), so one under way when the signal comes is cut short too. Giving up then is a crash at that point,
which the Delta log makes safe.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TypeVar

from kafka2delta.errors import FatalError, RetryableError
from kafka2delta.metrics import Metrics
from kafka2delta.status import StatusBoard

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_BACKOFF_S = 30.0
_SLEEP_SLICE_S = 1.0  # how late a backoff notices a stop request
# Retried operations that do not touch the tables (readiness only reports the table's).
_NOT_TABLE_OPERATIONS = frozenset({"consume", "watermarks", "processing", "coordinator turn"})


class Retrier:
    def __init__(
        self,
        *,
        max_retries: int,
        retry_after_stop_s: float,
        metrics: Metrics,
        board: StatusBoard,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._max_retries = max_retries
        self._retry_after_stop_s = retry_after_stop_s
        self._metrics = metrics
        self._board = board
        self._sleep = sleep
        self._clock = clock
        self._stop_deadline: float | None = None  # when retrying ends, once a stop was requested

    def stop_requested(self) -> None:
        """From now on, retry for ``retry_after_stop_s`` at most. Safe in a signal handler: it reads the clock
        (no lock) and sets a field, once."""
        if self._stop_deadline is None:
            self._stop_deadline = self._clock() + self._retry_after_stop_s

    def run(self, what: str, operation: Callable[[], T]) -> T:
        """``operation()``, retried while it raises RetryableError; ``what`` names it in logs and errors."""
        attempt = 0
        while True:
            try:
                result = operation()
            except RetryableError as exc:
                attempt += 1
                self.backoff(attempt, what, exc)
            else:
                if attempt and what not in _NOT_TABLE_OPERATIONS:
                    self._board.table_reachable()
                return result

    def backoff(self, attempt: int, what: str, exc: Exception) -> None:
        """Wait before retry ``attempt`` of ``what``; FatalError once the retries are used up."""
        limit = self._max_retries
        self._metrics.storage_retry()
        if what not in _NOT_TABLE_OPERATIONS:
            self._board.table_unreachable(f"{what}: {exc}")
        self._board.loop_turned()  # waiting on purpose is alive; /readyz tells the table is not reachable
        if attempt > limit:
            raise FatalError(f"{what} still failing after {limit} retries: {exc}") from exc
        delay = min(_MAX_BACKOFF_S, 0.5 * 2 ** (attempt - 1), self._left_after_stop())
        if delay <= 0:
            raise FatalError(
                f"{what} still failing {self._retry_after_stop_s:g} s after the stop request "
                f"(ingest.retry_after_stop_s), giving up: the next start replays from the Delta log: {exc}"
            ) from exc
        logger.warning("%s failed (attempt %d of %d), retrying in %.1f s: %s", what, attempt, limit, delay, exc)
        while delay > 0:
            step = min(delay, _SLEEP_SLICE_S)
            self._sleep(step)
            delay = min(delay - step, self._left_after_stop())

    def _left_after_stop(self) -> float:
        """Seconds of retrying left since the stop request (infinite while none came)."""
        return math.inf if self._stop_deadline is None else self._stop_deadline - self._clock()
