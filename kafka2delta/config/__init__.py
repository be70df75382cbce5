"""Typed configuration: TOML file, overridden by ``K2D_<SECTION>__<KEY>`` environment variables.

Only this package and the CLI read files or the environment. Every other module receives a
frozen :class:`Config`. Validation happens once, at start, and a bad value raises
:class:`~kafka2delta.errors.ConfigError` naming the key (``ingest.allowed_latency_s``) and,
for an environment override, the variable it came from.

Environment keys: ``K2D_KAFKA__TOPIC=events`` sets ``kafka.topic``. Mappings take one more level:
``K2D_KAFKA__SETTINGS__SASL_PASSWORD=…`` sets the librdkafka key ``sasl.password`` (underscores
become dots, as librdkafka keys never hold underscores), ``K2D_TABLE__STORAGE_OPTIONS__AWS_REGION=…``
sets the storage option ``AWS_REGION`` as written, ``K2D_TABLE__SCHEMA`` takes a JSON object.

The package: ``sections`` (the typed sections and :class:`Config`), ``loading`` (TOML, environment,
conversion), ``validation`` (checks across keys), ``masking`` (which keys and URI parts are secrets) and
``secret_files`` (values given as files).
"""

from __future__ import annotations

from kafka2delta.config.loading import SECTIONS, load_config
from kafka2delta.config.masking import MASK, is_secret_key, without_credentials
from kafka2delta.config.sections import (
    ENV_PREFIX,
    METADATA_COLUMNS,
    TOPIC_PLACEHOLDER,
    CoercionConfig,
    Config,
    CoordinatorConfig,
    DeadLetterConfig,
    FilterConfig,
    FormatConfig,
    IngestConfig,
    JobsConfig,
    KafkaConfig,
    LoggingConfig,
    MetricsConfig,
    RouteConfig,
    RoutingConfig,
    SchemaRegistryConfig,
    SparkConfig,
    TableConfig,
    table_key,
)

__all__ = [
    "ENV_PREFIX",
    "MASK",
    "METADATA_COLUMNS",
    "SECTIONS",
    "TOPIC_PLACEHOLDER",
    "CoercionConfig",
    "Config",
    "CoordinatorConfig",
    "DeadLetterConfig",
    "FilterConfig",
    "FormatConfig",
    "IngestConfig",
    "JobsConfig",
    "KafkaConfig",
    "LoggingConfig",
    "MetricsConfig",
    "RouteConfig",
    "RoutingConfig",
    "SchemaRegistryConfig",
    "SparkConfig",
    "TableConfig",
    "is_secret_key",
    "load_config",
    "table_key",
    "without_credentials",
]
