"""kafka2delta: stream Kafka topics into Delta Lake tables exactly once."""

from kafka2delta.config import Config, load_config
from kafka2delta.errors import (
    CommitConflict,
    ConfigError,
    FatalError,
    Kafka2DeltaError,
    MessageError,
    RetryableError,
)

__version__ = "0.1.0"

__all__ = [
    "CommitConflict",
    "Config",
    "ConfigError",
    "FatalError",
    "Kafka2DeltaError",
    "MessageError",
    "RetryableError",
    "__version__",
    "load_config",
]
