"""The configuration's shape: one frozen dataclass per TOML section, every field documented with its
unit and default, and :class:`Config`, the whole of it. Secrets are masked whenever it is shown.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from kafka2delta.config.masking import MASK, is_secret_key, uri_secrets, without_credentials

ENV_PREFIX = "K2D_"
TOPIC_PLACEHOLDER = "{topic}"
"""In a table URI: the topic's name (``table.uri = "s3://lake/raw/{topic}"``)."""
# table.metadata_columns: the Kafka metadata a row can record, and the column type a new table gets.
METADATA_COLUMNS = {
    "topic": "string",
    "partition": "int",
    "offset": "long",
    "timestamp": "timestamp",
    "timestamp_type": "int",
    "key": "string",
}


def s3_option_name(key: str) -> str:
    """A storage option's name as object_store reads it for S3: lower case, without ``aws_`` (``AWS_ENDPOINT_URL``,
    ``aws_endpoint_url`` and ``endpoint_url`` are one option)."""
    return key.lower().removeprefix("aws_")


S3_SCHEMES = ("s3", "s3a")
"""S3 table URIs: ``s3://bucket/path``."""
AZURE_SCHEMES = ("az", "azure", "abfs", "abfss", "adl")
"""Azure Blob Storage / ADLS Gen2 table URIs (object_store's names): ``az://container/path``,
``abfss://container@account.dfs.core.windows.net/path``."""
GCS_SCHEMES = ("gs",)
"""Google Cloud Storage table URIs: ``gs://bucket/path``."""


def table_key(table_uri: str) -> str:
    """One spelling per table, whoever names it (routing comparing its routes' tables, the coordinator's lock, a
    job's ``--target``, ``maintain --table``): a local path (``/x/t``, ``x/t``, ``file:///x/t``, ``file:/x/t``,
    ``file://localhost/x/t``) as its absolute normalised path (links not followed: containers that mount one volume
    under different links name it as they were told, and share a lock by spelling it alike), ``s3a://`` as
    ``s3://``, the scheme in lower case, no trailing ``/``. A URI already so spelled is unchanged."""
    uri = table_uri.strip()
    scheme, sep, rest = uri.partition("://")
    if uri.startswith("file:"):
        path = uri.removeprefix("file:")
        if path.startswith("//"):
            authority, _, tail = path[2:].partition("/")
            if authority not in ("", "localhost"):
                return uri  # file://host/x: another host's path, left as written
            path = "/" + tail
        return os.path.normpath(os.path.abspath(path or "/"))
    if not sep:
        return os.path.normpath(os.path.abspath(uri)) if uri else uri
    scheme = scheme.lower()
    if scheme == "s3a":
        scheme = "s3"
    return f"{scheme}://{rest}".rstrip("/")


@dataclass(frozen=True)
class KafkaConfig:
    """``[kafka]``: where messages come from."""

    bootstrap_servers: str
    """Comma-separated ``host:port`` list. Required."""
    topic: str = ""
    """The topic to ingest. One of ``topic``, ``topics`` and ``topic_pattern`` is required."""
    topics: tuple[str, ...] = ()
    """Several topics to ingest (each routed to its table: ``table.uri`` with ``{topic}``, or ``[[routes]]``)."""
    topic_pattern: str = ""
    """A regular expression; every topic it matches is ingested, new ones from the next metadata refresh
    (``settings."topic.metadata.refresh.interval.ms"``, librdkafka's default 5 minutes)."""
    group_id: str = "kafka2delta"
    """Consumer group; several daemons in one group share the topic's partitions."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a partition starts when the table holds no offset for it yet."""
    missing_offset_policy: Literal["fail", "earliest", "latest"] = "fail"
    """What to do when the offset after the table's committed one is no longer on the broker
    (deleted by retention): stop with an error, or jump to the earliest/latest offset (logged and counted)."""
    consume_batch_size: int = 10_000
    """Messages asked for in one consume call."""
    consume_timeout_s: float = 0.2
    """Longest wait of one consume call, seconds."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """librdkafka settings passed as they are (SASL, TLS, fetch sizes …)."""

    def subscription(self) -> list[str]:
        """What the consumer subscribes to: the topics, or the pattern (librdkafka wants it to start with ``^``)."""
        if self.topic_pattern:
            return [self.topic_pattern if self.topic_pattern.startswith("^") else f"^{self.topic_pattern}"]
        return [self.topic] if self.topic else list(self.topics)

    def subscribes(self, topic: str) -> bool:
        """Whether ``topic`` is one this daemon ingests."""
        if self.topic_pattern:
            return re.search(self.subscription()[0], topic) is not None
        return topic == self.topic or topic in self.topics


@dataclass(frozen=True)
class TableConfig:
    """``[table]``: where rows go."""

    uri: str = ""
    """Table location: a local path or an object-store URI. ``{topic}`` in it makes one table per topic (a topic
    name is always a safe path segment). Required unless ``[[routes]]`` give every topic its table."""
    app_id: str = ""
    """Prefix of the Delta ``txn`` app ids: ``<app_id>-<partition>``, or ``<app_id>-<topic>-<partition>`` for a
    table several topics can write; default: the topic name (``<topic>-<partition>`` either way)."""
    schema: Mapping[str, str] = field(default_factory=dict)
    """Columns and types used to create the table when it does not exist (see ``schema.py``)."""
    partition_by: tuple[str, ...] = ()
    """Partition columns used when the table is created."""
    storage_options: Mapping[str, str] = field(default_factory=dict)
    """Object-store options passed to deltalake (``AWS_ENDPOINT_URL`` …)."""
    checkpoint_interval: int = 10
    """Write a Delta checkpoint every this many commits of this daemon."""
    schema_evolution: Literal["none", "merge"] = "none"
    """``merge``: a field the table lacks becomes a new nullable column (nested too) in the commit that
    first carries it. ``none``: such fields are dropped and counted."""
    metadata_columns: tuple[str, ...] = ()
    """Kafka metadata recorded in every row, as columns ``kafka_<name>``: any of ``topic``, ``partition``,
    ``offset``, ``timestamp``, ``timestamp_type``, ``key``. ``kafka2delta verify`` needs partition and offset."""
    mode: Literal["append", "upsert", "changelog"] = "append"
    """``append``: every message is a new row. ``upsert``: the table holds the current state of each ``key``;
    a message is its key's new row, a tombstone (or a Debezium delete, ``format.envelope``) deletes it; each
    flush is one MERGE (README "Upsert tables"). ``changelog``: every change is a new row, flattened (key
    columns, the after image, ``_op``, ``_source_ts``, ``_lsn``, ``kafka_partition``, ``kafka_offset``), for
    ``kafka2delta jobs apply-changes`` to apply to a current-state table on Spark."""
    key: tuple[str, ...] = ()
    """``upsert``/``changelog``: the primary-key columns (from the message value; for a delete, from the Kafka
    key)."""
    delete_mode: Literal["hard", "soft"] = "hard"
    """``upsert``: ``hard`` removes a deleted key's row; ``soft`` keeps it with ``_deleted = true``.
    ``changelog``: how ``jobs apply-changes`` deletes, by default."""
    change_columns: tuple[str, ...] = ()
    """``upsert``: columns recording each row's last change: ``op`` (``_op``: c, r, u, d), ``source_ts``
    (``_source_ts``: when the source database made it) and ``lsn`` (``_lsn``: its source position); the last two
    need ``format.envelope = "debezium"``. A changelog has them all (the last two with the Debezium envelope)."""
    before_image: bool = False
    """``changelog`` with ``format.envelope = "debezium"``: keep each change's before image too, as the struct
    column ``_before`` (every changelog table of the daemon)."""


@dataclass(frozen=True)
class RouteConfig:
    """``[[routes]]``: which topics (or, with ``[routing] expression``, which messages) go to which table. The
    first route matching a topic is its route; a key left empty takes its value from ``[table]``."""

    name: str = ""
    """The route's name: the ``table`` label of the metrics, and what ``[routing] expression`` returns to pick it.
    Default: the table's URI."""
    topic: str = ""
    """The topic this route takes (or ``topic_pattern``; neither: every topic, only with ``[routing] expression``)."""
    topic_pattern: str = ""
    """A regular expression: the topics this route takes."""
    uri: str = ""
    """The table (``{topic}`` allowed, as in ``table.uri``)."""
    app_id: str = ""
    """As ``table.app_id``."""
    schema: Mapping[str, str] = field(default_factory=dict)
    """Columns of the table when it is created (empty: ``[table.schema]``, or the first batch's when that is empty
    too: see README "Routing")."""
    partition_by: tuple[str, ...] = ()
    """As ``table.partition_by`` (empty: ``[table]``'s)."""
    schema_evolution: Literal["", "none", "merge"] = ""
    """As ``table.schema_evolution`` (empty: ``[table]``'s)."""
    metadata_columns: tuple[str, ...] = ()
    """As ``table.metadata_columns`` (empty: ``[table]``'s)."""
    mode: Literal["", "append", "upsert", "changelog"] = ""
    """As ``table.mode`` (empty: ``[table]``'s); ``key``, ``delete_mode`` and ``change_columns`` likewise."""
    key: tuple[str, ...] = ()
    delete_mode: Literal["", "hard", "soft"] = ""
    change_columns: tuple[str, ...] = ()
    dead_letter_table_uri: str = ""
    """This route's own dead-letter table (empty: the daemon's, ``dead_letters.table_uri``). Routes writing one
    table, and with ``[routing] expression`` all routes, must share one."""
    transforms: tuple[tuple[str, str], ...] | None = None
    """This route's ``target = "JMESPath expression"`` pairs (``[routes.transforms]`` after its ``[[routes]]``), in
    place of ``[transforms]``; an empty table: none; None (not given): ``[transforms]``. Routing by topic only:
    with ``[routing] expression`` a message is transformed before its route is known."""
    filter: str | None = None
    """This route's filter expression, in place of ``filter.expression``; ``""``: none; None (not given): that
    one. Routing by topic only."""
    format: FormatConfig | None = None
    """This route's ``[routes.format]``, in place of ``[format]``: the whole of it, a key it leaves out takes its
    default, not ``[format]``'s (None: ``[format]``). The schema registry is the daemon's. Routing by topic only."""
    coercions: CoercionConfig | None = None
    """This route's ``[routes.coercions]``, in place of ``[coercions]``, whole as a format is (None: ``[coercions]``).
    Routing by topic only."""

    def stages(self, daemon: Config) -> RouteStages:
        """How this route's table reads its messages: the route's own format, coercions, transforms and filter
        where it gives them (empty transforms and filter too), else the daemon's."""
        return RouteStages(
            format=self.format or daemon.format,
            coercions=self.coercions or daemon.coercions,
            transforms=self.transforms if self.transforms is not None else daemon.transforms,
            filter=self.filter if self.filter is not None else daemon.filter.expression,
        )

    def takes(self, topic: str) -> bool:
        """Whether this route takes ``topic`` when routing by topic (neither ``topic`` nor ``topic_pattern``: every
        topic)."""
        if self.topic:
            return topic == self.topic
        return not self.topic_pattern or re.search(self.topic_pattern, topic) is not None


class RouteStages(NamedTuple):
    """A route's stages as its table runs them (:meth:`RouteConfig.stages`)."""

    format: FormatConfig
    coercions: CoercionConfig
    transforms: tuple[tuple[str, str], ...]
    filter: str


@dataclass(frozen=True)
class RoutingConfig:
    """``[routing]``: choosing a table per message rather than per topic."""

    expression: str = ""
    """A JMESPath expression over the transformed message whose value is the ``name`` of a route; a message
    whose value is empty or names no route matching its topic is a dead letter (stage ``route``). Empty: the
    table is chosen by topic."""

    def __post_init__(self) -> None:
        # Stripped once here, so validation and the router see the same expression ("  " is none: by topic).
        object.__setattr__(self, "expression", self.expression.strip())


@dataclass(frozen=True)
class IngestConfig:
    """``[ingest]``: when buffered messages become a commit."""

    allowed_latency_s: float = 5.0
    """Longest time a message waits in the buffer before it is committed, seconds."""
    max_messages_per_file: int = 1_000_000
    """Flush when one partition has buffered this many messages."""
    min_bytes_per_file: int = 64 * 1024 * 1024
    """Flush when one partition has buffered this many bytes (Arrow, uncompressed)."""
    max_buffered_bytes: int = 128 * 1024 * 1024
    """Flush when all partitions together hold this many bytes of buffered rows (encoded row groups, Arrow bytes
    of the rows not encoded yet, 16 a row for its offset and timestamp) and dead letters (payload, JSON text, key,
    reason): the largest tables first, until half of it is left (README)."""
    row_group_rows: int = 65_536
    """Rows of a Parquet row group: a lane of an unpartitioned append table encodes its buffered rows into its next
    file's row groups (in memory, compressed) each time this many (or 16 MiB of Arrow data) have arrived, so a
    buffered row costs about its Parquet size. 0: rows stay Arrow until the flush writes one row group per file."""
    compression: Literal["snappy", "zstd"] = "snappy"
    """Parquet compression."""
    progress_interval_s: float = 10.0
    """How often a progress line (messages/s, commits, lag) is logged, seconds."""
    max_commit_retries: int = 10
    """Retries of a failed storage operation before the daemon gives up (backoff doubles, 30 s at most)."""
    retry_after_stop_s: float = 45.0
    """Once a stop is requested (SIGTERM), how long a failing storage operation is still retried before the
    daemon gives up (exit 1; the next start replays from the Delta log), seconds, plus the attempt under way.
    Keep it inside the orchestrator's grace period (the Helm chart's default: max(allowed_latency_s, this) + 60)."""
    table_commits_per_s: float = 10.0
    """Budget of commits per second for a whole table, all its writers together: when more daemons share a table
    than ``table_commits_per_s × allowed_latency_s``, each waits longer between commits (never more than 60 s)
    so the log is not raced (kafka2delta/pacing.py). 0: no budget."""
    unused_table_close_s: float = 60.0
    """A table that no assigned partition writes any longer (its topics deleted, or assigned to other daemons) is
    closed after this many seconds: its snapshot, coordinator session, status row and metrics series go, and its
    topics' metrics series with it. A partition assigned again reopens it from its log. 0: at once."""


@dataclass(frozen=True)
class FormatConfig:
    """``[format]``: how message values and keys are decoded."""

    type: Literal["json", "avro", "protobuf", "raw"] = "json"
    """``json`` (one object per message), ``avro`` (a registry's wire format, Confluent's or Glue's, or bare
    datums with ``avro_schema_file``), ``protobuf`` (a registry's wire format, Confluent's or Glue's), ``raw``."""
    gzip: bool = False
    """``json``/``raw``: payloads are gzip-compressed (a payload that is not gzip is a dead letter)."""
    avro_schema_file: str = ""
    """``avro``: an ``.avsc`` file. Without a registry the payloads are bare Avro datums written with it;
    with a registry it is the reader schema every writer schema is resolved to."""
    raw_column: str = "value"
    """``raw``: the column receiving the payload (a ``string`` column gets UTF-8 text, ``binary`` the bytes)."""
    key: Literal["none", "string", "json", "avro", "protobuf"] = "none"
    """How the message key is decoded for ``kafka.key`` in transforms and for the deletes of upsert tables
    (``avro`` and ``protobuf``: in the registry's wire format, so they need the registry)."""
    envelope: Literal["none", "debezium"] = "none"
    """Upsert tables: ``none`` (the value is the key's new state) or ``debezium`` (change events with
    ``before``/``after``/``op``, with or without the JSON converter's embedded schema, or Avro or Protobuf)."""
    decimal_handling: Literal["auto", "precise", "string"] = "auto"
    """Upsert and changelog tables, change events without a Connect schema: how text in a ``decimal`` column
    reads, as Debezium's ``decimal.handling.mode`` wrote it. ``precise``: base64 of the unscaled bytes (Debezium's
    default); ``string``: the number as text; ``auto``: a number when the text reads as one, else base64 (so
    base64 made only of digits, such as ``"1234"``, is misread: set ``precise`` for Debezium's default)."""


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """``[schema_registry]``: where the writer schemas of registry-framed payloads come from."""

    type: Literal["confluent", "glue"] = "confluent"
    """``confluent``: a registry speaking the Confluent REST API at ``url`` (payloads in the Confluent wire
    format). ``glue``: the AWS Glue Schema Registry through boto3 (Avro, Protobuf or JSON payloads in Glue's wire
    format; the ``glue`` extra; credentials from the usual AWS chain)."""
    url: str = ""
    """``confluent``: base URL, e.g. ``http://registry:8081`` (Apicurio: ``http://host:8080/apis/ccompat/v7``)."""
    username: str = ""
    """Basic-auth user (empty: no authentication)."""
    password: str = ""
    """Basic-auth password."""
    timeout_s: float = 10.0
    """Timeout of one registry request, seconds. A registry that does not answer is retried with backoff."""
    cache_size: int = 1000
    """Schemas kept in memory by id (a schema id never changes its schema, so entries never expire)."""
    region: str = ""
    """``glue``: the AWS region of the registry (empty: the AWS chain's, e.g. ``AWS_REGION``)."""
    endpoint_url: str = ""
    """``glue``: another endpoint for the Glue API (a VPC endpoint, a local test double); empty: AWS's own."""

    @property
    def enabled(self) -> bool:
        """A registry is configured (a Confluent URL, or Glue)."""
        return self.type == "glue" or bool(self.url)


@dataclass(frozen=True)
class FilterConfig:
    """``[filter]``: which messages to keep."""

    expression: str = ""
    """A JMESPath expression evaluated after the transforms; messages for which it is false or null are
    skipped and counted (``kafka2delta_messages_skipped_total{reason="filtered"}``). Empty: keep all."""


@dataclass(frozen=True)
class CoercionConfig:
    """``[coercions]``: how values are fitted to the table's column types."""

    epoch_unit: Literal["s", "ms", "us"] = "ms"
    """Unit of numbers coerced into ``timestamp``/``timestamp_ntz``/``date`` columns."""
    epoch_units: Mapping[str, str] = field(default_factory=dict)
    """Per-column override of ``epoch_unit`` (``"created" = "s"``, nested columns as ``"user.created"``)."""


@dataclass(frozen=True)
class DeadLetterConfig:
    """``[dead_letters]``: where messages that fail a stage go."""

    table_uri: str = ""
    """The dead-letter Delta table (created if missing). Empty: ``<table.uri>_dead_letters``."""
    topic: str = ""
    """Also produce each dead letter to this Kafka topic, the error in headers (at least once). Empty: off."""


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: Prometheus endpoint."""

    port: int = 0
    """Port of the ``/metrics`` HTTP endpoint on ``host``; 0 turns it off."""
    host: str = "127.0.0.1"
    """Address the metrics endpoint listens on."""


@dataclass(frozen=True)
class LoggingConfig:
    """``[logging]``."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""
    format: Literal["plain", "json"] = "plain"
    """``plain`` text lines, or ``json``: one JSON object per line (for log shippers)."""


@dataclass(frozen=True)
class SparkConfig:
    """``[spark]``: the Spark session of ``kafka2delta maintain`` and ``kafka2delta jobs`` (never the daemon's)."""

    master: str = "local[*]"
    """Spark master URL; ``--master`` overrides it. Under ``spark-submit`` the submitted master is kept."""
    app_name: str = "kafka2delta"
    """Spark application name (the command is appended: ``kafka2delta-optimize``)."""
    jars: tuple[str, ...] = ()
    """Offline mode: local jar paths (delta-spark, delta-storage, spark-sql-kafka and its dependencies) set
    as ``spark.jars``; nothing is fetched. Empty: the jars are resolved from Maven Central by Spark's Ivy."""
    packages: tuple[str, ...] = ()
    """Extra Maven coordinates fetched besides Delta's and the Kafka source's (e.g. ``hadoop-aws``)."""
    ivy_dir: str = ""
    """Ivy cache directory (``spark.jars.ivy``). Empty: Spark's default (``~/.ivy2.5.2``)."""
    conf: Mapping[str, str] = field(default_factory=dict)
    """Spark settings passed as they are (``"spark.executor.memory" = "2g"``); ``--conf k=v`` adds to them.
    From the environment: ``K2D_SPARK__CONF__<key as written>``."""
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "WARN"
    """Log level of Spark's own (JVM) logger."""


@dataclass(frozen=True)
class CoordinatorConfig:
    """``[coordinator]``: the job coordinator, a lock per table plus an expected predecessor (see coordinator.py)."""

    backend: Literal["none", "file", "zookeeper"] = "none"
    """``zookeeper`` (jobs on several hosts), ``file`` (one host: an fcntl lock in ``lock_dir``), ``none``."""
    hosts: str = "127.0.0.1:2181"
    """``zookeeper``: the connect string (``host:port,host:port[/chroot]``)."""
    root: str = "/kafka2delta"
    """``zookeeper``: the znode under which each resource has its lock and last registration."""
    lock_dir: str = ""
    """``file``: a local directory shared by every job of this host. Required with ``backend = "file"``."""
    resource: str = ""
    """Name of the shared resource; every job writing one table must use the same. Default: from ``table.uri``."""
    lock_timeout_s: float = 10.0
    """Longest wait for the lock, seconds; a job that does not get it skips this turn (it does not fail)."""
    session_timeout_s: float = 10.0
    """``zookeeper``: session timeout, seconds; a crashed job's lock is released after it."""
    order: tuple[str, ...] = ()
    """Job names in their cycle, e.g. ``["ingest", "mutate", "ttl", "optimize"]``: a job runs only when the last
    registered job is the one before it (the last one's successor is the first). Empty: the lock alone."""
    order_timeout_s: float = 0.0
    """Run anyway when the last registration is older than this, seconds (a stopped predecessor would otherwise
    hold the cycle forever). 0: never; the order is strict."""
    join_ingest: bool = False
    """The ingestion daemon takes a turn named ``ingest`` for each Delta commit (and an empty turn when it has
    nothing to commit, so that a strict ``order`` keeps cycling). Off: its blind appends need no lock."""


@dataclass(frozen=True)
class JobsConfig:
    """``[jobs]``: the streaming jobs that change the table (``kafka2delta jobs mutate | ttl``)."""

    mutation_topic: str = ""
    """Topic of mutation requests (``{"op": "update", "match": {...}, "set": {...}}`` or ``"delete"``)."""
    ttl_topic: str = ""
    """Topic of GDPR delete requests (``{"subject_id": "..."}``)."""
    subject_column: str = ""
    """Column holding the subject id that GDPR requests delete by. Required for ``jobs ttl`` with ``ttl_topic``."""
    retention_column: str = ""
    """A date/timestamp column: ``jobs ttl`` deletes rows older than ``retention_days``. Empty: no retention."""
    retention_days: float = 0.0
    """Age in days after which rows are deleted by ``jobs ttl`` (with ``retention_column``); 0: off."""
    dead_letter_retention_days: float = 0.0
    """``jobs ttl`` deletes the dead letters recorded more than this many days ago (by their ``date``, a UTC day, kept
    until the whole day is that old), from the daemon's dead-letter table and every route's own; 0: kept forever.
    At least 1: a partition's recovery after a crash may read its newest dead letters."""
    checkpoint_dir: str = ""
    """Where the streaming queries keep their checkpoints (``<dir>/<job name>``, e.g. ``<dir>/mutate``).
    Default: ``<the job's table>_checkpoints`` (``table.uri``, or the topic's table a ``{topic}`` template names)."""
    trigger_interval_s: float = 10.0
    """Seconds between two turns of a running job (each turn processes what is available, under the lock)."""
    max_requests_per_batch: int = 10_000
    """Most requests one micro-batch takes (Spark's ``maxOffsetsPerTrigger``)."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """Where a request topic is read from the first time (no checkpoint yet)."""

    @property
    def dead_letters_only(self) -> bool:
        """``jobs ttl`` deletes dead letters only (``dead_letter_retention_days`` without ``ttl_topic`` or
        ``retention_column``): it changes no table of the daemon's."""
        return bool(self.dead_letter_retention_days) and not (self.ttl_topic or self.retention_column)


@dataclass(frozen=True)
class Config:
    """The whole configuration, one section per TOML table."""

    kafka: KafkaConfig
    table: TableConfig
    ingest: IngestConfig = field(default_factory=IngestConfig)
    format: FormatConfig = field(default_factory=FormatConfig)
    schema_registry: SchemaRegistryConfig = field(default_factory=SchemaRegistryConfig)
    transforms: tuple[tuple[str, str], ...] = ()
    """``[transforms]``: ``target = "JMESPath expression"`` pairs, applied in the order written."""
    filter: FilterConfig = field(default_factory=FilterConfig)
    coercions: CoercionConfig = field(default_factory=CoercionConfig)
    dead_letters: DeadLetterConfig = field(default_factory=DeadLetterConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    routes: tuple[RouteConfig, ...] = ()
    """``[[routes]]``, in the order written (the first matching a topic wins)."""
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    from_files: frozenset[tuple[str, ...]] = frozenset()
    """Where the values read from files sit (``("kafka", "settings", "sasl.password")`` …): secrets, whatever
    their key's name (README "Secrets from files")."""

    @property
    def app_id(self) -> str:
        """``[table]``'s app id: ``table.app_id``, or the topic of a one-topic daemon (the Spark jobs name their
        txns after it: ``<app_id>-<job>``)."""
        return self.table.app_id or self.kafka.topic or "kafka2delta"

    @property
    def metadata_transforms(self) -> tuple[tuple[str, str], ...]:
        """The transforms that fill ``table.metadata_columns`` (after the configured ones)."""
        return tuple((f"kafka_{name}", f"kafka.{name}") for name in self.table.metadata_columns)

    def create_schema_columns(self) -> dict[str, str]:
        """``table.schema`` plus the metadata columns it does not name: the columns of a new table."""
        columns = dict(self.table.schema)
        for name in self.table.metadata_columns:
            columns.setdefault(f"kafka_{name}", METADATA_COLUMNS[name])
        return columns

    @property
    def only_topic(self) -> str:
        """The one topic of a daemon subscribed to one by name (``kafka.topic``, or ``kafka.topics`` of one); ''."""
        kafka = self.kafka
        return kafka.topic or (kafka.topics[0] if len(kafka.topics) == 1 else "")

    @property
    def main_table_uri(self) -> str:
        """The one table ``table.uri`` names, which ``jobs mutate`` and ``jobs ttl`` change: ``table.uri``; for a
        ``{topic}`` template, the table of the only topic (through the first route that takes it, as the daemon
        routes it); '' when it names none (empty) or many (a template that a ``topic_pattern``, several topics or
        a ``[routing] expression`` fill)."""
        uri, only = self.table.uri, self.only_topic
        if TOPIC_PLACEHOLDER not in uri:
            return uri
        if not only or self.routing.expression:
            return ""
        route = next((r for r in self.routes if r.takes(only)), None)
        return (route.uri if route and route.uri else uri).replace(TOPIC_PLACEHOLDER, only)

    @property
    def dead_letter_table_uri(self) -> str:
        """``dead_letters.table_uri``; default ``<table.uri>_dead_letters``, or for a ``{topic}`` template the
        directory holding the topics' tables plus ``_dead_letters`` (one dead-letter table per daemon)."""
        if self.dead_letters.table_uri:
            return self.dead_letters.table_uri
        uri = self.table.uri
        if TOPIC_PLACEHOLDER in uri:
            # Found by review: "{topic}" alone gave "{topic/_dead_letters", and "/{topic}" a relative "_dead_letters".
            cut = uri.rfind("/", 0, uri.index(TOPIC_PLACEHOLDER))
            return f"{uri[:cut]}/_dead_letters" if cut >= 0 else "_dead_letters"
        return f"{uri.rstrip('/')}_dead_letters"

    def secret_values(self) -> list[str]:
        """Every secret value in the config, for log redaction."""
        secrets = [v for k, v in self.kafka.settings.items() if is_secret_key(k) and v]
        secrets += [v for k, v in self.table.storage_options.items() if is_secret_key(k) and v]
        secrets += [v for k, v in self.spark.conf.items() if is_secret_key(k) and v]
        if self.schema_registry.password:
            secrets.append(self.schema_registry.password)
        secrets += [secret for uri in self._uris() for secret in uri_secrets(uri)]
        data = dataclasses.asdict(self)
        secrets += [value for path in sorted(self.from_files) if (value := _at(data, path))]
        return list(dict.fromkeys(secrets))

    def _uris(self) -> list[str]:
        """Every URI of the config that may carry credentials (``user:password@``)."""
        registry = self.schema_registry
        uris = [registry.url, registry.endpoint_url, self.table.uri, self.dead_letters.table_uri]
        uris += [uri for route in self.routes for uri in (route.uri, route.dead_letter_table_uri)]
        return [uri for uri in uris if uri]

    def summary(self) -> list[str]:
        """The settings that matter, one readable line per concern, secrets masked (logged at start)."""
        kafka, table, ingest, fmt = self.kafka, self.table, self.ingest, self.format
        subscription = (
            f"topic {kafka.topic}" if kafka.topic else f"topics {', '.join(kafka.topics) or kafka.topic_pattern}"
        )
        registry = without_credentials(self.schema_registry.url) if self.schema_registry.url else "none"
        if self.schema_registry.type == "glue":
            glue = self.schema_registry
            endpoint = without_credentials(glue.endpoint_url) if glue.endpoint_url else ""
            registry = f"glue ({', '.join(filter(None, [glue.region, endpoint])) or 'AWS defaults'})"
        dead_letters = without_credentials(self.dead_letter_table_uri) + (
            f", topic {self.dead_letters.topic}" if self.dead_letters.topic else ""
        )
        return [
            f"kafka: {subscription}, group {kafka.group_id}, brokers {kafka.bootstrap_servers}, "
            f"auto_offset_reset {kafka.auto_offset_reset}, missing_offset_policy {kafka.missing_offset_policy}",
            *(
                [
                    f"table: {without_credentials(table.uri)}, schema_evolution {table.schema_evolution}, "
                    f"partition_by {list(table.partition_by) or 'none'}"
                ]
                if table.uri
                else []
            ),
            *(
                f"route {route.name or index}: {_route_match(route)} → {without_credentials(route.uri or table.uri)}"
                + (f", format {_format_line(route.format)}" if route.format else "")
                + (f", epoch unit {route.coercions.epoch_unit}" if route.coercions else "")
                + (f", its own transforms: {len(route.transforms) or 'none'}" if route.transforms is not None else "")
                + (f", its own filter: {route.filter or 'none'}" if route.filter is not None else "")
                for index, route in enumerate(self.routes)
            ),
            *([f"routing: per message by {self.routing.expression!r}"] if self.routing.expression else []),
            f"dead letters: {dead_letters}",
            f"format: {_format_line(fmt)}, schema registry {registry}, "
            f"{len(self.transforms)} transforms, filter {self.filter.expression or 'none'}",
            f"commit when the first limit is reached: {ingest.allowed_latency_s:g} s latency, "
            f"{ingest.max_messages_per_file:,} messages or {_mib(ingest.min_bytes_per_file)} per partition, "
            f"{_mib(ingest.max_buffered_bytes)} buffered in all; Parquet {ingest.compression}",
            f"metrics and status page: {f'{self.metrics.host}:{self.metrics.port}' if self.metrics.port else 'off'}; "
            f"coordinator: {self.coordinator.backend}{' (ingest joins)' if self.coordinator.join_ingest else ''}",
        ]

    def masked(self) -> dict[str, Any]:
        """The config as a dict with every secret replaced by ``***``: safe to print."""

        def mask(mapping: Mapping[str, str]) -> dict[str, str]:
            return {k: (MASK if is_secret_key(k) else v) for k, v in mapping.items()}

        data = dataclasses.asdict(self)
        data["kafka"]["settings"] = mask(self.kafka.settings)
        data["table"]["storage_options"] = mask(self.table.storage_options)
        data["spark"]["conf"] = mask(self.spark.conf)
        if self.schema_registry.password:
            data["schema_registry"]["password"] = MASK
        data["schema_registry"]["url"] = without_credentials(self.schema_registry.url)
        data["table"]["uri"] = without_credentials(self.table.uri)
        data["dead_letters"]["table_uri"] = without_credentials(self.dead_letters.table_uri)
        for route in data["routes"]:
            route["uri"] = without_credentials(route["uri"])
            route["dead_letter_table_uri"] = without_credentials(route["dead_letter_table_uri"])
        for path in self.from_files:
            *parents, key = _steps(path)
            holder: Any = data
            for part in parents:
                holder = holder[part]
            holder[key] = MASK
        return data


def _at(data: Mapping[str, Any], path: tuple[str, ...]) -> str:
    """The string at ``path`` in the dict form of a config."""
    value: Any = data
    for part in _steps(path):
        value = value[part]
    return str(value)


def _steps(path: tuple[str, ...]) -> list[str | int]:
    """The keys and list indexes that reach ``path`` in the dict form (``routes[1]`` is ``routes``, then 1)."""
    steps: list[str | int] = []
    for part in path:
        indexed = re.fullmatch(r"(\w+)\[(\d+)\]", part)
        steps += [indexed[1], int(indexed[2])] if indexed else [part]
    return steps


def _format_line(fmt: FormatConfig) -> str:
    return f"{fmt.type}{' (gzip)' if fmt.gzip else ''}, key {fmt.key}"


def _route_match(route: RouteConfig) -> str:
    if route.topic:
        return f"topic {route.topic}"
    return f"topics matching {route.topic_pattern!r}" if route.topic_pattern else "any topic"


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"
