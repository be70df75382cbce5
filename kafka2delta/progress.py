"""What the daemon tells about its progress, in one place: the stage counts of each processed piece; after
each commit the metrics, the status board and the commit's log line, and the table's pace; the lag gauges and
the partitions on the status page; the periodic progress line. The loop calls it; nothing here decides anything.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from kafka2delta.assignment import PartitionState
from kafka2delta.metrics import CommitStats, Metrics
from kafka2delta.records import DeadLetter, ProcessedPartition, Stage, TopicPartition
from kafka2delta.status import CommitRecord, StatusBoard
from kafka2delta.value_buffers import PartitionBuffer, ValueBuffers

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

logger = logging.getLogger(__name__)


class Progress:
    def __init__(
        self,
        *,
        metrics: Metrics,
        board: StatusBoard,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        interval_s: float,
        max_messages_per_file: int,
        table_commits_per_s: float,
    ) -> None:
        self._metrics = metrics
        self._board = board
        self._clock = clock
        self._wall_clock = wall_clock
        self._interval_s = interval_s
        self._max_messages_per_file = max_messages_per_file
        self._table_commits_per_s = table_commits_per_s
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

    def processed(self, topic: str, outcomes: Iterable[ProcessedPartition], messages: int) -> None:
        """Deserialized and failed-per-stage counts of one processed piece (per dead letter, not per message)."""
        failed: Counter[Stage] = Counter()
        empty = 0
        for processed in outcomes:
            failed.update(letter.stage for letter in processed.dead_letters)
            empty += processed.skipped_empty
        for stage, count in failed.items():
            self._metrics.failed(topic, stage, count)
        self._metrics.deserialized(topic, messages - empty - failed["deserialize"])

    def committed(
        self,
        *,
        table: str,
        reason: str,
        version: int,
        taken: Mapping[TopicPartition, PartitionBuffer],
        files: Sequence[AddAction],
        dead_letters: Sequence[DeadLetter],
        flush_seconds: float,
        commit_seconds: float,
    ) -> None:
        """A flush committed ``taken`` in version ``version`` of ``table``: metrics, status board, counters,
        log line. ``dead_letters``: the ones the flush recorded (not those another writer had, nor those of a
        partition it dropped); the committer counts them in the metrics."""
        rows = {tp: b.rows for tp, b in taken.items()}
        stamps: dict[str, list[pa.Array]] = {}
        for tp, buffer in taken.items():
            stamps.setdefault(tp.topic, []).extend(buffer.row_timestamps_ms)
        self._metrics.committed(
            CommitStats(
                table=table,
                reason=reason,
                version=version,
                rows=rows,
                file_sizes=[action.size for action in files],
                flush_seconds=flush_seconds,
                commit_seconds=commit_seconds,
                row_timestamps_ms=stamps,
            ),
        )
        letters = len(dead_letters)
        filtered = sum(b.filtered for b in taken.values())
        record = CommitRecord(
            version=version,
            time=self._wall_clock(),
            reason=reason,
            offsets={tp: (b.first_offset, b.last_offset) for tp, b in taken.items()},
            rows=sum(rows.values()),
            dead_letters=letters,
            seconds=flush_seconds,
            table=table,
        )
        self._board.committed(record, Counter(letter.stage for letter in dead_letters))
        self.commits += 1
        self.rows += sum(rows.values())
        self.dead_letters += letters
        self.filtered += filtered
        self.unknown_fields += sum(b.unknown_fields for b in taken.values())
        logger.info(
            "committed version %d of %s (%s): %s, %d rows, %d dead letters, %d filtered in %.3f s",
            version,
            table,
            reason,
            ", ".join(f"{tp}@{b.first_offset}..{b.last_offset}" for tp, b in taken.items()),
            sum(rows.values()),
            letters,
            filtered,
            flush_seconds,
        )

    def paced(self, table: str, *, writers: float, interval_s: float, before_s: float) -> None:
        """After a commit: the commit interval the table's pacer chose (logged when it moved by a quarter)."""
        self._metrics.paced(table, interval_s, writers)
        if abs(interval_s - before_s) >= max(0.5, before_s / 4):
            logger.info(
                "%s: about %.1f writers commit to it, budget %g commits/s: committing every %.1f s (was %.1f s)",
                table,
                writers,
                self._table_commits_per_s,
                interval_s,
                before_s,
            )

    def publish_partitions(
        self,
        partitions: Mapping[TopicPartition, PartitionState],
        buffers: ValueBuffers,
        tables: Mapping[TopicPartition, str],
    ) -> dict[TopicPartition, int]:
        """Set the lag gauges and the status page's partitions from ``partitions`` (``tables``: the table each
        goes to); return the lags. Called after commits, rebalances and with each progress line."""
        lags: dict[TopicPartition, int] = {}
        for tp, state in sorted(partitions.items()):
            lags[tp] = state.lag()
            self._metrics.lag(tp.topic, tp.partition, lags[tp])
        full = self._max_messages_per_file
        self._board.partitions(
            {tp: state.committed for tp, state in partitions.items()},
            {tp: state.high_watermark for tp, state in partitions.items()},
            lags,
            {tp: full - buffers.room(tp) for tp in partitions if tp in buffers},
            buffers.buffered_bytes,
            tables,
        )
        return lags

    def line(self, lags: Mapping[TopicPartition, int], buffered_messages: int) -> str:
        """The state of the run in one line (the periodic progress line and the last line at stop)."""
        elapsed = self._clock() - self._started
        rate = self.messages / elapsed if elapsed > 0 else 0.0
        total_lag = sum(lags.values())
        # Every partition's lag while few (one topic); beyond, the sum (the gauges have each one).
        shown = ", ".join(f"{tp}:{lag}" for tp, lag in lags.items()) if len(lags) <= 16 else f"{total_lag} in all"
        return (
            f"{rate:.0f} msg/s, {self.messages} messages, {self.rows} rows in {self.commits} commits, "
            f"{self.dead_letters} dead letters, {self.filtered} filtered, "
            f"{self.unknown_fields} unknown field values dropped, "
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
