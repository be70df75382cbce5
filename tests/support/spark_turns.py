"""A Spark job's turn that runs no query, for the unit tests of the turn loop (kafka2delta.spark.jobs.TurnJob):
its work fails a number of times with a given error, then works."""

from __future__ import annotations

import threading
from typing import Any

from kafka2delta.config import Config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.spark.jobs import TurnJob, TurnStats
from kafka2delta.spark.mutations import Target


class FlakyTurn(TurnJob[TurnStats]):
    """A turn whose work fails ``failures`` times with ``error``, then works; ``stop``, if given, is set at the last
    failure (a SIGTERM during that turn). ``session`` is a fake that answers what TurnJob asks before any query."""

    def __init__(
        self,
        session: Any,
        config: Config,
        error: Exception,
        *,
        failures: int = 1,
        target: str = "/nonexistent/t",
        stop: threading.Event | None = None,
    ) -> None:
        super().__init__(
            session,
            config,
            Coordinator(NoBackend(), "t"),
            name="flaky",
            target=Target(target),
            checkpoint="/nonexistent/checkpoint",
            stats=TurnStats(),
            step="jobs flaky",
        )
        self.error, self.failures, self.stop = error, failures, stop

    def check_target(self) -> None:
        pass

    def table_stats(self) -> None:
        return None

    def work(self) -> None:
        if self.failures:
            self.failures -= 1
            if self.stop is not None and not self.failures:
                self.stop.set()
            raise self.error
