"""An independent exactly-once checker: the topic, read with its own consumer, against both tables.

``kafka2delta verify -c config.toml`` reads every partition of the topic from its low to its high
watermark (no consumer group, nothing committed), the main table's metadata columns (partition and
offset of each row, see ``table.metadata_columns``) and the dead-letter table, and reports per
partition: messages produced, rows, dead letters, expected skips (empty payloads, and messages the
configured filter drops), missing offsets, duplicated offsets, offsets present in both tables, rows
at offsets the topic does not hold, rows after their own table's txn version; plus gaps in the Delta log
versions. Offsets after the main table's txn version are not final yet: they are reported as pending, never as
missing. Offsets whose rows a later commit deleted (``jobs ttl``, a ``jobs mutate`` DELETE, anyone's DELETE) are
counted as deleted, not missing, while the files those commits removed are on storage
(:mod:`kafka2delta.verify_deletes`).

It shares no state with the daemon; it only reuses the deserializer and transforms to tell which
messages the filter drops. Both tables are read (one snapshot each, txn versions and rows from the
same version) before the topic, so every committed offset is below the high watermarks read.

Exit codes of the command: 0 nothing lost or duplicated, 1 a problem found (named in the report),
2 bad configuration (``table.metadata_columns`` without partition and offset, say), 3 the check could
not be made (Kafka or storage unreachable, ``--timeout`` reached, an upsert table's history cut by retention).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException

from kafka2delta.config import Config
from kafka2delta.errors import ConfigError, FatalError, RetryableError
from kafka2delta.kafka import subscribed_topics, topic_partitions
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import PartitionMessages
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.schema import parse_schema
from kafka2delta.verify_changes import ChangesReport, check_upsert_table
from kafka2delta.verify_deletes import DeletingCommit, Deletions, deleted_rows
from kafka2delta.verify_reading import (
    Deadline,
    TableSnapshot,
    dead_letter_filter,
    is_compacted,
    partition_messages,
    read_partitions,
    read_table,
    start_marks,
    verify_consumer,
    watermarks,
)
from kafka2delta.writer import log_versions

logger = logging.getLogger(__name__)

Where = Callable[[pa.Schema], pc.Expression | None]

_SHOWN = 20  # offsets listed per problem in the text report (the JSON report has them all)
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_UNCHECKED = 0, 1, 2, 3


_PROBLEMS = ("missing", "duplicated", "in_both", "unexpected", "beyond_txn")
"""The lists of offsets of a :class:`PartitionReport` that fail the check."""


@dataclass
class PartitionReport:
    partition: int
    low: int
    """First offset on the broker (earlier ones were deleted by retention)."""
    high: int
    """High watermark when the check started: offsets [low, high) were read."""
    produced: int
    committed: int | None
    """The main table's txn version: offsets up to it are final."""
    rows: int
    dead_letters: int
    skipped: int
    """Final offsets that are expected in neither table: empty payloads and filtered messages."""
    pending: int
    """Offsets after the txn version (the daemon has not committed them yet)."""
    missing: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    in_both: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    """Rows or dead letters at offsets the topic does not hold (or another topic's, mislabelled)."""
    beyond_txn: list[int] = field(default_factory=list)
    """Rows after their table's txn version for the partition (no commit writes rows past its own txn)."""
    dead_letter_committed: int | None = None
    """The dead-letter table's txn version (``<app_id>-dlq-<p>``): may be ahead of ``committed``."""
    before_low: int = 0
    """Rows and dead letters at offsets before ``low``: deleted from the topic by retention, not checkable."""
    compacted: int = 0
    """Rows and dead letters at offsets inside ``[low, high)`` that log compaction removed: not checkable."""
    deleted: int = 0
    """Final offsets whose rows a later commit deleted (``jobs ttl``, a ``jobs mutate`` DELETE): not missing."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.in_both or self.unexpected or self.beyond_txn)


@dataclass
class Report:
    topic: str
    table_uri: str
    dead_letter_uri: str
    partitions: list[PartitionReport]
    log_gaps: dict[str, list[int]] = field(default_factory=dict)
    """Per table URI, versions missing between the oldest and newest commit file of its log."""
    dead_letter_log_gaps: list[int] = field(default_factory=list)
    table_version: int | None = None
    dead_letter_version: int | None = None
    untraced: int = 0
    """Rows of the topic with no partition or offset recorded (written before ``metadata_columns`` named them)."""
    deleted_by_version: dict[str, dict[int, DeletingCommit]] = field(default_factory=dict)
    """Per table URI, what each later deleting commit took out of the topic's rows, by table version (looked up only
    when offsets are missing)."""
    deletes_unreadable: dict[str, dict[int, str]] = field(default_factory=dict)
    """Per table URI, deleting commits whose rows cannot be told (files vacuumed, deletion vectors), and why."""
    log_starts_at: dict[str, int] = field(default_factory=dict)
    """Per table URI looked at for deletions, where its log's entries stop, going down from the snapshot: the version
    after the first one missing (cleaned up, or a gap); 0 when every entry was there or none was needed."""

    @property
    def lost(self) -> int:
        return sum(len(p.missing) for p in self.partitions)

    @property
    def duplicated(self) -> int:
        return sum(len(p.duplicated) for p in self.partitions)

    @property
    def in_both(self) -> int:
        return sum(len(p.in_both) for p in self.partitions)

    @property
    def unexpected(self) -> int:
        return sum(len(p.unexpected) for p in self.partitions)

    @property
    def beyond_txn(self) -> int:
        return sum(len(p.beyond_txn) for p in self.partitions)

    @property
    def gaps(self) -> int:
        return sum(len(gaps) for gaps in self.log_gaps.values()) + len(self.dead_letter_log_gaps)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions) and not self.gaps

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update(
            ok=self.ok,
            lost=self.lost,
            duplicated_total=self.duplicated,
            in_both_total=self.in_both,
            unexpected_total=self.unexpected,
            beyond_txn_total=self.beyond_txn,
            # A list as before several tables could hold one topic's rows (scripts compare it with []).
            log_gaps=sorted({gap for gaps in self.log_gaps.values() for gap in gaps}),
            log_gaps_by_table=self.log_gaps,
            produced=sum(p.produced for p in self.partitions),
            rows=sum(p.rows for p in self.partitions),
            dead_letters=sum(p.dead_letters for p in self.partitions),
            skipped=sum(p.skipped for p in self.partitions),
            pending=sum(p.pending for p in self.partitions),
            deleted=sum(p.deleted for p in self.partitions),
        )
        return json.dumps(data, indent=2)

    def render(self) -> str:
        def version(v: int | None) -> str:
            return "none" if v is None else f"v{v}"

        def txn(v: int | None) -> str:
            return "-" if v is None else str(v)

        lines = [
            f"topic {self.topic} → table {self.table_uri} ({version(self.table_version)}), "
            f"dead letters {self.dead_letter_uri} ({version(self.dead_letter_version)})",
            f"{'partition':>9} {'offsets':>17} {'produced':>9} {'txn':>9} {'dlq txn':>9} {'rows':>9} {'dead':>6} "
            f"{'skipped':>7} {'pending':>7} {'missing':>7} {'dup':>5} {'both':>5} {'unexp':>5} {'>txn':>5}",
        ]
        for p in self.partitions:
            span = f"{p.low}..{p.high - 1}" if p.high > p.low else "empty"
            lines.append(
                f"{p.partition:>9} {span:>17} {p.produced:>9} {txn(p.committed):>9} {txn(p.dead_letter_committed):>9} "
                f"{p.rows:>9} {p.dead_letters:>6} {p.skipped:>7} {p.pending:>7} {len(p.missing):>7} "
                f"{len(p.duplicated):>5} {len(p.in_both):>5} {len(p.unexpected):>5} {len(p.beyond_txn):>5}"
            )
            for name in _PROBLEMS:
                offsets: list[int] = getattr(p, name)
                if offsets:
                    more = f" … ({len(offsets)} in all)" if len(offsets) > _SHOWN else ""
                    lines.append(f"{'':>9} {name} offsets: {offsets[:_SHOWN]}{more}")
            if p.before_low:
                lines.append(f"{'':>9} {p.before_low} rows/dead letters before offset {p.low} (deleted by retention)")
            if p.compacted:
                lines.append(f"{'':>9} {p.compacted} rows/dead letters at offsets log compaction removed")
            if p.deleted:
                lines.append(f"{'':>9} {p.deleted} rows deleted by later commits (counted, not missing)")
            if p.beyond_txn and p.committed is None:
                lines.append(f"{'':>9} rows but no txn version: were the table's txn ids (table.app_id) renamed?")
        if self.untraced:
            lines.append(
                f"{self.untraced} rows carry no partition or offset (written before metadata_columns named them)"
            )
        for uri, gaps in self.log_gaps.items():
            if gaps:
                lines.append(f"gaps in the log versions of {uri}: {gaps[:_SHOWN]}")
        if self.dead_letter_log_gaps:
            lines.append(f"gaps in the dead-letter table's log versions: {self.dead_letter_log_gaps[:_SHOWN]}")
        for uri, by_version in self.deleted_by_version.items():
            if by_version:
                shown = ", ".join(f"v{v} {c.operation} {c.rows}" for v, c in sorted(by_version.items())[:_SHOWN])
                lines.append(f"rows of the topic later commits deleted from {uri}: {shown}")
        for uri, unreadable in self.deletes_unreadable.items():
            for at, why in sorted(unreadable.items())[:_SHOWN]:
                lines.append(f"what v{at} of {uri} deleted cannot be told from lost rows ({why})")
        for uri, first in self.log_starts_at.items():
            if first and self.lost:
                lines.append(
                    f"the log of {uri} has no entry for v{first - 1} (cleaned up, or a gap): what it and older commits "
                    "deleted cannot be told from lost rows"
                )
        totals = (
            f"{sum(p.produced for p in self.partitions)} messages: {sum(p.rows for p in self.partitions)} rows, "
            f"{sum(p.dead_letters for p in self.partitions)} dead letters, "
            f"{sum(p.skipped for p in self.partitions)} skipped, {sum(p.pending for p in self.partitions)} pending"
        )
        lines.append(totals)
        verdict = "OK" if self.ok else "FAILED"
        summary = f"{verdict}: lost {self.lost}, duplicated {self.duplicated}"
        if deleted := sum(p.deleted for p in self.partitions):
            summary += f" (deleted later {deleted})"
        if self.in_both or self.unexpected or self.beyond_txn or self.gaps:
            summary += (
                f", in both tables {self.in_both}, unexpected {self.unexpected}, after the txn {self.beyond_txn}, "
                f"log gaps {self.gaps}"
            )
        problems = [
            f"{name} {p.partition}:{getattr(p, name)[:5]}"
            for p in self.partitions
            for name in _PROBLEMS
            if getattr(p, name)
        ]
        if problems:
            summary += f" ({'; '.join(problems[:8])}{' …' if len(problems) > 8 else ''})"
        lines.append(summary)
        return "\n".join(lines)


@dataclass
class TopicOffsets:
    """What the topic holds, per partition: the offsets read and those expected in neither table."""

    low: dict[int, int]
    high: dict[int, int]
    offsets: dict[int, np.ndarray]
    skipped: dict[int, np.ndarray]
    compacted: bool = False
    """``cleanup.policy`` compacts the topic: offsets inside ``[low, high)`` may be gone."""


Filtered = Callable[[PartitionMessages], Iterable[int]]
"""Given messages of one partition, the offsets of those the configured filter drops."""


def read_topic(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, str],
    batch_size: int = 10_000,
    *,
    filtered: Filtered | None = None,
    deadline: Deadline | None = None,
    compacted: bool = False,
    tombstone_rows: bool = False,
) -> TopicOffsets:
    """Read every partition from its low watermark to the high watermark seen now.

    ``filtered`` is asked about batches of one partition (up to ``batch_size`` messages); empty payloads are
    skipped, unless ``tombstone_rows`` (a changelog without an envelope writes a tombstone as a delete row).
    ``deadline`` bounds the whole read (:class:`RetryableError` naming the partitions not read to their end).
    """
    deadline = deadline or Deadline(None)
    consumer = verify_consumer(bootstrap_servers, settings)
    try:
        metadata = consumer.list_topics(topic, timeout=deadline.wait(30, lambda: f"reading {topic}")).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise FatalError(f"kafka.topic: topic {topic!r} does not exist")
        bounds = watermarks(consumer, topic, sorted(metadata.partitions), deadline)
        offsets: dict[int, list[int]] = {p: [] for p in bounds}
        skipped: dict[int, list[int]] = {p: [] for p in bounds}
        pending: dict[int, list[Any]] = {p: [] for p in bounds}
        for messages in read_partitions(consumer, topic, bounds, deadline, batch_size):
            for message in messages:
                partition, offset = message.partition(), message.offset()
                offsets[partition].append(offset)
                if not message.value() and not tombstone_rows:
                    skipped[partition].append(offset)
                elif filtered is not None:
                    pending[partition].append(message)
                    if len(pending[partition]) >= batch_size:
                        _filter_batch(topic, partition, pending[partition], filtered, skipped)
        if filtered is not None:
            for partition, batch in pending.items():
                _filter_batch(topic, partition, batch, filtered, skipped)
        return TopicOffsets(
            {p: low for p, (low, _) in bounds.items()},
            {p: high for p, (_, high) in bounds.items()},
            {p: np.array(found, np.int64) for p, found in offsets.items()},
            {p: np.array(sorted(found), np.int64) for p, found in skipped.items()},
            compacted=compacted,
        )
    except KafkaException as exc:
        raise RetryableError(f"reading {topic} from {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _filter_batch(
    topic: str, partition: int, batch: list[Any], filtered: Filtered, skipped: dict[int, list[int]]
) -> None:
    if not batch:
        return
    skipped[partition].extend(filtered(partition_messages(topic, partition, batch)))
    batch.clear()


def pipeline_filter(pipeline: Pipeline) -> Filtered:
    """:data:`Filtered` from the daemon's own stages: the offsets that are neither a row nor a dead letter
    (those the filter dropped, and empty payloads the stages skip) (a message's outcome never depends on its
    neighbours, so a batch gives what the daemon's batches gave)."""

    def filtered(messages: PartitionMessages) -> list[int]:
        result = pipeline.process(messages)
        decided = set(result.row_offsets) | {letter.offset for letter in result.dead_letters}
        return [offset for offset in messages.offsets if offset not in decided]

    return filtered


def compare(
    topic: TopicOffsets,
    rows: pa.Table,
    dead_letters: pa.Table,
    committed: Mapping[int, int | None],
    dead_letter_committed: Mapping[int, int | None] | None = None,
    beyond_txn: Mapping[int, np.ndarray] | None = None,
    deleted: Mapping[int, np.ndarray] | None = None,
) -> list[PartitionReport]:
    """Per partition: what the topic holds against the rows and dead letters. Rows and dead letters at
    offsets before the low watermark (deleted by retention), or on a compacted topic at offsets compaction
    removed, are counted, not checked. ``beyond_txn``: rows a table holds after its own txn version.
    ``deleted``: offsets whose rows later commits deleted; missing ones among them count as deleted."""
    reports = []
    row_groups = _by_partition(rows)
    letter_groups = _by_partition(dead_letters)
    none = np.empty(0, np.int64)
    # Rows or dead letters of partitions the topic does not have are all unexpected (found by review: never looked at).
    for partition in sorted(set(topic.offsets) | set(row_groups) | set(letter_groups)):
        produced = topic.offsets.get(partition, none)
        low, high = topic.low.get(partition, 0), topic.high.get(partition, 0)
        row_offsets = row_groups.get(partition, none)
        letter_offsets = letter_groups.get(partition, none)
        done = committed.get(partition)
        final = produced[produced <= done] if done is not None else produced[:0]
        skipped = np.intersect1d(topic.skipped.get(partition, none), final)
        outcome = np.concatenate([row_offsets, letter_offsets])
        expected = np.setdiff1d(final, skipped)
        allowed = np.setdiff1d(produced, skipped)  # offsets where a row or a dead letter may be
        seen = np.union1d(row_offsets, letter_offsets)
        stray = np.setdiff1d(seen[seen >= low], allowed)
        compacted = stray[stray < high] if topic.compacted else none
        absent = np.setdiff1d(expected, outcome)
        taken_out = np.intersect1d(absent, (deleted or {}).get(partition, none))
        reports.append(
            PartitionReport(
                partition=partition,
                low=low,
                high=high,
                produced=int(produced.size),
                committed=done,
                rows=int(row_offsets.size),
                dead_letters=int(letter_offsets.size),
                skipped=int(skipped.size),
                pending=int(produced.size - final.size),
                missing=_ints(np.setdiff1d(absent, taken_out)),
                duplicated=_ints(np.union1d(_repeated(row_offsets), _repeated(letter_offsets))),
                in_both=_ints(np.intersect1d(row_offsets, letter_offsets)),
                unexpected=_ints(np.setdiff1d(stray, compacted)),
                beyond_txn=_ints((beyond_txn or {}).get(partition, none)),
                dead_letter_committed=(dead_letter_committed or {}).get(partition),
                before_low=int((row_offsets < low).sum() + (letter_offsets < low).sum()),
                compacted=int(compacted.size),
                deleted=int(taken_out.size),
            )
        )
    return reports


def rows_beyond_txn(table: TableSnapshot) -> dict[int, np.ndarray]:
    """Per partition, the offsets of rows after the table's own txn version (all of them without one): a commit
    carries its rows' offsets, so any is a broken invariant, or txn ids the configuration does not name."""
    return {
        partition: offsets if (txn := table.txns[partition]) is None else offsets[offsets > txn]
        for partition, offsets in _by_partition(table.rows).items()
        if partition in table.txns
    }


def _by_partition(table: pa.Table) -> dict[int, np.ndarray]:
    if table.num_rows == 0:
        return {}
    partitions = table.column("partition").to_numpy()
    offsets = table.column("offset").to_numpy()
    return {int(p): offsets[partitions == p] for p in np.unique(partitions)}


def _repeated(offsets: np.ndarray) -> np.ndarray:
    values, counts = np.unique(offsets, return_counts=True)
    return values[counts > 1]


def _ints(values: np.ndarray) -> list[int]:
    return [int(v) for v in values]


def log_gaps(uri: str, storage_options: Mapping[str, str]) -> list[int]:
    """Versions missing between the oldest and the newest commit file of a table's log."""
    versions = log_versions(uri, storage_options)
    if not versions:
        return []
    present = set(versions)
    return [v for v in range(min(versions), max(versions) + 1) if v not in present]


# --- the command --------------------------------------------------------------------------------


def check(
    config: Config,
    timeout_s: float | None = None,
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline] | None = None,
) -> list[Report | ChangesReport]:
    """The whole check: every subscribed topic against its table and the dead-letter table. ``pipeline_factory``
    builds the daemon's stages for a table (needed only with a ``[filter]``, to tell filtered messages apart)."""
    routes = Routes(config)
    settings = {k: v for k, v in config.kafka.settings.items() if k not in _CONSUMER_ONLY_FOR_GROUPS}
    reports: list[Report | ChangesReport] = []
    upsert_topics: dict[str, list[str]] = {}
    for topic in subscribed_topics(config.kafka.bootstrap_servers, config.kafka, settings):
        spec = routes.table_for(topic)
        if spec.changes is not None and spec.changes.upsert:  # a changelog is checked as any append
            upsert_topics.setdefault(spec.uri, []).append(topic)
            continue
        # With [routing] expression a topic's messages spread over its routes' tables: their rows are read as one.
        reports.append(
            _check_topic(
                config,
                topic,
                routes.tables_of(topic),
                routes.dead_letter_app_ids(topic),
                settings,
                timeout_s,
                pipeline_factory,
            )
        )
    # The topics of one upsert table are checked together: each key's last change may come from any of them.
    for topics in upsert_topics.values():
        letters = {topic: dead_letter_filter(routes.dead_letter_app_ids(topic), topic) for topic in topics}
        spec = routes.table_for(topics[0])
        reports.append(check_upsert_table(config, spec, topics, settings, letters, pipeline_factory, timeout_s))
    return reports


def _check_topic(
    config: Config,
    topic: str,
    specs: list[TableSpec],
    dead_letter_app_ids: tuple[str, ...],
    settings: Mapping[str, str],
    timeout_s: float | None,
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline] | None,
) -> Report:
    for spec in specs:
        _check_metadata(spec)
    spec = specs[0]
    options = config.table.storage_options
    bootstrap = config.kafka.bootstrap_servers
    partitions = topic_partitions(bootstrap, topic, settings)

    def rows_of_this_topic(table: TableSpec) -> Where:
        def where(schema: pa.Schema) -> pc.Expression | None:
            if "kafka_topic" not in schema.names:
                return None
            # A table only this topic writes: rows from before its topic was recorded are its too.
            mine = pc.field("kafka_topic") == topic
            return mine if table.txn_ids.multi_topic else mine | pc.field("kafka_topic").is_null()

        return where

    # Tables first, then the topic: every committed offset is below the high watermarks read after.
    tables = [
        read_table(
            s.uri,
            options,
            s.txn_ids.prefix(topic),
            partitions,
            "kafka_partition",
            "kafka_offset",
            rows_of_this_topic(s),
            topic=topic,
            legacy_app_id=s.txn_ids.legacy_prefix,
        )
        for s in specs
    ]
    beyond_txn: dict[int, np.ndarray] = {}
    for table in tables:
        for partition, beyond in rows_beyond_txn(table).items():
            beyond_txn[partition] = np.union1d(beyond_txn.get(partition, np.empty(0, np.int64)), beyond)
    main = tables[0]
    # A table not made yet (no row) holds a partition up to its mark too: its dead letters alone were committed.
    if len(tables) > 1 or any(main.txns[p] is None for p in partitions):
        uris = [s.uri for s in specs]
        marks = start_marks(spec.dead_letter_uri, options, dead_letter_app_ids[0], topic, uris, partitions)
        # A table with no txn of a partition, only a start mark, holds it up to the mark (DESIGN.md, invariant 11).
        held = {
            p: [
                v for uri, t in zip(uris, tables, strict=True) if (v := _or(t.txns[p], marks.get((uri, p)))) is not None
            ]
            for p in partitions
        }
        main = TableSnapshot(
            ", ".join(s.uri for s in specs),
            main.version,
            main.schema,
            {p: min(versions) if versions else None for p, versions in held.items()},
            pa.concat_tables([t.rows for t in tables]),
            untraced=sum(t.untraced for t in tables),
        )
    dead_letter_uri = spec.dead_letter_uri

    def letters_of_this_topic(schema: pa.Schema) -> pc.Expression:
        return dead_letter_filter(dead_letter_app_ids, topic)

    letters = read_table(
        dead_letter_uri,
        options,
        f"{dead_letter_app_ids[0]}-dlq",
        partitions,
        "partition",
        "offset",
        letters_of_this_topic,
        topic=topic,
        legacy_app_id=None if spec.txn_ids.legacy_prefix is None else f"{spec.txn_ids.legacy_prefix}-dlq",
    )
    filtered = None
    if spec.filter and pipeline_factory is not None:
        schema = main.schema
        if schema is None:
            schema = parse_schema(dict(spec.columns)) if spec.columns else pa.schema([])
        filtered = pipeline_filter(pipeline_factory(schema, spec))
    deadline = Deadline(timeout_s)  # for the topic's whole read, its cleanup policy included
    compacted = is_compacted(bootstrap, topic, settings, deadline)
    # Found by review: a changelog without an envelope writes tombstones as delete rows, not skips.
    tombstone_rows = spec.changes is not None and spec.changes.takes_tombstones
    offsets = read_topic(
        bootstrap,
        topic,
        settings,
        filtered=filtered,
        deadline=deadline,
        compacted=compacted,
        tombstone_rows=tombstone_rows,
    )
    logger.info(
        "read %d messages of %s; table %s v%s, dead-letter table v%s",
        sum(o.size for o in offsets.offsets.values()),
        topic,
        spec.name,
        main.version,
        letters.version,
    )
    partition_reports = compare(offsets, main.rows, letters.rows, main.txns, letters.txns, beyond_txn)
    deletions: dict[str, Deletions] = {}
    if any(p.missing for p in partition_reports):  # rows a later commit deleted? (reads the tables' history)
        missing = {p.partition: np.array(p.missing, np.int64) for p in partition_reports if p.missing}
        deleted: dict[int, np.ndarray] = {}

        def look(
            uri: str, version: int, columns: tuple[str, str], where: Where, where_columns: tuple[str, ...]
        ) -> None:
            left = {p: np.setdiff1d(o, deleted.get(p, np.empty(0, np.int64))) for p, o in missing.items()}
            if not any(o.size for o in left.values()):
                return  # all explained already: this table's log is not read
            found = deleted_rows(uri, options, version, *columns, where, where_columns, left, deadline)
            deletions[uri] = found
            for partition, gone in found.offsets.items():
                deleted[partition] = np.union1d(deleted.get(partition, np.empty(0, np.int64)), gone)

        # The dead-letter table first: its log is short (a commit only when messages fail), and what it explains
        # may spare reading the tables' long ones.
        if letters.version is not None:  # dead letters erased by hand (the GDPR step of docs/MAINTENANCE.md)
            look(dead_letter_uri, letters.version, ("partition", "offset"), letters_of_this_topic, ("app_id", "topic"))
        for s, t in zip(specs, tables, strict=True):
            if t.version is not None:
                look(t.uri, t.version, ("kafka_partition", "kafka_offset"), rows_of_this_topic(s), ("kafka_topic",))
        partition_reports = compare(offsets, main.rows, letters.rows, main.txns, letters.txns, beyond_txn, deleted)
    return Report(
        topic,
        main.uri,
        dead_letter_uri,
        partition_reports,
        {t.uri: log_gaps(t.uri, options) for t in tables if t.version is not None},
        log_gaps(dead_letter_uri, options) if letters.version is not None else [],
        table_version=main.version,
        dead_letter_version=letters.version,
        untraced=main.untraced,
        deleted_by_version={uri: found.by_version for uri, found in deletions.items()},
        deletes_unreadable={uri: found.unreadable for uri, found in deletions.items()},
        log_starts_at={uri: found.log_starts_at for uri, found in deletions.items()},
    )


def _check_metadata(spec: TableSpec) -> None:
    """The rows of ``spec``'s table must say where they came from."""
    metadata = set(spec.metadata_columns)
    key = f"{spec.route}.metadata_columns" if spec.route != "table" else "table.metadata_columns"
    if not {"partition", "offset"} <= metadata:
        missing = sorted({"partition", "offset"} - metadata)
        raise ConfigError(
            key,
            f"verify needs the Kafka partition and offset of every row, and {missing} is not recorded: "
            'set metadata_columns = ["topic", "partition", "offset"] (rows written before then carry '
            "no offset and would count as missing)",
        )
    if spec.txn_ids.multi_topic and "topic" not in metadata:
        raise ConfigError(key, f"several topics can write {spec.uri}: verify needs the topic of every row as well")


# Group-membership settings mean nothing to a consumer that is assigned its partitions.
_CONSUMER_ONLY_FOR_GROUPS = frozenset({"group.instance.id", "partition.assignment.strategy"})


def command(
    config: Config,
    as_json: bool,
    timeout_s: float | None,
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline] | None = None,
) -> int:
    """``kafka2delta verify``: print the report of each topic (text, or JSON: one object for one topic, else
    ``{"ok": …, "reports": [...]}``) and return the exit code."""
    try:
        reports = check(config, timeout_s, pipeline_factory)
    except (RetryableError, FatalError) as exc:
        logger.error("verify could not complete: %s", exc)
        return EXIT_UNCHECKED
    ok = all(report.ok for report in reports)
    # An upsert table whose early changes retention deleted, and nothing else wrong: not checked, rather than failed.
    unchecked = [r for r in reports if isinstance(r, ChangesReport) and not r.checkable]
    failed = [r for r in reports if not r.ok and r not in unchecked]
    if as_json:
        if len(reports) == 1:
            print(reports[0].to_json(), flush=True)
        else:
            documents = [json.loads(report.to_json()) for report in reports]
            print(json.dumps({"ok": ok, "reports": documents}, indent=2), flush=True)
    else:
        print("\n\n".join(report.render() for report in reports), flush=True)
    return EXIT_FAILED if failed else EXIT_UNCHECKED if unchecked else EXIT_OK


def _or(txn: int | None, mark: int | None) -> int | None:
    return txn if txn is not None else mark
