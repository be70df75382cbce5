"""What the daemon tells about its progress, in one place: after each commit the metrics, the status
board and the commit's log line; the lag gauges and the partitions on the status page; the periodic
progress line. The loop calls it; nothing here decides anything.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from kafka2delta.assignment import PartitionState
from kafka2delta.metrics import CommitStats, Metrics
from kafka2delta.status import CommitRecord, StatusBoard
from kafka2delta.value_buffers import PartitionBuffer, ValueBuffers

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

logger = logging.getLogger(__name__)


class Progress:
    def __init__(
        self,
        *,
        topic: str,
        metrics: Metrics,
        board: StatusBoard,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        interval_s: float,
        max_messages_per_file: int,
    ) -> None:
        self._topic = topic
        self._metrics = metrics
        self._board = board
        self._clock = clock
        self._wall_clock = wall_clock
        self._interval_s = interval_s
        self._max_messages_per_file = max_messages_per_file
        self._started = clock()
        self._last_logged = self._started
        self._last_messages = 0
        # Since start, for the progress line.
        self.messages = 0
        self.rows = 0
        self.commits = 0
        self.dead_letters = 0
        self.filtered = 0
        self.unknown_fields = 0

    def taken(self, messages: int) -> None:
        """``messages`` more were taken into the buffers (rows, dead letters or skips to be)."""
        self.messages += messages

    def committed(
        self,
        *,
        reason: str,
        version: int,
        taken: Mapping[int, PartitionBuffer],
        files: Sequence[AddAction],
        flush_seconds: float,
        commit_seconds: float,
        buffers: ValueBuffers,
    ) -> None:
        """A flush committed ``taken`` in table ``version``: metrics, status board, counters, log line."""
        rows = {p: b.rows for p, b in taken.items()}
        stamps = [stamp for b in taken.values() for stamp in b.row_timestamps_ms]
        self._metrics.committed(
            self._topic,
            CommitStats(
                reason=reason,
                version=version,
                rows=rows,
                file_sizes=[action.size for action in files],
                flush_seconds=flush_seconds,
                commit_seconds=commit_seconds,
                row_timestamps_ms=stamps,
            ),
        )
        self._metrics.buffered(buffers.buffered_messages, buffers.buffered_bytes)
        letters = sum(len(b.dead_letters) for b in taken.values())
        filtered = sum(b.filtered for b in taken.values())
        record = CommitRecord(
            version=version,
            time=self._wall_clock(),
            reason=reason,
            offsets={p: (b.first_offset, b.last_offset) for p, b in taken.items()},
            rows=sum(rows.values()),
            dead_letters=letters,
            seconds=flush_seconds,
        )
        self._board.committed(record, Counter(letter.stage for b in taken.values() for letter in b.dead_letters))
        self.commits += 1
        self.rows += sum(rows.values())
        self.dead_letters += letters
        self.filtered += filtered
        self.unknown_fields += sum(b.unknown_fields for b in taken.values())
        logger.info(
            "committed version %d (%s): %s, %d rows, %d dead letters, %d filtered in %.3f s",
            version,
            reason,
            ", ".join(f"{self._topic}[{p}]@{b.first_offset}..{b.last_offset}" for p, b in taken.items()),
            sum(rows.values()),
            letters,
            filtered,
            flush_seconds,
        )

    def publish_partitions(self, partitions: Mapping[int, PartitionState], buffers: ValueBuffers) -> dict[int, int]:
        """Set the lag gauges and the status page's partitions from ``partitions``; return the lags.
        Called after commits, rebalances and with each progress line."""
        lags: dict[int, int] = {}
        for partition, state in sorted(partitions.items()):
            lags[partition] = state.lag()
            self._metrics.lag(self._topic, partition, lags[partition])
        full = self._max_messages_per_file
        self._board.partitions(
            {p: state.committed for p, state in partitions.items()},
            {p: state.high_watermark for p, state in partitions.items()},
            {p: full - buffers.room(p) for p in partitions if p in buffers},
            buffers.buffered_bytes,
        )
        return lags

    def line(self, lags: Mapping[int, int], table_version: int, buffered_messages: int) -> str:
        """The state of the run in one line (the periodic progress line and the last line at stop)."""
        elapsed = self._clock() - self._started
        rate = self.messages / elapsed if elapsed > 0 else 0.0
        shown = ", ".join(f"{partition}:{lag}" for partition, lag in lags.items())
        return (
            f"{rate:.0f} msg/s, {self.messages} messages, {self.rows} rows in {self.commits} commits, "
            f"{self.dead_letters} dead letters, {self.filtered} filtered, "
            f"{self.unknown_fields} unknown field values dropped, table version {table_version}, "
            f"buffered {buffered_messages}, lag {{{shown}}}"
        )

    def maybe_log(self, line: Callable[[], str]) -> None:
        """Log the progress line when ``ingest.progress_interval_s`` has passed since the last one."""
        now = self._clock()
        if now - self._last_logged >= self._interval_s:
            window = self.messages - self._last_messages
            logger.info(
                "progress: %.0f msg/s over the last %.0f s; %s",
                window / (now - self._last_logged),
                now - self._last_logged,
                line(),
            )
            self._last_logged = now
            self._last_messages = self.messages
