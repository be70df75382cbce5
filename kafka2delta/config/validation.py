"""Checks across keys and value ranges, run once at start; each failure names its key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from kafka2delta.config.masking import without_credentials
from kafka2delta.config.sections import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    METADATA_COLUMNS,
    S3_SCHEMES,
    TOPIC_PLACEHOLDER,
    Config,
    FormatConfig,
    RouteConfig,
    SchemaRegistryConfig,
    s3_option_name,
    table_key,
)
from kafka2delta.errors import ConfigError
from kafka2delta.schema import is_required, parse_schema
from kafka2delta.transforms import Transformer
from kafka2delta.transforms.expressions import parse_expression


def validate(config: Config) -> None:
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
    if config.ingest.table_commits_per_s < 0:
        raise ConfigError("ingest.table_commits_per_s", "expected 0 (no budget) or more commits per second")
    if config.ingest.unused_table_close_s < 0:
        raise ConfigError("ingest.unused_table_close_s", "expected 0 (close at once) or more seconds")
    if config.ingest.row_group_rows < 0:
        raise ConfigError("ingest.row_group_rows", "expected 0 (encode at the flush) or more rows")
    if config.ingest.max_commit_retries < 0:
        raise ConfigError("ingest.max_commit_retries", "expected 0 or more")
    if config.ingest.retry_after_stop_s < 0:
        raise ConfigError("ingest.retry_after_stop_s", "expected 0 (give up at the next failure) or more seconds")
    if not 0 <= config.metrics.port <= 65535:
        raise ConfigError("metrics.port", f"expected a port 0..65535, got {config.metrics.port}")
    if not config.kafka.bootstrap_servers.strip():
        raise ConfigError("kafka.bootstrap_servers", "must not be empty")
    if not config.routes and not config.table.uri.strip():
        raise ConfigError("table.uri", "must not be empty (or give every topic its table with [[routes]])")
    _validate_subscription(config)
    _validate_routes(config)
    reserved = {
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "bootstrap.servers",
        "enable.partition.eof",
    }
    for key, value in config.kafka.settings.items():
        if key in reserved:
            raise ConfigError(f"kafka.settings.{key}", "is set by kafka2delta itself; use the [kafka] keys instead")
        if key == "auto.offset.reset":
            raise ConfigError(
                f"kafka.settings.{key}",
                "is set by kafka2delta itself (a vanished offset must be an error the daemon handles): use "
                "kafka.auto_offset_reset and kafka.missing_offset_policy",
            )
        if key == "isolation.level" and value != "read_committed":
            raise ConfigError(
                f"kafka.settings.{key}",
                "must be read_committed (librdkafka's default): read_uncommitted would write the records of aborted "
                "transactions as rows",
            )
    if config.table.schema:
        try:
            schema = parse_schema(config.table.schema)
        except ValueError as exc:
            raise ConfigError("table.schema", str(exc)) from exc
        for column in config.table.partition_by:
            if column not in schema.names:
                raise ConfigError("table.partition_by", f"column {column!r} is not in table.schema")
    _validate_format(config)
    _validate_changes(config)
    _validate_spark_jobs(config)
    for name in config.table.metadata_columns:
        if name not in METADATA_COLUMNS:
            raise ConfigError("table.metadata_columns", f"unknown {name!r} (known: {', '.join(METADATA_COLUMNS)})")
    coercions = [("coercions", config.coercions)]
    coercions += [(f"routes[{i}].coercions", r.coercions) for i, r in enumerate(config.routes) if r.coercions]
    for prefix, coercion in coercions:
        for column, unit in coercion.epoch_units.items():
            if unit not in ("s", "ms", "us"):
                raise ConfigError(f"{prefix}.epoch_units.{column}", f"expected one of 's', 'ms', 'us', got {unit!r}")


# S3 options that change how delta-rs commits, by their normalised name (lower case, no "aws_" prefix);
# delta-rs also reads them from the process environment (AWS_CONDITIONAL_PUT …).
_S3_COMMIT_OPTIONS = ("conditional_put", "s3_allow_unsafe_rename", "s3_locking_provider")


def validate_storage_options(config: Config, environ: Mapping[str, str], sources: dict[str, str]) -> None:
    """Refuse object-store settings under which a commit is not a put-if-absent.

    deltalake (>= 1.0) commits each log version on S3 with ``PUT`` + ``If-None-Match: *``, so two
    writers can never both commit one version; only ``conditional_put = "disabled"`` turns that off
    (every commit then fails). The DynamoDB locking provider is gone from delta-rs 1.x (ignored, so
    Spark writers coordinating through DynamoDB would not see our commits), and
    ``AWS_S3_ALLOW_UNSAFE_RENAME`` asks for commits without mutual exclusion.

    Azure (``az://``, ``abfss://``: Put Blob with ``If-None-Match: *``) and GCS (``gs://``: upload with
    ``x-goog-if-generation-match: 0``) have no such setting: object_store always sends the condition for a
    put-if-absent and delta-rs 1.x commits every store that way (its Azure and GCS log stores are the default
    one), so there is nothing to refuse for them.
    """
    found: list[tuple[str, str, str]] = []  # (normalised name, where, value)
    for key, value in config.table.storage_options.items():
        where = sources.get(f"table.storage_options.{key}", f"table.storage_options.{key}")
        if s3_option_name(key) == "profile":
            # deltalake would read the profile, pyarrow's S3 client (the Parquet files) cannot be given one.
            raise ConfigError(
                where,
                "set AWS_PROFILE in the environment instead: the log and the Parquet files must use one "
                "credential, and the Parquet writer's S3 client takes a profile from the environment only",
            )
        found.append((s3_option_name(key), where, value))
    for key, value in environ.items():
        if key.upper().startswith("AWS_"):
            found.append((s3_option_name(key), key, value))
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
        if name == "s3_allow_unsafe_rename" and text in ("1", "true", "yes", "y", "on"):  # delta-rs's str_is_truthy
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
    """``[format]`` and each route's own, against the daemon's one schema registry."""
    registry = config.schema_registry
    if registry.url and not re.match(r"https?://", registry.url):
        raise ConfigError(
            "schema_registry.url", f"expected an http:// or https:// URL, got {without_credentials(registry.url)!r}"
        )
    _validate_glue(config)
    formats = [("format", config.format)]
    formats += [(f"routes[{i}].format", route.format) for i, route in enumerate(config.routes) if route.format]
    for prefix, fmt in formats:
        _validate_one_format(prefix, fmt, registry)
    if registry.type == "glue" and not any(fmt.type != "raw" or fmt.key in ("avro", "protobuf") for _, fmt in formats):
        raise ConfigError(
            "schema_registry.type",
            "'glue' decodes avro, protobuf and json values and avro and protobuf keys: raw values with "
            f"{' and '.join(f'{prefix}.key = {fmt.key!r}' for prefix, fmt in formats)} use none",
        )
    if registry.password and not registry.username:
        raise ConfigError("schema_registry.username", "is required when schema_registry.password is set")


def _validate_one_format(prefix: str, fmt: FormatConfig, registry: SchemaRegistryConfig) -> None:
    if fmt.type == "avro" and not (registry.enabled or fmt.avro_schema_file):
        raise ConfigError(
            f"{prefix}.type",
            "avro needs a schema registry (schema_registry.url, or type = 'glue') or format.avro_schema_file",
        )
    if fmt.type == "protobuf" and not registry.enabled:
        raise ConfigError(f"{prefix}.type", "protobuf needs a schema registry (schema_registry.url, or type = 'glue')")
    if fmt.key in ("avro", "protobuf") and not registry.enabled:
        raise ConfigError(
            f"{prefix}.key", f"{fmt.key} keys need a schema registry (schema_registry.url, or type = 'glue')"
        )
    if fmt.gzip and fmt.type not in ("json", "raw"):
        raise ConfigError(f"{prefix}.gzip", f"gzip applies to json and raw payloads, not {fmt.type}")
    if fmt.gzip and fmt.type == "json" and registry.type == "glue":
        raise ConfigError(f"{prefix}.gzip", "Glue's wire format says itself whether a payload is compressed (zlib)")
    if fmt.avro_schema_file and fmt.type != "avro":
        raise ConfigError(f"{prefix}.avro_schema_file", f"is only used with format.type = 'avro', not {fmt.type!r}")


def _validate_glue(config: Config) -> None:
    """``schema_registry.type = "glue"``: Glue's keys only (the formats it serves: :func:`_validate_format`)."""
    registry = config.schema_registry
    if registry.type != "glue":
        for key in ("region", "endpoint_url"):
            if getattr(registry, key):
                raise ConfigError(f"schema_registry.{key}", "is only used with schema_registry.type = 'glue'")
        return
    for key in ("url", "username", "password"):
        if getattr(registry, key):
            raise ConfigError(
                f"schema_registry.{key}",
                "is for a Confluent registry; Glue is reached through boto3 (region, endpoint_url, AWS credentials)",
            )
    if registry.endpoint_url and not re.match(r"https?://", registry.endpoint_url):
        raise ConfigError(
            "schema_registry.endpoint_url",
            f"expected an http:// or https:// URL, got {without_credentials(registry.endpoint_url)!r}",
        )


CHANGE_COLUMN_NAMES = ("op", "source_ts", "lsn")
_ENVELOPE_COLUMNS = ("source_ts", "lsn")


def _validate_changes(config: Config) -> None:
    """Upsert and changelog tables: a key the messages (and, for deletes, the Kafka keys) can give, a format and
    envelope that carry changes, and messages routed by topic (a tombstone has no value for an expression to
    read)."""
    table = config.table
    tables = [("table", RouteConfig(), table.schema)] if table.uri else []
    tables += [(f"routes[{i}]", route, route.schema or table.schema) for i, route in enumerate(config.routes)]
    changing: dict[str, FormatConfig] = {}
    """The formats of the upsert and changelog tables, by the key that names each (``format``, ``routes[2].format``)."""
    debezium_changelogs = 0
    for prefix, route, columns in tables:
        fmt, fmt_at = (route.format, f"{prefix}.format") if route.format else (config.format, "format")
        mode = route.mode or table.mode
        key = route.key or table.key
        change_columns = route.change_columns or table.change_columns
        own = table if prefix == "table" else route
        if mode == "append":
            if own.key:
                raise ConfigError(f"{prefix}.key", 'is only used with mode = "upsert" or "changelog"')
            if own.change_columns:
                raise ConfigError(f"{prefix}.change_columns", 'is only used with mode = "upsert"')
            if route.format:
                _check_append_format(fmt_at, fmt)
            continue
        changing[fmt_at] = fmt
        key_at = f"{prefix}.key" if route.key else "table.key"
        if mode == "changelog":
            debezium_changelogs += fmt.envelope == "debezium"
            if own.change_columns:
                raise ConfigError(
                    f"{prefix}.change_columns",
                    'a changelog always has _op (and _source_ts and _lsn with format.envelope = "debezium")',
                )
        if not key and prefix == "table" and config.routes:
            continue  # [table] takes only the topics no route takes: checked when such a topic appears
        if not key:
            raise ConfigError(key_at, f'required with mode = "{mode}": the primary-key columns, e.g. key = ["id"]')
        if len(set(key)) != len(key):
            raise ConfigError(key_at, f"lists a column twice: {list(key)}")
        if columns and any(column not in columns for column in key):
            missing = [column for column in key if column not in columns]
            raise ConfigError(key_at, f"column(s) {missing} are not in the table schema")
        schema_at = f"{prefix}.schema" if route.schema else "table.schema"
        required = [name for name, kind in columns.items() if name not in key and is_required(kind)]
        if required and mode == "upsert":
            # A delete carries only the key (found by review: every delete was a dead letter).
            raise ConfigError(
                schema_at, f"{required} are not null, but a delete carries only the key: make them nullable"
            )
        transforms_at = f"{prefix}.transforms" if route.transforms is not None else "transforms"
        retargeted = [target for target, _ in route.stages(config).transforms if target.split(".")[0] in key]
        if retargeted and mode == "upsert":  # a changelog's deletes are rows, transformed like the others
            # A delete skips the transforms (it has only the key): a transformed key would never be deleted.
            raise ConfigError(transforms_at, f"{retargeted} write key column(s) of {key_at}; a delete could not match")
        at = f"{prefix}.change_columns" if route.change_columns else "table.change_columns"
        for name in change_columns:
            if name not in CHANGE_COLUMN_NAMES:
                raise ConfigError(at, f"unknown {name!r} (known: {', '.join(CHANGE_COLUMN_NAMES)})")
            if name in _ENVELOPE_COLUMNS and fmt.envelope != "debezium":
                raise ConfigError(at, f"{name!r} needs {fmt_at}.envelope = 'debezium' (the event's source gives it)")
    if table.before_image and not debezium_changelogs:
        raise ConfigError("table.before_image", 'is only used by changelog tables with format.envelope = "debezium"')
    if "format" not in changing:
        _check_append_format("format", config.format)
    if not changing:
        return
    for fmt_at, fmt in changing.items():
        if fmt.key == "none":
            raise ConfigError(
                f"{fmt_at}.key",
                "upsert and changelog tables read the key of a delete (a tombstone) from the Kafka key: "
                'set "json", "avro", "protobuf" or "string"',
            )
        if fmt.type == "raw":
            raise ConfigError(
                f"{fmt_at}.type",
                "upsert and changelog tables need a format with fields (json, avro or protobuf), not raw",
            )
    if config.routing.expression:
        raise ConfigError(
            "routing.expression",
            "cannot route the changes of upsert or changelog tables (a tombstone has no value to read): "
            "route them by topic",
        )


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
    if 0 < jobs.dead_letter_retention_days < 1 or jobs.dead_letter_retention_days < 0:
        raise ConfigError(
            "jobs.dead_letter_retention_days",
            f"expected 0 (keep them) or at least 1 day (the recovery of a partition after a crash reads its newest "
            f"dead letters), got {jobs.dead_letter_retention_days}",
        )
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
    check_coordinator_order(config)


# Where a job takes its coordinator turns, when that is not any table: `jobs mutate` and `jobs ttl` change
# table.uri alone (ttl's dead-letter retention drops whole old `date` partitions of the dead-letter tables, outside
# their turns: a conflict with `maintain` there is a retried turn), `jobs apply-changes` its --target alone (never a
# table the daemon writes), and the daemon (join_ingest) the tables it writes. When table.uri names no one table
# (empty, or a {topic} template several topics fill), `mutate` cannot run, nor `ttl` but for its dead-letter
# retention alone, which takes its turns on the daemon's dead-letter table. Anything else (`maintain`, a job of
# another name: `maintain --dead-letters` on the dead-letter tables too) may run on any table.
_MAIN, _ROUTED, _TARGET = "table.uri", "the daemon's other tables (routes, {topic})", "a jobs apply-changes --target"
_DEAD_LETTERS = "the daemon's dead-letter table"
JOB_TABLES: dict[str, frozenset[str]] = {
    "mutate": frozenset({_MAIN}),
    "ttl": frozenset({_MAIN}),
    "apply-changes": frozenset({_TARGET}),
}
"""The tables the turns of ``jobs mutate``, ``ttl`` and ``apply-changes`` are on (by action: the default job name),
when ``table.uri`` names one table (:func:`job_tables`)."""


def job_tables(config: Config, action: str) -> frozenset[str]:
    """The tables the turns of ``jobs <action>`` are on with this config (none: it cannot run)."""
    if config.main_table_uri or action not in ("mutate", "ttl"):
        return JOB_TABLES[action]
    return frozenset({_DEAD_LETTERS}) if action == "ttl" and config.jobs.dead_letters_only else frozenset()


def check_coordinator_order(config: Config, jobs: Mapping[str, frozenset[str]] = {}) -> None:
    """Each table has its own lock and registration (no ``coordinator.resource``), so ``coordinator.order`` cycles
    on each table through the jobs that run there. A table where two or more of its jobs run, but not all, stalls
    for good: a job whose predecessor never runs there waits for it once another job has registered (the daemon
    registers every ``ingest.allowed_latency_s``, so ``order_timeout_s`` does not help then). ConfigError naming
    ``coordinator.order``. ``jobs`` adds where a job of another name runs (a ``--job-name``)."""
    coordinator = config.coordinator
    order = coordinator.order
    if coordinator.backend == "none" or coordinator.resource or len(order) < 2:
        return  # no shared registration, or one cycle over every table
    runs_on = {**{action: job_tables(config, action) for action in JOB_TABLES}, **jobs}
    everywhere = frozenset({_MAIN, _ROUTED, _TARGET, _DEAD_LETTERS})
    if coordinator.join_ingest:
        runs_on["ingest"] = frozenset({_MAIN, _ROUTED})
    tables = [_MAIN] if config.table.uri else []
    if _writes_several_tables(config) or (config.routes and not config.table.uri):
        tables.append(_ROUTED)
    tables += [kind for kind in (_TARGET, _DEAD_LETTERS) if any(runs_on.get(job) == frozenset({kind}) for job in order)]
    for table in tables:
        there = [job for job in order if table in runs_on.get(job, everywhere)]
        daemon_there = coordinator.join_ingest and "ingest" in there
        if not 2 <= len(there) < len(order) or (coordinator.order_timeout_s > 0 and not daemon_there):
            continue
        stalled = next(job for job in there if order[order.index(job) - 1] not in there)
        waits_for = order[order.index(stalled) - 1]
        missing = [job for job in order if job not in there]
        outcome = "the daemon commits nothing there" if stalled == "ingest" else "reported skipped, exit 0"
        raise ConfigError(
            "coordinator.order",
            f"{list(order)} cannot cycle on {table}: only {', '.join(there)} take turns there, never "
            f"{', '.join(missing)} ({_WHY.get(missing[0], 'not run there')}), so once another of them has run, "
            f"{stalled} waits for {waits_for} there forever ({outcome}). Order only jobs that run on every "
            "table, or set coordinator.resource (one lock and one cycle for all the config's tables)",
        )


_WHY = {
    "mutate": "jobs mutate changes table.uri only (and none when that names no one table)",
    "ttl": "jobs ttl changes table.uri only (or, when that names no one table, runs on the dead-letter table)",
    "apply-changes": "jobs apply-changes writes its --target only, never a table the daemon writes",
    "ingest": "the daemon takes its ingest turns on the tables it writes only",
}


def _writes_several_tables(config: Config) -> bool:
    """Whether the daemon may write a table besides ``table.uri``: routes to other tables, or a ``{topic}`` that
    more than one topic fills."""
    table, only_topic = config.table, config.only_topic
    uris: set[str] = set()
    for uri, topic in [(table.uri, only_topic), *((r.uri or table.uri, r.topic or only_topic) for r in config.routes)]:
        if TOPIC_PLACEHOLDER in uri:
            if not topic:
                return True
            uri = uri.replace(TOPIC_PLACEHOLDER, topic)
        if uri:
            uris.add(table_key(uri))  # as routing compares tables
    return len(uris) > 1


def _validate_subscription(config: Config) -> None:
    """Exactly one of kafka.topic, kafka.topics and kafka.topic_pattern; names Kafka accepts; a valid regex."""
    kafka = config.kafka
    given = [
        key
        for key, value in (("topic", kafka.topic), ("topics", kafka.topics), ("topic_pattern", kafka.topic_pattern))
        if value
    ]
    if not given:
        raise ConfigError("kafka.topic", "required key missing (or kafka.topics, or kafka.topic_pattern)")
    if len(given) > 1:
        raise ConfigError(
            f"kafka.{given[1]}", f"set only one of kafka.topic, kafka.topics and kafka.topic_pattern (found {given})"
        )
    names = (
        [("kafka.topic", kafka.topic)]
        if kafka.topic
        else [(f"kafka.topics[{i}]", t) for i, t in enumerate(kafka.topics)]
    )
    for key, name in names:
        if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(key, f"{name!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
    if len({t for _, t in names}) != len(names):
        raise ConfigError("kafka.topics", f"lists a topic twice: {list(kafka.topics)}")
    if kafka.topic_pattern:
        try:
            re.compile(kafka.topic_pattern)
        except re.error as exc:
            raise ConfigError("kafka.topic_pattern", f"not a regular expression: {exc}") from exc


def _check_append_format(fmt_at: str, fmt: FormatConfig) -> None:
    """The change keys of a format no upsert or changelog table reads."""
    for name, unset in (("envelope", "none"), ("decimal_handling", "auto")):
        if getattr(fmt, name) != unset:
            raise ConfigError(
                f"{fmt_at}.{name}", "is only used with table.mode = 'upsert' or 'changelog' (or a route's mode)"
            )


# What Kafka accepts as a topic name: also safe as one path segment of a table URI ({topic} in table.uri).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _validate_routes(config: Config) -> None:
    """Each route takes some topics (or messages, by [routing] expression) to a table that can be named."""
    expression = config.routing.expression
    if expression:
        parse_expression("routing.expression", expression)  # else the router's compile names an internal key
    Transformer(config.transforms, config.filter.expression)  # at start, not when a first table opens
    _check_uri_template("table.uri", config.table.uri)
    if config.routes and not config.table.uri and not config.dead_letters.table_uri:
        raise ConfigError(
            "dead_letters.table_uri",
            "required when only [[routes]] name tables (table.uri is empty): where the daemon's dead letters go",
        )
    check_table_uri("dead_letters.table_uri", config.dead_letters.table_uri)
    table = urlsplit(config.table.uri)
    if not config.dead_letters.table_uri and TOPIC_PLACEHOLDER in table.netloc:
        raise ConfigError(
            "dead_letters.table_uri",
            f"required when the bucket (or host) of table.uri names the topic "
            f"({without_credentials(config.table.uri)}): the default would be "
            f"{without_credentials(config.dead_letter_table_uri)}",
        )
    if not config.dead_letters.table_uri and table.netloc and not table.path.strip("/"):
        raise ConfigError(
            "dead_letters.table_uri",
            f"required for a table at the root of a bucket ({without_credentials(config.table.uri)}): the default "
            f"<table.uri>_dead_letters would be another bucket, {without_credentials(config.dead_letter_table_uri)}",
        )
    names: set[str] = set()
    for index, route in enumerate(config.routes):
        key = f"routes[{index}]"
        if route.topic and route.topic_pattern:
            raise ConfigError(f"{key}.topic_pattern", "set topic or topic_pattern, not both")
        if not (route.topic or route.topic_pattern or expression):
            raise ConfigError(
                f"{key}.topic", "required (or topic_pattern): without [routing] expression a route is chosen by topic"
            )
        if route.topic_pattern:
            try:
                re.compile(route.topic_pattern)
            except re.error as exc:
                raise ConfigError(f"{key}.topic_pattern", f"not a regular expression: {exc}") from exc
        if route.topic and not config.kafka.subscribes(route.topic):
            raise ConfigError(
                f"{key}.topic", f"{route.topic!r} is not among the subscribed topics ({config.kafka.subscription()})"
            )
        uri = route.uri or config.table.uri
        if not uri.strip():
            raise ConfigError(f"{key}.uri", "required (table.uri is empty)")
        _check_uri_template(f"{key}.uri", route.uri)
        check_table_uri(f"{key}.dead_letter_table_uri", route.dead_letter_table_uri)
        schema_key = f"{key}.schema" if route.schema else "table.schema"
        columns = dict(route.schema or config.table.schema)
        try:
            schema = parse_schema(columns) if columns else None
        except ValueError as exc:
            raise ConfigError(schema_key, str(exc)) from exc
        for column in route.partition_by:
            if schema is not None and column not in schema.names:
                raise ConfigError(f"{key}.partition_by", f"column {column!r} is not in {schema_key}")
        for name in route.metadata_columns:
            if name not in METADATA_COLUMNS:
                raise ConfigError(f"{key}.metadata_columns", f"unknown {name!r} (known: {', '.join(METADATA_COLUMNS)})")
        if route.name:
            if route.name in names:
                raise ConfigError(f"{key}.name", f"{route.name!r} names two routes")
            names.add(route.name)
        elif expression:
            raise ConfigError(f"{key}.name", "required with [routing] expression (its value names the route)")
        stages = {
            "format": route.format,
            "transforms": route.transforms,
            "filter": route.filter,
            "coercions": route.coercions,
        }
        own = [name for name, value in stages.items() if value is not None]
        if own and expression:
            raise ConfigError(
                f"{key}.{own[0]}",
                "not with [routing] expression: a message is decoded and transformed before its route is known; "
                "give every route's in [format], [transforms], [filter] and [coercions]",
            )
        if route.transforms is not None or route.filter is not None:
            Transformer(route.transforms or (), route.filter or "", key=f"{key}.transforms", filter_key=f"{key}.filter")


def _check_uri_template(key: str, uri: str) -> None:
    for placeholder in re.findall(r"\{[^}]*\}", uri):
        if placeholder != TOPIC_PLACEHOLDER:
            raise ConfigError(key, f"unknown placeholder {placeholder} (only {TOPIC_PLACEHOLDER})")
    check_table_uri(key, uri.replace(TOPIC_PLACEHOLDER, "topic"))


def check_table_uri(key: str, uri: str) -> None:
    """A table URI names a place of its own: a bucket (or container) on an object store, a directory below the root
    on local disk. Found by review: ``file://`` wrote the table into the working directory, ``s3://`` had no bucket,
    and ``file://data/t`` names the host ``data``."""
    if not uri:
        return
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in S3_SCHEMES + AZURE_SCHEMES + GCS_SCHEMES and not parts.netloc:
        raise ConfigError(
            key, f"{without_credentials(uri)!r} names no bucket (or container): e.g. {scheme}://bucket/path"
        )
    if scheme == "file" and parts.netloc not in ("", "localhost"):
        raise ConfigError(
            key,
            # The host alone: a netloc's user part may hold a password (found by review).
            f"{without_credentials(uri)!r} names the host {parts.netloc.rsplit('@', 1)[-1]!r}: a local table is "
            "file:///absolute/path "
            "(three slashes) or a plain path",
        )
    if scheme in ("", "file") and not parts.path.strip("/"):
        raise ConfigError(
            key,
            f"{without_credentials(uri)!r} is the root directory (or nothing): give the table a directory of its own",
        )
