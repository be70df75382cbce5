"""The tables one daemon writes, each with what changes together with it: its writer, its pipeline (fitted to
its schema), its committer and, with ``[coordinator] join_ingest``, its coordinator. A table is opened the
first time a partition routed to it is assigned, through the :data:`TableOpener` the CLI wires up (the
real Delta table) or a test provides (fakes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from kafka2delta.committer import Committer
from kafka2delta.config import IngestConfig, table_key, without_credentials
from kafka2delta.coordinator import Coordinator
from kafka2delta.edges import DeadLetterProducer, DeadLetterStore, TableWriter
from kafka2delta.encoded_rows import RowGroups
from kafka2delta.metrics import Metrics
from kafka2delta.pacing import CommitPacer
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import TopicPartition
from kafka2delta.retries import Retrier
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.status import StatusBoard

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class OpenedTable:
    """What opening a table gives: the edge to it, its stages, and its coordinator if it joins one."""

    writer: TableWriter
    pipeline: Pipeline
    coordinator: Coordinator | None = None


TableOpener = Callable[[TableSpec], OpenedTable]
RouterOpener = Callable[[], Pipeline]
"""Builds the route stage's pipeline (:mod:`kafka2delta.splitting`), with ``[routing] expression``."""


DeadLetterOpener = Callable[[str], DeadLetterStore]
"""Opens a route's own dead-letter table by URI (the daemon's is opened at start)."""


@dataclass(kw_only=True)
class TableSink:
    spec: TableSpec
    writer: TableWriter
    dead_letters: DeadLetterStore
    """Where the dead letters of the partitions this table takes go."""
    pipeline: Pipeline
    committer: Committer
    coordinator: Coordinator | None
    pacer: CommitPacer
    """How long this table's buffers may wait, from how fast all its writers commit."""
    next_idle_turn: float = 0.0
    """When to register the next empty coordinator turn (monotonic seconds)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def row_groups(self, ingest: IngestConfig) -> RowGroups | None:
        """How this table's lanes encode rows while buffered: only an unpartitioned append table's (a partitioned
        one splits a flush into a file per value, an upsert table's MERGE takes Arrow rows); None: at the flush."""
        changes = self.spec.changes
        if not ingest.row_group_rows or self.spec.partition_by or (changes is not None and changes.upsert):
            return None
        return RowGroups(ingest.compression, ingest.row_group_rows)


@dataclass(kw_only=True)
class TopicTables:
    """Where one topic's messages go: its home table (its first route's), and with ``[routing] expression``
    the router and the table of each route it may name."""

    home: TableSink
    router: Pipeline | None = None
    by_route: dict[str, TableSink]
    """Route name → table (empty when routing by topic)."""

    @property
    def sinks(self) -> list[TableSink]:
        return [self.home, *self.by_route.values()]

    @property
    def uris(self) -> list[str]:
        """Every table the topic's messages can go to, the home table first."""
        return [self.home.spec.uri, *sorted({t.spec.uri for t in self.by_route.values()} - {self.home.spec.uri})]


class Tables:
    """The open tables, by URI; a topic's tables are opened on first use."""

    def __init__(
        self,
        *,
        routes: Routes,
        opener: TableOpener,
        dead_letters: DeadLetterStore,
        dead_letter_topic: DeadLetterProducer | None,
        metrics: Metrics,
        retrier: Retrier,
        board: StatusBoard,
        clock: Callable[[], float],
        ingest: IngestConfig,
        router: RouterOpener | None = None,
        dead_letter_opener: DeadLetterOpener | None = None,
    ) -> None:
        self._routes = routes
        self._router = router
        self._routers: dict[str, TopicTables] = {}
        self._unheld_since: dict[str, float] = {}
        """Opened topics no assigned partition reads, by topic: since when (see :meth:`close_unused`)."""
        self._next_unused_check = 0.0
        self._opener = opener
        # The daemon's dead-letter table serves every route without one of its own.
        self._dead_letter_tables = {table_key(routes.default_dead_letter_uri): dead_letters}
        self._dead_letter_opener = dead_letter_opener
        self._dead_letter_topic = dead_letter_topic
        self._metrics = metrics
        self._retrier = retrier
        self._board = board
        self._clock = clock
        self._ingest = ingest
        self._sinks: dict[str, TableSink] = {}
        """By :func:`table_key`; a sink's ``spec.uri`` is how the loop names the table."""

    def for_topic(self, topic: str) -> TopicTables:
        """The tables of ``topic``, opened if they are not yet."""
        known = self._routers.get(topic)
        if known is not None:
            return known
        opened = [self._open(spec, topic) for spec in self._routes.tables_of(topic)]
        home = opened[0]
        if self._router is None:
            tables = TopicTables(home=home, by_route={})
        else:
            by_route = {name: self._open(spec, topic) for name, spec in self._routes.tables_by_name(topic).items()}
            tables = TopicTables(home=home, router=self._router(), by_route=by_route)
        self._routers[topic] = tables
        return tables

    def _open(self, spec: TableSpec, topic: str) -> TableSink:
        """The table ``spec`` names, opened if it is not yet: one sink per table, however its URI is spelt (the
        routes refused two ways of reaching one table)."""
        sink = self._sinks.get(table_key(spec.uri))
        if sink is None:
            shown = without_credentials(spec.uri)  # retry lines and errors name it: never with a password
            opened = self._retrier.run(f"opening table {shown}", lambda: self._opener(spec))
            dead_letters = self._dead_letters_at(spec.dead_letter_uri)
            sink = self._sinks[table_key(spec.uri)] = TableSink(
                spec=spec,
                writer=opened.writer,
                dead_letters=dead_letters,
                pipeline=opened.pipeline,
                committer=Committer(
                    app_id=spec.txn_ids.app_id or (topic if not spec.txn_ids.multi_topic else ""),
                    multi_topic=spec.txn_ids.multi_topic,
                    name=spec.name,
                    writer=opened.writer,
                    dead_letters=dead_letters,
                    dead_letter_topic=self._dead_letter_topic,
                    pipeline=opened.pipeline,
                    metrics=self._metrics,
                    retrier=self._retrier,
                    clock=self._clock,
                ),
                coordinator=opened.coordinator,
                pacer=CommitPacer(
                    allowed_latency_s=self._ingest.allowed_latency_s,
                    table_commits_per_s=self._ingest.table_commits_per_s,
                ),
            )
            # A table made by its first rows asks the storage whether it exists yet (found by review: outside the
            # retrier, one transient error in an assignment stopped the daemon).
            version = self._retrier.run(f"reading the version of {shown}", lambda: opened.writer.version)
            self._board.table_opened(spec.name, spec.uri, version)
        return sink

    def _dead_letters_at(self, uri: str) -> DeadLetterStore:
        known = self._dead_letter_tables.get(table_key(uri))
        if known is not None:
            return known
        if self._dead_letter_opener is None:
            raise ValueError(f"a route's own dead-letter table {uri}: the Tables need a dead-letter opener")
        opened = self._retrier.run(f"opening dead-letter table {uri}", lambda: self._dead_letter_opener(uri))  # type: ignore[misc]
        self._dead_letter_tables[table_key(uri)] = opened
        return opened

    def close_unused(self, assigned: Collection[TopicPartition]) -> list[str]:
        """Close what no assigned partition has used for ``ingest.unused_table_close_s``: the tables of topics
        deleted or assigned to other daemons, with their coordinator sessions, status rows and metrics series (and
        those topics' series). The loop calls it between flushes, so nothing is buffered for them: their partitions'
        buffers went with the partitions. It looks once a second; the wait spares an eager rebalance (everything
        revoked, then most of it assigned back) from reopening every table. Returns the closed tables' URIs
        (``spec.uri``, as the loop names them)."""
        now = self._clock()
        if now < self._next_unused_check:
            return []
        self._next_unused_check = now + 1.0
        held_topics = {tp.topic for tp in assigned}
        for topic in self._routers:
            if topic in held_topics:
                self._unheld_since.pop(topic, None)
            else:
                self._unheld_since.setdefault(topic, now)
        gone = [t for t, since in self._unheld_since.items() if now - since >= self._ingest.unused_table_close_s]
        if not gone:
            return []
        for topic in gone:
            del self._routers[topic], self._unheld_since[topic]
        used = {table_key(sink.spec.uri) for tables in self._routers.values() for sink in tables.sinks}
        closed = [sink for key, sink in self._sinks.items() if key not in used]
        for sink in closed:
            del self._sinks[table_key(sink.spec.uri)]
            if sink.coordinator is not None:
                sink.coordinator.close()
            uri = without_credentials(sink.spec.uri)
            logger.info(
                "closed table %s: no assigned partition has written it for %g s (its topics deleted or assigned to "
                "another daemon); a partition assigned again reopens it",
                uri if sink.name == uri else f"{sink.name} ({uri})",
                self._ingest.unused_table_close_s,
            )
        # A route's name labels every table its {topic} URI makes: a name goes when its last table does (found by
        # review: closing one table of a route removed the live series of the others).
        names = {sink.name for sink in closed} - {sink.name for sink in self._sinks.values()}
        for name in names:
            self._board.table_closed(name)
        letters_used = {table_key(self._routes.default_dead_letter_uri)}
        letters_used.update(table_key(sink.dead_letters.uri) for sink in self._sinks.values())
        for key in [key for key in self._dead_letter_tables if key not in letters_used]:
            del self._dead_letter_tables[key]
        self._metrics.released(topics=gone, tables=names)
        logger.info("released topics %s: no partition of theirs is assigned here", ", ".join(sorted(gone)))
        return [sink.spec.uri for sink in closed]

    def __getitem__(self, uri: str) -> TableSink:
        return self._sinks[table_key(uri)]

    def __iter__(self) -> Iterator[TableSink]:
        return iter(self._sinks.values())

    def close(self) -> None:
        for sink in self._sinks.values():
            if sink.coordinator is not None:
                sink.coordinator.close()
