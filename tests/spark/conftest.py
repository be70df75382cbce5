"""Fixtures of the Spark job tests: one SparkSession per test session (Spark starts slowly on 2 cores), a real
ZooKeeper (from Maven Central, like the broker), and the broker/daemon factories of the integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.zookeeper.zookeeper import LocalZooKeeper

ROOT = Path(__file__).resolve().parents[2]

# Small and quiet: 2 cores, a few MB of data per test.
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.sql.streaming.stopTimeout": "10s",
    "spark.databricks.delta.checkpoint.writeStatsAsStruct": "true",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from kafka2delta.config import SparkConfig
    from kafka2delta.spark.session import get_session

    session = get_session(SparkConfig(master="local[2]"), master=None, conf=TEST_SPARK_CONF, app_name="k2d-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def zookeeper_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("K2D_TEST_ZOOKEEPER_HOSTS")
    if external:
        yield external
        return
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    try:
        yield server.start()
    finally:
        server.stop()
