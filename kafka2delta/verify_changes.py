"""``kafka2delta verify`` for an upsert table: per key, the table holds the last change of each key, and
nothing else.

The check reads the table (rows and txn versions from one snapshot), then every partition of its topics
from its low watermark up to the table's txn version (what the table says it has applied), runs those
messages through the daemon's own stages (the same config: envelope, key, transforms, coercion), collapses
them to the last change per key (by partition, then offset), and compares: keys the table lacks, keys it
holds that no change left standing, and keys whose values differ (the columns named). Dead letters are
checked too: every message the stages reject must be in the dead-letter table. The topics that feed one table are
checked together. A topic whose retention deleted early changes cannot be checked this way (``low`` above 0 is
reported: not checkable, unless something else is found wrong). Keys that are missing or differ are looked for in
the commits not made by the daemon (:mod:`kafka2delta.verify_later_changes`): a key ``jobs ttl`` or ``jobs mutate``
deleted or changed after its last change was written is counted as deleted or changed later, not as a fault.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.changes import DELETE_FLAG, DELETED_COLUMN, last_changes_of
from kafka2delta.changes.collapse import UNAVAILABLE_FLAG
from kafka2delta.changes.options import CHANGE_COLUMNS
from kafka2delta.config import Config
from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.kafka import topic_partitions
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import PartitionMessages
from kafka2delta.routing import TableSpec
from kafka2delta.verify_later_changes import KeyCommit, key_of, later_changes
from kafka2delta.verify_reading import (
    Deadline,
    is_compacted,
    partition_messages,
    read_partitions,
    read_table,
    txn_versions,
    verify_consumer,
    watermarks,
)

_SHOWN = 10
OFFSET_COLUMN, LSN_COLUMN = "kafka_offset", CHANGE_COLUMNS["lsn"][0]
"""Columns unique per change of a key, when the table has them: the Kafka offset, the source position."""


@dataclass
class ChangesReport:
    topic: str
    """The topics of the table, comma-separated (several topics may feed one upsert table)."""
    table: str
    table_version: int | None
    txns: dict[str, dict[int, int | None]]
    """Per topic, per partition: the table's txn version."""
    low: dict[str, dict[int, int]]
    keys: int = 0
    """Keys the changes leave standing (rows the table should hold)."""
    missing: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)
    duplicated: list[Any] = field(default_factory=list)
    """Keys the table holds more than once (an insert where an update was due)."""
    different: list[tuple[Any, list[str]]] = field(default_factory=list)
    """Keys whose row differs, with the columns that differ."""
    dead_letters_missing: list[tuple[str, int, int]] = field(default_factory=list)
    messages: int = 0
    deleted_later: list[Any] = field(default_factory=list)
    """Keys a later commit not made by the daemon deleted (``jobs ttl``, a ``jobs mutate`` DELETE): not missing."""
    changed_later: list[Any] = field(default_factory=list)
    """Keys later commits not made by the daemon changed to the row the table holds: not differing."""
    later_commits: dict[int, KeyCommit] = field(default_factory=dict)
    later_unreadable: dict[int, str] = field(default_factory=dict)
    """Commits whose rows cannot be told, by version: why (files vacuumed, deletion vectors …)."""
    log_starts_at: int = 0
    """Where the log read for those commits starts, when it has been cleaned up or has a gap (0: not)."""
    unmarked: list[Any] = field(default_factory=list)
    """Soft deletes of keys no change read upserted, with no row in the table: nothing to mark (its insert a dead
    letter, or older than the topic's history), not missing. After compaction took the key's upserts, a tombstone a
    job purged or the daemon lost looks the same."""
    compacted_away: list[Any] = field(default_factory=list)
    """Soft tombstones of a compacted topic that has no change of their key left: not extra."""
    later_by_value: bool = False
    """Rows were matched by value (a row looked for has no value unique to its change: ``kafka_offset`` or ``_lsn``,
    ``_lsn`` for a soft tombstone): a key whose last change brought back the values a job deleted or changed before
    would be explained too."""

    @property
    def truncated(self) -> dict[str, dict[int, int]]:
        """Partitions whose first changes retention deleted: their keys cannot be replayed."""
        return {topic: found for topic, lows in self.low.items() if (found := {p: v for p, v in lows.items() if v})}

    @property
    def problems(self) -> bool:
        return bool(self.missing or self.extra or self.duplicated or self.different or self.dead_letters_missing)

    @property
    def ok(self) -> bool:
        return not self.truncated and not self.problems

    @property
    def checkable(self) -> bool:
        """False when retention deleted changes and nothing else was found wrong (exit 3, not 1)."""
        return not self.truncated or self.problems

    def to_json(self) -> str:
        return json.dumps(
            {
                "topic": self.topic,
                "table": self.table,
                "mode": "upsert",
                "ok": self.ok,
                "table_version": self.table_version,
                "txns": {topic: {str(p): v for p, v in txns.items()} for topic, txns in self.txns.items()},
                "messages_applied": self.messages,
                "keys": self.keys,
                "missing_keys": [repr(k) for k in self.missing],
                "extra_keys": [repr(k) for k in self.extra],
                "duplicated_keys": [repr(k) for k in self.duplicated],
                "different": [{"key": repr(k), "columns": c} for k, c in self.different],
                "dead_letters_missing": self.dead_letters_missing,
                "deleted_later_keys": [repr(k) for k in self.deleted_later],
                "changed_later_keys": [repr(k) for k in self.changed_later],
                "soft_deletes_without_row_keys": [repr(k) for k in self.unmarked],
                "tombstones_compacted_away_keys": [repr(k) for k in self.compacted_away],
                "later_commits": {
                    str(at): {"operation": c.operation, "keys": c.keys} for at, c in sorted(self.later_commits.items())
                },
                "later_commits_unreadable": {str(at): why for at, why in sorted(self.later_unreadable.items())},
                "later_matched_by_value": self.later_by_value,
                "log_starts_at": self.log_starts_at,
                "low_watermarks": {topic: {str(p): v for p, v in low.items()} for topic, low in self.low.items()},
            },
            indent=2,
        )

    def render(self) -> str:
        lines = [
            f"topic {self.topic} → upsert table {self.table} (version {self.table_version})",
            f"  {self.messages} messages applied (up to the txn versions {self.txns}), {self.keys} keys standing",
        ]
        if self.truncated:
            lines.append(f"  NOT CHECKABLE: retention deleted the first changes of partitions {self.truncated}")
        found = (
            ("missing keys", self.missing),
            ("extra keys", self.extra),
            ("keys held more than once", self.duplicated),
        )
        for label, keys in found:
            if keys:
                lines.append(f"  {label}: {len(keys)} (e.g. {', '.join(repr(k) for k in keys[:_SHOWN])})")
        if self.different:
            shown = "; ".join(f"{k!r}: {c}" for k, c in self.different[:_SHOWN])
            lines.append(f"  rows that differ: {len(self.different)} ({shown})")
        if self.dead_letters_missing:
            lines.append(f"  dead letters not recorded: {self.dead_letters_missing[:_SHOWN]}")
        if self.unmarked:
            shown = ", ".join(repr(k) for k in self.unmarked[:_SHOWN])
            lines.append(
                f"  soft deletes with no upsert read and no row: {len(self.unmarked)} (e.g. {shown}; nothing to mark)"
            )
        if self.compacted_away:
            shown = ", ".join(repr(k) for k in self.compacted_away[:_SHOWN])
            lines.append(
                f"  tombstones whose key compaction left no change of: {len(self.compacted_away)} (e.g. {shown}; "
                "the table keeps the marked row)"
            )
        for label, keys in (("deleted", self.deleted_later), ("changed", self.changed_later)):
            if keys:
                shown = ", ".join(repr(k) for k in keys[:_SHOWN])
                lines.append(f"  keys later commits {label}: {len(keys)} (e.g. {shown}; counted, not faults)")
        if self.later_commits:
            shown = ", ".join(f"v{at} {c.operation} {c.keys}" for at, c in sorted(self.later_commits.items())[:_SHOWN])
            lines.append(f"  the commits not made by the daemon that left them so: {shown}")
            if self.later_by_value:
                lines.append(
                    "  (matched by value: a key looked for has no value unique to its change; "
                    'table.metadata_columns with "offset" makes the match exact, and _lsn (table.change_columns) for '
                    "soft deletes)"
                )
        if self.missing or self.different:
            for at, why in sorted(self.later_unreadable.items())[:_SHOWN]:
                lines.append(f"  what v{at} deleted or changed cannot be told from faults ({why})")
            if self.log_starts_at:
                lines.append(
                    f"  the log starts at v{self.log_starts_at} (cleaned up, or a gap): what older commits deleted "
                    "or changed cannot be told from faults"
                )
        later = [
            f"{label} later {len(keys)}"
            for label, keys in (("deleted", self.deleted_later), ("changed", self.changed_later))
            if keys
        ]
        said = f" ({', '.join(later)})" if later else ""
        if self.ok:
            lines.append(f"  OK: the table holds the last change of each key, and nothing else{said}")
        else:
            counts = [
                f"{label} {len(items)}"
                for label, items in (
                    ("missing", self.missing),
                    ("extra", self.extra),
                    ("duplicated", self.duplicated),
                    ("different", self.different),
                    ("dead letters not recorded", self.dead_letters_missing),
                )
                if items
            ]
            if self.truncated:
                counts.append(f"not checkable (retention) in {self.truncated}")
            lines.append(f"  FAILED: {', '.join(counts)}{said}")
        return "\n".join(lines)


def check_upsert_table(
    config: Config,
    spec: TableSpec,
    topics: list[str],
    settings: Mapping[str, str],
    dead_letters_of: Mapping[str, pc.Expression],
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline] | None,
    timeout_s: float | None = None,
) -> ChangesReport:
    """:func:`check_changes` for the upsert table ``topics`` go to (``dead_letters_of[topic]`` selects a topic's
    rows of its dead-letter table); ConfigError without the daemon's stages."""
    if pipeline_factory is None:
        raise ConfigError(f"{spec.route}.mode", "verify needs the daemon's stages to check an upsert table")
    options = config.table.storage_options
    bootstrap = config.kafka.bootstrap_servers
    deadline = Deadline(timeout_s)
    return check_changes(
        spec,
        {topic: topic_partitions(bootstrap, topic, settings) for topic in topics},
        bootstrap,
        settings,
        options,
        partial(dead_letter_offsets, spec.dead_letter_uri, options, dead_letters_of),
        pipeline_factory,
        deadline,
        lambda topic: is_compacted(bootstrap, topic, settings, deadline),
    )


def check_changes(
    spec: TableSpec,
    partitions: Mapping[str, list[int]],
    bootstrap_servers: str,
    settings: Mapping[str, str],
    storage_options: Mapping[str, str],
    dead_letters: Callable[[], set[tuple[str, int, int]]],
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline],
    deadline: Deadline | None = None,
    compacted: Callable[[str], bool] = lambda topic: False,
) -> ChangesReport:
    """The upsert table of ``spec`` against the changes of its topics (``partitions``: each topic's) up to its txn
    versions. ``dead_letters`` gives the ``(topic, partition, offset)`` of the dead letters the table's topics
    have; ``compacted(topic)``, whether the topic's ``cleanup.policy`` compacts it (asked only when it matters)."""
    assert spec.changes is not None
    deadline = deadline or Deadline(None)
    key = list(spec.changes.key)
    try:
        table = DeltaTable(spec.uri, storage_options=dict(storage_options) or None)
        # As for append tables: a joined table's one-topic ids count for their owner (found by review).
        txns = {
            topic: txn_versions(
                table,
                spec.uri,
                spec.txn_ids.prefix(topic),
                found,
                topic=topic,
                legacy_app_id=spec.txn_ids.legacy_prefix,
            )
            for topic, found in partitions.items()
        }
        rows = table.to_pyarrow_table()
        version: int | None = table.version()
        schema = pa.schema(table.schema().to_arrow())
    except TableNotFoundError:
        txns = {topic: dict.fromkeys(found) for topic, found in partitions.items()}
        rows, version, schema = pa.table({}), None, pa.schema([])
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {spec.uri}: {exc}") from exc
    recorded = dead_letters()
    messages: list[PartitionMessages] = []
    low: dict[str, dict[int, int]] = {}
    for topic, topic_txns in txns.items():
        upto = {p: v for p, v in topic_txns.items() if v is not None}
        read, low[topic] = read_changes(bootstrap_servers, topic, settings, upto, deadline=deadline)
        messages.extend(read)
    report = ChangesReport(", ".join(txns), spec.name, version, txns, low, messages=sum(len(m) for m in messages))
    pipeline = pipeline_factory(schema, spec)
    pieces: list[pa.Table] = []
    deletes: list[pa.Array] = []
    for piece in messages:
        processed = pipeline.process(piece)
        for letter in processed.dead_letters:
            if (piece.topic, letter.partition, letter.offset) not in recorded:
                report.dead_letters_missing.append((piece.topic, letter.partition, letter.offset))
        if processed.rows.num_rows:
            pieces.append(processed.rows)
            flags = processed.row_deletes
            deletes.append(flags if flags is not None else pa.array([False] * processed.rows.num_rows))
    expected_schema = pipeline.schema
    soft = spec.changes.delete_mode == "soft"
    # As the daemon collapses a flush (a whole history is one flush here): unchanged TOASTed values filled from
    # the key's earlier changes (found by review: they were compared as the placeholder).
    changes = (
        last_changes_of(pa.concat_tables(pieces, promote_options="permissive"), pa.concat_arrays(deletes), spec.changes)
        if pieces
        else None
    )
    expected: dict[Any, dict[str, Any]] = {}
    unplaced: dict[Any, dict[str, Any]] = {}
    if changes is not None:
        for row in changes.to_pylist():
            # Still a delete after the soft collapse: no change read upserted its key (a flipped soft delete is an
            # upsert, marked).
            if row.pop(DELETE_FLAG):
                if soft:
                    unplaced[key_of(row, key)] = row
                continue
            expected[key_of(row, key)] = row
    actual: dict[Any, dict[str, Any]] = {}
    held: Counter[Any] = Counter()
    for row in rows.to_pylist() if rows.num_rows else []:
        actual[key_of(row, key)] = row
        held[key_of(row, key)] += 1
    # The soft MERGE marks only a row it holds (found by review: a delete of a key the table never had, its insert a
    # dead letter or before the connector started, was reported missing); compaction that took the key's upserts
    # leaves a tombstone the table holds, compared as any.
    expected.update((k, row) for k, row in unplaced.items() if k in actual)
    report.unmarked = sorted((k for k in unplaced if k not in actual), key=repr)
    report.keys = len(expected)
    report.missing = sorted((k for k in expected if k not in actual), key=repr)
    report.extra = sorted((k for k in actual if k not in expected), key=repr)
    marked = [k for k in report.extra if actual[k].get(DELETED_COLUMN)] if soft else []
    if marked and any(compacted(topic) for topic in partitions):
        # Compaction keeps a key's last record, its tombstone, until delete.retention.ms: then the key has no change
        # left to read, and the table keeps its marked row (found by review: reported extra).
        report.compacted_away = marked
        report.extra = [k for k in report.extra if not actual[k].get(DELETED_COLUMN)]
    # The one fault a per-key dict would hide: the same key twice, an insert where an update was due (found by review).
    report.duplicated = sorted((k for k, count in held.items() if count > 1), key=repr)
    compared = [c for c in expected_schema.names if c in schema.names]
    differs = partial(_differs, compared, key, soft)
    for k in sorted(set(expected) & set(actual), key=repr):
        if columns := differs(expected[k], actual[k]):
            report.different.append((k, columns))
    if (report.missing or report.different) and version is not None:
        walked = partial(_tombstone_differs, compared, key) if soft else differs
        looked_for = [expected[k] for k in (*report.missing, *(k for k, _ in report.different))]
        by_value = not all(_unique(row, compared, soft) for row in looked_for)
        _explain_by_later_commits(
            report, spec.uri, storage_options, version, key, schema, expected, actual, walked, deadline, by_value
        )
    return report


def _differs(
    compared: list[str], key: list[str], soft: bool, want: Mapping[str, Any], got: Mapping[str, Any]
) -> list[str]:
    """The columns of ``compared`` in which ``got`` differs from the expected row ``want`` (a soft-deleted key: only
    its key and ``_deleted``)."""
    if soft and want.get(DELETED_COLUMN):
        compared = [c for c in compared if c in key or c == DELETED_COLUMN]
    # A TOASTed value no change in the history gave (retention deleted it) is the table's to keep.
    return [c for c in compared if want.get(c) != got.get(c) and not want.get(UNAVAILABLE_FLAG + c)]


def _tombstone_differs(
    compared: list[str], key: list[str], want: Mapping[str, Any], got: Mapping[str, Any]
) -> list[str]:
    """:func:`_differs` as the walk of a soft table's keys compares them: a tombstone on its key, ``_deleted`` and
    every other column it expects a value in (its data, as the key's last upsert left them, and the delete's change
    columns: told from the key's earlier tombstones), not where it expects null (compaction left only the delete, or
    Debezium's tombstone after it: the daemon's soft delete then keeps the row's own)."""
    if want.get(DELETED_COLUMN):
        compared = [c for c in compared if c in key or c == DELETED_COLUMN or want.get(c) is not None]
    return _differs(compared, key, False, want, got)


def _unique(row: Mapping[str, Any], compared: list[str], soft: bool) -> bool:
    """Whether the expected ``row`` has a value unique to its change among the compared columns: its Kafka offset, or
    its source position (a soft tombstone keeps its upsert's offset: only the position)."""
    columns = (LSN_COLUMN,) if soft and row.get(DELETED_COLUMN) else (OFFSET_COLUMN, LSN_COLUMN)
    return any(c in compared and row.get(c) is not None for c in columns)


def _explain_by_later_commits(
    report: ChangesReport,
    uri: str,
    storage_options: Mapping[str, str],
    version: int,
    key: list[str],
    schema: pa.Schema,
    expected: Mapping[Any, dict[str, Any]],
    actual: Mapping[Any, dict[str, Any]],
    differs: Callable[[dict[str, Any], dict[str, Any]], list[str]],
    deadline: Deadline,
    by_value: bool,
) -> None:
    """Move the missing and differing keys that commits not made by the daemon deleted or changed (``jobs ttl``,
    ``jobs mutate``) from the faults to ``deleted_later`` and ``changed_later``. ``by_value``: no column of the rows
    compared is unique per change (said in the report)."""
    held: dict[Any, dict[str, Any] | None] = {k: None for k in report.missing}
    held.update((k, actual[k]) for k, _ in report.different)
    found = later_changes(uri, storage_options, version, key, schema, expected, held, differs, deadline)
    report.deleted_later = sorted(found.deleted, key=repr)
    report.changed_later = sorted(found.changed, key=repr)
    report.missing = [k for k in report.missing if k not in found.deleted]
    report.different = [(k, c) for k, c in report.different if k not in found.changed]
    report.later_commits, report.later_unreadable = found.by_version, found.unreadable
    report.log_starts_at, report.later_by_value = found.log_starts_at, by_value


def read_changes(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, str],
    upto: Mapping[int, int],
    batch: int = 10_000,
    *,
    deadline: Deadline | None = None,
) -> tuple[list[PartitionMessages], dict[int, int]]:
    """Every message of ``topic`` from each partition's low watermark to ``upto[p]`` (inclusive), in pieces of
    one partition; and the low watermarks."""
    deadline = deadline or Deadline(None)
    consumer = verify_consumer(bootstrap_servers, settings)
    try:
        low = {p: bounds[0] for p, bounds in watermarks(consumer, topic, upto, deadline).items()}
        taken: dict[int, list[Any]] = {p: [] for p in upto}
        ranges = {p: (low[p], last + 1) for p, last in upto.items()}
        for messages in read_partitions(consumer, topic, ranges, deadline, batch):
            for message in messages:
                taken[message.partition()].append(message)
    finally:
        consumer.close()
    pieces = [
        partition_messages(topic, partition, chunk)
        for partition, found in sorted(taken.items())
        for chunk in (found[start : start + batch] for start in range(0, len(found), batch))
    ]
    return pieces, low


def dead_letter_offsets(
    uri: str, storage_options: Mapping[str, str], of_topic: Mapping[str, pc.Expression]
) -> set[tuple[str, int, int]]:
    """``(topic, partition, offset)`` of the dead letters in ``uri`` that ``of_topic[topic]`` selects."""
    found: set[tuple[str, int, int]] = set()
    for topic, where in of_topic.items():
        rows = read_table(uri, storage_options, "", [], "partition", "offset", lambda schema: where).rows  # noqa: B023
        found.update(
            (topic, p, o)
            for p, o in zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True)
        )
    return found
