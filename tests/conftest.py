"""Shared fixtures. Integration tests get a real Kafka broker (KRaft, from Maven Central jars)
started once per session on free loopback ports, unless K2D_TEST_BOOTSTRAP_SERVERS names one, and,
when a test asks for it, a real schema registry (Apicurio Registry, Confluent-compatible API) the
same way, unless K2D_TEST_SCHEMA_REGISTRY_URL names one."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_dev_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_broker_module() -> ModuleType:
    return _load_dev_module("k2d_dev_broker", ROOT / "dev" / "kafka" / "broker.py")


def load_registry_module() -> ModuleType:
    return _load_dev_module("k2d_dev_registry", ROOT / "dev" / "registry" / "registry.py")


@pytest.fixture(scope="session")
def broker_module() -> ModuleType:
    return load_broker_module()


@pytest.fixture(scope="session")
def kafka_bootstrap(broker_module: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("K2D_TEST_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    broker = broker_module.LocalBroker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker.start()
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible base URL of a real registry (``…/apis/ccompat/v7`` for Apicurio)."""
    external = os.environ.get("K2D_TEST_SCHEMA_REGISTRY_URL")
    if external:
        yield external
        return
    registry = load_registry_module().LocalRegistry(tmp_path_factory.mktemp("registry"))
    try:
        yield registry.start()
    finally:
        registry.stop()
