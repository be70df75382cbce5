"""An independent exactly-once checker: the topic, read with its own consumer, against both tables.

``kafka2delta verify -c config.toml`` reads every partition of the topic from its low to its high
watermark (no consumer group, nothing committed), the main table's metadata columns (partition and
offset of each row, see ``table.metadata_columns``) and the dead-letter table, and reports per
partition: messages produced, rows, dead letters, expected skips (empty payloads, and messages the
configured filter drops), missing offsets, duplicated offsets, offsets present in both tables, rows
at offsets the topic does not hold; plus gaps in the Delta log versions. Offsets after the main
table's txn version are not final yet: they are reported as pending, never as missing.

It shares no state with the daemon; it only reuses the deserializer and transforms to tell which
messages the filter drops. Both tables are read (one snapshot each, txn versions and rows from the
same version) before the topic, so every committed offset is below the high watermarks read.

Exit codes of the command: 0 nothing lost or duplicated, 1 a problem found (named in the report),
2 bad configuration (``table.metadata_columns`` without partition and offset, say), 3 the check could
not be made (Kafka or storage unreachable, ``--timeout`` reached).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.config import Config
from kafka2delta.errors import ConfigError, FatalError, MessageError, RetryableError
from kafka2delta.kafka import subscribed_topics, topic_partitions
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import PartitionMessages
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.schema import parse_schema
from kafka2delta.verify_changes import ChangesReport, check_upsert_table
from kafka2delta.writer import log_versions

logger = logging.getLogger(__name__)

_SHOWN = 20  # offsets listed per problem in the text report (the JSON report has them all)
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_UNCHECKED = 0, 1, 2, 3


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
    dead_letter_committed: int | None = None
    """The dead-letter table's txn version (``<app_id>-dlq-<p>``): may be ahead of ``committed``."""
    before_low: int = 0
    """Rows and dead letters at offsets before ``low``: deleted from the topic by retention, not checkable."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.in_both or self.unexpected)


@dataclass
class Report:
    topic: str
    table_uri: str
    dead_letter_uri: str
    partitions: list[PartitionReport]
    log_gaps: list[int] = field(default_factory=list)
    """Versions missing between the oldest and newest commit file of the main table's log."""
    dead_letter_log_gaps: list[int] = field(default_factory=list)
    table_version: int | None = None
    dead_letter_version: int | None = None

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
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions) and not self.log_gaps and not self.dead_letter_log_gaps

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update(
            ok=self.ok,
            lost=self.lost,
            duplicated_total=self.duplicated,
            in_both_total=self.in_both,
            unexpected_total=self.unexpected,
            produced=sum(p.produced for p in self.partitions),
            rows=sum(p.rows for p in self.partitions),
            dead_letters=sum(p.dead_letters for p in self.partitions),
            skipped=sum(p.skipped for p in self.partitions),
            pending=sum(p.pending for p in self.partitions),
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
            f"{'skipped':>7} {'pending':>7} {'missing':>7} {'dup':>5} {'both':>5} {'unexp':>5}",
        ]
        for p in self.partitions:
            span = f"{p.low}..{p.high - 1}" if p.high > p.low else "empty"
            lines.append(
                f"{p.partition:>9} {span:>17} {p.produced:>9} {txn(p.committed):>9} {txn(p.dead_letter_committed):>9} "
                f"{p.rows:>9} {p.dead_letters:>6} {p.skipped:>7} {p.pending:>7} {len(p.missing):>7} "
                f"{len(p.duplicated):>5} {len(p.in_both):>5} {len(p.unexpected):>5}"
            )
            for name in ("missing", "duplicated", "in_both", "unexpected"):
                offsets: list[int] = getattr(p, name)
                if offsets:
                    more = f" … ({len(offsets)} in all)" if len(offsets) > _SHOWN else ""
                    lines.append(f"{'':>9} {name} offsets: {offsets[:_SHOWN]}{more}")
            if p.before_low:
                lines.append(f"{'':>9} {p.before_low} rows/dead letters before offset {p.low} (deleted by retention)")
        if self.log_gaps:
            lines.append(f"gaps in the table's log versions: {self.log_gaps[:_SHOWN]}")
        if self.dead_letter_log_gaps:
            lines.append(f"gaps in the dead-letter table's log versions: {self.dead_letter_log_gaps[:_SHOWN]}")
        totals = (
            f"{sum(p.produced for p in self.partitions)} messages: {sum(p.rows for p in self.partitions)} rows, "
            f"{sum(p.dead_letters for p in self.partitions)} dead letters, "
            f"{sum(p.skipped for p in self.partitions)} skipped, {sum(p.pending for p in self.partitions)} pending"
        )
        lines.append(totals)
        verdict = "OK" if self.ok else "FAILED"
        summary = f"{verdict}: lost {self.lost}, duplicated {self.duplicated}"
        if self.in_both or self.unexpected or self.log_gaps or self.dead_letter_log_gaps:
            summary += (
                f", in both tables {self.in_both}, unexpected {self.unexpected}, "
                f"log gaps {len(self.log_gaps) + len(self.dead_letter_log_gaps)}"
            )
        problems = [
            f"{name} {p.partition}:{getattr(p, name)[:5]}"
            for p in self.partitions
            for name in ("missing", "duplicated", "in_both", "unexpected")
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


Skip = Callable[[PartitionMessages], bool]
"""Given one message (as a PartitionMessages of one), whether it is expected in neither table (filtered)."""
Filtered = Callable[[PartitionMessages], Iterable[int]]
"""Given messages of one partition, the offsets of those the configured filter drops."""


def read_topic(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, str],
    is_skipped: Skip | None = None,
    batch_size: int = 10_000,
    *,
    filtered: Filtered | None = None,
    timeout_s: float | None = None,
) -> TopicOffsets:
    """Read every partition from its low watermark to the high watermark seen now.

    ``is_skipped`` is asked about each message, ``filtered`` about batches of one partition (up to
    ``batch_size`` messages); empty payloads are always skipped. ``timeout_s`` bounds the whole read
    (:class:`RetryableError` naming the partitions not read to their end).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(cap: float) -> float:
        if deadline is None:
            return cap
        left = deadline - time.monotonic()
        if left <= 0:
            raise RetryableError(f"reading {topic}: timed out after {timeout_s} s")
        return min(cap, left)

    consumer = Consumer(
        {
            **settings,
            "bootstrap.servers": bootstrap_servers,
            # Its own group (never joined: partitions are assigned), nothing committed.
            "group.id": f"kafka2delta-verify-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=remaining(30)).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ConfigError("kafka.topic", f"topic {topic!r} does not exist")
        partitions = sorted(metadata.partitions)
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for partition in partitions:
            low[partition], high[partition] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=remaining(30)
            )
        todo = {p for p in partitions if high[p] > low[p]}
        consumer.assign([TopicPartition(topic, p, low[p]) for p in sorted(todo)])
        offsets: dict[int, list[int]] = {p: [] for p in partitions}
        skipped: dict[int, list[int]] = {p: [] for p in partitions}
        pending: dict[int, list[Any]] = {p: [] for p in partitions}
        while todo:
            try:
                wait = remaining(1.0)
            except RetryableError:
                unread = ", ".join(
                    f"{p} (at {offsets[p][-1] if offsets[p] else low[p]} of {high[p]})" for p in sorted(todo)
                )
                raise RetryableError(f"reading {topic}: timed out after {timeout_s} s; partitions {unread}") from None
            for message in consumer.consume(batch_size, timeout=wait):
                taken = _take(message, topic, high, todo, offsets, skipped, is_skipped)
                if taken is not None and filtered is not None and message.value():
                    batch = pending[taken]
                    batch.append(message)
                    if len(batch) >= batch_size:
                        _filter_batch(topic, taken, batch, filtered, skipped)
        if filtered is not None:
            for partition, batch in pending.items():
                _filter_batch(topic, partition, batch, filtered, skipped)
        return TopicOffsets(
            low,
            high,
            {p: np.array(found, np.int64) for p, found in offsets.items()},
            {p: np.array(sorted(found), np.int64) for p, found in skipped.items()},
        )
    except KafkaException as exc:
        raise RetryableError(f"reading {topic} from {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _take(
    message: Any,
    topic: str,
    high: Mapping[int, int],
    todo: set[int],
    offsets: dict[int, list[int]],
    skipped: dict[int, list[int]],
    is_skipped: Skip | None,
) -> int | None:
    """Record one consumed message; return its partition when it is one of the offsets read."""
    partition, offset = message.partition(), message.offset()
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            todo.discard(partition)
            return None
        raise RetryableError(f"reading {topic}[{partition}]: {error.str()}")
    if partition not in todo or offset >= high[partition]:
        if offset + 1 >= high[partition]:
            todo.discard(partition)
        return None
    offsets[partition].append(offset)
    payload = message.value()
    if not payload:
        skipped[partition].append(offset)
    elif is_skipped is not None:
        single = PartitionMessages(
            topic, partition, [offset], [payload], [message.timestamp()[1]], [message.key()], [message.headers()], [0]
        )
        if is_skipped(single):
            skipped[partition].append(offset)
    if offset + 1 >= high[partition]:
        todo.discard(partition)
    return int(partition)


def _filter_batch(
    topic: str, partition: int, batch: list[Any], filtered: Filtered, skipped: dict[int, list[int]]
) -> None:
    if not batch:
        return
    messages = PartitionMessages(
        topic,
        partition,
        [m.offset() for m in batch],
        [m.value() for m in batch],
        [m.timestamp()[1] for m in batch],
        [m.key() for m in batch],
        [m.headers() for m in batch],
        [m.timestamp()[0] for m in batch],
    )
    skipped[partition].extend(filtered(messages))
    batch.clear()


def pipeline_filter(pipeline: Pipeline) -> Filtered:
    """:data:`Filtered` from the daemon's own stages: the offsets that are neither a row, a dead letter
    nor an empty payload are the ones the filter dropped (a message's outcome never depends on its
    neighbours, so a batch gives what the daemon's batches gave)."""

    def filtered(messages: PartitionMessages) -> list[int]:
        result = pipeline.process(messages)
        decided = set(result.row_offsets) | {letter.offset for letter in result.dead_letters}
        return [
            offset
            for offset, payload in zip(messages.offsets, messages.payloads, strict=True)
            if payload and offset not in decided
        ]

    return filtered


@dataclass
class TableSnapshot:
    """One version of a table: its txn versions and the ``(partition, offset)`` of its rows."""

    uri: str
    version: int | None
    """None: the table does not exist."""
    schema: pa.Schema | None
    txns: dict[int, int | None]
    rows: pa.Table


def read_table(
    uri: str,
    storage_options: Mapping[str, str],
    app_id: str,
    partitions: Iterable[int],
    partition_column: str,
    offset_column: str,
    where: Callable[[pa.Schema], pc.Expression | None] | None = None,
) -> TableSnapshot:
    """Txn versions ``<app_id>-<p>`` (``app_id``: the table's txn prefix for the topic, see
    :class:`kafka2delta.offsets.TxnIds`) and rows from ONE version of the table (an absent table is empty)."""
    partitions = list(partitions)
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return TableSnapshot(uri, None, None, dict.fromkeys(partitions), _pairs())
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    try:
        schema = pa.schema(table.schema().to_arrow())
        for column in (partition_column, offset_column):
            if column not in schema.names:
                raise ConfigError(
                    "table.metadata_columns",
                    f"{uri} has no column {column!r}: verify needs the partition and offset of every row",
                )
        txns = {p: table.transaction_version(f"{app_id}-{p}") for p in partitions}
        rows = table.to_pyarrow_dataset().to_table(
            columns=[partition_column, offset_column], filter=where(schema) if where else None
        )
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    return TableSnapshot(
        uri,
        table.version(),
        schema,
        txns,
        pa.table(
            {
                "partition": rows.column(partition_column).cast(pa.int64()),
                "offset": rows.column(offset_column).cast(pa.int64()),
            }
        ),
    )


def _pairs() -> pa.Table:
    return pa.table({"partition": pa.array([], pa.int64()), "offset": pa.array([], pa.int64())})


def table_offsets(
    uri: str,
    storage_options: Mapping[str, str],
    partition_column: str,
    offset_column: str,
    where: pa.compute.Expression | None = None,
) -> pa.Table:
    """``(partition, offset)`` of every row of a table (``where`` restricts rows), or an empty table."""
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options))
    except TableNotFoundError:
        return pa.table({"partition": pa.array([], pa.int64()), "offset": pa.array([], pa.int64())})
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    names = pa.schema(table.schema().to_arrow()).names
    for column in (partition_column, offset_column):
        if column not in names:
            raise ConfigError(
                "table.metadata_columns",
                f"{uri} has no column {column!r}: verify needs the partition and offset of every row",
            )
    rows = table.to_pyarrow_dataset().to_table(columns=[partition_column, offset_column], filter=where)
    return pa.table(
        {
            "partition": rows.column(partition_column).cast(pa.int64()),
            "offset": rows.column(offset_column).cast(pa.int64()),
        }
    )


def committed_versions(
    uri: str, storage_options: Mapping[str, str], app_id: str, partitions: Iterable[int]
) -> dict[int, int | None]:
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options))
    except TableNotFoundError:
        return dict.fromkeys(partitions)
    return {p: table.transaction_version(f"{app_id}-{p}") for p in partitions}


def compare(
    topic: TopicOffsets,
    rows: pa.Table,
    dead_letters: pa.Table,
    committed: Mapping[int, int | None],
    dead_letter_committed: Mapping[int, int | None] | None = None,
) -> list[PartitionReport]:
    """Per partition: what the topic holds against the rows and dead letters. Rows and dead letters at
    offsets before the low watermark (deleted by retention) are counted, not checked."""
    reports = []
    row_groups = _by_partition(rows)
    letter_groups = _by_partition(dead_letters)
    for partition in sorted(topic.offsets):
        produced = topic.offsets[partition]
        row_offsets = row_groups.get(partition, np.empty(0, np.int64))
        letter_offsets = letter_groups.get(partition, np.empty(0, np.int64))
        done = committed.get(partition)
        final = produced[produced <= done] if done is not None else produced[:0]
        skipped = np.intersect1d(topic.skipped[partition], final)
        outcome = np.concatenate([row_offsets, letter_offsets])
        expected = np.setdiff1d(final, skipped)
        allowed = np.setdiff1d(produced, skipped)  # offsets where a row or a dead letter may be
        low = topic.low[partition]
        seen = np.union1d(row_offsets, letter_offsets)
        reports.append(
            PartitionReport(
                partition=partition,
                low=topic.low[partition],
                high=topic.high[partition],
                produced=int(produced.size),
                committed=done,
                rows=int(row_offsets.size),
                dead_letters=int(letter_offsets.size),
                skipped=int(skipped.size),
                pending=int(produced.size - final.size),
                missing=_ints(np.setdiff1d(expected, outcome)),
                duplicated=_ints(np.union1d(_repeated(row_offsets), _repeated(letter_offsets))),
                in_both=_ints(np.intersect1d(row_offsets, letter_offsets)),
                unexpected=_ints(np.setdiff1d(seen[seen >= low], allowed)),
                dead_letter_committed=(dead_letter_committed or {}).get(partition),
                before_low=int((row_offsets < low).sum() + (letter_offsets < low).sum()),
            )
        )
    return reports


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


def dead_letter_filter(app_ids: str | Sequence[str], topic: str) -> pa.compute.Expression:
    """The dead letters of ``topic`` written under one of ``app_ids``."""
    ids = [app_ids] if isinstance(app_ids, str) else list(app_ids)
    return pc.field("app_id").isin(ids) & (pc.field("topic") == topic)


def skip_by_filter(document: Callable[[PartitionMessages], Any]) -> Skip:
    """A :data:`Skip` from a function that returns the transformed document or None when filtered;
    a message the stages reject is a dead letter, not a skip."""

    def is_skipped(messages: PartitionMessages) -> bool:
        try:
            return document(messages) is None
        except MessageError:
            return False

    return is_skipped


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
    for topic in subscribed_topics(config.kafka.bootstrap_servers, config.kafka, settings):
        upsert = routes.table_for(topic)
        if upsert.changes is not None and upsert.changes.upsert:  # a changelog is checked as any append
            letters = dead_letter_filter(routes.dead_letter_app_ids(topic), topic)
            reports.append(check_upsert_table(config, upsert, topic, settings, letters, pipeline_factory))
            continue
        # With [routing] expression a topic's messages spread over its routes' tables: their rows are read as one.
        specs = {spec.uri: spec for spec in [routes.table_for(topic)]}
        if config.routing.expression:
            specs.update((spec.uri, spec) for spec in routes.tables_by_name(topic).values())
        reports.append(
            _check_topic(
                config,
                topic,
                list(specs.values()),
                routes.dead_letter_app_ids(topic),
                settings,
                timeout_s,
                pipeline_factory,
            )
        )
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
    partitions = topic_partitions(config.kafka.bootstrap_servers, topic, settings)

    def rows_of_this_topic(schema: pa.Schema) -> pc.Expression:
        if "kafka_topic" in schema.names:
            return pc.field("kafka_topic") == topic
        return pc.field("kafka_partition").is_valid()

    # Tables first, then the topic: every committed offset is below the high watermarks read after.
    tables = [
        read_table(
            s.uri, options, s.txn_ids.prefix(topic), partitions, "kafka_partition", "kafka_offset", rows_of_this_topic
        )
        for s in specs
    ]
    main = tables[0]
    if len(tables) > 1:
        held = {p: [v for t in tables if (v := t.txns[p]) is not None] for p in partitions}
        main = TableSnapshot(
            ", ".join(s.uri for s in specs),
            main.version,
            main.schema,
            {p: min(versions) if versions else None for p, versions in held.items()},
            pa.concat_tables([t.rows for t in tables]),
        )
    dead_letter_uri = spec.dead_letter_uri
    letters = read_table(
        dead_letter_uri,
        options,
        f"{dead_letter_app_ids[0]}-dlq",
        partitions,
        "partition",
        "offset",
        lambda schema: dead_letter_filter(dead_letter_app_ids, topic),
    )
    filtered = None
    if config.filter.expression and pipeline_factory is not None:
        schema = main.schema
        if schema is None:
            schema = parse_schema(dict(spec.columns)) if spec.columns else pa.schema([])
        filtered = pipeline_filter(pipeline_factory(schema, spec))
    offsets = read_topic(config.kafka.bootstrap_servers, topic, settings, filtered=filtered, timeout_s=timeout_s)
    logger.info(
        "read %d messages of %s; table %s v%s, dead-letter table v%s",
        sum(o.size for o in offsets.offsets.values()),
        topic,
        spec.name,
        main.version,
        letters.version,
    )
    return Report(
        topic,
        main.uri,
        dead_letter_uri,
        compare(offsets, main.rows, letters.rows, main.txns, letters.txns),
        [gap for t in tables if t.version is not None for gap in log_gaps(t.uri, options)],
        log_gaps(dead_letter_uri, options) if letters.version is not None else [],
        table_version=main.version,
        dead_letter_version=letters.version,
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
    if as_json:
        if len(reports) == 1:
            print(reports[0].to_json(), flush=True)
        else:
            documents = [json.loads(report.to_json()) for report in reports]
            print(json.dumps({"ok": ok, "reports": documents}, indent=2), flush=True)
    else:
        print("\n\n".join(report.render() for report in reports), flush=True)
    return EXIT_OK if ok else EXIT_FAILED
