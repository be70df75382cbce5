"""The Spark edge: one SparkSession with Delta Lake and the Kafka source, built from ``[spark]``.

Jars: by default Spark's own package mechanism (Ivy) fetches ``io.delta:delta-spark_2.13:<delta-spark version>``
and ``org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>`` (and their dependencies) from Maven Central
once into its cache (``~/.ivy2.5.2``, or ``spark.ivy_dir``). Offline (a container image): ``spark.jars`` lists
local jar files and nothing is fetched. Under ``spark-submit`` the submitted master and jars are kept; only the
Delta session settings are added (they must be set before the first SparkSession, which this module creates).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.metadata
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kafka2delta.config import SparkConfig
from kafka2delta.errors import ConfigError, FatalError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

SCALA_VERSION = "2.13"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Set before ours from [spark].conf and --conf, which override them.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.extensions": DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Never let a job turn on a feature the daemon (deltalake) cannot write, nor widen the schema under it.
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    "spark.databricks.delta.properties.defaults.enableRowTracking": "false",
    "spark.databricks.delta.properties.defaults.enableInCommitTimestamps": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
}


def versions() -> tuple[str, str]:
    """(pyspark, delta-spark) versions installed."""
    try:
        return importlib.metadata.version("pyspark"), importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            "spark", f"the Spark jobs need the [spark] extra (pip install 'kafka2delta[spark]'): {exc}"
        ) from exc


def maven_packages(extra: tuple[str, ...] = ()) -> list[str]:
    """The Maven coordinates Spark fetches: Delta for the installed delta-spark, the Kafka source for the
    installed pyspark (both Scala 2.13), then ``extra``."""
    spark, delta = versions()
    return [
        f"io.delta:delta-spark_{SCALA_VERSION}:{delta}",
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_VERSION}:{spark}",
        *extra,
    ]


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``--conf k=v`` arguments as a mapping."""
    conf: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--conf", f"expected KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value
    return conf


def expand_jars(entries: tuple[str, ...]) -> list[str]:
    """``spark.jars`` entries as jar files: a file as it is, a directory's ``*.jar``, a glob's matches."""
    jars: list[str] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if any(c in entry for c in "*?["):
            found = sorted(str(Path(p).resolve()) for p in glob.glob(str(path)) if p.endswith(".jar"))
        elif path.is_dir():
            found = sorted(str(p.resolve()) for p in path.glob("*.jar"))
        else:
            found = [str(path.resolve())] if path.is_file() else []
        if not found:
            raise ConfigError("spark.jars", f"no jar file at {entry!r}")
        jars.extend(found)
    return jars


def local_defaults(master: str) -> dict[str, str]:
    """For a ``local[...]`` master: a few partitions per core instead of Spark's cluster-sized defaults (200 for
    shuffles, Delta's 50 for log replay, 10,000 for VACUUM's listing), which cost minutes of task overhead."""
    if not master.startswith("local"):
        return {}
    partitions = str(min(16, 2 * (os.cpu_count() or 2)))
    return {
        "spark.sql.shuffle.partitions": partitions,
        "spark.databricks.delta.snapshotPartitions": partitions,
        # VACUUM lists the table's directories with this many tasks (Spark's default: 10,000).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": partitions,
    }


def session_conf(
    config: SparkConfig, overrides: Mapping[str, str], *, submitted: bool, master: str = ""
) -> dict[str, str]:
    """Every setting the session is built with (pure: tested without Spark)."""
    conf = {**DEFAULT_CONF, **local_defaults(master)}
    if not submitted:
        if config.jars:
            conf["spark.jars"] = ",".join(expand_jars(config.jars))
            if config.packages:
                conf["spark.jars.packages"] = ",".join(config.packages)
        else:
            conf["spark.jars.packages"] = ",".join(maven_packages(config.packages))
        if config.ivy_dir:
            conf["spark.jars.ivy"] = config.ivy_dir
    conf.update(config.conf)
    conf.update(overrides)
    return conf


def under_spark_submit() -> bool:
    """True when spark-submit started this Python process (its JVM gateway is already there)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


DEFAULT_IVY_DIR = "~/.ivy2.5.2"
"""Where Spark 4's Ivy keeps what ``spark.jars.packages`` fetched, unless ``spark.jars.ivy`` says otherwise."""


@contextlib.contextmanager
def resolving_alone(settings: Mapping[str, str]) -> Iterator[None]:
    """Hold a file lock in the Ivy directory while a session that fetches ``spark.jars.packages`` starts: Ivy
    takes no lock of its own, so two jobs starting at once on a new machine (two pytest workers, two cron jobs on
    one host) would download into the same cache files and one would read a jar the other is still writing."""
    if not settings.get("spark.jars.packages"):
        yield
        return
    ivy_dir = Path(settings.get("spark.jars.ivy") or DEFAULT_IVY_DIR).expanduser()
    ivy_dir.mkdir(parents=True, exist_ok=True)
    with open(ivy_dir / ".kafka2delta-resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def get_session(config: SparkConfig, *, master: str | None, conf: Mapping[str, str], app_name: str) -> SparkSession:
    """The active SparkSession if there is one (tests, notebooks), else a new one."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        if DELTA_EXTENSION not in (active.conf.get("spark.sql.extensions", "") or ""):
            raise ConfigError("spark.conf", f"the active SparkSession lacks spark.sql.extensions={DELTA_EXTENSION}")
        return active
    submitted = under_spark_submit()
    builder = SparkSession.builder.appName(app_name)
    if master or not submitted:
        builder = builder.master(master or config.master)
    effective_master = master or ("" if submitted else config.master)
    settings = session_conf(config, conf, submitted=submitted, master=effective_master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with resolving_alone(settings):
            session = builder.getOrCreate()
    except (PySparkException, Py4JError, OSError) as exc:
        where = "spark.jars" if config.jars else "spark.packages / Maven Central (Ivy)"
        raise FatalError(
            f"cannot start Spark (master {master or config.master}; jars from {where}; Java 17 or 21 on PATH?): {exc}"
        ) from exc
    session.sparkContext.setLogLevel(config.log_level)
    logger.info("Spark %s session %s on %s", session.version, app_name, session.sparkContext.master)
    return session


def spark_reaches(uri: str) -> bool:
    """Whether the Spark jobs can reach the table at ``uri``: a local or s3:// table, not an Azure or GCS one
    (hadoop-azure / gcs-connector, their credentials and an equivalent of delta-rs's put-if-absent commit, Delta's
    AzureLogStore / GCSLogStore, are not wired up for them)."""
    from kafka2delta.config.sections import AZURE_SCHEMES, GCS_SCHEMES

    return "://" not in uri or uri.split("://", 1)[0].lower() not in AZURE_SCHEMES + GCS_SCHEMES


def spark_path(uri: str) -> str:
    """The table's location as Spark's Hadoop filesystems name it: absolute local paths, ``s3a://`` for ``s3://``."""
    if "://" not in uri:
        return str(Path(uri).resolve())
    scheme = uri.split("://", 1)[0].lower()
    if not spark_reaches(uri):
        raise ConfigError(
            "table.uri",
            f"{uri}: the Spark jobs (maintain, jobs) support local and s3:// tables only; the daemon, status and "
            f"verify support {scheme}:// (README 'Object storage')",
        )
    if uri.startswith("s3://"):
        return "s3a://" + uri.removeprefix("s3://")
    return uri
