# syntax=docker/dockerfile:1.7
# kafka2delta images (docs/OPERATING-deploy.md). Two targets from one build context (this checkout):
#
#   docker build --target daemon      -t kafka2delta:0.1.0 .              # the ingest daemon
#   docker build --target maintenance -t kafka2delta-maintenance:0.1.0 .  # Spark jobs: maintain, jobs
#
# Every install step is a script under docker/, run here through read-only bind mounts (BuildKit), so that
# the scripts leave no trace in the images; tests/integration/test_container.py runs the daemon's scripts in
# a fresh virtualenv and starts what they install, and lints this file (structure, hadolint, shellcheck).
# Configuration is environment only (K2D_<SECTION>__<KEY>); both images run as uid 10001 and write nothing
# outside /tmp, so they run with a read-only root filesystem and an emptyDir (or tmpfs) on /tmp.

# Debian 12 (bookworm): the maintenance image takes Java 17 from Debian, and bookworm is the last Debian
# release with openjdk-17. Pin a digest (python:3.11-slim-bookworm@sha256:…) in a release pipeline. Any bookworm
# image with Debian's python3 and python3-venv works too: `make image-test` builds on one made from Debian
# packages (dev/image.py: mmdebstrap, then buildah bud --build-arg PYTHON_IMAGE=localhost/k2d-base:bookworm).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------------------
# builder: wheels for kafka2delta and every dependency (with the [glue] extra: boto3, for the AWS Glue Schema
# Registry). The only stage with a compiler.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    /mnt/docker/install-build-deps.sh
COPY pyproject.toml README.md /src/
COPY kafka2delta/ /src/kafka2delta/
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    /mnt/docker/build-wheels.sh /src /wheels glue

# spark-builder: the [spark] extra's wheels (pyspark, delta-spark, kazoo) and the jars the jobs load (Delta,
# Spark's Kafka source) from Maven Central, fetched here so that the jobs never reach the network at run time.
# S3_JARS=false leaves out hadoop-aws and the AWS SDK bundle (about 530 MB) when no table is on S3.
FROM builder AS spark-builder
ARG S3_JARS=true
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    /mnt/docker/install-build-deps.sh maven \
    && /mnt/docker/build-wheels.sh /src /wheels spark \
    && /mnt/docker/install-maintenance.sh /opt/kafka2delta /wheels \
    && S3_JARS="${S3_JARS}" /mnt/docker/fetch-spark-jars.sh /opt/kafka2delta /opt/kafka2delta-jars

# ---------------------------------------------------------------------------------------------------------
# runtime: what both final images share. No compiler, no pip at run time, uid 10001, HOME and TMPDIR on /tmp.
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kafka2delta" \
      org.opencontainers.image.description="Stream Kafka topics into Delta Lake tables exactly once." \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kafka2delta/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    /mnt/docker/add-user.sh 10001
WORKDIR /tmp

# ---------------------------------------------------------------------------------------------------------
# daemon: `kafka2delta ingest`, metrics and probes on 0.0.0.0:9102 (/metrics, /healthz, /readyz, /).
FROM runtime AS daemon
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    --mount=type=bind,from=builder,source=/wheels,target=/mnt/wheels \
    /mnt/docker/install-daemon.sh /opt/kafka2delta /mnt/wheels "kafka2delta[glue]"
ENV K2D_METRICS__HOST=0.0.0.0 \
    K2D_METRICS__PORT=9102
EXPOSE 9102
USER 10001:10001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/opt/kafka2delta/bin/kafka2delta-healthcheck", "/healthz"]
ENTRYPOINT ["kafka2delta"]
CMD ["ingest"]

# ---------------------------------------------------------------------------------------------------------
# maintenance: `kafka2delta maintain optimize|vacuum`, `kafka2delta jobs mutate|ttl` on a local Spark, with
# Java 17 and the jars baked in (K2D_SPARK__JARS = spark.jars, the jobs' offline mode: no Ivy resolution);
# Spark's scratch space and Ivy home are under /tmp.
FROM runtime AS maintenance
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    /mnt/docker/install-java.sh
RUN --mount=type=bind,source=docker,target=/mnt/docker \
    --mount=type=bind,from=spark-builder,source=/wheels,target=/mnt/wheels \
    /mnt/docker/install-maintenance.sh /opt/kafka2delta /mnt/wheels
COPY --from=spark-builder /opt/kafka2delta-jars/ /opt/kafka2delta/jars/
ENV K2D_SPARK__JARS="/opt/kafka2delta/jars/*" \
    PYSPARK_PYTHON=/opt/kafka2delta/bin/python \
    SPARK_LOCAL_DIRS=/tmp \
    SPARK_NO_DAEMONIZE=1
USER 10001:10001
ENTRYPOINT ["kafka2delta"]
CMD ["--help"]
