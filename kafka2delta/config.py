"""Typed configuration: TOML file, overridden by ``K2D_<SECTION>__<KEY>`` environment variables.

Only this module and the CLI read files or the environment. Every other module receives a
frozen :class:`Config`. Validation happens once, at start, and a bad value raises
:class:`~kafka2delta.errors.ConfigError` naming the key (``ingest.allowed_latency_s``) and,
for an environment override, the variable it came from.

Environment keys: ``K2D_KAFKA__TOPIC=events`` sets ``kafka.topic``. Mappings take one more level:
``K2D_KAFKA__SETTINGS__SASL_PASSWORD=…`` sets the librdkafka key ``sasl.password`` (underscores
become dots, as librdkafka keys never hold underscores), ``K2D_TABLE__STORAGE_OPTIONS__AWS_REGION=…``
sets the storage option ``AWS_REGION`` as written, ``K2D_TABLE__SCHEMA`` takes a JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kafka2delta.errors import ConfigError
from kafka2delta.schema import parse_schema

ENV_PREFIX = "K2D_"
# table.metadata_columns: the Kafka metadata a row can record, and the column type a new table gets.
METADATA_COLUMNS = {
    "topic": "string",
    "partition": "int",
    "offset": "long",
    "timestamp": "timestamp",
    "timestamp_type": "int",
    "key": "string",
}
MASK = "***"
# A key holding one of these words, or a part named "key"/"pem", carries a secret.
_SECRET_WORDS = ("password", "secret", "token", "credential")
_SECRET_PARTS = frozenset({"key", "pem"})


def is_secret_key(key: str) -> bool:
    """``sasl.password``, ``ssl.key.pem``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ACCESS_KEY_ID`` … are secrets."""
    lowered = key.lower()
    parts = set(re.split(r"[._]", lowered))
    return any(word in lowered for word in _SECRET_WORDS) or bool(parts & _SECRET_PARTS)


@dataclass(frozen=True)
class KafkaConfig:
    """``[kafka]``: where messages come from."""

    bootstrap_servers: str
    """Comma-separated ``host:port`` list. Required."""
    topic: str
    """The topic to ingest. Required."""
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


@dataclass(frozen=True)
class TableConfig:
    """``[table]``: where rows go."""

    uri: str
    """Table location: a local path or an object-store URI. Required."""
    app_id: str = ""
    """Prefix of the Delta ``txn`` app ids (``<app_id>-<partition>``); default: the topic name."""
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


@dataclass(frozen=True)
class IngestConfig:
    """``[ingest]``: when buffered messages become a commit."""

    allowed_latency_s: float = 5.0
    """Longest time a message waits in the buffer before it is committed, seconds."""
    max_messages_per_file: int = 1_000_000
    """Flush when one partition has buffered this many messages."""
    min_bytes_per_file: int = 64 * 1024 * 1024
    """Flush when one partition has buffered this many bytes (Arrow, uncompressed)."""
    max_buffered_bytes: int = 256 * 1024 * 1024
    """Flush when all partitions together have buffered this many bytes."""
    compression: Literal["snappy", "zstd"] = "snappy"
    """Parquet compression."""
    progress_interval_s: float = 10.0
    """How often a progress line (messages/s, commits, lag) is logged, seconds."""
    max_commit_retries: int = 10
    """Retries of a failed storage operation before the daemon gives up (backoff doubles, 30 s at most)."""


@dataclass(frozen=True)
class FormatConfig:
    """``[format]``: how message values and keys are decoded."""

    type: Literal["json", "avro", "protobuf", "raw"] = "json"
    """``json`` (one object per message), ``avro`` (Confluent wire format through the registry, or bare
    datums with ``avro_schema_file``), ``protobuf`` (Confluent wire format through the registry), ``raw``."""
    gzip: bool = False
    """``json``/``raw``: payloads are gzip-compressed (a payload that is not gzip is a dead letter)."""
    avro_schema_file: str = ""
    """``avro``: an ``.avsc`` file. Without a registry the payloads are bare Avro datums written with it;
    with a registry it is the reader schema every writer schema is resolved to."""
    raw_column: str = "value"
    """``raw``: the column receiving the payload (a ``string`` column gets UTF-8 text, ``binary`` the bytes)."""
    key: Literal["none", "string", "json", "avro"] = "none"
    """How the message key is decoded for ``kafka.key`` in transforms (``avro`` needs the registry)."""


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """``[schema_registry]``: a registry speaking the Confluent REST API."""

    url: str = ""
    """Base URL, e.g. ``http://registry:8081`` (Apicurio: ``http://host:8080/apis/ccompat/v7``)."""
    username: str = ""
    """Basic-auth user (empty: no authentication)."""
    password: str = ""
    """Basic-auth password."""
    timeout_s: float = 10.0
    """Timeout of one registry request, seconds. A registry that does not answer is retried with backoff."""
    cache_size: int = 1000
    """Schemas kept in memory by id (a schema id never changes its schema, so entries never expire)."""


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
    checkpoint_dir: str = ""
    """Where the streaming queries keep their checkpoints (``<dir>/<job name>``, e.g. ``<dir>/mutate``).
    Default: ``<table.uri>_checkpoints``."""
    trigger_interval_s: float = 10.0
    """Seconds between two turns of a running job (each turn processes what is available, under the lock)."""
    max_requests_per_batch: int = 10_000
    """Most requests one micro-batch takes (Spark's ``maxOffsetsPerTrigger``)."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """Where a request topic is read from the first time (no checkpoint yet)."""


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

    @property
    def app_id(self) -> str:
        return self.table.app_id or self.kafka.topic

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
    def dead_letter_table_uri(self) -> str:
        return self.dead_letters.table_uri or f"{self.table.uri.rstrip('/')}_dead_letters"

    def secret_values(self) -> list[str]:
        """Every secret value in the config, for log redaction."""
        secrets = [v for k, v in self.kafka.settings.items() if is_secret_key(k) and v]
        secrets += [v for k, v in self.table.storage_options.items() if is_secret_key(k) and v]
        secrets += [v for k, v in self.spark.conf.items() if is_secret_key(k) and v]
        if self.schema_registry.password:
            secrets.append(self.schema_registry.password)
        return secrets

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
        return data


# --- loading -------------------------------------------------------------------------------

_SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaConfig,
    "table": TableConfig,
    "ingest": IngestConfig,
    "format": FormatConfig,
    "schema_registry": SchemaRegistryConfig,
    "filter": FilterConfig,
    "coercions": CoercionConfig,
    "dead_letters": DeadLetterConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "spark": SparkConfig,
    "coordinator": CoordinatorConfig,
    "jobs": JobsConfig,
}
# A section that is a plain ordered table of strings, not a dataclass.
_TRANSFORMS = "transforms"
_TYPE_HINTS = {name: typing.get_type_hints(cls) for name, cls in _SECTIONS.items()}


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (optional), apply ``K2D_`` overrides from ``environ``, validate, return."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                raw = tomllib.load(handle)
        except FileNotFoundError as exc:
            raise ConfigError("--config", f"file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    sources: dict[str, str] = {}
    environ = os.environ if environ is None else environ
    _apply_environment(raw, environ, sources)
    config = _build(raw, sources)
    _validate_storage_options(config, environ, sources)
    return config


def _apply_environment(raw: dict[str, Any], environ: Mapping[str, str], sources: dict[str, str]) -> None:
    transforms_variable = f"{ENV_PREFIX}{_TRANSFORMS.upper()}"
    if transforms_variable in environ:
        raw[_TRANSFORMS] = _json_object(_TRANSFORMS, transforms_variable, environ[transforms_variable])
        sources[_TRANSFORMS] = transforms_variable
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or "__" not in variable:
            continue
        parts = variable[len(ENV_PREFIX) :].lower().split("__")
        section, key = parts[0], parts[1]
        if section not in _SECTIONS:
            continue  # K2D_TEST_* and friends are not config
        value: Any = environ[variable]
        dotted = f"{section}.{key}"
        if len(parts) == 3 and key in ("settings", "storage_options", "conf"):
            sub = parts[2].replace("_", ".") if key == "settings" else variable.split("__", 2)[2]
            raw.setdefault(section, {}).setdefault(key, {})[sub] = value
            sources[f"{dotted}.{sub}"] = variable
            continue
        if len(parts) != 2:
            raise ConfigError(variable, "expected K2D_<SECTION>__<KEY> (or __<SUBKEY> for settings/storage_options)")
        if key in _JSON_KEYS:
            value = _json_object(dotted, variable, value)
        raw.setdefault(section, {})[key] = value
        sources[dotted] = variable


# Mappings whose keys are column names (any case, dots allowed): from the environment as one JSON object.
_JSON_KEYS = frozenset({"schema", "epoch_units"})


def _json_object(key: str, variable: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON object, got {text!r}")
    return value


def _build(raw: dict[str, Any], sources: dict[str, str]) -> Config:
    for section in raw:
        if section not in _SECTIONS and section != _TRANSFORMS:
            raise ConfigError(section, f"unknown section (known: {', '.join([*_SECTIONS, _TRANSFORMS])})")
    built: dict[str, Any] = {"transforms": _build_transforms(raw.get(_TRANSFORMS, {}), sources)}
    for section, cls in _SECTIONS.items():
        values = raw.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(section, "expected a table")
        built[section] = _build_section(section, cls, values, sources)
    config = Config(**built)
    _validate(config)
    return config


def _build_transforms(values: Any, sources: dict[str, str]) -> tuple[tuple[str, str], ...]:
    where = f"{_TRANSFORMS} (from {sources[_TRANSFORMS]})" if _TRANSFORMS in sources else _TRANSFORMS
    if not isinstance(values, dict):
        raise ConfigError(where, 'expected a table of target = "expression"')
    pairs = []
    for target, expression in _flatten_targets(values):
        if not isinstance(expression, str) or not expression.strip():
            raise ConfigError(f"{where}.{target}", f"expected a JMESPath expression string, got {expression!r}")
        pairs.append((target, expression))
    return tuple(pairs)


def _flatten_targets(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``meta.offset = "kafka.offset"`` in TOML is a nested table; the target is the dotted path."""
    flat: list[tuple[str, Any]] = []
    for key, value in values.items():
        target = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.extend(_flatten_targets(value, f"{target}."))
        else:
            flat.append((target, value))
    return flat


def _build_section(section: str, cls: type[Any], values: dict[str, Any], sources: dict[str, str]) -> Any:
    hints = _TYPE_HINTS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise ConfigError(f"{section}.{key}", f"unknown key (known keys: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    for name, spec in fields.items():
        dotted = f"{section}.{name}"
        if name not in values:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ConfigError(dotted, f"required key missing (expected {_describe(hints[name])})")
            continue
        where = f"{dotted} (from {sources[dotted]})" if dotted in sources else dotted
        kwargs[name] = _convert(where, hints[name], values[name], secret=False)
    return cls(**kwargs)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(hint))
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if origin is tuple:
        return "a list of strings"
    return "a table of string values"


def _convert(where: str, hint: Any, value: Any, *, secret: bool) -> Any:
    """Convert a TOML value (or an environment string) to ``hint``; raise naming ``where``."""
    shown = MASK if secret else repr(value)
    problem = f"expected {_describe(hint)}, got {shown}"
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(where, problem)
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(where, problem)
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(where, problem)
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(where, problem)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(where, problem)
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where, problem)
    if origin is tuple:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(value)
        raise ConfigError(where, problem)
    if origin in (Mapping, dict) or hint is Mapping or isinstance(hint, types.GenericAlias):
        if not isinstance(value, dict):
            raise ConfigError(where, problem)
        converted = {}
        for key, item in value.items():
            if isinstance(item, bool):
                item = "true" if item else "false"
            elif isinstance(item, (int, float)):
                item = str(item)
            if not isinstance(item, str):
                raise ConfigError(
                    f"{where}.{key}", f"expected a string, got {MASK if is_secret_key(key) else repr(item)}"
                )
            converted[str(key)] = item
        return converted
    raise ConfigError(where, f"unsupported type {hint!r}")  # pragma: no cover - a bug in this module


def _validate(config: Config) -> None:
    """Checks across keys and value ranges, each naming its key."""
    must_be_positive: dict[str, tuple[float, str]] = {
        "kafka.consume_batch_size": (config.kafka.consume_batch_size, "a positive integer"),
        "table.checkpoint_interval": (config.table.checkpoint_interval, "a positive integer"),
        "ingest.max_messages_per_file": (config.ingest.max_messages_per_file, "a positive integer"),
        "ingest.min_bytes_per_file": (config.ingest.min_bytes_per_file, "a positive integer"),
        "ingest.max_buffered_bytes": (config.ingest.max_buffered_bytes, "a positive integer"),
        "kafka.consume_timeout_s": (config.kafka.consume_timeout_s, "a positive number of seconds"),
        "ingest.allowed_latency_s": (config.ingest.allowed_latency_s, "a positive number of seconds"),
        "ingest.progress_interval_s": (config.ingest.progress_interval_s, "a positive number of seconds"),
        "schema_registry.timeout_s": (config.schema_registry.timeout_s, "a positive number of seconds"),
        "schema_registry.cache_size": (config.schema_registry.cache_size, "a positive integer"),
    }
    for key, (number, expected) in must_be_positive.items():
        if number <= 0:
            raise ConfigError(key, f"expected {expected}, got {number}")
    if config.ingest.max_commit_retries < 0:
        raise ConfigError("ingest.max_commit_retries", "expected 0 or more")
    if not 0 <= config.metrics.port <= 65535:
        raise ConfigError("metrics.port", f"expected a port 0..65535, got {config.metrics.port}")
    for key, text in (
        ("kafka.bootstrap_servers", config.kafka.bootstrap_servers),
        ("kafka.topic", config.kafka.topic),
        ("table.uri", config.table.uri),
    ):
        if not text.strip():
            raise ConfigError(key, "must not be empty")
    reserved = {"group.id", "enable.auto.commit", "enable.auto.offset.store", "bootstrap.servers"}
    for key in config.kafka.settings:
        if key in reserved:
            raise ConfigError(f"kafka.settings.{key}", "is set by kafka2delta itself; use the [kafka] keys instead")
    if config.table.schema:
        try:
            schema = parse_schema(config.table.schema)
        except ValueError as exc:
            raise ConfigError("table.schema", str(exc)) from exc
        for column in config.table.partition_by:
            if column not in schema.names:
                raise ConfigError("table.partition_by", f"column {column!r} is not in table.schema")
    _validate_format(config)
    _validate_spark_jobs(config)
    for name in config.table.metadata_columns:
        if name not in METADATA_COLUMNS:
            raise ConfigError("table.metadata_columns", f"unknown {name!r} (known: {', '.join(METADATA_COLUMNS)})")
    for column, unit in config.coercions.epoch_units.items():
        if unit not in ("s", "ms", "us"):
            raise ConfigError(f"coercions.epoch_units.{column}", f"expected one of 's', 'ms', 'us', got {unit!r}")


# S3 options that change how delta-rs commits, by their normalised name (lower case, no "aws_" prefix);
# delta-rs also reads them from the process environment (AWS_CONDITIONAL_PUT …).
_S3_COMMIT_OPTIONS = ("conditional_put", "s3_allow_unsafe_rename", "s3_locking_provider")


def _validate_storage_options(config: Config, environ: Mapping[str, str], sources: dict[str, str]) -> None:
    """Refuse object-store settings under which a commit is not a put-if-absent.

    deltalake (>= 1.0) commits each log version on S3 with ``PUT`` + ``If-None-Match: *``, so two
    writers can never both commit one version; only ``conditional_put = "disabled"`` turns that off
    (every commit then fails). The DynamoDB locking provider is gone from delta-rs 1.x (ignored, so
    Spark writers coordinating through DynamoDB would not see our commits), and
    ``AWS_S3_ALLOW_UNSAFE_RENAME`` asks for commits without mutual exclusion.
    """
    found: list[tuple[str, str, str]] = []  # (normalised name, where, value)
    for key, value in config.table.storage_options.items():
        where = sources.get(f"table.storage_options.{key}", f"table.storage_options.{key}")
        found.append((key.lower().removeprefix("aws_"), where, value))
    for key, value in environ.items():
        if key.upper().startswith("AWS_"):
            found.append((key.lower().removeprefix("aws_"), key, value))
    for name, where, value in found:
        if name not in _S3_COMMIT_OPTIONS:
            continue
        text = value.strip().lower()
        if name == "conditional_put" and text == "disabled":
            raise ConfigError(
                where,
                "must not be 'disabled': commits are put-if-absent (If-None-Match: *), so two writers never "
                "commit one log version; remove it (the default) or set 'etag'",
            )
        if name == "s3_allow_unsafe_rename" and text in ("1", "true", "yes", "on"):
            raise ConfigError(
                where,
                "would allow commits without mutual exclusion; kafka2delta needs put-if-absent commits "
                "(deltalake's default on S3): remove it",
            )
        if name == "s3_locking_provider" and text:
            raise ConfigError(
                where,
                "deltalake >= 1.0 has no DynamoDB locking provider (it is ignored): commits are put-if-absent "
                "on the bucket itself, which the store must support (AWS S3, MinIO, R2 …); remove it",
            )


def _validate_format(config: Config) -> None:
    fmt, registry = config.format, config.schema_registry
    if registry.url and not re.match(r"https?://", registry.url):
        raise ConfigError("schema_registry.url", f"expected an http:// or https:// URL, got {registry.url!r}")
    if fmt.type == "avro" and not (registry.url or fmt.avro_schema_file):
        raise ConfigError(
            "format.type", "avro needs schema_registry.url (Confluent wire format) or format.avro_schema_file"
        )
    if fmt.type == "protobuf" and not registry.url:
        raise ConfigError("format.type", "protobuf needs schema_registry.url (Confluent wire format)")
    if fmt.key == "avro" and not registry.url:
        raise ConfigError("format.key", "avro keys need schema_registry.url")
    if fmt.gzip and fmt.type not in ("json", "raw"):
        raise ConfigError("format.gzip", f"gzip applies to json and raw payloads, not {fmt.type}")
    if fmt.avro_schema_file and fmt.type != "avro":
        raise ConfigError("format.avro_schema_file", f"is only used with format.type = 'avro', not {fmt.type!r}")
    if registry.password and not registry.username:
        raise ConfigError("schema_registry.username", "is required when schema_registry.password is set")


def _validate_spark_jobs(config: Config) -> None:
    """The ``[spark]``, ``[coordinator]`` and ``[jobs]`` sections (used by ``maintain`` and ``jobs`` only)."""
    coordinator, jobs = config.coordinator, config.jobs
    for key, number in (
        ("coordinator.lock_timeout_s", coordinator.lock_timeout_s),
        ("coordinator.session_timeout_s", coordinator.session_timeout_s),
        ("jobs.trigger_interval_s", jobs.trigger_interval_s),
        ("jobs.max_requests_per_batch", jobs.max_requests_per_batch),
    ):
        if number <= 0:
            raise ConfigError(key, f"expected a positive number, got {number}")
    for key, number in (
        ("coordinator.order_timeout_s", coordinator.order_timeout_s),
        ("jobs.retention_days", jobs.retention_days),
    ):
        if number < 0:
            raise ConfigError(key, f"expected 0 or more, got {number}")
    if not config.spark.master.strip():
        raise ConfigError("spark.master", "must not be empty")
    if coordinator.backend == "file" and not coordinator.lock_dir.strip():
        raise ConfigError("coordinator.lock_dir", "is required with coordinator.backend = 'file'")
    if coordinator.backend == "zookeeper":
        if not coordinator.hosts.strip():
            raise ConfigError("coordinator.hosts", "is required with coordinator.backend = 'zookeeper'")
        root = coordinator.root
        if not root.startswith("/") or (root.endswith("/") and root != "/"):
            raise ConfigError("coordinator.root", f"expected an absolute znode path like /kafka2delta, got {root!r}")
    if "/" in coordinator.resource:
        raise ConfigError("coordinator.resource", f"must not contain '/', got {coordinator.resource!r}")
    if jobs.max_requests_per_batch >= 1_000_000:  # txnVersion = batch id * 1,000,000 + group (spark/mutations.py)
        raise ConfigError(
            "jobs.max_requests_per_batch", f"expected fewer than 1000000, got {jobs.max_requests_per_batch}"
        )
    if len(set(coordinator.order)) != len(coordinator.order):
        raise ConfigError("coordinator.order", f"lists a job twice: {list(coordinator.order)}")
    if coordinator.join_ingest and coordinator.backend == "none":
        raise ConfigError("coordinator.join_ingest", "needs coordinator.backend = 'file' or 'zookeeper'")
    if bool(jobs.retention_column) != bool(jobs.retention_days):
        raise ConfigError(
            "jobs.retention_days" if jobs.retention_column else "jobs.retention_column",
            "retention needs both jobs.retention_column and jobs.retention_days",
        )
