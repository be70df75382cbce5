"""kafka2delta: stream Kafka topics into Delta Lake tables exactly once.

The public names load on first use: ``import kafka2delta.startup`` (the entry point) must not pay for pyarrow
before it has installed its signal handlers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_HOMES = {"Config": "kafka2delta.config", "load_config": "kafka2delta.config"}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'kafka2delta' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES.get(name, "kafka2delta.errors")), name)
